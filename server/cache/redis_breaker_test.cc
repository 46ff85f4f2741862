#include "server/cache/redis_breaker.h"

#include <chrono>

#include "gtest/gtest.h"

namespace idem {
namespace {

// Any steady time; the breaker never reads a clock itself.
const SteadyTime kT0 = SteadyTime(std::chrono::hours(1000));
const absl::Duration kMin = absl::Milliseconds(100);
const absl::Duration kMax = absl::Seconds(1);

SteadyTime At(SteadyTime t, absl::Duration d) { return SteadyDeadline(d, t); }

TEST(CircuitBreakerTest, StartsOpenWithAProbeDueAtOnce) {
  CircuitBreaker b(kMin, kMax);
  EXPECT_FALSE(b.closed());
  EXPECT_LE(b.next_probe(), kT0);
  EXPECT_TRUE(b.ProbeSucceeded());
  EXPECT_TRUE(b.closed());
  EXPECT_FALSE(b.ProbeSucceeded());
}

TEST(CircuitBreakerTest, FailedFirstProbeWaitsTheMinimumBackoff) {
  CircuitBreaker b(kMin, kMax);
  b.ProbeFailed(kT0);
  EXPECT_FALSE(b.closed());
  EXPECT_EQ(b.next_probe(), At(kT0, kMin));
}

TEST(CircuitBreakerTest, ACallFailureOpensOnceAndBacksOffExponentially) {
  CircuitBreaker b(kMin, kMax);
  b.ProbeSucceeded();
  const uint64_t epoch = b.epoch();
  EXPECT_TRUE(b.CallFailed(epoch, kT0));
  EXPECT_FALSE(b.closed());
  EXPECT_EQ(b.next_probe(), At(kT0, kMin));
  // Calls that were in flight with it fail too: no change, no extra wait.
  EXPECT_FALSE(b.CallFailed(epoch, At(kT0, absl::Milliseconds(5))));
  EXPECT_EQ(b.next_probe(), At(kT0, kMin));

  SteadyTime now = At(kT0, kMin);
  for (absl::Duration want : {2 * kMin, 4 * kMin, 8 * kMin, kMax, kMax, kMax}) {
    b.ProbeFailed(now);
    EXPECT_EQ(b.backoff(), want);
    EXPECT_EQ(b.next_probe(), At(now, want));
    now = b.next_probe();
  }
  EXPECT_TRUE(b.ProbeSucceeded());
  EXPECT_TRUE(b.closed());
  // The next outage starts from the minimum again.
  EXPECT_TRUE(b.CallFailed(b.epoch(), now));
  EXPECT_EQ(b.backoff(), kMin);
}

TEST(CircuitBreakerTest, AFailureFromBeforeARecoveryIsIgnored) {
  CircuitBreaker b(kMin, kMax);
  b.ProbeSucceeded();
  const uint64_t before = b.epoch();
  ASSERT_TRUE(b.CallFailed(before, kT0));
  ASSERT_TRUE(b.ProbeSucceeded());
  // A call that started before the outage fails late: Redis is back.
  EXPECT_FALSE(b.CallFailed(before, At(kT0, kMin)));
  EXPECT_TRUE(b.closed());
}

TEST(CircuitBreakerTest, ProbeResultsDoNotMatterWhileClosed) {
  CircuitBreaker b(kMin, kMax);
  b.ProbeSucceeded();
  b.ProbeFailed(kT0);
  EXPECT_TRUE(b.closed());
}

}  // namespace
}  // namespace idem
