// GroupCommit: every item flushed exactly once, batches within bounds, no
// more batches in flight than allowed, a lone call flushed at once on its own
// thread; BatchThreads: every item flushed once, off its caller's thread,
// none left queued while its threads sleep; and PgArray's literal escaping.
#include "common/group_commit.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/postgres/pg_batch.h"

namespace idem {
namespace {

// Raises `max` to `v` if `v` is larger.
template <typename T>
void RaiseTo(std::atomic<T>& max, T v) {
  T seen = max.load();
  while (v > seen && !max.compare_exchange_weak(seen, v)) {
  }
}

struct Item {
  int id = 0;
  int flushed = 0;
  std::thread::id flushed_on;
};

TEST(GroupCommitTest, LoneCallIsFlushedAloneOnItsOwnThread) {
  std::vector<size_t> sizes;
  GroupCommit<Item> group(64, 1, [&](const std::vector<Item*>& batch) {
    sizes.push_back(batch.size());
    for (Item* item : batch) {
      ++item->flushed;
      item->flushed_on = std::this_thread::get_id();
    }
  });
  for (int i = 0; i < 3; ++i) {
    Item item;
    group.Run(&item);
    EXPECT_EQ(item.flushed, 1);
    EXPECT_EQ(item.flushed_on, std::this_thread::get_id());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 1, 1}));
}

TEST(GroupCommitTest, ConcurrentCallsShareBatchesWithinBounds) {
  constexpr int kThreads = 32;
  constexpr int kCalls = 200;
  constexpr size_t kMaxBatch = 8;
  constexpr int kInflight = 2;
  std::atomic<int> inflight{0};
  std::atomic<int> max_inflight{0};
  std::atomic<size_t> max_size{0};
  std::atomic<int> batches{0};
  GroupCommit<Item> group(
      kMaxBatch, kInflight, [&](const std::vector<Item*>& batch) {
        RaiseTo(max_inflight, ++inflight);
        RaiseTo(max_size, batch.size());
        ++batches;
        // A slow flush, so that calls pile up behind it.
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        for (Item* item : batch) ++item->flushed;
        --inflight;
      });
  std::vector<std::vector<Item>> items(kThreads, std::vector<Item>(kCalls));
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (Item& item : items[t]) {
        group.Run(&item);
        EXPECT_EQ(item.flushed, 1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& per_thread : items) {
    for (const Item& item : per_thread) ASSERT_EQ(item.flushed, 1);
  }
  EXPECT_LE(max_inflight.load(), kInflight);
  EXPECT_LE(max_size.load(), kMaxBatch);
  EXPECT_GT(max_size.load(), 1u) << "no call ever waited for another";
  EXPECT_LT(batches.load(), kThreads * kCalls);
}

TEST(BatchThreadsTest, FlushesEveryItemOnceInBoundedBatchesOffTheCaller) {
  constexpr int kSubmitters = 8;
  constexpr int kItems = 500;
  constexpr size_t kMaxBatch = 16;
  std::atomic<int> flushed{0};
  std::atomic<size_t> max_size{0};
  std::atomic<int> batches{0};
  std::atomic<int> on_caller{0};
  std::vector<std::atomic<int>> seen(size_t{kSubmitters} * kItems);
  std::vector<std::thread::id> submitters(kSubmitters);
  {
    BatchThreads<std::pair<int, std::thread::id>> group(
        kMaxBatch, 2, [&](std::vector<std::pair<int, std::thread::id>>& b) {
          RaiseTo(max_size, b.size());
          ++batches;
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          for (const auto& [id, from] : b) {
            ++seen[id];
            ++flushed;
            if (from == std::this_thread::get_id()) ++on_caller;
          }
        });
    std::vector<std::thread> threads;
    threads.reserve(kSubmitters);
    for (int t = 0; t < kSubmitters; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kItems; ++i) {
          group.Submit({t * kItems + i, std::this_thread::get_id()});
        }
      });
    }
    for (std::thread& t : threads) t.join();
    // The destructor flushes whatever is still queued.
  }
  EXPECT_EQ(flushed.load(), kSubmitters * kItems);
  for (const std::atomic<int>& n : seen) ASSERT_EQ(n.load(), 1);
  EXPECT_EQ(on_caller.load(), 0);
  EXPECT_LE(max_size.load(), kMaxBatch);
  EXPECT_GT(max_size.load(), 1u) << "no batch ever held two items";
  EXPECT_LT(batches.load(), kSubmitters * kItems);
}

