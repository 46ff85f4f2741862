#include "bench/report.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace idem::bench {
namespace {

double Throughput(const LoadResult& r) {
  return r.measured_seconds > 0
             ? static_cast<double>(r.requests) / r.measured_seconds
             : 0;
}

double RpcRate(const LoadResult& r) {
  return r.measured_seconds > 0
             ? static_cast<double>(r.rpcs) / r.measured_seconds
             : 0;
}

std::string Rate(const LoadOptions& o) {
  return o.target_rate > 0 ? absl::StrFormat("%.0f/s", o.target_rate)
                           : std::string("closed");
}

std::string Counts(const std::map<std::string, int64_t>& counts) {
  if (counts.empty()) return "none";
  return absl::StrJoin(counts, " ", absl::PairFormatter("="));
}

nlohmann::ordered_json Latency(const Histogram& h) {
  nlohmann::ordered_json j;
  j["p50"] = h.Percentile(50);
  j["p90"] = h.Percentile(90);
  j["p99"] = h.Percentile(99);
  j["p999"] = h.Percentile(99.9);
  j["max"] = h.max();
  j["mean"] = h.Mean();
  return j;
}

}  // namespace

std::string FormatTable(const std::string& label, const LoadOptions& o,
                        const LoadResult& r) {
  const Histogram& h = r.latency_us;
  auto ms = [](int64_t us) {
    return absl::StrFormat("%.3f", static_cast<double>(us) / 1000);
  };
  std::string out = absl::StrFormat(
      "%-13s %7s %8s %9s %10s %9s %9s %9s %9s %9s %7s\n", "scenario", "clients",
      "rate", "requests", "req/s", "p50(ms)", "p90(ms)", "p99(ms)", "p99.9(ms)",
      "max(ms)", "errors");
  absl::StrAppendFormat(
      &out, "%-13s %7d %8s %9d %10.1f %9s %9s %9s %9s %9s %7d\n", label,
      o.concurrency, Rate(o), r.requests, Throughput(r), ms(h.Percentile(50)),
      ms(h.Percentile(90)), ms(h.Percentile(99)), ms(h.Percentile(99.9)),
      ms(h.max()), r.ErrorCount());
  absl::StrAppendFormat(&out,
                        "target %s, %d threads, warmup %s, measured %s, "
                        "%.1f RPC/s\n",
                        o.target, std::min(o.threads, o.concurrency),
                        absl::FormatDuration(o.warmup),
                        absl::FormatDuration(o.duration), RpcRate(r));
  if (o.target_rate > 0) {
    const Histogram& s = r.service_us;
    absl::StrAppendFormat(
        &out,
        "latency from the scheduled start (above); from the send: p50 %s "
        "p99 %s ms; start lag: p50 %s p99 %s ms\n",
        ms(s.Percentile(50)), ms(s.Percentile(99)),
        ms(r.start_lag_us.Percentile(50)), ms(r.start_lag_us.Percentile(99)));
  }
  absl::StrAppend(&out, "outcomes: ", Counts(r.outcomes), "\n");
  absl::StrAppend(&out,
                  "errors (whole run, by gRPC code or unexpected "
                  "outcome): ",
                  Counts(r.errors), "\n");
  return out;
}

std::string FormatJson(const std::string& label, const LoadOptions& o,
                       const LoadResult& r) {
  nlohmann::ordered_json j;
  j["scenario"] = label;
  j["target"] = o.target;
  j["concurrency"] = o.concurrency;
  j["threads"] = std::min(o.threads, o.concurrency);
  j["warmup_s"] = absl::ToDoubleSeconds(o.warmup);
  j["duration_s"] = r.measured_seconds;
  j["target_rate"] = o.target_rate;
  j["key_space"] = o.key_space;
  j["snapshot_bytes"] = o.snapshot_bytes;
  j["throughput_rps"] = Throughput(r);
  j["rpc_rate"] = RpcRate(r);
  j["requests"] = r.requests;
  j["rpcs"] = r.rpcs;
  j["requests_total"] = r.requests_total;
  j["rpcs_total"] = r.rpcs_total;
  j["latency_us"] = Latency(r.latency_us);
  j["service_latency_us"] = Latency(r.service_us);
  j["start_lag_us"] = Latency(r.start_lag_us);
  j["errors_total"] = r.ErrorCount();
  j["errors"] = nlohmann::ordered_json::object();
  for (const auto& [name, n] : r.errors) j["errors"][name] = n;
  j["outcomes"] = nlohmann::ordered_json::object();
  for (const auto& [name, n] : r.outcomes) j["outcomes"][name] = n;
  return j.dump(2) + "\n";
}

std::string FormatSummaryLine(const std::string& label, const LoadOptions& o,
                              const LoadResult& r) {
  const Histogram& h = r.latency_us;
  return absl::StrFormat(
      "RESULT scenario=%s concurrency=%d throughput=%.2f rpc_rate=%.2f "
      "p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d requests=%d "
      "requests_total=%d rpcs_total=%d errors=%d",
      label, o.concurrency, Throughput(r), RpcRate(r), h.Percentile(50),
      h.Percentile(90), h.Percentile(99), h.Percentile(99.9), h.max(),
      r.requests, r.requests_total, r.rpcs_total, r.ErrorCount());
}

}  // namespace idem::bench
