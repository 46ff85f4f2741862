// idem-bench: a load generator for the idempotency sidecar (and for
// idem-bench-echo, the same RPC answered by a server that does nothing).
//
//   idem-bench --target 127.0.0.1:50051 --scenario fresh -c 64 --duration 10s
//   idem-bench --scenario replay-redis --key-space 10000 --json out.json
//   idem-bench --scenario fresh -c 64 --target-rate 500     # open loop
//   idem-bench --scenario replay --preload-only             # create the pool
//   idem-bench --ready-only --wait-ready 10s                # wait for SERVING
//
// Prints a table, then a last line "RESULT key=value ..." for scripts; with
// --json FILE also writes one JSON document. Exits 0 when the run took place
// (call failures are reported, not fatal) unless --fail-on-error is given.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/load.h"
#include "bench/report.h"

namespace idem::bench {
namespace {

struct Flags {
  std::string target = "127.0.0.1:50051";
  std::string scenario = "fresh";
  int concurrency = 8;
  int threads = 2;
  std::string duration = "10s";
  std::string warmup = "2s";
  double target_rate = 0;
  int key_space = 10000;
  size_t snapshot_bytes = 256;
  double replay_fraction = 0.9;
  std::string tenant = "bench";
  std::string operation = "bench";
  std::string key_prefix;
  bool no_preload = false;
  bool preload_only = false;
  std::string rpc_timeout = "10s";
  std::string wait_ready;
  std::string json;
  bool ready_only = false;
  bool fail_on_error = false;
};

int Fail(const std::string& message) {
  std::cerr << "idem-bench: " << message << "\n";
  return 2;
}

bool ParseDuration(const std::string& flag, const std::string& text,
                   absl::Duration* out, std::string* error) {
  if (absl::ParseDuration(text, out) && *out >= absl::ZeroDuration()) {
    return true;
  }
  *error = absl::StrCat("--", flag, ": bad duration \"", text,
                        "\" (e.g. 500ms, 10s, 1m)");
  return false;
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{
      "idem-bench: closed-loop (or fixed-rate) gRPC load generator for the "
      "idempotency sidecar and idem-bench-echo."};
  app.add_option("--target", f.target, "host:port of the server")
      ->capture_default_str();
  app.add_option("--scenario", f.scenario,
                 "fresh (Begin+Complete on new keys), replay | replay-redis | "
                 "replay-pg (Begin on finished keys), contention (many "
                 "clients on --key-space hot keys), mixed (--replay-fraction "
                 "replays, the rest fresh)")
      ->capture_default_str();
  app.add_option("-c,--concurrency", f.concurrency,
                 "requests outstanding at once")
      ->capture_default_str();
  app.add_option("--threads", f.threads,
                 "CompletionQueue threads, one channel (connection) each")
      ->capture_default_str();
  app.add_option("--duration", f.duration, "measured time")
      ->capture_default_str();
  app.add_option("--warmup", f.warmup, "time run before measuring")
      ->capture_default_str();
  app.add_option("--target-rate", f.target_rate,
                 "requests/s started on a Poisson schedule, like pgbench "
                 "--rate (0: closed loop); latency then counts from the "
                 "scheduled start")
      ->capture_default_str();
  app.add_option("--key-space", f.key_space,
                 "replay/mixed: keys in the preloaded pool; contention: hot "
                 "keys")
      ->capture_default_str();
  app.add_option("--snapshot-bytes", f.snapshot_bytes,
                 "result body size sent with Complete")
      ->capture_default_str();
  app.add_option("--replay-fraction", f.replay_fraction,
                 "mixed: the share of replays")
      ->capture_default_str();
  app.add_option("--tenant", f.tenant, "tenant of every key")
      ->capture_default_str();
  app.add_option("--operation", f.operation,
                 "operation of fresh keys; the replay pool uses "
                 "<operation>-replay, contention <operation>-contention")
      ->capture_default_str();
  app.add_option("--key-prefix", f.key_prefix,
                 "replay pool keys are <key-prefix><0..key-space-1>");
  app.add_flag("--no-preload", f.no_preload,
               "replay/mixed: the pool exists already (or the target is "
               "idem-bench-echo)");
  app.add_flag("--preload-only", f.preload_only,
               "create the replay pool and exit");
  app.add_option("--rpc-timeout", f.rpc_timeout, "deadline of each call")
      ->capture_default_str();
  app.add_option("--wait-ready", f.wait_ready,
                 "first wait up to this long for grpc.health.v1 SERVING");
  app.add_flag("--ready-only", f.ready_only,
               "only wait for --wait-ready (default 10s), then exit");
  app.add_option("--json", f.json, "also write the result as JSON here");
  app.add_flag("--fail-on-error", f.fail_on_error,
               "exit 1 if any call failed or got an unexpected outcome");
  CLI11_PARSE(app, argc, argv);

  LoadOptions o;
  absl::StatusOr<Scenario> scenario = ParseScenario(f.scenario);
  if (!scenario.ok()) return Fail(std::string(scenario.status().message()));
  o.target = f.target;
  o.scenario = *scenario;
  o.concurrency = f.concurrency;
  o.threads = f.threads;
  o.target_rate = f.target_rate;
  o.key_space = f.key_space;
  o.snapshot_bytes = f.snapshot_bytes;
  o.replay_fraction = f.replay_fraction;
  o.tenant = f.tenant;
  o.operation = f.operation;
  o.key_prefix = f.key_prefix;
  std::string error;
  if (!ParseDuration("duration", f.duration, &o.duration, &error) ||
      !ParseDuration("warmup", f.warmup, &o.warmup, &error) ||
      !ParseDuration("rpc-timeout", f.rpc_timeout, &o.rpc_timeout, &error)) {
    return Fail(error);
  }
  if (f.ready_only && f.wait_ready.empty()) f.wait_ready = "10s";
  if (!f.wait_ready.empty()) {
    absl::Duration wait;
    if (!ParseDuration("wait-ready", f.wait_ready, &wait, &error)) {
      return Fail(error);
    }
    absl::Status s = WaitServing(o.target, wait);
    if (!s.ok()) return Fail(std::string(s.message()));
    if (f.ready_only) return 0;
  }

  const bool needs_pool =
      o.scenario == Scenario::kReplay || o.scenario == Scenario::kMixed;
  if (f.preload_only || (needs_pool && !f.no_preload)) {
    const absl::Time start = absl::Now();
    absl::StatusOr<int64_t> created = Preload(o);
    if (!created.ok()) return Fail(std::string(created.status().message()));
    std::cerr << "preloaded " << o.key_space << " keys (" << *created
              << " new) in " << absl::FormatDuration(absl::Now() - start)
              << "\n";
    if (f.preload_only) return 0;
  }

  absl::StatusOr<LoadResult> result = RunLoad(o);
  if (!result.ok()) return Fail(std::string(result.status().message()));
  std::cout << FormatTable(f.scenario, o, *result);
  if (!f.json.empty()) {
    std::ofstream out(f.json);
    out << FormatJson(f.scenario, o, *result);
    out.close();
    if (!out) return Fail(absl::StrCat("--json: cannot write ", f.json));
  }
  std::cout << FormatSummaryLine(f.scenario, o, *result) << std::endl;
  if (f.fail_on_error && result->ErrorCount() > 0) return 1;
  return 0;
}

}  // namespace
}  // namespace idem::bench

int main(int argc, char** argv) {
  // As in the sidecar: Debian's Abseil has its deadlock detector on, which
  // costs every absl::Mutex (gRPC's too) more than the lock itself.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return idem::bench::Main(argc, argv);
}
