#include "tests/testing/files.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"

namespace idem::testing {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string ReadFileTail(const std::string& path, size_t max_bytes) {
  std::string content = ReadFile(path);
  if (content.size() <= max_bytes) return content;
  return absl::StrCat("...\n", content.substr(content.size() - max_bytes));
}

absl::StatusOr<std::string> MakeTempDir(const std::string& prefix) {
  std::string pattern = absl::StrCat("/tmp/", prefix, "XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("mkdtemp(", pattern, "): ", std::strerror(errno)));
  }
  return std::string(buf.data());
}

void RemoveTempDir(const std::string& dir) {
  if (dir.empty()) return;
  const char* keep = std::getenv("IDEM_KEEP_TEST_DIRS");
  if (keep != nullptr && keep[0] != '\0') {
    std::fprintf(stderr, "IDEM_KEEP_TEST_DIRS: leaving %s\n", dir.c_str());
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace idem::testing
