#include "server/metrics/metrics.h"

#include <dirent.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace idem {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,  0.5,    1,     2.5,  5,     10};
  return *buckets;
}

// process_* metrics of the Prometheus conventions, read from /proc.
class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    std::ifstream stat("/proc/self/stat");
    std::string line;
    std::getline(stat, line);
    // Fields after the parenthesised command name (none without /proc).
    const size_t paren = line.rfind(')');
    std::vector<std::string> f;
    if (paren != std::string::npos && paren + 2 <= line.size()) {
      f = absl::StrSplit(line.substr(paren + 2), ' ');
    }
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    if (f.size() > 21) {
      out.push_back(Gauge("process_cpu_seconds_total",
                          "User and system CPU time spent in seconds.",
                          (std::stod(f[11]) + std::stod(f[12])) / ticks,
                          prometheus::MetricType::Counter));
      out.push_back(Gauge("process_resident_memory_bytes",
                          "Resident memory size in bytes.",
                          std::stod(f[21]) * page));
      out.push_back(Gauge("process_virtual_memory_bytes",
                          "Virtual memory size in bytes.", std::stod(f[20])));
      out.push_back(
          Gauge("process_threads", "Number of OS threads.", std::stod(f[17])));
    }
    if (DIR* dir = opendir("/proc/self/fd")) {
      int fds = 0;
      while (readdir(dir) != nullptr) ++fds;
      closedir(dir);
      // Less ".", ".." and the descriptor of the listing itself.
      out.push_back(Gauge("process_open_fds",
                          "Number of open file descriptors.", fds - 3));
    }
    return out;
  }

 private:
  static prometheus::MetricFamily Gauge(
      const std::string& name, const std::string& help, double value,
      prometheus::MetricType type = prometheus::MetricType::Gauge) {
    prometheus::MetricFamily family;
    family.name = name;
    family.help = help;
    family.type = type;
    prometheus::ClientMetric m;
    if (type == prometheus::MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    family.metric.push_back(m);
    return family;
  }
};

// Gauges whose values are read at scrape time.
class ScrapedGauges final : public prometheus::Collectable {
 public:
  void Add(std::string name, std::string help, std::function<double()> fn,
           prometheus::MetricType type) {
    absl::MutexLock lock(&mu_);
    gauges_.push_back({std::move(name), std::move(help), std::move(fn), type});
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    std::vector<prometheus::MetricFamily> out;
    for (const Gauge& g : gauges_) {
      prometheus::MetricFamily family;
      family.name = g.name;
      family.help = g.help;
      family.type = g.type;
      prometheus::ClientMetric m;
      if (g.type == prometheus::MetricType::Counter) {
        m.counter.value = g.value();
      } else {
        m.gauge.value = g.value();
      }
      family.metric.push_back(m);
      out.push_back(std::move(family));
    }
    return out;
  }

