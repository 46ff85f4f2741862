// The circuit breaker in front of Redis, as a pure state machine driven by
// its caller's steady clock: closed (calls go through) or open (calls fail fast
// until a probe succeeds; probes are spaced by an exponential backoff).
#ifndef IDEM_SERVER_CACHE_REDIS_BREAKER_H_
#define IDEM_SERVER_CACHE_REDIS_BREAKER_H_

#include <cstdint>

#include "absl/time/time.h"
#include "common/steady_wait.h"

namespace idem {

// Not thread-safe; the Redis client guards it with its mutex.
class CircuitBreaker {
 public:
  // Starts open with a probe due at once: nothing is sent to Redis before a
  // probe has shown that it answers.
  CircuitBreaker(absl::Duration backoff_min, absl::Duration backoff_max);

  // Returns true iff calls may go through.
  bool closed() const { return closed_; }

  // Counts state changes. A call remembers it when it starts, so that a
  // failure from before a recovery does not open the breaker again.
  uint64_t epoch() const { return epoch_; }

  // While open: when the next probe is due.
  SteadyTime next_probe() const { return next_probe_; }

  // While open: the wait before the next probe.
  absl::Duration backoff() const { return backoff_; }

  // A call that started in `epoch` failed at `now` (Redis did not answer or
  // the connection broke): opens the breaker, with the first probe
  // backoff_min later. Returns true iff this changed the state.
  bool CallFailed(uint64_t epoch, SteadyTime now);

  // A probe failed at `now`: the next one is due after twice the previous
  // backoff (backoff_min if there was none), at most backoff_max.
  void ProbeFailed(SteadyTime now);

  // A probe succeeded: closes the breaker and resets the backoff. Returns
  // true iff this changed the state.
  bool ProbeSucceeded();

 private:
  const absl::Duration backoff_min_;
  const absl::Duration backoff_max_;
  bool closed_ = false;
  uint64_t epoch_ = 0;
  absl::Duration backoff_ = absl::ZeroDuration();
  SteadyTime next_probe_ = SteadyTime::min();
};

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_REDIS_BREAKER_H_
