// The Redis cache envelope (server/cache/redis_codec.h): "IDC2", key id,
// HMAC-SHA256, record; signed with a fixed key.
//
// Input: a mode byte, then:
//   0  a key and an arbitrary value;
//   1  a key and a payload, sealed in an envelope with the right MAC (so
//      that the record checks behind the MAC are reached);
//   2  a cacheable record, encoded, then 1-3 bits flipped anywhere;
//   3  a cacheable record encoded under one key and read under another;
//   4  a cacheable record, encoded, then a slice of it replaced by
//      arbitrary bytes (a truncation, an insertion, an overwrite).
// Properties:
//   - DecodeCacheValue never crashes, and refuses with DATA_LOSS, NOT_FOUND
//     or UNAUTHENTICATED;
//   - an accepted value carries the magic, the current key's id and a MAC
//     that re-sealing its payload reproduces; it holds the record named by
//     the key asked for, with a fencing token, terminal and cacheable;
//     re-encoding it is stable;
//   - an encoded value round-trips, and is also accepted while keys rotate
//     (as the previous key) but not once its key is dropped;
//   - any change to an encoded value is refused;
//   - a value is never accepted under another key, not even one whose parts
//     join alike ("a:b" + "c" vs "a" + "b:c");
//   - CacheTtl of an accepted record is at least 1 ms and never outlives
//     expires_at.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"
#include "server/cache/redis_codec.h"

