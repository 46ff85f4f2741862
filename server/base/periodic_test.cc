#include "server/base/periodic.h"

#include <pthread.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"

namespace idem {
namespace {

std::string ThisThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

TEST(PeriodicJobTest, RunsEveryPeriodOnTheSharedThread) {
  std::atomic<int> turns{0};
  SteadyMutex mu;
  std::string thread;
  SteadyNotification three;
  {
    PeriodicJob job(absl::Milliseconds(5), [&] {
      {
        SteadyMutexLock lock(&mu);
        thread = ThisThreadName();
      }
      if (++turns == 3) three.Notify();
    });
    ASSERT_TRUE(three.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  const int stopped_at = turns.load();
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(turns.load(), stopped_at);
  SteadyMutexLock lock(&mu);
  EXPECT_EQ(thread, "idem-timer");
}

// Two jobs take turns on the one thread: never two turns at once.
TEST(PeriodicJobTest, TurnsNeverOverlap) {
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};
  std::atomic<int> turns{0};
  auto turn = [&] {
    if (++running > 1) overlapped = true;
    absl::SleepFor(absl::Milliseconds(1));
    --running;
    ++turns;
  };
  {
    PeriodicJob a(absl::Milliseconds(2), turn);
    PeriodicJob b(absl::Milliseconds(3), turn);
    const SteadyTime until = SteadyDeadline(absl::Seconds(10));
    while (turns.load() < 20 && SteadyClock::now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  EXPECT_GE(turns.load(), 20);
  EXPECT_FALSE(overlapped.load());
}

// The destructor waits for a turn under way: what the turn uses may go
// right after.
TEST(PeriodicJobTest, StoppingWaitsForTheTurnUnderWay) {
  SteadyNotification started;
  std::atomic<bool> ended{false};
  auto job = std::make_unique<PeriodicJob>(absl::Milliseconds(1), [&] {
    if (started.HasBeenNotified()) return;
    started.Notify();
    absl::SleepFor(absl::Milliseconds(50));
    ended = true;
  });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  job.reset();
  EXPECT_TRUE(ended.load());
}

}  // namespace
}  // namespace idem
