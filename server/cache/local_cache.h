// An in-process cache of finished records in front of the store (and of the
// Redis cache, when there is one), as a RecordStore decorator. Replays of a key
// this instance saw recently (a client retrying, a retry storm) then cost no
// round trip at all. Safe for the same reason the Redis cache is: it holds
// only records that will not change any more (SUCCEEDED, FAILED not
// retryable, with their result), each no longer than its expires_at by the
// store's clock (measured as a duration on this process's steady clock, so a
// skewed or jumping wall clock changes nothing), and never decides
// ownership.
#ifndef IDEM_SERVER_CACHE_LOCAL_CACHE_H_
#define IDEM_SERVER_CACHE_LOCAL_CACHE_H_

#include <cstddef>
#include <memory>

#include "absl/time/time.h"
#include "server/store/store.h"

namespace idem {

struct LocalCacheOptions {
  // Bytes of records kept (keys, results and bookkeeping, roughly); the
  // least recently used go first. 0 turns the cache off.
  size_t max_bytes = 32 << 20;
  // Longest an entry is served, whatever its expires_at.
  absl::Duration max_ttl = absl::Minutes(1);
};

// Over `base`, which must outlive the result. Fills from records `base`
// returns (Read, InsertOrRead, an Apply that committed a finished record)
// and from its ReadCached hits (Redis); answers ReadCached itself when it
// can (source "memory"); drops purged keys (Forget). Returns null when
// options.max_bytes is 0: no cache, `base` serves alone.
std::unique_ptr<RecordStore> NewLocalCacheStore(RecordStore* base,
                                                LocalCacheOptions options);

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_LOCAL_CACHE_H_
