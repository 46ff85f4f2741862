#include "server/rpc/rate_limit.h"

#include <algorithm>

namespace idem {

bool TenantRateLimiter::Allow(const std::string& tenant, SteadyTime now) {
  if (rate_ <= 0) return true;
  absl::MutexLock lock(&mu_);
  auto found = index_.find(tenant);
  if (found == index_.end()) {
    lru_.push_front(Bucket{tenant, burst_, now});
    index_.emplace(lru_.front().tenant, lru_.begin());
  } else {
    lru_.splice(lru_.begin(), lru_, found->second);
    Bucket& b = lru_.front();
    const double elapsed =
        std::max(0.0, absl::ToDoubleSeconds(absl::FromChrono(now - b.last)));
    b.tokens = std::min(burst_, b.tokens + elapsed * rate_);
    b.last = now;
  }
  Bucket& b = lru_.front();
  const bool allowed = b.tokens >= 1;
  if (allowed) b.tokens -= 1;
  Trim(now);
  return allowed;
}

void TenantRateLimiter::Trim(SteadyTime now) {
  // A bucket left alone this long holds `burst_` tokens again.
  const absl::Duration refill = absl::Seconds(burst_ / rate_);
  // At most two drops per call: the cost stays O(1), and the list still
  // shrinks faster than one call can grow it.
  for (int i = 0; i < 2 && lru_.size() > 1; ++i) {
    const Bucket& cold = lru_.back();
    if (lru_.size() <= max_buckets_ &&
        absl::FromChrono(now - cold.last) < refill) {
      return;
    }
    index_.erase(cold.tenant);
    lru_.pop_back();
  }
}

size_t TenantRateLimiter::buckets() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

}  // namespace idem
