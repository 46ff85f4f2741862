// What the Redis cache reports, besides its store timings.
#ifndef IDEM_SERVER_CACHE_CACHE_METRICS_H_
#define IDEM_SERVER_CACHE_CACHE_METRICS_H_

#include <string>

#include "server/store/store_metrics.h"

namespace idem {

class CacheMetrics : public virtual StoreMetrics {
 public:
  // idem_redis_fallback_total{reason}: a lookup answered by PostgreSQL
  // because Redis could not ("timeout", "error", "breaker_open", ...).
  virtual void RedisFallback(const std::string& reason) = 0;
};

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_CACHE_METRICS_H_
