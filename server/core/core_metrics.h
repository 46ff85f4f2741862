// What the core reports: Begin outcomes, replays, lease expiries, fencing,
// resolutions, reconciliation and parked Begins (docs/spec.md#metrics).
#ifndef IDEM_SERVER_CORE_CORE_METRICS_H_
#define IDEM_SERVER_CORE_CORE_METRICS_H_

#include <cstdint>
#include <string>

#include "statemachine/record.h"

namespace idem {

class CoreMetrics {
 public:
  virtual ~CoreMetrics() = default;
  virtual void BeginOutcome(const std::string& operation, Outcome outcome) = 0;
  // `source`: "postgres", "redis" or "memory".
  virtual void Replay(const std::string& source) = 0;
  virtual void LeaseExpired(const std::string& operation,
                            ExpiryPolicy policy) = 0;
  virtual void FencingRejected() = 0;
  // `actor_kind`: "operator", "late-report", "reconciler".
  virtual void Resolved(const std::string& actor_kind) = 0;
  // `verdict`: applied, not_applied, indeterminate, error.
  virtual void Reconciled(const std::string& verdict) = 0;
  virtual void ReconcileGivenUp() = 0;
  // idem_waiters: Begins parked until their record settles.
  virtual void SetWaiters(int64_t parked) = 0;
  // A parked Begin left without a settled record; `reason`: "cancelled"
  // (its caller hung up), "deadline" (its wait ran out), "shutdown".
  virtual void WaiterDropped(const char* reason) = 0;
  // A call refused at a bound; `bound`: "waiters_per_key",
  // "waiters_per_tenant", "waiters", "calls_in_flight",
  // "admin_calls_in_flight", "health_watches".
  virtual void Refused(const char* bound) = 0;
};

}  // namespace idem

#endif  // IDEM_SERVER_CORE_CORE_METRICS_H_
