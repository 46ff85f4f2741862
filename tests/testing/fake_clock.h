// Steps this process's wall clock in tests that run under libfaketime
// (ctest preloads it and sets FAKETIME_TIMESTAMP_FILE; see
// tests/CMakeLists.txt): the steady clock stays the kernel's.
#ifndef IDEM_TESTS_TESTING_FAKE_CLOCK_H_
#define IDEM_TESTS_TESTING_FAKE_CLOCK_H_

#include <string>

namespace idem::testing {

// Sets libfaketime's wall-clock offset, e.g. "+0" or "+2h".
void SetWallClockOffset(const std::string& offset);

// Whether writing the offset file steps this process's wall clock: false
// when the binary runs without libfaketime (not through ctest).
bool WallClockStepsWork();

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_FAKE_CLOCK_H_
