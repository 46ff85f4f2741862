// The fault scenarios: each starts its own cluster (PostgreSQL, Redis, three
// sidecars, fault proxies), runs the workload while a nemesis injects its
// faults on a schedule drawn from the seed, heals everything, scans the
// final state and checks the history.
#ifndef IDEM_TESTS_FAULTS_SCENARIOS_H_
#define IDEM_TESTS_FAULTS_SCENARIOS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/faults/checker.h"

namespace idem::faults {

struct ScenarioConfig {
  std::string name;
  uint64_t seed = 1;
  // How long the workload runs under faults.
  absl::Duration duration = absl::Seconds(15);
  int workers = 10;
  std::string sidecar_path;
  // Extra sidecar arguments (see ClusterOptions::extra_args).
  std::vector<std::string> sidecar_args;
  // This program (the paused-holder scenario runs it with --holder).
  std::string self_path;
  // Where a failing scenario leaves its history, fault log and server logs.
  std::string artifacts_dir;
  bool verbose = false;
};

struct ScenarioResult {
  std::string name;
  uint64_t seed = 0;
  // Set when the scenario could not run (setup or healing failed).
  std::string error;
  // Set (why) when the scenario did not run: it needs Citus and Citus is
  // not installed, outside CI (testing::CitusRequired()), or it has no
  // meaning on Citus (IDEM_TEST_CITUS=1).
  std::string skipped;
  Report report;
  int64_t faults = 0;
  absl::Duration elapsed;
  std::vector<std::string> fault_log;
  bool passed() const { return error.empty() && report.ok(); }
};

// The scenario names, in run order.
std::vector<std::string> ScenarioNames();
// A one-line description of each.
std::string ScenarioDescription(const std::string& name);

ScenarioResult RunScenario(const ScenarioConfig& config);

// Makes a running scenario stop injecting faults and finish early (its
// cluster is still healed, scanned and torn down); for SIGINT/SIGTERM.
// Async-signal-safe.
void RequestAbort();
bool AbortRequested();

// "scenario NAME seed=S: ops=... faults=... violations=V lost=L ... PASS",
// or "scenario NAME seed=S: skipped: WHY SKIP".
std::string SummaryLine(const ScenarioResult& result);

}  // namespace idem::faults

#endif  // IDEM_TESTS_FAULTS_SCENARIOS_H_
