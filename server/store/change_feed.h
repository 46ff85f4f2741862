// In-process fan-out of "this record changed" events to whoever waits on
// records (the parked Begins of begin_waiters.h). Events may be spurious (a
// lost PostgreSQL connection announces a change of every record); a
// listener always reads again.
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
  // may have been lost). Runs on the publisher's thread: must not block.
  using Listener = std::function<void(const RecordKey* key)>;

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
  void Publish(const RecordKey& key) { Call(&key); }
  // Announces that any record may have changed.
  void PublishAll() { Call(nullptr); }

  // Whether events are being delivered; while not, waiters must re-read on
  // their own now and then. A feed starts live.
  void SetLive(bool live) { live_.store(live); }
  bool live() const { return live_.load(); }

 private:
  void Call(const RecordKey* key) {
    absl::ReaderMutexLock lock(&mu_);
    if (listener_) listener_(key);
  }

  std::atomic<bool> live_{true};
  absl::Mutex mu_;
  Listener listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace idem

#endif  // IDEM_SERVER_STORE_CHANGE_FEED_H_
