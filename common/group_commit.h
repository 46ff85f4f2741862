// Folds concurrent calls into batches, the way a database folds concurrent
// commits into one log flush. A caller queues its item; while fewer than
// `max_inflight` batches run, it leads: it takes up to `max_batch` queued
// items (oldest first, its own among them when it fits) and runs `flush` on
// them outside the lock. Other callers sleep until their item is done. There
// is no thread of its own: a batch runs on one of its callers' threads, so a
// lone call is flushed at once, alone, with no hand-off, and batches grow
// only while earlier ones are in flight. Thread-safe.
#ifndef IDEM_COMMON_GROUP_COMMIT_H_
#define IDEM_COMMON_GROUP_COMMIT_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/steady_wait.h"
#include "common/thread_name.h"

namespace idem {

template <typename Item>
class GroupCommit {
 public:
  // Runs one batch: must finish every item of it (set its result); items
  // are not touched by anyone else meanwhile.
  using FlushFn = std::function<void(const std::vector<Item*>& batch)>;

  GroupCommit(size_t max_batch, int max_inflight, FlushFn flush)
      : max_batch_(max_batch < 1 ? 1 : max_batch),
        max_inflight_(max_inflight < 1 ? 1 : max_inflight),
        flush_(std::move(flush)) {}
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  // Returns once `item` has been flushed, in this thread's batch or another.
  void Run(Item* item) {
    Waiter self(item);
    SteadyMutexLock lock(&mu_);
    queue_.push_back(&self);
    if (leaders_ < max_inflight_) {
      ++leaders_;
      self.lead = true;
    }
    while (!self.done) {
      if (!self.lead) {
        self.cv.Wait(&lock);
        continue;
      }
      std::vector<Waiter*> batch = Take();
      if (batch.empty()) {
        // Our item is in another leader's batch: let newcomers lead.
        self.lead = false;
        --leaders_;
        continue;
      }
      std::vector<Item*> items;
      items.reserve(batch.size());
      for (Waiter* w : batch) items.push_back(w->item);
      lock.Unlock();
      flush_(items);
      lock.Lock();
      for (Waiter* w : batch) {
        w->done = true;
        if (w != &self) w->cv.Signal();
      }
    }
    if (self.lead) HandOver();
  }

 private:
  struct Waiter {
    explicit Waiter(Item* i) : item(i) {}
    Item* const item;
    // done and lead are guarded by the GroupCommit's mu_.
    bool done = false;
    bool lead = false;
    SteadyCondVar cv;
  };

  // Up to max_batch_ queued waiters, oldest first.
  std::vector<Waiter*> Take() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Waiter*> batch;
    while (!queue_.empty() && batch.size() < max_batch_) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    return batch;
  }

  // Passes a finished leader's turn to the oldest queued waiter that does
  // not lead already, or gives it up.
  void HandOver() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (Waiter* w : queue_) {
      if (!w->lead) {
        w->lead = true;
        w->cv.Signal();
        return;
      }
    }
    --leaders_;
  }

  const size_t max_batch_;
  const int max_inflight_;
  const FlushFn flush_;
  SteadyMutex mu_;
  std::deque<Waiter*> queue_ ABSL_GUARDED_BY(mu_);
  int leaders_ ABSL_GUARDED_BY(mu_) = 0;  // waiters with lead set
};

// The same folding for callers that must not wait: Submit() queues an item
// and returns; `threads` threads of its own take up to `max_batch` queued
// items at a time (oldest first) and run `flush` on them, which finishes
// each (typically by calling the item's completion). Batches grow while
// every thread is busy with one. The destructor flushes what is queued.
template <typename Item>
class BatchThreads {
 public:
  using FlushFn = std::function<void(std::vector<Item>& batch)>;

  // `name`: the threads' name (thread_name.h), or null.
  BatchThreads(size_t max_batch, int threads, FlushFn flush,
               const char* name = nullptr)
      : max_batch_(max_batch < 1 ? 1 : max_batch), flush_(std::move(flush)) {
    for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) {
      threads_.emplace_back([this, name] {
        NameThisThread(name);
        Work();
      });
    }
  }
  BatchThreads(const BatchThreads&) = delete;
  BatchThreads& operator=(const BatchThreads&) = delete;
  ~BatchThreads() {
    {
      SteadyMutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.SignalAll();
    for (std::thread& t : threads_) t.join();
  }

  // Whether no item is queued or being flushed (a hint: it may change at
  // once).
  bool Quiet() const { return pending_.load(std::memory_order_relaxed) == 0; }

  void Submit(Item item) {
    pending_.fetch_add(1, std::memory_order_relaxed);
    {
      SteadyMutexLock lock(&mu_);
      queue_.push_back(std::move(item));
      // One wake-up per idle thread: a thread already woken takes this item
      // with the others (a futex call per item cost more than the item).
      if (idle_ == waking_) return;
      ++waking_;
    }
    cv_.Signal();
  }

 private:
  void Work() {
    SteadyMutexLock lock(&mu_);
    while (true) {
      if (queue_.empty()) {
        if (stopping_) return;
        ++idle_;
        cv_.Wait(&lock);
        // Every return from wait counts, spurious ones too, so waking_
        // never exceeds the wake-ups still to come.
        --idle_;
        if (waking_ > 0) --waking_;
        continue;
      }
      std::vector<Item> batch;
      const size_t n = std::min(max_batch_, queue_.size());
      batch.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      lock.Unlock();
      flush_(batch);
      pending_.fetch_sub(static_cast<int>(n), std::memory_order_relaxed);
      lock.Lock();
    }
  }

  const size_t max_batch_;
  const FlushFn flush_;
  SteadyMutex mu_;
  SteadyCondVar cv_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;    // threads waiting for work
  int waking_ ABSL_GUARDED_BY(mu_) = 0;  // of them, notified but not yet up
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Items submitted and not yet flushed.
  std::atomic<int> pending_{0};
  std::vector<std::thread> threads_;
};

}  // namespace idem

#endif  // IDEM_COMMON_GROUP_COMMIT_H_
