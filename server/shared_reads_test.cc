#include "server/shared_reads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/steady_wait.h"
#include "server/change_feed.h"
#include "server/memory_store.h"

namespace idem {
namespace {

// A store whose reads are counted and held until the gate opens.
class GatedStore : public StoreWrapper {
 public:
  GatedStore() : StoreWrapper(NewMemoryStore()) {}

  absl::StatusOr<StoreRead> Read(const RecordKey& key) override {
    ++reads_;
    gate_.WaitForNotificationWithTimeout(absl::Seconds(30));
    return StoreWrapper::Read(key);
  }

  // Waits until `n` reads have reached the store, for 5 s at most.
  void AwaitReads(int n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (reads_.load() < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  int reads() const { return reads_.load(); }
  void Open() { gate_.Notify(); }

 private:
  std::atomic<int> reads_{0};
  SteadyNotification gate_;  // annotated for TSan, unlike absl's
};

const RecordKey kKey{"t", "op", "k"};

TEST(SharedReadsTest, WaitersWokenByOneEventShareOneRead) {
  GatedStore store;
  SharedReads reads(&store);
  ChangeFeed feed;
  constexpr int kWaiters = 20;
  std::vector<std::unique_ptr<ChangeFeed::Subscription>> subs;
  subs.reserve(kWaiters);
  for (int i = 0; i < kWaiters; ++i) subs.push_back(feed.Subscribe(kKey));
  feed.Publish(kKey);
  std::vector<uint64_t> events;
  events.reserve(subs.size());
  for (auto& sub : subs)
    events.push_back(sub->WaitUntil(SteadyDeadline(absl::ZeroDuration())));
  ASSERT_GT(events[0], 0u);

  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  threads.emplace_back(
      [&] { ok += reads.Read(kKey, events[0], *subs[0]).ok(); });
  store.AwaitReads(1);
  for (int i = 1; i < kWaiters; ++i) {
    threads.emplace_back(
        [&, i] { ok += reads.Read(kKey, events[i], *subs[i]).ok(); });
  }
  // The others find the read in flight and wait for it.
  absl::SleepFor(absl::Milliseconds(300));
  store.Open();
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kWaiters);
  EXPECT_EQ(store.reads(), 1);
}

TEST(SharedReadsTest, AReadThatBeganBeforeTheEventIsNotJoined) {
  GatedStore store;
  SharedReads reads(&store);
  ChangeFeed feed;
  std::unique_ptr<ChangeFeed::Subscription> early = feed.Subscribe(kKey);
  std::unique_ptr<ChangeFeed::Subscription> late = feed.Subscribe(kKey);
  feed.Publish(kKey);
  const uint64_t first = early->WaitUntil(SteadyDeadline(absl::ZeroDuration()));
  late->WaitUntil(SteadyDeadline(absl::ZeroDuration()));
  std::thread before(
      [&] { EXPECT_TRUE(reads.Read(kKey, first, *early).ok()); });
  store.AwaitReads(1);
  // A change after that read began: its waiter must read again.
  feed.Publish(kKey);
  const uint64_t second = late->WaitUntil(SteadyDeadline(absl::ZeroDuration()));
  ASSERT_GT(second, first);
  std::thread after([&] { EXPECT_TRUE(reads.Read(kKey, second, *late).ok()); });
  store.AwaitReads(2);
  store.Open();
  before.join();
  after.join();
  EXPECT_EQ(store.reads(), 2);
}

TEST(SharedReadsTest, FinishedReadsAreForgotten) {
  GatedStore store;
  store.Open();
  SharedReads reads(&store);
  ChangeFeed feed;
  std::unique_ptr<ChangeFeed::Subscription> sub = feed.Subscribe(kKey);
  feed.Publish(kKey);
  const uint64_t event = sub->WaitUntil(SteadyDeadline(absl::ZeroDuration()));
  ASSERT_TRUE(reads.Read(kKey, event, *sub).ok());
  ASSERT_TRUE(reads.Read(kKey, event, *sub).ok());
  EXPECT_EQ(store.reads(), 2);
}

}  // namespace
}  // namespace idem
