// The coordinator: read a record, let the state machine decide, write
// conditionally, and on a lost race read and decide again. Begin and Get ask
// the store's cache first and answer from a cached record when the decision
// needs no write. Knows nothing of gRPC; callers validate their input first.
#ifndef IDEM_SERVER_CORE_COORDINATOR_H_
#define IDEM_SERVER_CORE_COORDINATOR_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "server/base/config.h"
#include "server/core/core_metrics.h"
#include "server/core/held_records.h"
#include "server/store/store.h"
#include "statemachine/transitions.h"

namespace idem {

struct BeginResult {
  Outcome outcome = Outcome::kInProgress;
  // Never null in an answer. Shared, not copied: with the cache that
  // answered, and among the Begins woken by one change.
  std::shared_ptr<const Record> record;
  // Set when IN_PROGRESS: when to retry, and how long the holder's lease
  // has left by the store's clock.
  absl::Duration retry_after = absl::ZeroDuration();
  absl::Duration lease_left = absl::ZeroDuration();
  // The answer came from the store's cache (RecordStore::ReadCached), without
  // touching the store; cache_source says which ("memory", "redis").
  bool cached = false;
  const char* cache_source = nullptr;
};

struct CoordinatorOptions {
  // A Begin that would create a tenant's record beyond this many open
  // PROCESSING ones is RESOURCE_EXHAUSTED; 0 means no cap. Checked before
  // the insert, so concurrent Begins may overshoot it slightly.
  int64_t max_processing_per_tenant = 0;
  // Granted records kept for their holder's Heartbeat, Complete and Fail
  // (held_records.h); 0 turns that off (every such call reads first).
  size_t held_records = 16384;
};

// Thread-safe if the store is. Does not own the store.
class Coordinator {
 public:
  // `metrics` may be null.
  Coordinator(RecordStore* store, const PolicySet* policies,
              CoreMetrics* metrics = nullptr, CoordinatorOptions options = {})
      : store_(store),
        policies_(policies),
        metrics_(metrics),
        options_(options),
        held_(options.held_records) {}

  // Every call answers through `done`, exactly once: at once on the
  // caller's thread (a cache answered, an error, a store that answers at
  // once) or later on a store's thread. `done` must not block. Arguments
  // need to live only until the call returns.
  using BeginFn = std::function<void(absl::StatusOr<BeginResult>)>;
  using RecordFn = std::function<void(absl::StatusOr<Record>)>;

  // Begin, without waiting: an IN_PROGRESS answer is final here (waiting
  // for the record to settle is BeginWaiters'). Asks the caches, then the
  // store with its first statement (insert-or-read), decides, and writes
  // when the decision does. `cache_checked`: BeginFromCacheMany just
  // missed; skip the cache.
  void Begin(const RecordKey& key, BeginCommand cmd, BeginFn done,
             bool cache_checked = false);
  // Begins answered from the caches alone (RecordStore::ReadCachedMany: one
  // round trip for them all, on the caller's thread): result[i] answers
  // (*keys[i], *cmds[i]) with a replay (or MISMATCH) of a finished record,
  // or is nullopt: the caches cannot answer; call Begin(..., true).
  std::vector<std::optional<BeginResult>> BeginFromCacheMany(
      const std::vector<const RecordKey*>& keys,
      const std::vector<const BeginCommand*>& cmds);
  // Begin's decision on `read` when it needs no write: the answer, or an
  // error; nullopt when it writes (a lease to expire, a retryable failure
  // to take over: call Begin). For Begins woken by a change.
  std::optional<absl::StatusOr<BeginResult>> DecideWoken(
      const RecordKey& key, const BeginCommand& cmd, const StoreRead& read);

  // Answer the record with its new lease.
  void Heartbeat(const RecordKey& key, HeartbeatCommand cmd, RecordFn done);
  void Complete(const RecordKey& key, CompleteCommand cmd, RecordFn done);
  void Fail(const RecordKey& key, FailCommand cmd, RecordFn done);
  void Get(const RecordKey& key, RecordFn done);
  void Resolve(const RecordKey& key, ResolveCommand cmd, RecordFn done);

  const PolicySet& policies() const { return *policies_; }

 private:
  // The outcome and record after a decision was carried out.
  struct Done {
    Outcome outcome;
    Record record;
    absl::Time now;
  };
  // Owns what it needs (a copy of the command): it outlives the call.
  using DecideFn =
      std::function<Decision(const std::optional<Record>&, absl::Time now)>;
  using DoneFn = std::function<void(absl::StatusOr<Done>)>;
  // One call's rounds of read, decide, write.
  struct Op {
    RecordKey key;
    DecideFn decide;
    DoneFn done;
    int rounds = 0;
  };

  // Decides on `read` and carries the decision out: answers, or writes and
  // answers, or (the write's guard no longer held: another caller changed
  // the record) reads and decides again.
  void Step(std::shared_ptr<Op> op, absl::StatusOr<StoreRead> read);
  // Reads the record, then Step.
  void ReadStep(std::shared_ptr<Op> op);
  // Makes `write`, decided on a read at `now` with `outcome`, then answers
  // or reads again.
  void WriteStep(std::shared_ptr<Op> op, const Write& write, Outcome outcome,
                 absl::Time now);
  // A holder's call (Heartbeat, Complete, Fail) with `token`: the first
  // round decides on the record held for it if any (HeldRecords), else
  // reads; then forgets the record unless it is still held by `token`
  // (`keep` and the call succeeded) or the call may be retried (the store
  // failed).
  void RunHolder(const RecordKey& key, int64_t token, DecideFn decide,
                 bool keep, RecordFn done);
  // Get and Resolve: a read, then Step.
  void RunRead(const RecordKey& key, DecideFn decide, RecordFn done);

  // The answer to decision `d` on `read` when it needs no write (or is an
  // error); nullopt: make d.write.
  std::optional<absl::StatusOr<Done>> Settled(const Decision& d,
                                              StoreRead& read);
  // Begin's answer from `cached` when there is one and the decision on it
  // neither writes nor fails; nullopt otherwise (ask the store). Cached
  // records are terminal, so the local clock serves as "now".
  std::optional<BeginResult> BeginFromCache(const RecordKey& key,
                                            const BeginCommand& cmd,
                                            std::optional<CachedRecord> cached);
  // Decides Begin (`key`, `cmd`); owns copies of both.
  DecideFn BeginDecider(const RecordKey& key, BeginCommand cmd) const;
  // Also holds a granted record (ACQUIRED) for its holder's calls.
  BeginResult ToBeginResult(Outcome outcome,
                            std::shared_ptr<const Record> record,
                            absl::Time now, const char* cache_source);
  BeginResult ToBeginResult(Done done);

  // Logs and counts an audited write (lazy expiry, late report).
  void Audited(const AuditEntry& audit, const Record& written);

  RecordStore* const store_;
  const PolicySet* const policies_;
  CoreMetrics* const metrics_;
  const CoordinatorOptions options_;
  HeldRecords held_;
};

}  // namespace idem

#endif  // IDEM_SERVER_CORE_COORDINATOR_H_
