#include "server/base/snapshot_validation.h"

#include "absl/strings/str_cat.h"

namespace idem {
namespace {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

absl::Status CheckSnapshot(const ::idempotency::v1::Snapshot& snapshot,
                           const std::string& field, size_t max_bytes) {
  size_t size = snapshot.body().size() + snapshot.content_type().size();
  if (snapshot.content_type().find('\0') != std::string::npos) {
    return Invalid(field + ".content_type", "must not contain NUL");
  }
  for (const auto& [name, value] : snapshot.headers()) {
    if (name.empty() || name.find('\0') != std::string::npos ||
        value.find('\0') != std::string::npos) {
      return Invalid(field + ".headers",
                     "names must be non-empty; names and values must not "
                     "contain NUL");
    }
    size += name.size() + value.size();
  }
  if (size > max_bytes) {
    return Invalid(field, absl::StrCat("snapshot is ", size,
                                       " bytes; the limit is ", max_bytes));
  }
  return absl::OkStatus();
}

// libpqxx 6.4 would send a string with NUL cut at the first one.
absl::Status CheckText(const std::string& value, const std::string& field,
                       size_t max, bool required) {
  if ((required && value.empty()) || value.size() > max) {
    return Invalid(field, absl::StrCat(required ? "required, " : "", "at most ",
                                       max, " bytes"));
  }
  if (value.find('\0') != std::string::npos) {
    return Invalid(field, "must not contain NUL");
  }
  return absl::OkStatus();
}

}  // namespace idem
