#ifndef IDEM_TESTS_TESTING_FILES_H_
#define IDEM_TESTS_TESTING_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace idem::testing {

// Returns the whole content of the file at `path`, or "" if it cannot be read
// (meant for showing logs in failure messages).
std::string ReadFile(const std::string& path);

// Returns the last `max_bytes` bytes of the file at `path` (all of it when
// shorter), prefixed with "...\n" when cut; "" if it cannot be read.
std::string ReadFileTail(const std::string& path, size_t max_bytes = 16384);

// Creates a fresh directory /tmp/<prefix>XXXXXX (mode 0700, owned by the
// caller) and returns its absolute path.
absl::StatusOr<std::string> MakeTempDir(const std::string& prefix);

// Removes `dir` recursively, unless the environment variable
// IDEM_KEEP_TEST_DIRS is set to a non-empty value (then it only says where the
// directory was left, on stderr). Errors are ignored.
void RemoveTempDir(const std::string& dir);

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_FILES_H_