// Submit wakes an idle thread only when none is being woken already; a
// miscount would leave an item queued while every thread sleeps. Items come
// one at a time (each waits on the idle pool) and in bursts from several
// threads, with flushes short enough for wake-ups to overlap.
TEST(BatchThreadsTest, NoItemWaitsWhileEveryThreadSleeps) {
  std::mutex mu;
  std::condition_variable cv;
  int flushed = 0;
  BatchThreads<int> group(4, 2, [&](std::vector<int>& b) {
    std::lock_guard<std::mutex> lock(mu);
    flushed += static_cast<int>(b.size());
    cv.notify_all();
  });
  const auto flushed_within = [&](int want) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(5),
                       [&] { return flushed >= want; });
  };
  int submitted = 0;
  for (int round = 0; round < 300; ++round) {
    if (round % 3 == 0) {
      group.Submit(++submitted);
    } else {
      std::vector<std::thread> burst;
      burst.reserve(3);
      for (int t = 0; t < 3; ++t) {
        burst.emplace_back([&group] {
          for (int i = 0; i < 5; ++i) group.Submit(i);
        });
      }
      for (std::thread& t : burst) t.join();
      submitted += 15;
    }
    ASSERT_TRUE(flushed_within(submitted))
        << "round " << round << ": " << submitted << " submitted, " << flushed
        << " flushed after 5 s";
  }
}

TEST(BeginMixTest, ReadsFirstWhileMostBeginsFindTheirRecord) {
  BeginMix mix;
  EXPECT_FALSE(mix.ReadFirst());
  // Half replays: still inserts first.
  for (int i = 0; i < 100; ++i) mix.Observe(8, 16);
  EXPECT_FALSE(mix.ReadFirst());
  // Replays only: reads first after a few batches, and says so once.
  int changes = 0;
  for (int i = 0; i < 100; ++i) changes += mix.Observe(16, 16) ? 1 : 0;
  EXPECT_TRUE(mix.ReadFirst());
  EXPECT_EQ(changes, 1);
  // A mix of 60% stays on reads (hysteresis)...
  for (int i = 0; i < 100; ++i) mix.Observe(6, 10);
  EXPECT_TRUE(mix.ReadFirst());
  // ...new keys only switch back.
  changes = 0;
  for (int i = 0; i < 100; ++i) changes += mix.Observe(0, 16) ? 1 : 0;
  EXPECT_FALSE(mix.ReadFirst());
  EXPECT_EQ(changes, 1);
  EXPECT_FALSE(mix.Observe(0, 0));
}

TEST(PgArrayTest, QuotesAndEscapesEveryElement) {
  PgArray text;
  text.Text("plain");
  text.Text("quote\"d");
  text.Text("back\\slash");
  text.Text("NULL");
  text.Text("");
  EXPECT_EQ(text.Finish(), R"({"plain","quote\"d","back\\slash","NULL",""})");
  PgArray bytes;
  bytes.Bytes(std::string("\x00\xff\x10", 3));
  bytes.Bytes("");
  EXPECT_EQ(bytes.Finish(), R"({"\\x00ff10","\\x"})");
  PgArray numbers;
  numbers.Int(-1);
  numbers.Int(9007199254740993);
  numbers.Bool(true);
  numbers.Bool(false);
  EXPECT_EQ(numbers.Finish(), "{-1,9007199254740993,t,f}");
  EXPECT_EQ(PgArray().Finish(), "{}");
}

}  // namespace
}  // namespace idem
