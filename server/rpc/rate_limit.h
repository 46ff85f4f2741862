// Per-tenant token buckets: each tenant may make `rate` calls a second on
// average, in bursts of up to `burst`. One tenant's excess never slows
// another's calls.
#ifndef IDEM_SERVER_RPC_RATE_LIMIT_H_
#define IDEM_SERVER_RPC_RATE_LIMIT_H_

#include <cstddef>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/synchronization/mutex.h"
#include "common/steady_wait.h"

namespace idem {

// Thread-safe. Memory and the cost of a call are bounded whatever callers
// send: at most `max_buckets` buckets, kept in least-recently-used order;
// a call touches its own bucket and drops idle ones from the cold end.
class TenantRateLimiter {
 public:
  static constexpr size_t kDefaultMaxBuckets = 100000;

  // `rate` <= 0 turns limiting off.
  TenantRateLimiter(double rate, double burst,
                    size_t max_buckets = kDefaultMaxBuckets)
      : rate_(rate), burst_(burst), max_buckets_(max_buckets) {}

  // Takes one token from `tenant`'s bucket at time `now`; false when empty.
  bool Allow(const std::string& tenant, SteadyTime now);

  bool enabled() const { return rate_ > 0; }

  // How many buckets are kept.
  size_t buckets() const;

 private:
  struct Bucket {
    std::string tenant;
    double tokens;
    SteadyTime last;
  };
  using Lru = std::list<Bucket>;

  // Drops buckets from the cold end: every one full again (the same as no
  // bucket) and, past max_buckets_, the least recently used.
  void Trim(SteadyTime now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const double rate_;
  const double burst_;
  const size_t max_buckets_;
  mutable absl::Mutex mu_;
  // Most recently used first.
  Lru lru_ ABSL_GUARDED_BY(mu_);
  // Keys view the tenant names held in lru_'s nodes, which never move.
  std::unordered_map<std::string_view, Lru::iterator> index_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_RATE_LIMIT_H_