 private:
  struct Gauge {
    std::string name;
    std::string help;
    std::function<double()> value;
    prometheus::MetricType type;
  };
  mutable absl::Mutex mu_;
  std::vector<Gauge> gauges_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

Metrics::Metrics(const std::set<std::string>& known_operations)
    : registry_(std::make_shared<prometheus::Registry>()),
      begin_(BuildCounter()
                 .Name("idem_begin_total")
                 .Help("Begin calls answered, by operation and outcome.")
                 .Register(*registry_)),
      replay_(BuildCounter()
                  .Name("idem_replay_total")
                  .Help("Stored results replayed, by where they came from.")
                  .Register(*registry_)),
      lease_expired_(BuildCounter()
                         .Name("idem_lease_expired_total")
                         .Help("Leases that ran out, by operation and the "
                               "expiry policy applied.")
                         .Register(*registry_)),
      fencing_rejected_(
          BuildCounter()
              .Name("idem_fencing_rejected_total")
              .Help("Heartbeat, Complete or Fail calls refused for a stale "
                    "fencing token.")
              .Register(*registry_)
              .Add({})),
      resolve_(BuildCounter()
                   .Name("idem_resolve_total")
                   .Help("Records settled by someone other than their holder.")
                   .Register(*registry_)),
      records_(BuildGauge()
                   .Name("idem_records")
                   .Help("Records by status (refreshed periodically).")
                   .Register(*registry_)),
      oldest_unknown_age_(
          BuildGauge()
              .Name("idem_oldest_unknown_age_seconds")
              .Help("Age of the oldest UNKNOWN record; 0 when none.")
              .Register(*registry_)
              .Add({})),
      rpc_duration_(BuildHistogram()
                        .Name("idem_rpc_duration_seconds")
                        .Help("Time to answer a gRPC call, by method.")
                        .Register(*registry_)),
      store_duration_(BuildHistogram()
                          .Name("idem_store_duration_seconds")
                          .Help("Time of one store operation.")
                          .Register(*registry_)),
      store_errors_(BuildCounter()
                        .Name("idem_store_errors_total")
                        .Help("Store operations that failed, by kind.")
                        .Register(*registry_)),
      redis_fallback_(BuildCounter()
                          .Name("idem_redis_fallback_total")
                          .Help("Redis lookups that fell through to "
                                "PostgreSQL, by reason.")
                          .Register(*registry_)),
      reconcile_(BuildCounter()
                     .Name("idem_reconcile_total")
                     .Help("Reconciler probes of UNKNOWN records, by verdict.")
                     .Register(*registry_)),
      reconcile_given_up_(
          BuildCounter()
              .Name("idem_reconcile_given_up_total")
              .Help("UNKNOWN records left to an operator after the last "
                    "probe attempt.")
              .Register(*registry_)
              .Add({})),
      redis_up_(BuildGauge()
                    .Name("idem_redis_up")
                    .Help("1 while the Redis cache answers, 0 while lookups "
                          "fall through to PostgreSQL.")
                    .Register(*registry_)),
      waiters_(BuildGauge()
                   .Name("idem_waiters")
                   .Help("Begin calls parked until their record settles.")
                   .Register(*registry_)
                   .Add({})),
      waiters_dropped_(BuildCounter()
                           .Name("idem_waiters_dropped_total")
                           .Help("Parked Begin calls that left before their "
                                 "record settled, by reason.")
                           .Register(*registry_)),
      refused_(BuildCounter()
                   .Name("idem_refused_total")
                   .Help("Calls refused with RESOURCE_EXHAUSTED at a bound, "
                         "by bound.")
                   .Register(*registry_)),
      auth_failures_(BuildCounter()
                         .Name("idem_auth_failures_total")
                         .Help("Calls refused UNAUTHENTICATED or "
                               "PERMISSION_DENIED, by code.")
                         .Register(*registry_)),
      health_watches_(BuildGauge()
                          .Name("idem_health_watches")
                          .Help("Open grpc.health.v1.Health/Watch streams.")
                          .Register(*registry_)
                          .Add({})),
      http_requests_(BuildCounter()
                         .Name("idem_http_requests_total")
                         .Help("Requests the HTTP gateway answered, by route "
                               "and result.")
                         .Register(*registry_)),
      http_duration_(BuildHistogram()
                         .Name("idem_http_request_seconds")
                         .Help("Time from a gateway request's header to its "
                               "answer, by result.")
                         .Register(*registry_)),
      http_upstream_errors_(BuildCounter()
                                .Name("idem_http_upstream_errors_total")
                                .Help("Gateway exchanges with the service "
                                      "that got no answer, by kind.")
                                .Register(*registry_)),
      scraped_(std::make_shared<ScrapedGauges>()),
      operations_(known_operations.begin(), known_operations.end()) {
  for (Status s : {Status::kProcessing, Status::kSucceeded, Status::kFailed,
                   Status::kUnknown}) {
    records_.Get({{"status", StatusName(s)}}).Set(0);
  }
}

absl::string_view Metrics::OperationLabel(absl::string_view operation) {
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = operations_.find(operation);
    if (it != operations_.end()) return *it;
  }
  absl::MutexLock lock(&mu_);
  auto it = operations_.find(operation);
  if (it != operations_.end()) return *it;
  if (learned_ < kMaxOperationLabels) {
    ++learned_;
    return *operations_.emplace(operation).first;
  }
  return "other";
}

void Metrics::BeginOutcome(const std::string& operation, Outcome outcome) {
  begin_
      .Get({{"operation", OperationLabel(operation)},
            {"outcome", OutcomeName(outcome)}})
      .Increment();
}

void Metrics::Replay(const std::string& source) {
  replay_.Get({{"source", source}}).Increment();
}

void Metrics::LeaseExpired(const std::string& operation, ExpiryPolicy policy) {
  lease_expired_
      .Get({{"operation", OperationLabel(operation)},
            {"policy", ExpiryPolicyName(policy)}})
      .Increment();
}

void Metrics::FencingRejected() { fencing_rejected_.Increment(); }

void Metrics::Resolved(const std::string& actor_kind) {
  resolve_.Get({{"actor_kind", actor_kind}}).Increment();
}

