#include "bench/histogram.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace idem::bench {
namespace {

TEST(HistogramTest, EmptyReportsZero) {
  Histogram h;
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(h.Percentile(50), 0);
  EXPECT_EQ(h.Percentile(99.9), 0);
  EXPECT_EQ(h.Mean(), 0);
  EXPECT_EQ(h.min(), 0);
  EXPECT_EQ(h.max(), 0);
}

TEST(HistogramTest, SmallValuesAreExact) {
  Histogram h;
  for (int v = 1; v <= 100; ++v) h.Record(v);
  EXPECT_EQ(h.count(), 100);
  EXPECT_EQ(h.Percentile(50), 50);
  EXPECT_EQ(h.Percentile(90), 90);
  EXPECT_EQ(h.Percentile(99), 99);
  EXPECT_EQ(h.Percentile(100), 100);
  EXPECT_EQ(h.min(), 1);
  EXPECT_EQ(h.max(), 100);
  EXPECT_DOUBLE_EQ(h.Mean(), 50.5);
}

TEST(HistogramTest, LargeValuesWithinBucketPrecision) {
  Histogram h;
  for (int64_t v = 1; v <= 1000000; ++v) h.Record(v);
  for (double p : {50.0, 90.0, 99.0, 99.9}) {
    const double exact = p / 100.0 * 1000000;
    const auto got = static_cast<double>(h.Percentile(p));
    EXPECT_GE(got, exact) << p;
    EXPECT_LE(got, exact * (1 + 1.0 / 64)) << p;
  }
  EXPECT_EQ(h.Percentile(100), 1000000);
}

TEST(HistogramTest, EveryValueLandsInABucketThatContainsIt) {
  // Round trip: the percentile of a single value is that value, to within
  // the bucket width, and never below it.
  for (int64_t v : {int64_t{0}, int64_t{127}, int64_t{128}, int64_t{129},
                    int64_t{255}, int64_t{256}, int64_t{1} << 20,
                    (int64_t{1} << 40) + 12345, int64_t{1} << 62}) {
    Histogram h;
    h.Record(v);
    h.Record(v);
    EXPECT_EQ(h.Percentile(50), v) << v;  // capped at max, which is v
    Histogram two;
    two.Record(v);
    two.Record(v + v / 8 + 200);  // a larger value in a later bucket
    EXPECT_GE(two.Percentile(50), v) << v;
    EXPECT_LE(static_cast<double>(two.Percentile(50)),
              static_cast<double>(v) * (1 + 1.0 / 64) + 1)
        << v;
  }
}

TEST(HistogramTest, MergeEqualsRecordingEverythingInOne) {
  Histogram a;
  Histogram b;
  Histogram all;
  for (int64_t v = 0; v < 5000; ++v) {
    (v % 3 == 0 ? a : b).Record(v * 37);
    all.Record(v * 37);
  }
  a.Merge(b);
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.min(), all.min());
  EXPECT_EQ(a.max(), all.max());
  EXPECT_DOUBLE_EQ(a.Mean(), all.Mean());
  for (double p : {1.0, 50.0, 90.0, 99.0, 99.9}) {
    EXPECT_EQ(a.Percentile(p), all.Percentile(p)) << p;
  }
}

TEST(HistogramTest, NegativeValuesCountAsZero) {
  Histogram h;
  h.Record(-5);
  EXPECT_EQ(h.count(), 1);
  EXPECT_EQ(h.Percentile(50), 0);
}

}  // namespace
}  // namespace idem::bench
