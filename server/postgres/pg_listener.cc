#include "server/postgres/pg_listener.h"

#include <pqxx/pqxx>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/thread_name.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "server/postgres/pg_pool.h"

namespace idem {
namespace {

class Receiver final : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection& c, ChangeFeed* feed)
      : pqxx::notification_receiver(c, kRecordChannel), feed_(feed) {}

  void operator()(const std::string& payload, int) override {
    std::vector<std::string> parts = absl::StrSplit(payload, '\n');
    if (parts.size() == 3) {
      feed_->Publish(RecordKey{parts[0], parts[1], parts[2]});
    }
  }

 private:
  ChangeFeed* const feed_;
};

}  // namespace

PgListener::PgListener(const std::string& conninfo, ChangeFeed* feed)
    : conninfo_(TunedConnInfo(conninfo, absl::Seconds(2))),
      // Not live until the first LISTEN succeeds (before the thread runs).
      feed_((feed->SetLive(false), feed)),
      thread_([this] { Loop(); }) {}

PgListener::~PgListener() {
  stop_.Notify();
  thread_.join();
}

void PgListener::Loop() {
  NameThisThread(thread_names::kPgListen);
  absl::Duration backoff = absl::Milliseconds(100);
  bool was_up = false;
  // Lost after it was up: its return is logged at the loss's level.
  bool lost = false;
  while (!stop_.HasBeenNotified()) {
    try {
      pqxx::connection c(conninfo_);
      Receiver receiver(c, feed_);
      // Anything that changed while we were not listening.
      feed_->SetLive(true);
      feed_->PublishAll();
      if (lost) {
        Log(LogLevel::kWarn, "record change listener is back");
      } else if (!was_up) {
        Log(LogLevel::kInfo, "listening for record changes");
      }
      lost = false;
      was_up = true;
      backoff = absl::Milliseconds(100);
      while (!stop_.HasBeenNotified()) {
        c.await_notification(0, 200000);
        if (!c.is_open()) break;
      }
    } catch (...) {
      absl::Status s = StatusFromCurrentException("listen");
      if (was_up) {
        Log(LogLevel::kWarn,
            "lost the record change listener; waiters poll "
            "until it is back",
            {{"error", std::string(s.message())}});
        lost = true;
      }
      was_up = false;
    }
    feed_->SetLive(false);
    feed_->PublishAll();
    stop_.WaitForNotificationWithTimeout(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace idem
