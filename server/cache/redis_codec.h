// How the Redis cache names and stores records (docs/spec.md#cache): the key
// format, and a checksummed envelope around the API's Record message. Pure
// functions; no I/O.
//
// A value is "IDC1" (4 bytes), the CRC-32C of the payload (4 bytes, little
// endian), then the payload: the record as a serialised
// idempotency.v1.Record, which carries its identity and fencing token.
#ifndef IDEM_SERVER_CACHE_REDIS_CODEC_H_
#define IDEM_SERVER_CACHE_REDIS_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>

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

// Returns the CRC-32C (Castagnoli) of `data`.
uint32_t Crc32c(absl::string_view data);

// Returns true iff `record` may be cached: terminal and never changing again
// (SUCCEEDED, or FAILED and not retryable) with an expires_at.
bool Cacheable(const Record& record);

// Returns the envelope holding `record`, result included.
std::string EncodeCacheValue(const Record& record);

// Returns the record in `value` if it is a well-formed, intact envelope
// holding a cacheable record named `key`; DATA_LOSS otherwise (a corrupt
// value, or another record's value under this key). attempt_id is not
// cached: it matters only while a record is PROCESSING.
absl::StatusOr<Record> DecodeCacheValue(const RecordKey& key,
                                        absl::string_view value);

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
