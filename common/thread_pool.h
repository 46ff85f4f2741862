// A pool of threads for blocking work handed off by callers that must not
// block (gRPC's callback handlers). Threads start on demand, up to
// `max_threads`, and end after `idle_timeout` without work, so a burst of
// long waits does not leave a thousand idle threads behind. Tasks run in
// submission order; past max_threads they queue. Thread-safe.
#ifndef IDEM_COMMON_THREAD_POOL_H_
#define IDEM_COMMON_THREAD_POOL_H_

#include <algorithm>
#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "common/thread_name.h"

namespace idem {

class ThreadPool {
 public:
  // `name`: the threads' name (thread_name.h), or null.
  ThreadPool(int max_threads, absl::Duration idle_timeout,
             const char* name = nullptr)
      : max_threads_(std::max(1, max_threads)),
        idle_timeout_(idle_timeout),
        name_(name) {}
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs every task submitted so far, then waits for the threads to end.
  ~ThreadPool() {
    SteadyMutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
    // Threads are detached: each one signals as it ends.
    while (threads_ > 0) {
      ended_.WaitFor(&lock, absl::Seconds(1),
                     [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       return threads_ == 0;
                     });
    }
  }

  void Submit(std::function<void()> task) {
    SteadyMutexLock lock(&mu_);
    queue_.push_back(std::move(task));
    if (idle_ > static_cast<int>(queue_.size()) - 1) {
      work_.Signal();
      return;
    }
    if (threads_ < max_threads_) {
      ++threads_;
      std::thread([this] { Work(); }).detach();
    }
  }

  // Threads running now (busy or idle).
  int threads() {
    SteadyMutexLock lock(&mu_);
    return threads_;
  }

 private:
  void Work() {
    NameThisThread(name_);
    SteadyMutexLock lock(&mu_);
    while (true) {
      if (queue_.empty()) {
        if (stopping_) break;
        ++idle_;
        const bool woken = work_.WaitFor(
            &lock, idle_timeout_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return !queue_.empty() || stopping_;
            });
        --idle_;
        if (!woken) break;
        continue;
      }
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      lock.Unlock();
      task();
      task = nullptr;
      lock.Lock();
    }
    --threads_;
    ended_.SignalAll();
  }

  const int max_threads_;
  const absl::Duration idle_timeout_;
  const char* const name_;
  SteadyMutex mu_;
  SteadyCondVar work_;
  SteadyCondVar ended_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int threads_ ABSL_GUARDED_BY(mu_) = 0;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace idem

#endif  // IDEM_COMMON_THREAD_POOL_H_
