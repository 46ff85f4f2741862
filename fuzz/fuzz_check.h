// Shared helpers of the fuzz targets: a checked property that stops the run
// (libFuzzer then saves the input as a crash) with a readable message.
#ifndef IDEM_FUZZ_FUZZ_CHECK_H_
#define IDEM_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

namespace idem {
namespace fuzz {

// Prints "property violated: <what>" and aborts.
[[noreturn]] inline void Violated(const std::string& what) {
  std::fprintf(stderr, "\n*** property violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace fuzz
}  // namespace idem

// Aborts with `what` (any expression convertible to std::string, evaluated
// only on failure) unless `cond` holds.
#define IDEM_FUZZ_CHECK(cond, what)                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      ::idem::fuzz::Violated(std::string(#cond) + ": " + std::string(what)); \
    }                                                                        \
  } while (false)

#endif  // IDEM_FUZZ_FUZZ_CHECK_H_
