// The Redis cache envelope (server/cache/redis_codec.h): "IDC1", CRC-32C,
// record.
//
// Input: a mode byte, then:
//   0  a key and an arbitrary value;
//   1  a key and a payload, wrapped in an envelope with the right checksum
//      (so that the record checks behind the checksum are reached);
//   2  a cacheable record, encoded, then 1-3 bits flipped anywhere;
//   3  a cacheable record encoded under one key and read under another.
// Properties:
//   - DecodeCacheValue never crashes, and refuses with DATA_LOSS;
//   - an accepted value carries the magic and the checksum of its payload,
//     holds the record named by the key asked for, with a fencing token,
//     terminal and cacheable; re-encoding it is stable;
//   - CRC-32C detects every 1-3 bit error, so a flipped value is refused;
//   - a value is never accepted under another key, even one whose cache key
//     is the same ("a:b" + "c" vs "a" + "b:c");
//   - CacheTtl of an accepted record is at least 1 ms and never outlives
//     expires_at.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"
#include "server/cache/redis_codec.h"

namespace idem {
namespace {

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

uint32_t StoredCrc(const std::string& value) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(value[4 + i]))
         << (8 * i);
  }
  return v;
}

std::string Envelope(const std::string& payload) {
  std::string out = "IDC1";
  const uint32_t crc = Crc32c(payload);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(crc >> (8 * i)));
  return out + payload;
}

// Checks an accepted value; returns nothing on a refusal.
void CheckDecoded(const RecordKey& key, const std::string& value,
                  const absl::StatusOr<Record>& r, absl::Time store_now,
                  absl::Duration elapsed) {
  if (!r.ok()) {
    IDEM_FUZZ_CHECK(r.status().code() == absl::StatusCode::kDataLoss,
                    "refused with " + r.status().ToString());
    return;
  }
  IDEM_FUZZ_CHECK(value.size() >= 8 && value.compare(0, 4, "IDC1") == 0,
                  "accepted without the magic");
  IDEM_FUZZ_CHECK(StoredCrc(value) == Crc32c(value.substr(8)),
                  "accepted with a wrong checksum");
  IDEM_FUZZ_CHECK(r->key == key, "accepted another record's value");
  IDEM_FUZZ_CHECK(r->fencing_token >= 1, "accepted without a token");
  IDEM_FUZZ_CHECK(Cacheable(*r) && r->result.has_value() && !r->tombstone,
                  "accepted a record that may still change");
  IDEM_FUZZ_CHECK(r->attempt_id.empty(), "attempt_id came from the cache");
  // Times are kept in microseconds: one round trip normalises them.
  absl::StatusOr<Record> once = DecodeCacheValue(key, EncodeCacheValue(*r));
  IDEM_FUZZ_CHECK(once.ok(),
                  "re-encoded value refused: " + once.status().ToString());
  absl::StatusOr<Record> twice = DecodeCacheValue(key, EncodeCacheValue(*once));
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

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace idem;  // NOLINT(build/namespaces)
  FuzzedDataProvider in(data, size);
  const int mode = in.ConsumeIntegralInRange(0, 3);
  const absl::Time store_now = SomeTime(in);
  const absl::Duration elapsed =
      absl::Milliseconds(in.ConsumeIntegralInRange(0, 10000));
  const RecordKey key = Key(in);
  switch (mode) {
    case 0: {
      const std::string value = in.ConsumeRemainingBytesAsString();
      CheckDecoded(key, value, DecodeCacheValue(key, value), store_now,
                   elapsed);
      break;
    }
    case 1: {
      const std::string value = Envelope(in.ConsumeRemainingBytesAsString());
      CheckDecoded(key, value, DecodeCacheValue(key, value), store_now,
                   elapsed);
      break;
    }
    case 2: {
      const Record record = CacheableRecord(in, key);
      std::string value = EncodeCacheValue(record);
      absl::StatusOr<Record> intact = DecodeCacheValue(key, value);
      IDEM_FUZZ_CHECK(intact.ok(), "a cacheable record's value refused: " +
                                       intact.status().ToString());
      CheckDecoded(key, value, intact, store_now, elapsed);
      const int flips = in.ConsumeIntegralInRange(1, 3);
      const std::string original = value;
      for (int i = 0; i < flips; ++i) {
        const size_t bit =
            in.ConsumeIntegralInRange<size_t>(0, value.size() * 8 - 1);
        value[bit / 8] = static_cast<char>(value[bit / 8] ^ (1 << (bit % 8)));
      }
      if (value == original) break;  // two flips of one bit
      absl::StatusOr<Record> flipped = DecodeCacheValue(key, value);
      IDEM_FUZZ_CHECK(!flipped.ok(), "a value with flipped bits accepted");
      CheckDecoded(key, value, flipped, store_now, elapsed);
      break;
    }
    default: {
      const Record record = CacheableRecord(in, key);
      const std::string value = EncodeCacheValue(record);
      const RecordKey other = Key(in);
      absl::StatusOr<Record> r = DecodeCacheValue(other, value);
      IDEM_FUZZ_CHECK(r.ok() == (other == key),
                      "a value read under another key, or refused under "
                      "its own");
      CheckDecoded(other, value, r, store_now, elapsed);
      break;
    }
  }
  return 0;
}
