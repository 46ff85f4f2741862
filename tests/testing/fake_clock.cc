#include "tests/testing/fake_clock.h"

#include <cstdlib>
#include <ctime>
#include <fstream>

#include "absl/time/time.h"

namespace idem::testing {

void SetWallClockOffset(const std::string& offset) {
  std::ofstream(std::getenv("FAKETIME_TIMESTAMP_FILE"), std::ios::trunc)
      << offset << "\n";
}

bool WallClockStepsWork() {
  if (std::getenv("FAKETIME_TIMESTAMP_FILE") == nullptr) return false;
  SetWallClockOffset("+0");
  const absl::Time before = absl::FromUnixSeconds(time(nullptr));
  SetWallClockOffset("+2h");
  const absl::Time after = absl::FromUnixSeconds(time(nullptr));
  SetWallClockOffset("+0");
  return after - before > absl::Minutes(119);
}

}  // namespace idem::testing