namespace idem {
namespace {

// The fuzzer's keys (fuzz/make_seeds_main.cc signs its seeds with kKey).
const std::string kKey(32, 'F');
const std::string kNextKey(40, 'N');

const CacheMac& Mac() {
  static const auto* mac =
      new std::shared_ptr<const CacheMac>(*CacheMac::Create(kKey));
  return **mac;
}
// kNextKey current, kKey previous: the middle of a rotation.
const CacheMac& Rotating() {
  static const auto* mac =
      new std::shared_ptr<const CacheMac>(*CacheMac::Create(kNextKey, kKey));
  return **mac;
}
// kKey dropped.
const CacheMac& Rotated() {
  static const auto* mac =
      new std::shared_ptr<const CacheMac>(*CacheMac::Create(kNextKey));
  return **mac;
}

// Printable ASCII: the API's string fields are UTF-8 (proto3 refuses
// anything else on the wire, so nothing else reaches a record).
std::string Text(FuzzedDataProvider& in, size_t max) {
  std::string s = in.ConsumeRandomLengthString(max);
  for (char& c : s) c = static_cast<char>(' ' + (c & 0x7f) % 95);
  return s;
}

RecordKey Key(FuzzedDataProvider& in) {
  RecordKey k;
  k.tenant = Text(in, 12);
  k.operation = Text(in, 12);
  k.key = Text(in, 24);
  return k;
}

absl::Time SomeTime(FuzzedDataProvider& in) {
  return absl::FromUnixMicros(
      in.ConsumeIntegralInRange<int64_t>(0, int64_t{253402300799} * 1000000));
}

// A record Cacheable() accepts.
Record CacheableRecord(FuzzedDataProvider& in, const RecordKey& key) {
  Record r;
  r.key = key;
  r.status = in.ConsumeBool() ? Status::kSucceeded : Status::kFailed;
  r.request_hash = in.ConsumeRandomLengthString(64);
  r.fencing_token = in.ConsumeIntegralInRange<int64_t>(1, INT64_MAX);
  r.attempt = in.ConsumeIntegral<int32_t>();
  r.lease_expires_at = SomeTime(in);
  Snapshot s;
  s.code = in.ConsumeIntegral<int32_t>();
  s.body = in.ConsumeRandomLengthString(64);
  s.content_type = Text(in, 16);
  if (in.ConsumeBool()) s.headers["x-h"] = Text(in, 8);
  r.result = s;
  r.created_at = SomeTime(in);
  r.updated_at = SomeTime(in);
  r.expires_at = SomeTime(in);
  r.resolved_by = Text(in, 8);
  r.resolve_reason = Text(in, 8);
  return r;
}

bool SameRecord(const Record& a, const Record& b) {
  return a.key == b.key && a.status == b.status &&
         a.request_hash == b.request_hash &&
         a.fencing_token == b.fencing_token && a.attempt == b.attempt &&
         a.lease_expires_at == b.lease_expires_at && a.result == b.result &&
         a.retryable == b.retryable && a.created_at == b.created_at &&
         a.updated_at == b.updated_at && a.expires_at == b.expires_at &&
         a.resolved_by == b.resolved_by && a.resolve_reason == b.resolve_reason;
}

// Checks an accepted value; returns nothing on a refusal.
void CheckDecoded(const RecordKey& key, const std::string& value,
                  const absl::StatusOr<Record>& r, absl::Time store_now,
                  absl::Duration elapsed) {
  if (!r.ok()) {
    const absl::StatusCode code = r.status().code();
    IDEM_FUZZ_CHECK(code == absl::StatusCode::kDataLoss ||
                        code == absl::StatusCode::kNotFound ||
                        code == absl::StatusCode::kUnauthenticated,
                    "refused with " + r.status().ToString());
    return;
  }
  IDEM_FUZZ_CHECK(value.size() >= 40 && value.compare(0, 4, "IDC2") == 0,
                  "accepted without the magic");
  IDEM_FUZZ_CHECK(value.substr(4, 4) == Mac().current_id(),
                  "accepted without the key's id");
  IDEM_FUZZ_CHECK(SealCacheValue(key, value.substr(40), Mac()) == value,
                  "accepted with a wrong MAC");
  IDEM_FUZZ_CHECK(r->key == key, "accepted another record's value");
  IDEM_FUZZ_CHECK(r->fencing_token >= 1, "accepted without a token");
  IDEM_FUZZ_CHECK(Cacheable(*r) && r->result.has_value() && !r->tombstone,
                  "accepted a record that may still change");
  IDEM_FUZZ_CHECK(r->attempt_id.empty(), "attempt_id came from the cache");
  // Times are kept in microseconds: one round trip normalises them.
  absl::StatusOr<Record> once =
      DecodeCacheValue(key, EncodeCacheValue(*r, Mac()), Mac());
  IDEM_FUZZ_CHECK(once.ok(),
                  "re-encoded value refused: " + once.status().ToString());
  absl::StatusOr<Record> twice =
      DecodeCacheValue(key, EncodeCacheValue(*once, Mac()), Mac());
  IDEM_FUZZ_CHECK(twice.ok() && SameRecord(*once, *twice),
                  "encoding is not stable");
  std::optional<absl::Duration> ttl = CacheTtl(*r, store_now, elapsed);
  if (ttl) {
    IDEM_FUZZ_CHECK(*ttl >= absl::Milliseconds(1) &&
                        store_now + elapsed + *ttl <= *r->expires_at,
                    absl::StrCat("ttl ", absl::FormatDuration(*ttl),
                                 " outlives expires_at"));
  }
}

// Checks that every change to the `original` encoding of a record is
// refused.
void CheckChanged(const RecordKey& key, const std::string& original,
                  const std::string& value, absl::Time store_now,
                  absl::Duration elapsed) {
  if (value == original) return;
  absl::StatusOr<Record> changed = DecodeCacheValue(key, value, Mac());
  IDEM_FUZZ_CHECK(!changed.ok(), "a changed value accepted");
  CheckDecoded(key, value, changed, store_now, elapsed);
}

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace idem;  // NOLINT(build/namespaces)
  FuzzedDataProvider in(data, size);
  const int mode = in.ConsumeIntegralInRange(0, 4);
  const absl::Time store_now = SomeTime(in);
  const absl::Duration elapsed =
      absl::Milliseconds(in.ConsumeIntegralInRange(0, 10000));
  const RecordKey key = Key(in);
  switch (mode) {
    case 0: {
      const std::string value = in.ConsumeRemainingBytesAsString();
      CheckDecoded(key, value, DecodeCacheValue(key, value, Mac()), store_now,
                   elapsed);
      break;
    }
    case 1: {
      const std::string value =
          SealCacheValue(key, in.ConsumeRemainingBytesAsString(), Mac());
      CheckDecoded(key, value, DecodeCacheValue(key, value, Mac()), store_now,
                   elapsed);
      break;
    }
    case 2:
    case 4: {
      const Record record = CacheableRecord(in, key);
      const std::string original = EncodeCacheValue(record, Mac());
      absl::StatusOr<Record> intact = DecodeCacheValue(key, original, Mac());
      IDEM_FUZZ_CHECK(intact.ok(), "a cacheable record's value refused: " +
                                       intact.status().ToString());
      CheckDecoded(key, original, intact, store_now, elapsed);
      IDEM_FUZZ_CHECK(DecodeCacheValue(key, original, Rotating()).ok(),
                      "refused under the previous key while rotating");
      IDEM_FUZZ_CHECK(
          DecodeCacheValue(key, original, Rotated()).status().code() ==
              absl::StatusCode::kNotFound,
          "accepted after its key was dropped");
      std::string value = original;
      if (mode == 2) {
        const int flips = in.ConsumeIntegralInRange(1, 3);
        for (int i = 0; i < flips; ++i) {
          const size_t bit =
              in.ConsumeIntegralInRange<size_t>(0, value.size() * 8 - 1);
          value[bit / 8] = static_cast<char>(value[bit / 8] ^ (1 << (bit % 8)));
        }
      } else {
        const size_t at = in.ConsumeIntegralInRange<size_t>(0, value.size());
        const size_t cut =
            in.ConsumeIntegralInRange<size_t>(0, value.size() - at);
        value.replace(at, cut, in.ConsumeRemainingBytesAsString());
      }
      CheckChanged(key, original, value, store_now, elapsed);
      break;
    }
    default: {
      const Record record = CacheableRecord(in, key);
      const std::string value = EncodeCacheValue(record, Mac());
      const RecordKey other = Key(in);
      absl::StatusOr<Record> r = DecodeCacheValue(other, value, Mac());
      IDEM_FUZZ_CHECK(r.ok() == (other == key),
                      "a value read under another key, or refused under "
                      "its own");
      CheckDecoded(other, value, r, store_now, elapsed);
      break;
    }
  }
  return 0;
}
