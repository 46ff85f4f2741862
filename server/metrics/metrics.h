// Prometheus metrics of docs/spec.md#metrics (names and labels are a public
// contract), plus process metrics. No tenant label. Thread-safe. Each layer
// reports through its own small interface (StoreMetrics, CacheMetrics,
// CoreMetrics, RpcMetrics, HttpMetrics); this one registry implements them
// all, and only the composition root and tests name it.
#ifndef IDEM_SERVER_METRICS_METRICS_H_
#define IDEM_SERVER_METRICS_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cache/cache_metrics.h"
#include "server/gateway/http_metrics.h"
#include "server/rpc/rpc_metrics.h"
#include "statemachine/record.h"

namespace prometheus {
class Exposer;
}

namespace idem {

// The series of one family, found by label values. prometheus-cpp's
// Family::Add builds a whole metric (a histogram with all its buckets) and a
// label map on every call before it finds the series exists; on the request
// path that cost more than the update itself. Thread-safe.
template <typename T>
class Series {
 public:
  using Label = std::pair<const char*, absl::string_view>;  // name, value

  explicit Series(prometheus::Family<T>& family) : family_(family) {}

  // The series with `labels`, added (made with `args`) the first time.
  template <typename... Args>
  T& Get(std::initializer_list<Label> labels, const Args&... args) {
    std::string key;
    for (const Label& l : labels) {
      key.append(l.second.data(), l.second.size());
      key.push_back('\0');
    }
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = series_.find(key);
      if (it != series_.end()) return *it->second;
    }
    prometheus::Labels names;
    for (const Label& l : labels) names.emplace(l.first, std::string(l.second));
    T& series = family_.Add(names, args...);
    absl::MutexLock lock(&mu_);
    series_.emplace(std::move(key), &series);
    return series;
  }

 private:
  prometheus::Family<T>& family_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, T*> series_ ABSL_GUARDED_BY(mu_);
};

class Metrics final : public RpcMetrics,
                      public HttpMetrics,
                      public CacheMetrics {
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
  const std::shared_ptr<prometheus::Collectable>& scraped() const {
    return scraped_;
  }

  void BeginOutcome(const std::string& operation, Outcome outcome) override;
  void Replay(const std::string& source) override;
  void LeaseExpired(const std::string& operation, ExpiryPolicy policy) override;
  void FencingRejected() override;
  void Resolved(const std::string& actor_kind) override;
  void ObserveRpc(const std::string& method, absl::Duration d) override;
  void ObserveStore(const std::string& store, const std::string& op,
                    absl::Duration d) override;
  void StoreError(const std::string& store, const std::string& kind) override;
  void RedisFallback(const std::string& reason) override;
  // idem_redis_up: 1 while the Redis cache answers, 0 while lookups fall
  // through to PostgreSQL. Absent when no Redis is configured.
  void SetRedisUp(bool up);
  // idem_records{status} and idem_oldest_unknown_age_seconds; a status
  // missing from `records` counts zero.
  void SetRecordCounts(const std::map<Status, int64_t>& records,
                       absl::Duration oldest_unknown_age);
  void Reconciled(const std::string& verdict) override;
  void ReconcileGivenUp() override;
  void SetWaiters(int64_t parked) override;
  void WaiterDropped(const char* reason) override;
  void Refused(const char* bound) override;
  void AuthFailed(const char* code) override;
  // Adds a gauge read from `value` when the metrics are scraped (for a
  // figure that changes on every call, where setting a gauge each time
  // would cost the call). `value` must be thread-safe and stay valid as
  // long as this does.
  void AddScrapedGauge(std::string name, std::string help,
                       std::function<double()> value);
  // The same for a counter (`value` never goes down).
  void AddScrapedCounter(std::string name, std::string help,
                         std::function<double()> value);
  // idem_health_watches: open grpc.health.v1.Health/Watch streams.
  void SetHealthWatches(int64_t watches) override;
  RequestSeries* HttpRequestSeries(absl::string_view route,
                                   const char* result) override;
  void HttpRequest(absl::string_view route, const char* result,
                   absl::Duration d) override;
  Counter* BeginOutcomeCounter(const std::string& operation,
                               Outcome outcome) override;
  Counter* ReplayCounter(const std::string& source) override;
  void HttpUpstreamError(const char* kind) override;

 private:
  // The operation's own label, or "other"; valid as long as this is.
  absl::string_view OperationLabel(absl::string_view operation);

  std::shared_ptr<prometheus::Registry> registry_;
  Series<prometheus::Counter> begin_;
  Series<prometheus::Counter> replay_;
  Series<prometheus::Counter> lease_expired_;
  prometheus::Counter& fencing_rejected_;
  Series<prometheus::Counter> resolve_;
  Series<prometheus::Gauge> records_;
  prometheus::Gauge& oldest_unknown_age_;
  Series<prometheus::Histogram> rpc_duration_;
  Series<prometheus::Histogram> store_duration_;
  Series<prometheus::Counter> store_errors_;
  Series<prometheus::Counter> redis_fallback_;
  Series<prometheus::Counter> reconcile_;
  prometheus::Counter& reconcile_given_up_;
  Series<prometheus::Gauge> redis_up_;
  prometheus::Gauge& waiters_;
  Series<prometheus::Counter> waiters_dropped_;
  Series<prometheus::Counter> refused_;
  Series<prometheus::Counter> auth_failures_;
  prometheus::Gauge& health_watches_;
  Series<prometheus::Counter> http_requests_;
  Series<prometheus::Histogram> http_duration_;
  class HttpSeries final : public HttpMetrics::RequestSeries {
   public:
    HttpSeries(prometheus::Counter& requests, prometheus::Histogram& duration)
        : requests_(requests), duration_(duration) {}
    void Add(absl::Duration d) override {
      requests_.Increment();
      duration_.Observe(absl::ToDoubleSeconds(d));
    }

   private:
    prometheus::Counter& requests_;
    prometheus::Histogram& duration_;
  };
  class CounterRef final : public HttpMetrics::Counter {
   public:
    explicit CounterRef(prometheus::Counter& counter) : counter_(counter) {}
    void Increment() override { counter_.Increment(); }

   private:
    prometheus::Counter& counter_;
  };
  // The CounterRef of `key` (the family and labels), made on first use.
  Counter* CounterOf(const std::string& key, prometheus::Counter& counter);
  absl::Mutex http_series_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<HttpSeries>> http_series_
      ABSL_GUARDED_BY(http_series_mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<CounterRef>> http_counters_
      ABSL_GUARDED_BY(http_series_mu_);
  Series<prometheus::Counter> http_upstream_errors_;

  // The figures of AddScrapedGauge and AddScrapedCounter, collected with
  // the registry.
  std::shared_ptr<prometheus::Collectable> scraped_;

  absl::Mutex mu_;
  // Nodes of a std::set stay put: OperationLabel returns views of them.
  std::set<std::string, std::less<>> operations_ ABSL_GUARDED_BY(mu_);
  int learned_ ABSL_GUARDED_BY(mu_) = 0;
};

// The metrics endpoint's worker threads, and how long one waits on a
// connection's read or write before closing it: a client that connects and
// sends nothing holds a thread at most that long.
inline constexpr int kMetricsThreads = 4;
inline constexpr int kMetricsTimeoutMs = 2000;

// Serves `metrics` (and process metrics) as Prometheus text on `address`
// (host:port) at /metrics. The exposer's threads live as long as it does.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& address, Metrics& metrics);

}  // namespace idem

#endif  // IDEM_SERVER_METRICS_METRICS_H_
