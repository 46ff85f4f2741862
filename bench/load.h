// The closed-loop (or fixed-arrival-rate) load generator behind idem-bench:
// asynchronous unary calls to idempotency.v1.Idempotency over a few
// CompletionQueue threads, each with its own channel (TCP connection), with a
// fixed number of requests outstanding.
#ifndef IDEM_BENCH_LOAD_H_
#define IDEM_BENCH_LOAD_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/histogram.h"

namespace idem::bench {

// What one request of a run does.
enum class Scenario {
  // Begin on a new key (expects ACQUIRED), then Complete with the token.
  kFresh,
  // Begin on a finished key of the preloaded key space (expects COMPLETED).
  // The same load measures replay-redis and replay-pg: the difference is
  // whether the sidecar under test has --redis.
  kReplay,
  // Many clients race on key_space hot keys: Begin; the winner (ACQUIRED)
  // Completes and moves that hot key on to a new generation, the others get
  // IN_PROGRESS or COMPLETED.
  kContention,
  // replay_fraction of the requests replay, the rest are fresh.
  kMixed,
};

// Parses "fresh", "replay", "replay-redis", "replay-pg", "contention" or
// "mixed".
absl::StatusOr<Scenario> ParseScenario(const std::string& name);
const char* ScenarioName(Scenario s);

struct LoadOptions {
  std::string target = "127.0.0.1:50051";
  Scenario scenario = Scenario::kFresh;
  // Requests outstanding at once (the closed loop's clients).
  int concurrency = 8;
  // CompletionQueue threads; each owns one channel.
  int threads = 2;
  absl::Duration warmup = absl::Seconds(2);
  absl::Duration duration = absl::Seconds(10);
  // Requests per second started on a schedule fixed in advance (a Poisson
  // process, like pgbench --rate); 0: closed loop. With a rate, latency
  // counts from the scheduled start (no coordinated omission), and at most
  // `concurrency` requests are outstanding: a start finding none free waits.
  double target_rate = 0;
  // Replay and mixed: keys in the preloaded pool. Contention: hot keys.
  int key_space = 10000;
  // Bytes of the result body sent with Complete.
  size_t snapshot_bytes = 256;
  double replay_fraction = 0.9;
  std::string tenant = "bench";
  // Fresh and contention keys use operation "<operation>"; the preloaded
  // replay pool uses "<operation>-replay" with keys "<key_prefix><i>".
  std::string operation = "bench";
  std::string key_prefix;
  absl::Duration rpc_timeout = absl::Seconds(10);
};

// What a run measured. Counts named "measured" cover completions inside the
// measurement window (after warmup); the others cover the whole run.
struct LoadResult {
  double measured_seconds = 0;
  int64_t requests = 0;        // measured, successful
  int64_t rpcs = 0;            // measured, every answered or failed call
  int64_t requests_total = 0;  // successful, warmup and drain included
  int64_t rpcs_total = 0;
  // From the (scheduled) start of a request to its last answer, in
  // microseconds; successful measured requests only.
  Histogram latency_us;
  // From the moment the first call was sent (differs only with a rate).
  Histogram service_us;
  // With a rate: how late the generator sent requests after their scheduled
  // start (large values mean every request slot was busy, or the generator
  // itself had no CPU).
  Histogram start_lag_us;
  // Failed calls by gRPC code name ("UNAVAILABLE"), and answers a scenario
  // does not expect by outcome name ("OUTCOME_MISMATCH"); whole run.
  std::map<std::string, int64_t> errors;
  // Begin outcomes by name; whole run.
  std::map<std::string, int64_t> outcomes;

  int64_t ErrorCount() const;
};

// Creates keys 0..key_space-1 of the replay pool (Begin + Complete, with
// `options.concurrency` outstanding); a key that already exists and is
// finished counts as created. Returns how many were created by this call.
absl::StatusOr<int64_t> Preload(const LoadOptions& options);

// Runs warmup then duration of `options.scenario` and drains the calls still
// outstanding. Fails only if the run could not start; call failures are
// counted in the result.
absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options);

// Polls grpc.health.v1.Health/Check for the overall status until SERVING;
// DEADLINE_EXCEEDED after `timeout`.
absl::Status WaitServing(const std::string& target, absl::Duration timeout);

}  // namespace idem::bench

#endif  // IDEM_BENCH_LOAD_H_
