// The one entry point of every call the sidecar serves, from whichever wire
// it came (the gRPC services, the HTTP gateway): those translate their
// format, call it, and answer from its completion. It owns the whole life
// of a call: the coordinator's rounds of read, decide and write, and for a
// Begin that may wait, its parking until the record settles (BeginWaiters,
// an implementation detail no caller sees). docs/threading.md follows a
// Begin through it.
#ifndef IDEM_SERVER_CORE_CALLS_H_
#define IDEM_SERVER_CORE_CALLS_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/steady_wait.h"
#include "server/core/coordinator.h"
#include "server/core/core_metrics.h"
#include "server/store/change_feed.h"
#include "server/store/store.h"

namespace idem {

class BeginWaiters;

// How many Begins may be parked at once; past one: RESOURCE_EXHAUSTED.
struct WaiterLimits {
  int per_key = 2048;
  int per_tenant = 4096;
  int total = 16384;
};

struct CallsOptions {
  CoordinatorOptions coordinator;
  WaiterLimits waiters;
};

// Thread-safe. Does not own the store, change feed, policies or metrics,
// which must outlive it.
class Calls {
 public:
  // Every call answers through its completion exactly once: at once on the
  // caller's thread (a cache answered, an error, a store that answers at
  // once), later on a store's thread, or, for a Begin that waited, on the
  // thread that learnt the outcome (a store's, or the waiters' timer when
  // the wait ran out), on the canceller's or on the one that calls
  // Shutdown(). A completion must not block. Arguments need to live only
  // until the call returns (docs/threading.md).
  using BeginFn = Coordinator::BeginFn;
  using RecordFn = Coordinator::RecordFn;

  // A Begin that may wait for its record to settle: until when, and its
  // caller's hang-up (Cancel). Made when the call is taken, so that a
  // hang-up reaches the Begin wherever it is by then. Opaque.
  class Wait;

  // Reads and writes `records`; parked Begins listen to `feed` (the backing
  // store's change feed). `metrics` may be null.
  Calls(RecordStore* records, ChangeFeed* feed, const PolicySet* policies,
        CoreMetrics* metrics, CallsOptions options = {});
  // Shutdown(), then waits for the store work the waiters started.
  ~Calls();
  Calls(const Calls&) = delete;
  Calls& operator=(const Calls&) = delete;

  // A wait for a Begin that may wait until `until`.
  std::shared_ptr<Wait> NewWait(SteadyTime until) const;
  // The caller of `wait`'s Begin hung up: a parked Begin is answered
  // CANCELLED now, one not parked yet never parks. Any thread; no-op on
  // null.
  void Cancel(const std::shared_ptr<Wait>& wait);

  // Begin `key` with `cmd`. Without `wait` (null) an IN_PROGRESS answer is
  // final. With it, an IN_PROGRESS answer parks the Begin (holding no
  // thread) until the record settles (then its answer), the wait runs out
  // or Shutdown() (the latest IN_PROGRESS answer), the caller cancels
  // (CANCELLED), or is RESOURCE_EXHAUSTED at a WaiterLimits bound.
  // `cache_checked`: BeginFromCacheMany just missed; skip the caches.
  void Begin(const RecordKey& key, BeginCommand cmd, std::shared_ptr<Wait> wait,
             BeginFn done, bool cache_checked = false);
  // Begins answered from the caches alone (one round trip for them all, on
  // the caller's thread): result[i] answers (*keys[i], *cmds[i]) with a
  // replay or MISMATCH of a finished record, or is nullopt: call
  // Begin(..., /*cache_checked=*/true). A finished record never waits.
  std::vector<std::optional<BeginResult>> BeginFromCacheMany(
      const std::vector<const RecordKey*>& keys,
      const std::vector<const BeginCommand*>& cmds) {
    return coordinator_.BeginFromCacheMany(keys, cmds);
  }

  // The holder's calls and the reads: answer the record as written or read.
  void Heartbeat(const RecordKey& key, HeartbeatCommand cmd, RecordFn done) {
    coordinator_.Heartbeat(key, cmd, std::move(done));
  }
  void Complete(const RecordKey& key, CompleteCommand cmd, RecordFn done) {
    coordinator_.Complete(key, std::move(cmd), std::move(done));
  }
  void Fail(const RecordKey& key, FailCommand cmd, RecordFn done) {
    coordinator_.Fail(key, std::move(cmd), std::move(done));
  }
  void Get(const RecordKey& key, RecordFn done) {
    coordinator_.Get(key, std::move(done));
  }
  void Resolve(const RecordKey& key, ResolveCommand cmd, RecordFn done) {
    coordinator_.Resolve(key, std::move(cmd), std::move(done));
  }

  // Answers every parked Begin with its latest answer and parks none from
  // now on (their callers retry elsewhere). Idempotent.
  void Shutdown();

  // Begins parked now.
  int64_t parked();

  const PolicySet& policies() const { return coordinator_.policies(); }
  // For core's own background loops (the reconciler's Resolve).
  Coordinator* coordinator() { return &coordinator_; }

 private:
  Coordinator coordinator_;
  // After the coordinator: goes first, with the store work it started.
  std::unique_ptr<BeginWaiters> waiters_;
};

}  // namespace idem

#endif  // IDEM_SERVER_CORE_CALLS_H_
