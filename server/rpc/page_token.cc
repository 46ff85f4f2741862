#include "server/rpc/page_token.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace idem {
namespace {

constexpr char kVersion[] = "v1";
constexpr char kHistoryVersion[] = "h1";

// The filters, so that a token is refused for another listing. Tenants,
// operations and keys never contain a newline (validation).
std::string Filters(const ListQuery& q) {
  return absl::StrCat(q.tenant, "|", q.operation, "|",
                      q.status ? StatusName(*q.status) : "", "|",
                      absl::ToInt64Microseconds(q.older_than));
}

absl::Status Bad() {
  return absl::InvalidArgumentError(
      "page_token: not a token from a listing with these filters");
}

}  // namespace

std::string EncodePageToken(const ListQuery& query, const ListCursor& after) {
  return absl::WebSafeBase64Escape(
      absl::StrCat(kVersion, "\n", Filters(query), "\n",
                   absl::ToUnixMicros(after.updated_at), "\n", after.key.tenant,
                   "\n", after.key.operation, "\n", after.key.key));
}

absl::StatusOr<ListCursor> DecodePageToken(const std::string& token,
                                           const ListQuery& query) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return Bad();
  std::vector<std::string> parts = absl::StrSplit(raw, '\n');
  int64_t micros = 0;
  if (parts.size() != 6 || parts[0] != kVersion || parts[1] != Filters(query) ||
      !absl::SimpleAtoi(parts[2], &micros)) {
    return Bad();
  }
  ListCursor cursor;
  cursor.updated_at = absl::FromUnixMicros(micros);
  cursor.key = RecordKey{parts[3], parts[4], parts[5]};
  return cursor;
}

std::string EncodeHistoryToken(const RecordKey& key, int64_t after_id) {
  return absl::WebSafeBase64Escape(absl::StrCat(kHistoryVersion, "\n",
                                                key.tenant, "\n", key.operation,
                                                "\n", key.key, "\n", after_id));
}

absl::StatusOr<int64_t> DecodeHistoryToken(const std::string& token,
                                           const RecordKey& key) {
  std::string raw;
  std::vector<std::string> parts;
  if (absl::WebSafeBase64Unescape(token, &raw)) {
    parts = absl::StrSplit(raw, '\n');
  }
  int64_t after_id = 0;
  if (parts.size() != 5 || parts[0] != kHistoryVersion ||
      parts[1] != key.tenant || parts[2] != key.operation ||
      parts[3] != key.key || !absl::SimpleAtoi(parts[4], &after_id) ||
      after_id < 1) {
    return absl::InvalidArgumentError(
        "page_token: not a token from a History of this record");
  }
  return after_id;
}

}  // namespace idem
