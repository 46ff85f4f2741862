// The coordinator: read a record, let the state machine decide, write
// conditionally, and on a lost race read and decide again. Begin and Get ask
// the store's cache first and answer from a cached record when the decision
// needs no write. Knows nothing of gRPC; callers validate their input first.
#ifndef IDEM_SERVER_COORDINATOR_H_
#define IDEM_SERVER_COORDINATOR_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/held_records.h"
#include "server/metrics.h"
#include "server/store.h"
#include "statemachine/transitions.h"

namespace idem {

struct BeginResult {
  Outcome outcome = Outcome::kInProgress;
  Record record;
  // Set when IN_PROGRESS: when to retry, and how long the holder's lease
  // has left by the store's clock.
  absl::Duration retry_after = absl::ZeroDuration();
  absl::Duration lease_left = absl::ZeroDuration();
  // The answer came from the store's cache (Store::ReadCached), without
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
  Coordinator(Store* store, const PolicySet* policies,
              Metrics* metrics = nullptr, CoordinatorOptions options = {})
      : store_(store),
        policies_(policies),
        metrics_(metrics),
        options_(options),
        held_(options.held_records) {}

  // Begin, without waiting: an IN_PROGRESS answer is final here (waiting
  // for the record to settle is BeginWaiters'). `cache_checked`:
  // BeginFromCacheMany just missed; skip the cache once.
  absl::StatusOr<BeginResult> Begin(const RecordKey& key,
                                    const BeginCommand& cmd,
                                    bool cache_checked = false);
  // Begin's decision on `read` when it needs no write: the answer, or an
  // error; nullopt when it writes (a lease to expire, a retryable failure
  // to take over: call Begin). For Begins woken by a change.
  std::optional<absl::StatusOr<BeginResult>> DecideWoken(
      const RecordKey& key, const BeginCommand& cmd, const StoreRead& read);
  // Begins answered from the caches alone (Store::ReadCachedMany: one round
  // trip for them all, on the caller's thread): result[i] answers
  // (*keys[i], *cmds[i]) with a replay (or MISMATCH) of a finished record,
  // or is nullopt: the caches cannot answer; go on to the store.
  std::vector<std::optional<BeginResult>> BeginFromCacheMany(
      const std::vector<const RecordKey*>& keys,
      const std::vector<const BeginCommand*>& cmds);
  // Begin's first statement (Store::InsertOrReadAsync) for a caller that
  // must not block, after BeginFromCacheMany missed. Returns false, without
  // calling `done`, when the store cannot run it that way (or a tenant cap
  // means counting first). Otherwise calls `done` exactly once, possibly on
  // a store thread, with the answer when that statement settles the call (a
  // new record: ACQUIRED; a record whose answer needs no write), with an
  // error, or with nullopt: call Begin(..., cache_checked) on a thread that
  // may block.
  using BeginFromStoreFn =
      std::function<void(std::optional<absl::StatusOr<BeginResult>>)>;
  bool BeginFromStoreAsync(const RecordKey& key, const BeginCommand& cmd,
                           BeginFromStoreFn done);
  // Heartbeat, Complete or Fail for a caller that must not block, when this
  // instance holds the record for the command's token (held_records.h): the
  // write decided on it goes to the store's threads (Store::ApplyAsync).
  // Returns false, without calling `done`, when nothing is held for the
  // token or the store cannot run it that way. Otherwise calls `done`
  // exactly once, possibly on a store thread, with what the blocking form
  // returns, or with nullopt: the record changed since (the guard failed);
  // call the blocking form, which reads and decides again.
  using HolderFn = std::function<void(std::optional<absl::StatusOr<Record>>)>;
  bool HeartbeatAsync(const RecordKey& key, const HeartbeatCommand& cmd,
                      HolderFn done);
  bool CompleteAsync(const RecordKey& key, const CompleteCommand& cmd,
                     HolderFn done);
  bool FailAsync(const RecordKey& key, const FailCommand& cmd, HolderFn done);
  // Returns the record with its new lease.
  absl::StatusOr<Record> Heartbeat(const RecordKey& key,
                                   const HeartbeatCommand& cmd);
  absl::StatusOr<Record> Complete(const RecordKey& key,
                                  const CompleteCommand& cmd);
  absl::StatusOr<Record> Fail(const RecordKey& key, const FailCommand& cmd);
  absl::StatusOr<Record> Get(const RecordKey& key);
  absl::StatusOr<Record> Resolve(const RecordKey& key,
                                 const ResolveCommand& cmd);

  const PolicySet& policies() const { return *policies_; }

 private:
  // The outcome and record after a decision was carried out.
  struct Done {
    Outcome outcome;
    Record record;
    absl::Time now;
    // The cache that answered (CachedRecord::source); null: the store.
    const char* cache_source = nullptr;
  };
  using DecideFn =
      std::function<Decision(const std::optional<Record>&, absl::Time now)>;

  // Reads, decides and writes until a decision sticks. With `try_first` (an
  // insert), that write is attempted first, with the record it runs into
  // read in the same round trip (Begin's optimistic insert). With `held`
  // (HeldRecords), the first round decides on it instead of reading.
  absl::StatusOr<Done> Run(const RecordKey& key, const DecideFn& decide,
                           const std::optional<Write>& try_first,
                           std::optional<Record> held = std::nullopt);
  // A holder's call (Heartbeat, Complete, Fail) with `token`: Run, first
  // deciding on the record held for it if any; then forgets the record
  // unless it is still held by `token` (`keep` and the call succeeded) or
  // the call may be retried (the store failed).
  absl::StatusOr<Done> RunHolder(const RecordKey& key, int64_t token,
                                 const DecideFn& decide, bool keep);
  // The non-blocking form of RunHolder, for the *Async calls: only on a
  // held record, only for a write without an audit row.
  bool RunHolderAsync(const RecordKey& key, int64_t token,
                      const DecideFn& decide, bool keep, HolderFn done);

  // The answer to decision `d` on `read` when it needs no write (or is an
  // error); nullopt: make d.write.
  std::optional<absl::StatusOr<Done>> Settled(const Decision& d,
                                              StoreRead& read);
  // The answer from `cached` when there is one and `decide` neither writes
  // nor fails on it; nullopt otherwise (ask the store). Cached records are
  // terminal, so the local clock serves as "now".
  std::optional<Done> FromCache(std::optional<CachedRecord> cached,
                                const DecideFn& decide);
  static DecideFn BeginDecider(const RecordKey& key, const BeginCommand& cmd,
                               const Policy& policy);
  // Also holds a granted record (ACQUIRED) for its holder's calls.
  BeginResult ToBeginResult(Done done);

  // RESOURCE_EXHAUSTED if `tenant` may not open another PROCESSING record.
  absl::Status CheckCapacity(const std::string& tenant);
  // Logs and counts an audited write (lazy expiry, late report).
  void Audited(const Write& write, const Record& written);

  Store* const store_;
  const PolicySet* const policies_;
  Metrics* const metrics_;
  const CoordinatorOptions options_;
  HeldRecords held_;
};

}  // namespace idem

#endif  // IDEM_SERVER_COORDINATOR_H_
