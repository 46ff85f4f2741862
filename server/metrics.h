// Prometheus metrics of DESIGN.md section 7 (names and labels are a public
// contract), plus process metrics. No tenant label. Thread-safe.
#ifndef IDEM_SERVER_METRICS_H_
#define IDEM_SERVER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "server/store.h"
#include "statemachine/record.h"

namespace prometheus {
class Exposer;
}

namespace idem {

class Metrics {
 public:
  // Registers every metric in a new registry. Operation labels are the
  // operations named in `known_operations` plus the first
  // kMaxOperationLabels others seen; the rest count as "other", so clients
  // cannot blow up the series count.
  explicit Metrics(const std::set<std::string>& known_operations = {});

  static constexpr int kMaxOperationLabels = 200;

  const std::shared_ptr<prometheus::Registry>& registry() const {
    return registry_;
  }

  void BeginOutcome(const std::string& operation, Outcome outcome);
  // `source`: "postgres" or "redis".
  void Replay(const std::string& source);
  void LeaseExpired(const std::string& operation, ExpiryPolicy policy);
  void FencingRejected();
  // `actor_kind`: "operator", "late-report", "reconciler".
  void Resolved(const std::string& actor_kind);
  void ObserveRpc(const std::string& method, absl::Duration d);
  void ObserveStore(const std::string& store, const std::string& op,
                    absl::Duration d);
  // `kind`: "unavailable", "aborted", "internal", ...
  void StoreError(const std::string& store, const std::string& kind);
  void RedisFallback(const std::string& reason);
  // idem_redis_up: 1 while the Redis cache answers, 0 while lookups fall
  // through to PostgreSQL. Absent when no Redis is configured.
  void SetRedisUp(bool up);
  void SetStats(const StoreStats& stats);
  // `verdict`: applied, not_applied, indeterminate, error.
  void Reconciled(const std::string& verdict);
  void ReconcileGivenUp();

 private:
  std::string OperationLabel(const std::string& operation);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& begin_;
  prometheus::Family<prometheus::Counter>& replay_;
  prometheus::Family<prometheus::Counter>& lease_expired_;
  prometheus::Counter& fencing_rejected_;
  prometheus::Family<prometheus::Counter>& resolve_;
  prometheus::Family<prometheus::Gauge>& records_;
  prometheus::Gauge& oldest_unknown_age_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Family<prometheus::Histogram>& store_duration_;
  prometheus::Family<prometheus::Counter>& store_errors_;
  prometheus::Family<prometheus::Counter>& redis_fallback_;
  prometheus::Family<prometheus::Counter>& reconcile_;
  prometheus::Counter& reconcile_given_up_;
  prometheus::Family<prometheus::Gauge>& redis_up_;

  absl::Mutex mu_;
  std::set<std::string> operations_ ABSL_GUARDED_BY(mu_);
  int learned_ ABSL_GUARDED_BY(mu_) = 0;
};

// Measures the time from construction to destruction (on the steady clock)
// into idem_rpc_duration_seconds{method}. `metrics` may be null.
class RpcTimer {
 public:
  RpcTimer(Metrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(SteadyClock::now()) {}
  ~RpcTimer() {
    if (metrics_ != nullptr) {
      metrics_->ObserveRpc(method_, SteadySince(start_));
    }
  }
  RpcTimer(const RpcTimer&) = delete;
  RpcTimer& operator=(const RpcTimer&) = delete;

 private:
  Metrics* const metrics_;
  const char* const method_;
  const SteadyTime start_;
};

// Serves `metrics` (and process metrics) as Prometheus text on `address`
// (host:port) at /metrics. The exposer's threads live as long as it does.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& address, Metrics& metrics);

}  // namespace idem

#endif  // IDEM_SERVER_METRICS_H_
