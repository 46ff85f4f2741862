// Runs callbacks at steady-clock times on one thread of its own, so that
// something that must happen later (a parked call's deadline) holds a heap
// entry, not a sleeping thread. Callbacks run one at a time and must not
// block; a cancelled timer's callback never runs after Cancel returned
// (unless it is the one running on the timer's own thread). Thread-safe.
#ifndef IDEM_COMMON_TIMER_QUEUE_H_
#define IDEM_COMMON_TIMER_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/steady_wait.h"
#include "common/thread_name.h"

namespace idem {

class TimerQueue {
 public:
  using Id = uint64_t;

  // `name`: the thread's name (thread_name.h).
  explicit TimerQueue(const char* name) {
    thread_ = std::thread([this, name] {
      NameThisThread(name);
      Run();
    });
  }
  // Drops the timers not yet due and joins the thread.
  ~TimerQueue() {
    {
      SteadyMutexLock lock(&mu_);
      stopping_ = true;
      changed_.SignalAll();
    }
    thread_.join();
  }
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` at `at` (at once if it has passed); returns its id for Cancel.
  Id Schedule(SteadyTime at, std::function<void()> fn) {
    SteadyMutexLock lock(&mu_);
    const Id id = ++last_id_;
    const bool first = timers_.empty() || at < timers_.begin()->first.first;
    timers_.emplace(std::make_pair(at, id), std::move(fn));
    due_.emplace(id, at);
    if (first) changed_.Signal();
    return id;
  }

  // Forgets timer `id` if it has not run yet; returns whether it had not.
  bool Cancel(Id id) {
    SteadyMutexLock lock(&mu_);
    auto it = due_.find(id);
    if (it == due_.end()) return false;
    timers_.erase(std::make_pair(it->second, id));
    due_.erase(it);
    return true;
  }

  // Timers not yet run.
  size_t size() {
    SteadyMutexLock lock(&mu_);
    return timers_.size();
  }

 private:
  void Run() {
    SteadyMutexLock lock(&mu_);
    while (!stopping_) {
      if (timers_.empty()) {
        changed_.WaitUntil(&lock, SteadyTime::max(),
                           [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                             return stopping_ || !timers_.empty();
                           });
        continue;
      }
      const SteadyTime due = timers_.begin()->first.first;
      if (SteadyClock::now() < due) {
        changed_.WaitUntil(&lock, due,
                           [this, due]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                             return stopping_ || timers_.empty() ||
                                    timers_.begin()->first.first < due;
                           });
        continue;
      }
      std::function<void()> fn = std::move(timers_.begin()->second);
      due_.erase(timers_.begin()->first.second);
      timers_.erase(timers_.begin());
      lock.Unlock();
      fn();
      fn = nullptr;
      lock.Lock();
    }
  }

  SteadyMutex mu_;
  SteadyCondVar changed_;
  // By (due time, id): ids keep timers due at the same time apart.
  std::map<std::pair<SteadyTime, Id>, std::function<void()>> timers_
      ABSL_GUARDED_BY(mu_);
  // Each pending timer's due time, by id (Cancel).
  absl::flat_hash_map<Id, SteadyTime> due_ ABSL_GUARDED_BY(mu_);
  Id last_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace idem

#endif  // IDEM_COMMON_TIMER_QUEUE_H_
