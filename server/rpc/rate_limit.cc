#include "server/rpc/rate_limit.h"

#include <algorithm>

namespace idem {

bool TenantRateLimiter::Allow(const std::string& tenant, absl::Time now) {
  if (rate_ <= 0) return true;
  absl::MutexLock lock(&mu_);
  if (buckets_.size() > kMaxIdleBuckets) {
    // A full bucket is the same as no bucket: drop those.
    const absl::Duration refill = absl::Seconds(burst_ / rate_);
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      it = now - it->second.last >= refill ? buckets_.erase(it) : std::next(it);
    }
  }
  auto [it, inserted] = buckets_.try_emplace(tenant, Bucket{burst_, now});
  Bucket& b = it->second;
  if (!inserted) {
    const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - b.last));
    b.tokens = std::min(burst_, b.tokens + elapsed * rate_);
    b.last = now;
  }
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

}  // namespace idem
