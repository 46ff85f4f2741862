#include "common/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace idem {
namespace {

// Waits up to 5 s for `cond`.
template <typename Cond>
bool Eventually(Cond cond) {
  const SteadyTime deadline = SteadyDeadline(absl::Seconds(5));
  while (!cond()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ThreadPoolTest, RunsEveryTaskAndTheDestructorWaitsForThem) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(4, absl::Seconds(10));
    for (int i = 0; i < 1000; ++i) pool.Submit([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 1000);
}

TEST(ThreadPoolTest, BlockingTasksGetThreadsUpToTheCapThenQueue) {
  ThreadPool pool(3, absl::Seconds(10));
  SteadyNotification release;
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  for (int i = 0; i < 5; ++i) {
    pool.Submit([&] {
      ++started;
      release.WaitForNotificationWithTimeout(absl::Seconds(10));
      ++finished;
    });
  }
  // Three run at once, each on its own thread; two wait for a thread.
  ASSERT_TRUE(Eventually([&] { return started.load() == 3; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(started.load(), 3);
  EXPECT_EQ(pool.threads(), 3);
  release.Notify();
  ASSERT_TRUE(Eventually([&] { return finished.load() == 5; }));
}

TEST(ThreadPoolTest, IdleThreadsEnd) {
  ThreadPool pool(8, absl::Milliseconds(50));
  SteadyNotification release;
  std::atomic<int> started{0};
  for (int i = 0; i < 8; ++i) {
    pool.Submit([&] {
      ++started;
      release.WaitForNotificationWithTimeout(absl::Seconds(10));
    });
  }
  ASSERT_TRUE(Eventually([&] { return started.load() == 8; }));
  EXPECT_EQ(pool.threads(), 8);
  release.Notify();
  EXPECT_TRUE(Eventually([&] { return pool.threads() == 0; }));
  // And new work starts a thread again.
  std::atomic<bool> ran{false};
  pool.Submit([&] { ran = true; });
  EXPECT_TRUE(Eventually([&] { return ran.load(); }));
}

TEST(ThreadPoolTest, AnIdleThreadTakesTheNextTask) {
  ThreadPool pool(8, absl::Seconds(10));
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i) {
    pool.Submit([&] { ++ran; });
    ASSERT_TRUE(Eventually([&] { return ran.load() == i + 1; }));
  }
  // One at a time: one thread served them all.
  EXPECT_EQ(pool.threads(), 1);
}

}  // namespace
}  // namespace idem
