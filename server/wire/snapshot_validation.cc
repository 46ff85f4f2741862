#include "server/wire/snapshot_validation.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace idem {
namespace {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// RFC 9110 section 5.6.2: tchar, the characters of a field name.
bool TokenChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
         (c >= 'a' && c <= 'z') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool GoodHeaderName(const std::string& name) {
  if (name.empty() || name.size() > kMaxHeaderNameBytes) return false;
  for (char c : name) {
    if (!TokenChar(c)) return false;
  }
  return true;
}

// CR and LF would split the replayed header line; PostgreSQL holds no NUL.
bool HasLineBreakOrNul(const std::string& s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos;
}

}  // namespace

absl::Status CheckSnapshot(const ::idempotency::v1::Snapshot& snapshot,
                           const std::string& field, size_t max_bytes) {
  const std::string& content_type = snapshot.content_type();
  if (content_type.size() > kMaxContentTypeBytes ||
      HasLineBreakOrNul(content_type)) {
    return Invalid(field + ".content_type",
                   absl::StrCat("at most ", kMaxContentTypeBytes,
                                " bytes without CR, LF or NUL"));
  }
  const size_t headers = snapshot.headers().size();
  if (headers > kMaxHeaders) {
    return Invalid(field + ".headers", absl::StrCat(headers,
                                                    " headers; the "
                                                    "limit is ",
                                                    kMaxHeaders));
  }
  size_t size = snapshot.body().size() + content_type.size();
  for (const auto& [name, value] : snapshot.headers()) {
    if (!GoodHeaderName(name)) {
      return Invalid(field + ".headers",
                     absl::StrCat("names must be 1-", kMaxHeaderNameBytes,
                                  " bytes of HTTP token characters"));
    }
    if (value.size() > kMaxHeaderValueBytes || HasLineBreakOrNul(value)) {
      return Invalid(
          field + ".headers",
          absl::StrCat("values must be at most ", kMaxHeaderValueBytes,
                       " bytes without CR, LF or NUL"));
    }
    size += name.size() + value.size();
  }
  if (size > max_bytes) {
    return Invalid(field, absl::StrCat("snapshot is ", size,
                                       " bytes; the limit is ", max_bytes));
  }
  return absl::OkStatus();
}

bool IsRecordName(const std::string& name) {
  return !name.empty() && name.size() <= 128 &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
                  c == '-';
         });
}

std::string ProbeReason(const std::string& verdict, const std::string& detail) {
  const std::string said = absl::StrCat("reconciler: probe said ", verdict,
                                        detail.empty() ? "" : ": ");
  // The longest prefix of the detail that fits and never ends inside a
  // UTF-8 character.
  size_t end = std::min(detail.size(), kMaxReasonBytes - said.size());
  if (end < detail.size()) {
    while (end > 0 &&
           (static_cast<unsigned char>(detail[end]) & 0xC0) == 0x80) {
      --end;
    }
  }
  return said + detail.substr(0, end);
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
