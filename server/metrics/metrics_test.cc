// Metrics: a series is found again by its label values (one time series per
// label set, updates adding up), histograms keep their buckets, and
// operation labels stop growing at the cap ("other").
#include "server/metrics/metrics.h"

#include <prometheus/text_serializer.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace idem {
namespace {

std::string Scrape(Metrics& m) {
  return prometheus::TextSerializer().Serialize(m.registry()->Collect());
}

TEST(SeriesTest, SameLabelsSameSeriesFromEveryThread) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family =
      prometheus::BuildCounter().Name("t_total").Help("t").Register(*registry);
  Series<prometheus::Counter> series(family);
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&series] {
      for (int i = 0; i < 1000; ++i) {
        series.Get({{"a", "x"}, {"b", i % 2 ? "odd" : "even"}}).Increment();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(&series.Get({{"a", "x"}, {"b", "odd"}}),
            &family.Add({{"a", "x"}, {"b", "odd"}}));
  EXPECT_EQ(series.Get({{"a", "x"}, {"b", "odd"}}).Value(), 2000);
  EXPECT_EQ(series.Get({{"a", "x"}, {"b", "even"}}).Value(), 2000);
  // Values are separated: ("ab", "") is not ("a", "b").
  series.Get({{"a", "ab"}, {"b", ""}}).Increment();
  EXPECT_EQ(series.Get({{"a", "a"}, {"b", "b"}}).Value(), 0);
  EXPECT_EQ(family.Collect()[0].metric.size(), 4u);
}

TEST(MetricsTest, HistogramsAndCountersReachTheScrape) {
  Metrics m;
  m.ObserveStore("redis", "get", absl::Microseconds(700));
  m.ObserveStore("redis", "get", absl::Milliseconds(20));
  m.BeginOutcome("pay", Outcome::kCompleted);
  m.BeginOutcome("pay", Outcome::kCompleted);
  const std::string text = Scrape(m);
  EXPECT_TRUE(absl::StrContains(
      text,
      "idem_store_duration_seconds_bucket{op=\"get\",store=\"redis\",le=\"0."
      "001\"} 1"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "idem_store_duration_seconds_count{op=\"get\",store=\"redis\"} 2"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "idem_begin_total{operation=\"pay\",outcome=\"COMPLETED\"} 2"))
      << text;
}

TEST(MetricsTest, AnHttpSeriesFoundOnceCountsAsHttpRequest) {
  Metrics m;
  HttpMetrics::RequestSeries* series = m.HttpRequestSeries("pay", "replayed");
  EXPECT_EQ(m.HttpRequestSeries("pay", "replayed"), series);
  EXPECT_NE(m.HttpRequestSeries("pay", "executed"), series);
  series->Add(absl::Microseconds(100));
  m.HttpRequest("pay", "replayed", absl::Microseconds(100));
  const std::string text = Scrape(m);
  EXPECT_TRUE(absl::StrContains(
      text, "idem_http_requests_total{result=\"replayed\",route=\"pay\"} 2"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "idem_http_request_seconds_count{result=\"replayed\"} 2"))
      << text;
}

TEST(MetricsTest, CountersFoundOnceCountAsTheirCalls) {
  Metrics m;
  HttpMetrics::Counter* begin =
      m.BeginOutcomeCounter("pay", Outcome::kCompleted);
  EXPECT_EQ(m.BeginOutcomeCounter("pay", Outcome::kCompleted), begin);
  EXPECT_NE(m.BeginOutcomeCounter("pay", Outcome::kFailed), begin);
  HttpMetrics::Counter* replay = m.ReplayCounter("memory");
  EXPECT_EQ(m.ReplayCounter("memory"), replay);
  EXPECT_NE(m.ReplayCounter("redis"), replay);
  begin->Increment();
  m.BeginOutcome("pay", Outcome::kCompleted);
  replay->Increment();
  m.Replay("memory");
  const std::string text = Scrape(m);
  EXPECT_TRUE(absl::StrContains(
      text, "idem_begin_total{operation=\"pay\",outcome=\"COMPLETED\"} 2"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "idem_replay_total{source=\"memory\"} 2"))
      << text;
}

TEST(MetricsTest, OperationLabelsStopAtTheCap) {
  Metrics m({"known"});
  for (int i = 0; i < Metrics::kMaxOperationLabels + 5; ++i) {
    m.BeginOutcome(absl::StrCat("op", i), Outcome::kAcquired);
  }
  m.BeginOutcome("known", Outcome::kAcquired);
  const std::string text = Scrape(m);
  EXPECT_TRUE(absl::StrContains(
      text, "idem_begin_total{operation=\"other\",outcome=\"ACQUIRED\"} 5"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "idem_begin_total{operation=\"known\",outcome=\"ACQUIRED\"} 1"));
  EXPECT_TRUE(absl::StrContains(
      text,
      absl::StrCat("operation=\"op", Metrics::kMaxOperationLabels - 1, "\"")));
  EXPECT_FALSE(absl::StrContains(
      text,
      absl::StrCat("operation=\"op", Metrics::kMaxOperationLabels, "\"")));
}

}  // namespace
}  // namespace idem
