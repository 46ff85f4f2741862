// Planted violations for the checker's self-test: a small clean history
// (which must pass) and variants of it that each break one guarantee (which
// the checker must report). Used by faults_checker_test and by
// `faults_runner --selftest` (the first line of every run.sh run).
#ifndef IDEM_TESTS_FAULTS_SELFTEST_H_
#define IDEM_TESTS_FAULTS_SELFTEST_H_

#include <string>
#include <vector>

#include "tests/faults/checker.h"
#include "tests/faults/history.h"

namespace idem::faults {

struct Planted {
  std::string name;
  // The violation kind the checker must report.
  std::string kind;
  std::vector<Op> history;
  FinalState final_state;
};

// A history without violations, and its final state.
Planted CleanCase();
// Each of these must be reported with its kind.
std::vector<Planted> PlantedCases();

// Runs every case; returns "" when the checker passed the clean case and
// reported every planted one, else what went wrong. Sets the counts.
std::string RunSelfTest(int* planted, int* detected);

}  // namespace idem::faults

#endif  // IDEM_TESTS_FAULTS_SELFTEST_H_
