// The clients of a fault run: workers that Begin, write their business
// effect, then Complete or Fail (retrying the same call on info outcomes),
// replay old keys and probe them with another request hash; operators that
// list UNKNOWN records and Resolve them; and the holder process of the
// paused-holder scenario. Every call is recorded as an Op.
#ifndef IDEM_TESTS_FAULTS_WORKLOAD_H_
#define IDEM_TESTS_FAULTS_WORKLOAD_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <pqxx/connection>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "tests/faults/history.h"

namespace idem::faults {

// CLOCK_MONOTONIC in nanoseconds (the same clock in every process).
int64_t NowNs();

// The request hash every caller of `key` sends (one intent per key), and
// another one for MISMATCH probes. Stable across processes.
std::string IntentHash(const std::string& key);
std::string OtherHash(const std::string& key);

// Collects ops from every thread. Thread-safe.
class Recorder {
 public:
  explicit Recorder(int64_t first_id = 1) : next_id_(first_id) {}
  int64_t NextId() { return next_id_.fetch_add(1); }
  void Add(Op op);
  std::vector<Op> Take();
  int64_t size() const;

 private:
  std::atomic<int64_t> next_id_;
  mutable absl::Mutex mu_;
  std::vector<Op> ops_ ABSL_GUARDED_BY(mu_);
};

// gRPC calls of one worker, over its own channels (one per sidecar, not
// shared with other workers), each recorded as an Op. Not thread-safe.
class Client {
 public:
  Client(const std::vector<std::string>& addresses, int worker,
         Recorder* recorder, absl::Duration deadline, uint64_t seed);

  // With `wait_ms` > 0, a waiting Begin: it blocks up to that long while
  // another attempt holds the lease.
  Op Begin(const std::string& key, const std::string& hash,
           const std::string& attempt_id, int64_t lease_ms,
           int64_t wait_ms = 0);
  Op Complete(const std::string& key, int64_t token,
              const pb::Snapshot& result);
  Op Fail(const std::string& key, int64_t token, const pb::Snapshot& error,
          bool retryable);
  Op Get(const std::string& key);
  Op Resolve(const std::string& key, pb::Status to, const pb::Snapshot& result,
             bool retryable, int64_t expected, const std::string& actor,
             const std::string& reason);
  // Lists UNKNOWN records of the tenant (one page); recorded without them.
  Op ListUnknown(std::vector<pb::Record>* records);

  int worker() const { return worker_; }
  // retry_after of the last IN_PROGRESS answer.
  absl::Duration last_retry_after() const { return last_retry_after_; }

 private:
  int Pick();
  Op NewOp(OpType type, const std::string& key);
  void Finish(Op& op, const grpc::Status& status);
  std::unique_ptr<grpc::ClientContext> Context() const;

  const int worker_;
  Recorder* const recorder_;
  const absl::Duration deadline_;
  std::mt19937_64 rng_;
  absl::Duration last_retry_after_;
  std::vector<std::unique_ptr<pb::Idempotency::Stub>> stubs_;
  std::vector<std::unique_ptr<pb::IdempotencyAdmin::Stub>> admins_;
};

// The business table: effect rows (key, token, writer) behind a per-key
// token fence (a write with a token below the highest one written is
// refused: the fencing-token check the README asks business services for).
class Ledger {
 public:
  Ledger(std::string conninfo, Recorder* recorder);
  ~Ledger();
  // Writes the effect; ok, fail (fenced off: code 9) or info.
  Op Write(const std::string& key, int64_t token, const std::string& writer,
           int worker);
  // Whether an effect with `token` exists for `key`; nullopt on error.
  std::optional<bool> Has(const std::string& key, int64_t token);

 private:
  pqxx::connection* Connection();

