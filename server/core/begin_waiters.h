// Begin calls with `wait` that found their record IN_PROGRESS, parked until
// it settles: a parked call is an entry in a map, not a thread. The store's
// change feed (LISTEN/NOTIFY) tells which key changed; all the Begins parked
// on that key then decide again on one shared read, and the settled ones
// are answered from the thread that did the read. A settle written by this
// instance comes with its record (ChangeFeed::PublishSettled): they decide
// on that, on the writer's thread, without a read. Each read marks the
// record as waited on (RecordStore::ReadForWaiter): only marked records
// announce their settle, and a Begin parks only on a read that marked. A Begin
// leaves early when its wait runs out (answered IN_PROGRESS, as without a
// wait), when its caller hangs up (Cancel), or at shutdown. The bounds on how
// many may park keep one hot key or one tenant from holding the whole instance.
// Core's own: callers reach it through Calls (calls.h).
#ifndef IDEM_SERVER_CORE_BEGIN_WAITERS_H_
#define IDEM_SERVER_CORE_BEGIN_WAITERS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/steady_wait.h"
#include "common/timer_queue.h"
#include "server/base/thread_names.h"
#include "server/core/calls.h"
#include "server/core/coordinator.h"
#include "server/core/core_metrics.h"
#include "server/store/store.h"

namespace idem {

// Thread-safe. Does not own the coordinator, store or metrics.
class BeginWaiters {
 public:
  // An answer may be shared by several Begins (the same command woken by
  // the same change).
  using DoneFn = std::function<void(const absl::StatusOr<BeginResult>&)>;

  // One Begin that may park: made when the call is taken, so that its
  // caller's hang-up reaches it wherever the call is by then.
  class Ticket {
   public:
    bool cancelled() const { return cancelled_.load(); }

   private:
    friend class BeginWaiters;
    std::atomic<bool> cancelled_{false};
  };

  // Reads through `store` (the coordinator's) and listens to `feed` (the
  // backing store's). `metrics` may be null.
  BeginWaiters(Coordinator* coordinator, RecordStore* store, ChangeFeed* feed,
               WaiterLimits limits, CoreMetrics* metrics = nullptr);
  // Shutdown(), then waits for the store work it started.
  ~BeginWaiters();
  BeginWaiters(const BeginWaiters&) = delete;
  BeginWaiters& operator=(const BeginWaiters&) = delete;

  static std::shared_ptr<Ticket> NewTicket() {
    return std::make_shared<Ticket>();
  }

  // Answers `done` exactly once with `result`, or, when it is IN_PROGRESS
  // and `until` has not passed, parks the Begin (`key`, `cmd`) first: then
  // with the settled answer, with the latest IN_PROGRESS one at `until` or
  // at shutdown, with CANCELLED once `ticket` is cancelled, or with
  // RESOURCE_EXHAUSTED naming the bound it would pass.
  void Settle(std::shared_ptr<Ticket> ticket, const RecordKey& key,
              const BeginCommand& cmd, absl::StatusOr<BeginResult> result,
              SteadyTime until, DoneFn done);

  // The caller of `ticket`'s Begin hung up: a parked Begin leaves now
  // (answered CANCELLED), one not parked yet never parks.
  void Cancel(const std::shared_ptr<Ticket>& ticket);

  // Answers every parked Begin with its latest answer and parks none from
  // now on. Idempotent.
  void Shutdown();

  // Begins parked now.
  int64_t parked();

 private:
  struct Parked {
    std::shared_ptr<Ticket> ticket;
    RecordKey key;
    BeginCommand cmd;
    BeginResult last;
    DoneFn done;
    SteadyTime until;
    TimerQueue::Id deadline = 0;
  };
  // The Begins parked on one key, and its one read at a time.
  struct Group {
    absl::flat_hash_set<Ticket*> members;
    bool reading = false;
    bool read_again = false;  // a change came during the read
    TimerQueue::Id wake = 0;  // when to read without a change
  };
  // An answer to give once the lock is released.
  struct Answer {
    DoneFn done;
    std::shared_ptr<const absl::StatusOr<BeginResult>> result;
  };
  // What a read decided for one parked Begin that leaves: its answer, or
  // null when the decision writes (then Rerun).
  struct Leaving {
    Ticket* ticket;
    std::shared_ptr<const absl::StatusOr<BeginResult>> decided;
  };

  // What one decision on a group's record let go: answered, or to run
  // whole.
  struct Woken {
    std::vector<Answer> answers;
    std::vector<Parked> reruns;
  };

  void OnChange(const RecordKey* key);
  // `settled` as its settle wrote it (ChangeFeed::PublishSettled): the
  // Begins parked on it decide without a read.
  void OnSettled(const Record& settled);
  // Reads the group's record (once at a time; a change during the read
  // means another read after it).
  void Refresh(const RecordKey& key, Group& group,
               std::vector<RecordKey>* to_read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartReads(const std::vector<RecordKey>& keys);
  void OnRead(const RecordKey& key, const absl::StatusOr<StoreRead>& read);
  // Decides again for every Begin parked in `it`'s group on `read`: those
  // that leave are unparked (the group may go with them), the rest wait on.
  Woken Decide(std::map<RecordKey, Group>::iterator it, const StoreRead& read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers and reruns what Decide let go, once the lock is released.
  void Deliver(Woken& woken);
  // A Begin whose decision writes: run whole, then settled again.
  void Rerun(Parked parked);
  void OnDeadline(Ticket* ticket);
  // Takes `ticket`'s entry out of the maps (and its timers); the caller
  // publishes the new count.
  Parked Unpark(Ticket* ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the group's wake-up: when the holder's lease runs out (expiry is
  // then due), and every so often while the change feed is down.
  void ScheduleWake(const RecordKey& key, Group& group,
                    absl::Duration lease_left)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts the store calls in flight, which the destructor waits for.
  void Started();
  void Finished();
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Coordinator* const coordinator_;
  RecordStore* const store_;
  ChangeFeed* const feed_;
  const WaiterLimits limits_;
  CoreMetrics* const metrics_;

  // A std::mutex underneath: ThreadSanitizer sees it (Debian's Abseil is
  // not instrumented).
  SteadyMutex mu_;
  SteadyCondVar idle_;  // submitted_ fell to 0
  absl::flat_hash_map<Ticket*, Parked> parked_ ABSL_GUARDED_BY(mu_);
  std::map<RecordKey, Group> groups_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_tenant_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int submitted_ ABSL_GUARDED_BY(mu_) = 0;  // store work not yet done
  // Last: its thread stops before the members its timers use go.
  TimerQueue timers_{thread_names::kWaitTimer};
};

}  // namespace idem

#endif  // IDEM_SERVER_CORE_BEGIN_WAITERS_H_
