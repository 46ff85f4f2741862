// Per-tenant token buckets: each tenant may make `rate` calls a second on
// average, in bursts of up to `burst`. One tenant's excess never slows
// another's calls.
#ifndef IDEM_SERVER_RPC_RATE_LIMIT_H_
#define IDEM_SERVER_RPC_RATE_LIMIT_H_

#include <string>
#include <unordered_map>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace idem {

// Thread-safe.
class TenantRateLimiter {
 public:
  // `rate` <= 0 turns limiting off.
  TenantRateLimiter(double rate, double burst) : rate_(rate), burst_(burst) {}

  // Takes one token from `tenant`'s bucket at time `now`; false when empty.
  bool Allow(const std::string& tenant, absl::Time now);

  bool enabled() const { return rate_ > 0; }

 private:
  struct Bucket {
    double tokens;
    absl::Time last;
  };
  // Buckets idle long enough to be full again are forgotten past this many.
  static constexpr size_t kMaxIdleBuckets = 100000;

  const double rate_;
  const double burst_;
  absl::Mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_RATE_LIMIT_H_
