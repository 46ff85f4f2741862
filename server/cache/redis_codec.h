// How the Redis cache names and stores records (docs/spec.md#cache,
// docs/redis.md): the key format, and an authenticated envelope around the
// API's Record message. Pure functions; no I/O.
//
// A value is "IDC2" (4 bytes), the id of the key that signed it (4 bytes:
// the first bytes of SHA-256 of the key), the HMAC-SHA256 (32 bytes), then
// the payload: the record as a serialised idempotency.v1.Record, which
// carries its identity and fencing token. The MAC covers the magic, the key
// id, the value's Redis key (length-prefixed) and the payload, so a value
// is refused anywhere but under the key it was written for, and nobody
// without the key can write one the sidecar accepts.
#ifndef IDEM_SERVER_CACHE_REDIS_CODEC_H_
#define IDEM_SERVER_CACHE_REDIS_CODEC_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "statemachine/record.h"

namespace idem {

// Returns "idem:{<n>:<tenant><n>:<operation><n>:<key>}", each part preceded
// by its length in bytes, so distinct identities never share a key ("a:b" +
// "c" and "a" + "b:c" differ). The braces are a Redis Cluster hash tag: one
// record, one slot.
std::string CacheKey(const RecordKey& key);

// The keys that sign and verify cache values (HMAC-SHA256). Values are
// signed with the current key and verified with the key their id names:
// the current one or, while keys rotate, the previous one. Thread-safe.
class CacheMac {
  struct Key;

 public:
  // Least key material accepted, in bytes (HMAC-SHA256's block is 64, its
  // output 32).
  static constexpr size_t kMinKeySize = 32;
  static constexpr size_t kIdSize = 4;
  static constexpr size_t kSize = 32;

  // INVALID_ARGUMENT if a key is shorter than kMinKeySize, or `previous`
  // (optional: empty for none) has the id of `current`.
  static absl::StatusOr<std::shared_ptr<const CacheMac>> Create(
      absl::string_view current, absl::string_view previous = {});

  // Use Create (public for std::make_shared).
  explicit CacheMac(std::vector<std::unique_ptr<Key>> keys);
  ~CacheMac();
  CacheMac(const CacheMac&) = delete;
  CacheMac& operator=(const CacheMac&) = delete;

  // The id of the current key: the first kIdSize bytes of its SHA-256.
  const std::string& current_id() const;

  // Whether a key with `id` is held.
  bool Has(absl::string_view id) const;

  // The MAC of the concatenated `parts` by the key with `id`, which Has().
  std::string Sign(absl::string_view id,
                   const std::vector<absl::string_view>& parts) const;

 private:
  std::vector<std::unique_ptr<Key>> keys_;  // current first
};

// Returns true iff `record` may be cached: terminal and never changing again
// (SUCCEEDED, or FAILED and not retryable) with an expires_at.
bool Cacheable(const Record& record);

// Returns the envelope holding `record`, result included, signed by `mac`'s
// current key.
std::string EncodeCacheValue(const Record& record, const CacheMac& mac);

// Returns the envelope holding `payload` (meant to be a serialised Record)
// as `key`'s value, signed by `mac`'s current key: EncodeCacheValue's
// envelope, for any payload.
std::string SealCacheValue(const RecordKey& key, absl::string_view payload,
                           const CacheMac& mac);

// Returns the record in `value` if it is an envelope signed by one of
// `mac`'s keys for `key`, holding a cacheable record named `key`. Otherwise:
//   NOT_FOUND        signed by a key `mac` does not hold (e.g. one rotated
//                    out);
//   UNAUTHENTICATED  the MAC does not verify: forged, damaged, or another
//                    record's value copied under this key;
//   DATA_LOSS        anything else: not an envelope (an "IDC1" value of an
//                    older version), or a signed value whose record is
//                    unusable.
// attempt_id is not cached: it matters only while a record is PROCESSING.
absl::StatusOr<Record> DecodeCacheValue(const RecordKey& key,
                                        absl::string_view value,
                                        const CacheMac& mac);

// The idem_redis_fallback_total reason of a DecodeCacheValue refusal:
// "unknown_key", "forged" or "corrupt".
const char* CacheRefusalReason(const absl::Status& refusal);

// How long a cache entry for `record` may live: until its expires_at, by the
// store's clock `store_now` (the time the store read or wrote it), less
// `elapsed` (local time spent since before that store call), rounded down to
// whole milliseconds. nullopt when the record is not cacheable or less than a
// millisecond is left.
std::optional<absl::Duration> CacheTtl(const Record& record,
                                       absl::Time store_now,
                                       absl::Duration elapsed);

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_REDIS_CODEC_H_
