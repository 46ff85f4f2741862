#include "server/console/vitals.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace idem::console {
namespace {

const std::string* Label(const prometheus::ClientMetric& m,
                         const std::string& name) {
  for (const prometheus::ClientMetric::Label& l : m.label) {
    if (l.name == name) return &l.value;
  }
  return nullptr;
}

}  // namespace

VitalsReading Read(const std::vector<prometheus::MetricFamily>& families,
                   absl::Time at) {
  VitalsReading r;
  r.at = at;
  for (const prometheus::MetricFamily& f : families) {
    if (f.name == "idem_begin_total") {
      for (const prometheus::ClientMetric& m : f.metric) {
        const std::string* outcome = Label(m, "outcome");
        if (outcome != nullptr) r.begins[*outcome] += m.counter.value;
      }
    } else if (f.name == "idem_rpc_duration_seconds") {
      for (const prometheus::ClientMetric& m : f.metric) {
        const std::string* method = Label(m, "method");
        if (method == nullptr || *method != "Begin") continue;
        for (const prometheus::ClientMetric::Bucket& b : m.histogram.bucket) {
          r.begin_buckets.emplace_back(b.upper_bound,
                                       static_cast<double>(b.cumulative_count));
        }
      }
    } else if (f.name == "idem_waiters" && !f.metric.empty()) {
      r.waiters = f.metric[0].gauge.value;
    } else if (f.name == "idem_redis_up" && !f.metric.empty()) {
      r.redis_up = f.metric[0].gauge.value;
    } else if (f.name == "idem_calls_in_flight" && !f.metric.empty()) {
      r.calls_in_flight = f.metric[0].gauge.value;
    } else if (f.name == "idem_pg_connections_in_use" && !f.metric.empty()) {
      r.pg_in_use = f.metric[0].gauge.value;
    } else if (f.name == "idem_records") {
      for (const prometheus::ClientMetric& m : f.metric) {
        const std::string* status = Label(m, "status");
        if (status != nullptr && *status == "UNKNOWN") {
          r.unknown_records = m.gauge.value;
        }
      }
    }
  }
  return r;
}

double Quantile(const std::vector<std::pair<double, double>>& before,
                const std::vector<std::pair<double, double>>& now, double q) {
  if (now.empty()) return -1;
  auto count = [&](size_t i) {
    const double was = before.size() == now.size() ? before[i].second : 0;
    return now[i].second - was;
  };
  const double total = count(now.size() - 1);
  if (total <= 0) return -1;
  const double rank = q * total;
  double lower_bound = 0;
  double lower_count = 0;
  for (size_t i = 0; i < now.size(); ++i) {
    const double c = count(i);
    if (c >= rank) {
      // Past the last finite bound nothing says how far: its bound.
      if (i + 1 == now.size()) return lower_bound;
      const double in_bucket = c - lower_count;
      const double upper = now[i].first;
      if (in_bucket <= 0) return upper;
      return lower_bound +
             (upper - lower_bound) * (rank - lower_count) / in_bucket;
    }
    lower_bound = now[i].first;
    lower_count = c;
  }
  return lower_bound;
}

VitalsSample Derive(const VitalsReading& before, const VitalsReading& now) {
  VitalsSample s;
  s.at = now.at;
  const double seconds =
      std::max(absl::ToDoubleSeconds(now.at - before.at), 1e-3);
  for (const auto& [outcome, value] : now.begins) {
    auto it = before.begins.find(outcome);
    const double was = it == before.begins.end() ? 0 : it->second;
    s.begins_per_second[outcome] = std::max(0.0, value - was) / seconds;
  }
  s.begin_p50_seconds = Quantile(before.begin_buckets, now.begin_buckets, 0.5);
  s.begin_p99_seconds = Quantile(before.begin_buckets, now.begin_buckets, 0.99);
  s.waiters = now.waiters;
  s.redis_up = now.redis_up;
  s.unknown_records = now.unknown_records;
  s.calls_in_flight = now.calls_in_flight;
  s.pg_in_use = now.pg_in_use;
  return s;
}

Vitals::Vitals(std::vector<std::shared_ptr<prometheus::Collectable>> sources,
               absl::Duration interval, int keep)
    : sources_(std::move(sources)),
      interval_(interval),
      keep_(static_cast<size_t>(std::max(keep, 1))),
      last_(Collect()),
      sampler_(interval_, [this] { Sample(); }) {}

Vitals::~Vitals() = default;

std::vector<VitalsSample> Vitals::Samples() const {
  absl::MutexLock lock(&mu_);
  return {samples_.begin(), samples_.end()};
}

VitalsReading Vitals::Collect() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& source : sources_) {
    std::vector<prometheus::MetricFamily> more = source->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return Read(families, absl::Now());
}

void Vitals::Sample() {
  VitalsReading now = Collect();
  VitalsSample sample = Derive(last_, now);
  last_ = std::move(now);
  absl::MutexLock lock(&mu_);
  samples_.push_back(std::move(sample));
  while (samples_.size() > keep_) samples_.pop_front();
}

}  // namespace idem::console
