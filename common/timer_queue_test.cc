#include "common/timer_queue.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"

namespace idem {
namespace {

TEST(TimerQueueTest, RunsTimersInDueOrder) {
  std::mutex mu;
  std::vector<int> order;
  SteadyNotification last;
  TimerQueue timers("test-timer");
  const SteadyTime now = SteadyClock::now();
  const auto record = [&](int n) {
    return [&, n] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(n);
      if (order.size() == 3) last.Notify();
    };
  };
  timers.Schedule(now + std::chrono::milliseconds(60), record(3));
  timers.Schedule(now + std::chrono::milliseconds(20), record(1));
  timers.Schedule(now + std::chrono::milliseconds(40), record(2));
  ASSERT_TRUE(last.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(TimerQueueTest, RunsNoEarlierThanDue) {
  TimerQueue timers("test-timer");
  const SteadyTime due = SteadyClock::now() + std::chrono::milliseconds(50);
  std::atomic<bool> early{true};
  SteadyNotification ran;
  timers.Schedule(due, [&] {
    early = SteadyClock::now() < due;
    ran.Notify();
  });
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(early);
}

TEST(TimerQueueTest, ACancelledTimerNeverRuns) {
  TimerQueue timers("test-timer");
  std::atomic<int> runs{0};
  const SteadyTime soon = SteadyClock::now() + std::chrono::milliseconds(30);
  const TimerQueue::Id cancelled = timers.Schedule(soon, [&] { ++runs; });
  SteadyNotification after;
  timers.Schedule(soon + std::chrono::milliseconds(20),
                  [&] { after.Notify(); });
  EXPECT_TRUE(timers.Cancel(cancelled));
  EXPECT_FALSE(timers.Cancel(cancelled));
  ASSERT_TRUE(after.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(runs.load(), 0);
  EXPECT_EQ(timers.size(), 0u);
}

TEST(TimerQueueTest, AnEarlierTimerScheduledLaterWakesTheThread) {
  TimerQueue timers("test-timer");
  timers.Schedule(SteadyClock::now() + std::chrono::hours(1), [] {});
  SteadyNotification ran;
  timers.Schedule(SteadyClock::now(), [&] { ran.Notify(); });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(timers.size(), 1u);
}

}  // namespace
}  // namespace idem
