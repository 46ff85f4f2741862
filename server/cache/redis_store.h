// The Redis cache of finished records (docs/spec.md#cache), as a RecordStore
// decorator. Never authoritative: every call but ReadCached is answered by
// the base store; Redis only saves PostgreSQL the replays of records that
// will not change any more, and losing it loses nothing.
#ifndef IDEM_SERVER_CACHE_REDIS_STORE_H_
#define IDEM_SERVER_CACHE_REDIS_STORE_H_

#include <functional>
#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/cache/cache_metrics.h"
#include "server/cache/redis_client.h"
#include "server/cache/redis_codec.h"
#include "server/store/store.h"

namespace idem {

// Over `base`, which must outlive the result. A cacheable record
// (redis_codec.h) is written to `redis`, signed by `mac`, after `base` returned
// it: from Read, or from an Apply that committed it (Complete, Fail, Resolve),
// with a TTL that ends no later than its expires_at. ReadCached and
// ReadCachedMany (one pipelined round trip on the caller's thread) answer from
// `redis` and count every lookup that falls through in
// idem_redis_fallback_total{reason}: miss, error, timeout, breaker_open, and
// for a value that is not used: forged (its MAC does not verify), unknown_key
// (signed by a key `mac` does not hold), corrupt (not an envelope, or an
// unusable record), no_ttl, expired (its expires_at has passed by `clock`).
// Those values are logged (at most once a second) and deleted from `redis` in
// one more round trip of the lookup. Forget deletes the purged keys from
// `redis`. Redis calls are timed in idem_store_duration_seconds{store="redis"}.
// `metrics` must outlive the result.
std::unique_ptr<RecordStore> NewRedisCacheStore(
    RecordStore* base, std::unique_ptr<RedisClient> redis,
    std::shared_ptr<const CacheMac> mac, CacheMetrics* metrics,
    std::function<absl::Time()> clock = [] { return absl::Now(); });

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_REDIS_STORE_H_
