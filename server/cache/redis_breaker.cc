#include "server/cache/redis_breaker.h"

#include <algorithm>

namespace idem {

CircuitBreaker::CircuitBreaker(absl::Duration backoff_min,
                               absl::Duration backoff_max)
    : backoff_min_(backoff_min),
      backoff_max_(std::max(backoff_min, backoff_max)) {}

bool CircuitBreaker::CallFailed(uint64_t epoch, SteadyTime now) {
  if (!closed_ || epoch != epoch_) return false;
  closed_ = false;
  ++epoch_;
  backoff_ = backoff_min_;
  next_probe_ = SteadyDeadline(backoff_, now);
  return true;
}

void CircuitBreaker::ProbeFailed(SteadyTime now) {
  if (closed_) return;
  backoff_ = backoff_ == absl::ZeroDuration()
                 ? backoff_min_
                 : std::min(backoff_ * 2, backoff_max_);
  next_probe_ = SteadyDeadline(backoff_, now);
}

bool CircuitBreaker::ProbeSucceeded() {
  if (closed_) return false;
  closed_ = true;
  ++epoch_;
  backoff_ = absl::ZeroDuration();
  next_probe_ = SteadyTime::min();
  return true;
}

}  // namespace idem
