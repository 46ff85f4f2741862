// In-process fan-out of "this record changed" events to whoever waits on
// records (the parked Begins of begin_waiters.h). Events may be spurious (a
// lost PostgreSQL connection announces a change of every record) and late
// (a newer state may have been read by then); a listener reads again,
// unless the event carries the record as the change left it.
#ifndef IDEM_SERVER_STORE_CHANGE_FEED_H_
#define IDEM_SERVER_STORE_CHANGE_FEED_H_

#include <atomic>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "statemachine/record.h"

namespace idem {

// Thread-safe.
class ChangeFeed {
 public:
  // Told of a change of `*key`, or of any record when `key` is null (events
  // may have been lost). `settled`, when not null, is the record of `*key`
  // as its settle wrote it, its updated_at on the store's clock. Runs on
  // the publisher's thread: must not block.
  using Listener =
      std::function<void(const RecordKey* key, const Record* settled)>;

  ChangeFeed() = default;
  ChangeFeed(const ChangeFeed&) = delete;
  ChangeFeed& operator=(const ChangeFeed&) = delete;

  // The one listener; an empty function removes it. Publish calls running
  // while it is replaced may still call the old one.
  void SetListener(Listener listener) {
    absl::MutexLock lock(&mu_);
    listener_ = std::move(listener);
  }

  // Announces a change of `key`. Call it once the change is visible to
  // reads.
  void Publish(const RecordKey& key) { Call(&key, nullptr); }
  // Announces that `record` settled (a terminal status), as written: the
  // writer's own instance spares its listener a read (a settle by another
  // instance arrives by Publish). Call it once the write is visible.
  void PublishSettled(const Record& record) { Call(&record.key, &record); }
  // Announces that any record may have changed.
  void PublishAll() { Call(nullptr, nullptr); }

  // Whether events are being delivered; while not, waiters must re-read on
  // their own now and then. A feed starts live.
  void SetLive(bool live) { live_.store(live); }
  bool live() const { return live_.load(); }

 private:
  // A listener may publish in turn on its own thread (a store that answers
  // at once, as the memory store does: a woken Begin writes and settles
  // another record). That nested call runs under the outer call's reader
  // lock: taking it again could wait behind a SetListener queued in
  // between, which waits for the outer call, for ever.
  void Call(const RecordKey* key,
            const Record* settled) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    thread_local const ChangeFeed* calling = nullptr;
    if (calling == this) {
      if (listener_) listener_(key, settled);
      return;
    }
    absl::ReaderMutexLock lock(&mu_);
    const ChangeFeed* const outer = calling;
    calling = this;
    if (listener_) listener_(key, settled);
    calling = outer;
  }

  std::atomic<bool> live_{true};
  absl::Mutex mu_;
  Listener listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace idem

#endif  // IDEM_SERVER_STORE_CHANGE_FEED_H_
