// The figures of the console's overview, from metric readings.
#include "server/console/vitals.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace idem::console {
namespace {

using Buckets = std::vector<std::pair<double, double>>;

TEST(QuantileTest, InterpolatesWithinTheBucketOfTheRank) {
  // 100 observations in the second: 50 under 1 ms, 40 in 1-10 ms, 10 in
  // 10-100 ms.
  const Buckets before = {{0.001, 10}, {0.01, 10}, {0.1, 10}, {1e300, 10}};
  const Buckets now = {{0.001, 60}, {0.01, 100}, {0.1, 110}, {1e300, 110}};
  EXPECT_DOUBLE_EQ(Quantile(before, now, 0.5), 0.001);
  EXPECT_NEAR(Quantile(before, now, 0.99), 0.01 + 0.09 * 9 / 10, 1e-12);
}

TEST(QuantileTest, NoObservationsIsMinusOne) {
  const Buckets same = {{0.001, 5}, {1e300, 5}};
  EXPECT_EQ(Quantile(same, same, 0.5), -1);
  EXPECT_EQ(Quantile({}, {}, 0.5), -1);
}

TEST(VitalsTest, DerivesRatesAndGaugesFromTheMetrics) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& begins =
      prometheus::BuildCounter().Name("idem_begin_total").Register(*registry);
  auto& acquired = begins.Add({{"operation", "pay"}, {"outcome", "acquired"}});
  auto& latency =
      prometheus::BuildHistogram()
          .Name("idem_rpc_duration_seconds")
          .Register(*registry)
          .Add({{"method", "Begin"}},
               prometheus::Histogram::BucketBoundaries{0.001, 0.01});
  auto& records =
      prometheus::BuildGauge().Name("idem_records").Register(*registry);
  records.Add({{"status", "UNKNOWN"}}).Set(3);
  prometheus::BuildGauge()
      .Name("idem_waiters")
      .Register(*registry)
      .Add({})
      .Set(7);
  prometheus::BuildGauge()
      .Name("idem_pg_connections_in_use")
      .Register(*registry)
      .Add({})
      .Set(2);

  const absl::Time t0 = absl::FromUnixSeconds(1000);
  VitalsReading before = Read(registry->Collect(), t0);
  acquired.Increment(20);
  for (int i = 0; i < 20; ++i) latency.Observe(0.005);
  VitalsSample s =
      Derive(before, Read(registry->Collect(), t0 + absl::Seconds(2)));
  EXPECT_DOUBLE_EQ(s.begins_per_second["acquired"], 10);
  EXPECT_GT(s.begin_p50_seconds, 0.001);
  EXPECT_LE(s.begin_p99_seconds, 0.01);
  EXPECT_EQ(s.unknown_records, 3);
  EXPECT_EQ(s.waiters, 7);
  EXPECT_EQ(s.pg_in_use, 2);
  EXPECT_EQ(s.redis_up, -1);  // no Redis configured
}

TEST(VitalsTest, KeepsTheLastSamplesOnceAnInterval) {
  auto registry = std::make_shared<prometheus::Registry>();
  Vitals vitals({registry}, absl::Milliseconds(10), /*keep=*/5);
  absl::SleepFor(absl::Milliseconds(200));
  const std::vector<VitalsSample> samples = vitals.Samples();
  ASSERT_EQ(samples.size(), 5u);
  for (size_t i = 1; i < samples.size(); ++i) {
    EXPECT_LT(samples[i - 1].at, samples[i].at);
  }
}

}  // namespace
}  // namespace idem::console
