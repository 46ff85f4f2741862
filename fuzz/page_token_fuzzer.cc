// List page tokens (server/rpc/page_token.h).
//
// Input: a listing (tenant, operation, status, older_than), then either an
// arbitrary token or a cursor to encode. Properties:
//   - DecodePageToken never crashes, and refuses with INVALID_ARGUMENT
//     "page_token: ...";
//   - a token that decodes re-encodes to one that decodes to the same cursor;
//   - EncodePageToken then DecodePageToken with the same listing gives the
//     cursor back (identities valid per docs/spec.md#validation, times in whole
//     microseconds);
//   - a token is refused for a listing with other filters.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_check.h"
#include "server/rpc/page_token.h"
#include "server/store/store.h"

namespace idem {
namespace {

// A valid tenant or operation: 1-128 of [A-Za-z0-9._:-], or empty when
// `optional` (a listing filter).
std::string Name(FuzzedDataProvider& in, bool optional) {
  static constexpr char kChars[] = "ABCXYZabcxyz0189._:-";
  const size_t n =
      in.ConsumeIntegralInRange<size_t>(optional ? 0 : 1, optional ? 12 : 128);
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kChars[in.ConsumeIntegralInRange<size_t>(0, sizeof(kChars) - 2)];
  }
  return s;
}

// A valid key: 1-255 bytes of visible ASCII.
std::string Key(FuzzedDataProvider& in) {
  const size_t n = in.ConsumeIntegralInRange<size_t>(1, 40);
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += static_cast<char>(in.ConsumeIntegralInRange<int>('!', '~'));
  }
  return s;
}

ListQuery Query(FuzzedDataProvider& in) {
  ListQuery q;
  q.tenant = Name(in, /*optional=*/true);
  q.operation = Name(in, /*optional=*/true);
  const int status = in.ConsumeIntegralInRange(0, 4);
  if (status > 0) q.status = static_cast<Status>(status - 1);
  q.older_than = absl::Microseconds(in.ConsumeIntegralInRange<int64_t>(
      0, int64_t{10} * 366 * 86400 * 1000000));
  q.limit = in.ConsumeIntegralInRange(1, 1000);
  return q;
}

bool SameCursor(const ListCursor& a, const ListCursor& b) {
  return a.updated_at == b.updated_at && a.key == b.key;
}

bool SameFilters(const ListQuery& a, const ListQuery& b) {
  return a.tenant == b.tenant && a.operation == b.operation &&
         a.status == b.status &&
         absl::ToInt64Microseconds(a.older_than) ==
             absl::ToInt64Microseconds(b.older_than);
}

void CheckRefusal(const absl::Status& s) {
  IDEM_FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument &&
                      s.message().rfind("page_token: ", 0) == 0,
                  "refused with " + s.ToString());
}

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace idem;  // NOLINT(build/namespaces)
  FuzzedDataProvider in(data, size);
  const ListQuery query = Query(in);
  if (in.ConsumeBool()) {
    // An arbitrary token.
    const std::string token = in.ConsumeRemainingBytesAsString();
    absl::StatusOr<ListCursor> cursor = DecodePageToken(token, query);
    if (!cursor.ok()) {
      CheckRefusal(cursor.status());
      return 0;
    }
    absl::StatusOr<ListCursor> again =
        DecodePageToken(EncodePageToken(query, *cursor), query);
    IDEM_FUZZ_CHECK(again.ok() && SameCursor(*again, *cursor),
                    "a decoded token does not survive a round trip");
    return 0;
  }
  // A cursor at a valid record, encoded, then decoded.
  ListCursor after;
  after.key = RecordKey{Name(in, false), Name(in, false), Key(in)};
  after.updated_at = absl::FromUnixMicros(in.ConsumeIntegralInRange<int64_t>(
      -int64_t{62135596800} * 1000000, int64_t{253402300799} * 1000000));
  const std::string token = EncodePageToken(query, after);
  absl::StatusOr<ListCursor> back = DecodePageToken(token, query);
  IDEM_FUZZ_CHECK(back.ok(), "own token refused: " + back.status().ToString());
  IDEM_FUZZ_CHECK(SameCursor(*back, after),
                  absl::StrCat("cursor changed by a round trip: ",
                               back->key.key, " vs ", after.key.key));
  // Another listing must not accept it.
  const ListQuery other = Query(in);
  absl::StatusOr<ListCursor> elsewhere = DecodePageToken(token, other);
  if (SameFilters(query, other)) {
    IDEM_FUZZ_CHECK(elsewhere.ok(), "token refused by the same filters");
  } else {
    IDEM_FUZZ_CHECK(!elsewhere.ok(), "token accepted by other filters");
    CheckRefusal(elsewhere.status());
  }
  return 0;
}
