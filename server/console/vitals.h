// The vital signs of this instance for the console's overview: a ring
// buffer of samples taken once a second from the Prometheus metrics it
// already keeps (docs/spec.md#metrics), so the call path pays nothing more
// and nothing at all while the console is off.
#ifndef IDEM_SERVER_CONSOLE_VITALS_H_
#define IDEM_SERVER_CONSOLE_VITALS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/base/periodic.h"

namespace idem::console {

// One second of the instance's life. A figure the metrics do not have (no
// Redis configured, no Begin in the second) is -1.
struct VitalsSample {
  absl::Time at;
  // idem_begin_total's increase over the second, by outcome.
  std::map<std::string, double> begins_per_second;
  // Begin's latency over the second, from idem_rpc_duration_seconds'
  // buckets (interpolated within a bucket).
  double begin_p50_seconds = -1;
  double begin_p99_seconds = -1;
  double waiters = -1;          // idem_waiters
  double redis_up = -1;         // idem_redis_up: 1 up, 0 breaker open
  double unknown_records = -1;  // idem_records{status="UNKNOWN"}
  double calls_in_flight = -1;  // idem_calls_in_flight
  double pg_in_use = -1;        // idem_pg_connections_in_use
};

// Figures read from one collection of the metrics; cumulative counters as
// they stand (Derive turns two into a sample).
struct VitalsReading {
  absl::Time at;
  std::map<std::string, double> begins;  // by outcome
  // Begin's histogram: cumulative counts by upper bound.
  std::vector<std::pair<double, double>> begin_buckets;
  double waiters = -1;
  double redis_up = -1;
  double unknown_records = -1;
  double calls_in_flight = -1;
  double pg_in_use = -1;
};

VitalsReading Read(const std::vector<prometheus::MetricFamily>& families,
                   absl::Time at);
// The sample of the second between `before` and `now`.
VitalsSample Derive(const VitalsReading& before, const VitalsReading& now);

// The q-quantile (0..1) of the observations between two cumulative
// histograms (same bounds, the last +Inf); -1 when there are none.
double Quantile(const std::vector<std::pair<double, double>>& before,
                const std::vector<std::pair<double, double>>& now, double q);

// Samples `sources` every `interval` on the shared timer thread
// (periodic.h), keeping the last `keep`. A turn collects the in-process
// registries and derives a sample: CPU only, no wait. Thread-safe.
class Vitals {
 public:
  Vitals(std::vector<std::shared_ptr<prometheus::Collectable>> sources,
         absl::Duration interval = absl::Seconds(1), int keep = 600);
  ~Vitals();
  Vitals(const Vitals&) = delete;
  Vitals& operator=(const Vitals&) = delete;

  absl::Duration interval() const { return interval_; }
  // Oldest first.
  std::vector<VitalsSample> Samples() const;

 private:
  // One sample: collects, derives it from last_, keeps it.
  void Sample();
  VitalsReading Collect() const;

  const std::vector<std::shared_ptr<prometheus::Collectable>> sources_;
  const absl::Duration interval_;
  const size_t keep_;
  mutable absl::Mutex mu_;
  std::deque<VitalsSample> samples_ ABSL_GUARDED_BY(mu_);
  // The reading before; only turns use it, one at a time.
  VitalsReading last_;
  // Last: stops before the members Sample uses go.
  PeriodicJob sampler_;
};

}  // namespace idem::console

#endif  // IDEM_SERVER_CONSOLE_VITALS_H_
