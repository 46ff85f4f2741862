// faults_runner: runs one fault scenario (tests/faults/run.sh runs them
// all), the checker's self-test, or the holder process of the paused-holder
// scenario.
//
//   faults_runner --scenario=NAME [--seed=N] [--duration=SECONDS]
//                 [--workers=N] [--artifacts=DIR] [--verbose]
//                 [--sidecar=PATH] [--sidecar-arg=ARG]...
//   faults_runner --selftest
//   faults_runner --list
//
// Prints one line "scenario NAME seed=N: ops=... faults=... violations=V
// lost=L ... PASS|FAIL" and exits 0 iff the scenario passed; a scenario
// that needs Citus where it is not installed (outside CI), or pg-failover
// with IDEM_TEST_CITUS=1, prints "... skipped: WHY SKIP" and exits 77. With
// --artifacts, a failing scenario leaves its history, fault log, violations
// and server logs in DIR/NAME-SEED/.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/faults/scenarios.h"
#include "tests/faults/selftest.h"
#include "tests/faults/workload.h"

namespace {

// The exit status of a skipped scenario (CTest's SKIP_RETURN_CODE).
constexpr int kSkipped = 77;

using ::idem::faults::ScenarioConfig;
using ::idem::faults::ScenarioResult;

bool Flag(const std::string& arg, const std::string& name, std::string* out) {
  const std::string prefix = "--" + name + "=";
  if (!absl::StartsWith(arg, prefix)) return false;
  *out = arg.substr(prefix.size());
  return true;
}

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "faults_runner: %s\nusage: faults_runner --scenario=NAME "
               "[--seed=N] [--duration=SECONDS] [--workers=N] "
               "[--artifacts=DIR] [--verbose] | --selftest | --list\n",
               why.c_str());
  return 2;
}

std::string SelfPath(const char* argv0) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return argv0;
  return std::string(buf, n);
}

int RunSelfTest() {
  int planted = 0;
  int detected = 0;
  std::string problems = idem::faults::RunSelfTest(&planted, &detected);
  std::printf(
      "scenario checker-selftest: planted=%d detected=%d clean_history=%s "
      "%s\n",
      planted, detected,
      problems.find("clean history") == std::string::npos ? "ok" : "violations",
      problems.empty() ? "PASS" : "FAIL");
  if (!problems.empty()) std::fputs(problems.c_str(), stdout);
  return problems.empty() ? 0 : 1;
}

int RunHolderMode(const std::vector<std::string>& args) {
  idem::faults::HolderOptions o;
  for (const std::string& arg : args) {
    std::string v;
    if (Flag(arg, "addresses", &v)) {
      o.addresses = absl::StrSplit(v, ',');
    } else if (Flag(arg, "conninfo", &v)) {
      o.conninfo = v;
    } else if (Flag(arg, "out", &v)) {
      o.out_path = v;
    } else if (Flag(arg, "keys", &v)) {
      if (!absl::SimpleAtoi(v, &o.keys)) return Usage("bad --keys");
    } else if (Flag(arg, "lease-ms", &v)) {
      if (!absl::SimpleAtoi(v, &o.lease_ms)) return Usage("bad --lease-ms");
    } else if (Flag(arg, "seed", &v)) {
      if (!absl::SimpleAtoi(v, &o.seed)) return Usage("bad --seed");
    } else if (arg != "--holder") {
      return Usage("unknown holder flag " + arg);
    }
  }
  if (o.addresses.empty() || o.conninfo.empty() || o.out_path.empty()) {
    return Usage("--holder needs --addresses, --conninfo and --out");
  }
  return idem::faults::RunHolder(o);
}

}  // namespace

// SIGINT/SIGTERM: the first one ends the scenario early and cleanly (its
// PostgreSQL, Redis and sidecars are torn down); a second one exits at once.
void HandleSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "faults_runner: signal %d, stopping\n", sig);
    idem::faults::RequestAbort();
    sigwait(&set, &sig);
    _exit(128 + sig);
  }).detach();
}

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--holder") return RunHolderMode(args);
    if (arg == "--selftest") return RunSelfTest();
    if (arg == "--list") {
      for (const std::string& name : idem::faults::ScenarioNames()) {
        std::printf("%-14s %s\n", name.c_str(),
                    idem::faults::ScenarioDescription(name).c_str());
      }
      return 0;
    }
  }
  ScenarioConfig config;
  config.sidecar_path = IDEM_SIDECAR_PATH;
  config.self_path = SelfPath(argv[0]);
  config.seed =
      static_cast<uint64_t>(absl::ToUnixMicros(absl::Now())) % 1000000;
  for (const std::string& arg : args) {
    std::string v;
    int64_t n = 0;
    if (Flag(arg, "scenario", &v)) {
      config.name = v;
    } else if (Flag(arg, "seed", &v)) {
      if (!absl::SimpleAtoi(v, &config.seed)) return Usage("bad --seed");
    } else if (Flag(arg, "duration", &v)) {
      if (!absl::SimpleAtoi(v, &n) || n <= 0) return Usage("bad --duration");
      config.duration = absl::Seconds(n);
    } else if (Flag(arg, "workers", &v)) {
      if (!absl::SimpleAtoi(v, &config.workers) || config.workers <= 0) {
        return Usage("bad --workers");
      }
    } else if (Flag(arg, "artifacts", &v)) {
      config.artifacts_dir = v;
    } else if (Flag(arg, "sidecar", &v)) {
      config.sidecar_path = v;
    } else if (Flag(arg, "sidecar-arg", &v)) {
      config.sidecar_args.push_back(v);
    } else if (arg == "--verbose") {
      config.verbose = true;
    } else {
      return Usage("unknown flag " + arg);
    }
  }
  if (config.name.empty()) return Usage("--scenario is required");
  HandleSignals();
  if (idem::faults::ScenarioDescription(config.name).empty()) {
    return Usage("unknown scenario " + config.name);
  }
  ScenarioResult result = idem::faults::RunScenario(config);
  if (config.verbose) {
    for (const std::string& line : result.fault_log) {
      std::printf("  fault %s\n", line.c_str());
    }
  }
  if (!result.report.violations.empty()) {
    std::map<std::string, int> by_kind;
    for (const idem::faults::Violation& v : result.report.violations) {
      ++by_kind[v.kind];
    }
    std::string kinds;
    for (const auto& [kind, n] : by_kind) {
      kinds += " " + kind + "=" + std::to_string(n);
    }
    std::printf("  violations by kind:%s\n", kinds.c_str());
  }
  int shown = 0;
  for (const idem::faults::Violation& v : result.report.violations) {
    if (++shown > 20) {
      std::printf("  ... %zu violations in all\n",
                  result.report.violations.size());
      break;
    }
    std::printf("  VIOLATION %s %s: %s\n", v.kind.c_str(), v.key.c_str(),
                v.detail.c_str());
  }
  if (!result.passed() && !config.artifacts_dir.empty()) {
    std::printf("  artifacts: %s/%s-%llu/\n", config.artifacts_dir.c_str(),
                config.name.c_str(),
                static_cast<unsigned long long>(config.seed));
  }
  std::printf("%s\n", idem::faults::SummaryLine(result).c_str());
  std::fflush(stdout);
  if (!result.skipped.empty()) return kSkipped;
  return result.passed() ? 0 : 1;
}