  const std::string conninfo_;
  Recorder* const recorder_;
  std::unique_ptr<pqxx::connection> conn_;
};

struct WorkloadOptions {
  int workers = 10;
  int operators = 1;
  int64_t lease_ms = 3000;
  int64_t abandon_lease_ms = 1000;
  // Of each worker's intents: replays of known keys, probes with another
  // hash, Gets, keys of the shared hot set (contention), abandoned grants
  // (a crashed caller: the record turns UNKNOWN or is released), Begins on
  // records seen UNKNOWN (racing the operators' Resolve), and focus keys
  // (set by a scenario). The rest are fresh keys.
  double p_replay = 0.12;
  double p_probe = 0.04;
  double p_get = 0.04;
  double p_hot = 0.20;
  double p_abandon = 0.03;
  double p_chase = 0.05;
  double p_focus = 0.0;
  // Share of keys under the release expiry policy (send-email).
  double p_release_op = 0.25;
  // After ACQUIRED and the effect: Fail retryable / Fail final, else
  // Complete.
  double p_fail_retryable = 0.08;
  double p_fail_final = 0.05;
  int hot_keys = 16;
  absl::Duration hot_rotation = absl::Seconds(4);
  absl::Duration call_deadline = absl::Seconds(2);
  // How long one call is retried on info outcomes before giving up.
  absl::Duration give_up = absl::Seconds(10);
  absl::Duration operator_interval = absl::Milliseconds(300);
  // An operator follows the ledger (effect there: SUCCEEDED, else FAILED
  // retryable) with this probability, else decides at random.
  double operator_follow_ledger = 0.85;
};

// State shared by the threads of a workload. Thread-safe.
class Shared {
 public:
  std::atomic<bool> stop{false};
  const int64_t start_ns = NowNs();

  void AddKnown(const std::string& key);
  std::optional<std::string> RandomKnown(std::mt19937_64& rng);
  void AddUnknown(const std::string& key);
  void RemoveUnknown(const std::string& key);
  std::optional<std::string> RandomUnknown(std::mt19937_64& rng);
  void SetFocus(std::vector<std::string> keys);
  std::optional<std::string> RandomFocus(std::mt19937_64& rng);

 private:
  absl::Mutex mu_;
  std::vector<std::string> known_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> unknown_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> focus_ ABSL_GUARDED_BY(mu_);
};

// Worker and operator threads over one cluster.
class Workload {
 public:
  Workload(WorkloadOptions options, std::vector<std::string> addresses,
           std::string conninfo, uint64_t seed, Recorder* recorder);
  ~Workload();
  void Start();
  // Stops the threads; each finishes the intent it is in (bounded by
  // give_up per call) and is joined.
  void Stop();
  Shared& shared() { return shared_; }

 private:
  void WorkerLoop(int index);
  void OperatorLoop(int index);

  const WorkloadOptions options_;
  const std::vector<std::string> addresses_;
  const std::string conninfo_;
  const uint64_t seed_;
  Recorder* const recorder_;
  Shared shared_;
  std::vector<std::thread> threads_;
};

// One caller's intent on `key`: Begin (retried with the same attempt id on
// info outcomes, and after IN_PROGRESS), then on ACQUIRED the effect and
// Complete or Fail. Returns the Begin outcome reached (UNSPECIFIED if none).
struct IntentOptions {
  int64_t lease_ms = 3000;
  bool abandon = false;  // stop after the grant (and maybe the effect)
  double p_fail_retryable = 0.0;
  double p_fail_final = 0.0;
  absl::Duration give_up = absl::Seconds(10);
  int max_in_progress = 3;
  // Called with the granted token before the effect is written (the holder
  // process stops itself there).
  std::function<void(const std::string& key, int64_t token)> on_grant;
};
pb::Outcome RunIntent(Client& client, Ledger& ledger, Shared* shared,
                      std::mt19937_64& rng, const std::string& key,
                      const std::string& attempt_id,
                      const IntentOptions& options);

// The holder process of the paused-holder scenario (faults_runner
// --holder): for each of `keys` keys it Begins with a short lease, prints
// "GRANTED <key> <token>", stops itself (SIGSTOP) until the harness
// continues it, then writes its effect and Completes with its (by then
// usually stale) token. Its ops are appended to `out_path`, one line each.
struct HolderOptions {
  std::vector<std::string> addresses;
  std::string conninfo;
  std::string out_path;
  int keys = 5;
  int64_t lease_ms = 1000;
  uint64_t seed = 1;
  int worker = 1000;
};
int RunHolder(const HolderOptions& options);

}  // namespace idem::faults

#endif  // IDEM_TESTS_FAULTS_WORKLOAD_H_
