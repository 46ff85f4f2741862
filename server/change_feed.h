// In-process fan-out of "this record changed" events to callers waiting on
// it (Begin with `wait`). Events may be spurious (a lost PostgreSQL
// connection wakes everyone); waiters always re-read. Every event has a
// number, increasing, so that waiters can tell a read that began after
// their event (and sees the change) from one that did not (SharedReads).
#ifndef IDEM_SERVER_CHANGE_FEED_H_
#define IDEM_SERVER_CHANGE_FEED_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>

#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "statemachine/record.h"

namespace idem {

// Thread-safe.
class ChangeFeed {
 public:
  // Interest in one record; unsubscribes when destroyed. Not thread-safe
  // itself: one waiter owns it.
  class Subscription {
   public:
    ~Subscription();
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

    // Blocks until an event for the record since the last call (or since
    // subscribing), or until `deadline` (steady clock: a wall-clock step
    // neither stretches nor cuts the wait). Returns the number of the
    // latest such event, or 0 if there was none.
    uint64_t WaitUntil(SteadyTime deadline);

    // The number of the feed's latest event, of any record.
    uint64_t LatestEvent() const { return feed_->events_.load(); }

   private:
    friend class ChangeFeed;
    Subscription(ChangeFeed* feed, RecordKey key)
        : feed_(feed), key_(std::move(key)) {}

    ChangeFeed* const feed_;
    const RecordKey key_;
    uint64_t fired_ ABSL_GUARDED_BY(feed_->mu_) = 0;  // an event's number
    SteadyCondVar fired_cv_;
  };

  ChangeFeed() = default;
  ChangeFeed(const ChangeFeed&) = delete;
  ChangeFeed& operator=(const ChangeFeed&) = delete;

  // Starts watching `key`. The feed must outlive the subscription.
  std::unique_ptr<Subscription> Subscribe(const RecordKey& key);

  // Wakes every subscription of `key`. Call it once the change is visible
  // to reads.
  void Publish(const RecordKey& key);

  // Wakes every subscription (events may have been lost).
  void PublishAll();

  // Whether events are being delivered; while not, waiters must re-read on
  // their own now and then. A feed starts live.
  void SetLive(bool live) { live_.store(live); }
  bool live() const { return live_.load(); }

 private:
  // The next event's number; written under mu_.
  uint64_t NextEvent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return events_.fetch_add(1) + 1;
  }

  std::atomic<bool> live_{true};
  std::atomic<uint64_t> events_{0};
  SteadyMutex mu_;
  std::map<RecordKey, std::set<Subscription*>> subscribers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace idem

#endif  // IDEM_SERVER_CHANGE_FEED_H_