void Metrics::ObserveRpc(const std::string& method, absl::Duration d) {
  rpc_duration_.Get({{"method", method}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(d));
}

void Metrics::ObserveStore(const std::string& store, const std::string& op,
                           absl::Duration d) {
  store_duration_.Get({{"store", store}, {"op", op}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(d));
}

void Metrics::StoreError(const std::string& store, const std::string& kind) {
  store_errors_.Get({{"store", store}, {"kind", kind}}).Increment();
}

void Metrics::Reconciled(const std::string& verdict) {
  reconcile_.Get({{"verdict", verdict}}).Increment();
}

void Metrics::ReconcileGivenUp() { reconcile_given_up_.Increment(); }

void Metrics::RedisFallback(const std::string& reason) {
  redis_fallback_.Get({{"reason", reason}}).Increment();
}

void Metrics::SetWaiters(int64_t parked) {
  waiters_.Set(static_cast<double>(parked));
}

void Metrics::WaiterDropped(const char* reason) {
  waiters_dropped_.Get({{"reason", reason}}).Increment();
}

void Metrics::Refused(const char* bound) {
  refused_.Get({{"bound", bound}}).Increment();
}

void Metrics::AuthFailed(const char* code) {
  auth_failures_.Get({{"code", code}}).Increment();
}

void Metrics::AddScrapedGauge(std::string name, std::string help,
                              std::function<double()> value) {
  static_cast<ScrapedGauges&>(*scraped_).Add(std::move(name), std::move(help),
                                             std::move(value),
                                             prometheus::MetricType::Gauge);
}

void Metrics::AddScrapedCounter(std::string name, std::string help,
                                std::function<double()> value) {
  static_cast<ScrapedGauges&>(*scraped_).Add(std::move(name), std::move(help),
                                             std::move(value),
                                             prometheus::MetricType::Counter);
}

void Metrics::SetHealthWatches(int64_t watches) {
  health_watches_.Set(static_cast<double>(watches));
}

HttpMetrics::RequestSeries* Metrics::HttpRequestSeries(absl::string_view route,
                                                       const char* result) {
  const std::string key = absl::StrCat(route, "\n", result);
  absl::MutexLock lock(&http_series_mu_);
  std::unique_ptr<HttpSeries>& series = http_series_[key];
  if (series == nullptr) {
    series = std::make_unique<HttpSeries>(
        http_requests_.Get({{"route", route}, {"result", result}}),
        http_duration_.Get({{"result", result}}, LatencyBuckets()));
  }
  return series.get();
}

HttpMetrics::Counter* Metrics::CounterOf(const std::string& key,
                                         prometheus::Counter& counter) {
  absl::MutexLock lock(&http_series_mu_);
  std::unique_ptr<CounterRef>& ref = http_counters_[key];
  if (ref == nullptr) ref = std::make_unique<CounterRef>(counter);
  return ref.get();
}

HttpMetrics::Counter* Metrics::BeginOutcomeCounter(const std::string& operation,
                                                   Outcome outcome) {
  return CounterOf(
      absl::StrCat("begin\n", operation, "\n", OutcomeName(outcome)),
      begin_.Get({{"operation", OperationLabel(operation)},
                  {"outcome", OutcomeName(outcome)}}));
}

HttpMetrics::Counter* Metrics::ReplayCounter(const std::string& source) {
  return CounterOf(absl::StrCat("replay\n", source),
                   replay_.Get({{"source", source}}));
}

void Metrics::HttpRequest(absl::string_view route, const char* result,
                          absl::Duration d) {
  http_requests_.Get({{"route", route}, {"result", result}}).Increment();
  http_duration_.Get({{"result", result}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(d));
}

void Metrics::HttpUpstreamError(const char* kind) {
  http_upstream_errors_.Get({{"kind", kind}}).Increment();
}

void Metrics::SetRedisUp(bool up) { redis_up_.Get({}).Set(up ? 1 : 0); }

void Metrics::SetRecordCounts(const std::map<Status, int64_t>& records,
                              absl::Duration oldest_unknown_age) {
  for (Status s : {Status::kProcessing, Status::kSucceeded, Status::kFailed,
                   Status::kUnknown}) {
    auto it = records.find(s);
    records_.Get({{"status", StatusName(s)}})
        .Set(it == records.end() ? 0 : static_cast<double>(it->second));
  }
  oldest_unknown_age_.Set(absl::ToDoubleSeconds(oldest_unknown_age));
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& address, Metrics& metrics) {
  static const auto* process = new std::shared_ptr<ProcessCollector>(
      std::make_shared<ProcessCollector>());
  try {
    // CivetWeb's defaults (2 threads, 30 s per network read) let two
    // connections that send nothing block every scrape for 30 s.
    auto exposer =
        std::make_unique<prometheus::Exposer>(std::vector<std::string>{
            "listening_ports", address, "num_threads",
            absl::StrCat(kMetricsThreads), "request_timeout_ms",
            absl::StrCat(kMetricsTimeoutMs)});
    exposer->RegisterCollectable(metrics.registry());
    exposer->RegisterCollectable(metrics.scraped());
    exposer->RegisterCollectable(*process);
    return exposer;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen=", address, ": cannot listen: ", e.what()));
  }
}

}  // namespace idem
