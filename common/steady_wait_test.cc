#include "common/steady_wait.h"

#include <thread>

#include "gtest/gtest.h"

namespace idem {
namespace {

// How long `fn` takes on the steady clock.
template <typename Fn>
absl::Duration Took(Fn fn) {
  const SteadyTime start = SteadyClock::now();
  fn();
  return SteadySince(start);
}

TEST(SteadyDeadlineTest, Saturates) {
  const SteadyTime now = SteadyClock::now();
  EXPECT_EQ(SteadyDeadline(absl::InfiniteDuration(), now), SteadyTime::max());
  EXPECT_EQ(SteadyDeadline(absl::Hours(24 * 365 * 1000), now),
            SteadyTime::max());
  EXPECT_EQ(SteadyDeadline(-absl::InfiniteDuration(), now), now);
  EXPECT_EQ(SteadyDeadline(absl::ZeroDuration(), now), now);
  EXPECT_EQ(SteadyDeadline(absl::Milliseconds(1500), now),
            now + std::chrono::milliseconds(1500));
  EXPECT_EQ(SteadyLeft(now - std::chrono::seconds(1)), absl::ZeroDuration());
  EXPECT_GT(SteadyLeft(SteadyDeadline(absl::Seconds(10))), absl::Seconds(9));
}

TEST(SteadyNotificationTest, TimesOutAfterTheTimeout) {
  SteadyNotification n;
  bool notified = true;
  const absl::Duration took = Took([&] {
    notified = n.WaitForNotificationWithTimeout(absl::Milliseconds(200));
  });
  EXPECT_FALSE(notified);
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_FALSE(n.HasBeenNotified());
}

TEST(SteadyNotificationTest, NotifyWakesAWaiter) {
  SteadyNotification n;
  std::thread notifier([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    n.Notify();
  });
  bool notified = false;
  const absl::Duration took = Took(
      [&] { notified = n.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  notifier.join();
  EXPECT_TRUE(notified);
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_TRUE(n.HasBeenNotified());
  // Once notified, waits return at once, even an endless one.
  EXPECT_TRUE(n.WaitForNotificationWithTimeout(absl::InfiniteDuration()));
}

TEST(SteadyCondVarTest, WaitsForTheConditionOrTheTimeout) {
  SteadyMutex mu;
  SteadyCondVar cv;
  int value = 0;
  {
    SteadyMutexLock lock(&mu);
    bool met = true;
    const absl::Duration took = Took([&] {
      met = cv.WaitFor(&lock, absl::Milliseconds(200),
                       [&] { return value == 1; });
    });
    EXPECT_FALSE(met);
    EXPECT_GE(took, absl::Milliseconds(200));
    EXPECT_LT(took, absl::Seconds(2));
  }
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    SteadyMutexLock lock(&mu);
    value = 1;
    cv.Signal();
  });
  SteadyMutexLock lock(&mu);
  EXPECT_TRUE(cv.WaitFor(&lock, absl::Seconds(30), [&] { return value == 1; }));
  setter.join();
}

}  // namespace
}  // namespace idem
