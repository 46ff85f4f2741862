// Timed waits on std::chrono::steady_clock. Abseil 20220623's timed waits
// (Mutex::AwaitWithTimeout, CondVar::WaitWithTimeout,
// Notification::WaitForNotificationWithTimeout, ...) sleep until a wall-clock
// deadline: a backward clock step makes them sleep that much longer, a
// forward one returns them at once. These waits ignore the wall clock.
#ifndef IDEM_COMMON_STEADY_WAIT_H_
#define IDEM_COMMON_STEADY_WAIT_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace idem {

using SteadyClock = std::chrono::steady_clock;
using SteadyTime = SteadyClock::time_point;

// `d` after `from`; saturates, so an infinite or huge `d` means never.
inline SteadyTime SteadyDeadline(absl::Duration d,
                                 SteadyTime from = SteadyClock::now()) {
  if (d <= absl::ZeroDuration()) return from;
  if (d >= absl::FromChrono(SteadyTime::max() - from)) return SteadyTime::max();
  return from + std::chrono::duration_cast<SteadyClock::duration>(
                    absl::ToChronoNanoseconds(d));
}

// How long since `start`.
inline absl::Duration SteadySince(SteadyTime start) {
  return absl::FromChrono(SteadyClock::now() - start);
}

// How long until `deadline` (zero once it has passed).
inline absl::Duration SteadyLeft(SteadyTime deadline) {
  const SteadyTime now = SteadyClock::now();
  return deadline > now ? absl::FromChrono(deadline - now)
                        : absl::ZeroDuration();
}

// A std::mutex that thread-safety annotations (ABSL_GUARDED_BY) accept.
// Lock it with SteadyMutexLock.
class ABSL_LOCKABLE SteadyMutex {
 private:
  friend class SteadyMutexLock;
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE SteadyMutexLock {
 public:
  explicit SteadyMutexLock(SteadyMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : lock_(mu->mu_) {}
  ~SteadyMutexLock() ABSL_UNLOCK_FUNCTION() {}
  // Releases the mutex for a stretch of work, and takes it back.
  void Unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }
  SteadyMutexLock(const SteadyMutexLock&) = delete;
  SteadyMutexLock& operator=(const SteadyMutexLock&) = delete;

 private:
  friend class SteadyCondVar;
  std::unique_lock<std::mutex> lock_;
};

class SteadyCondVar {
 public:
  // Releases `lock` until signalled (or woken spuriously), like
  // std::condition_variable::wait.
  void Wait(SteadyMutexLock* lock) { cv_.wait(lock->lock_); }
  // Releases `lock` until `cond()` holds (checked with the lock held) or
  // `deadline` passes; returns `cond()`.
  template <typename Cond>
  bool WaitUntil(SteadyMutexLock* lock, SteadyTime deadline, Cond cond) {
    return cv_.wait_until(lock->lock_, deadline, std::move(cond));
  }
  template <typename Cond>
  bool WaitFor(SteadyMutexLock* lock, absl::Duration timeout, Cond cond) {
    return WaitUntil(lock, SteadyDeadline(timeout), std::move(cond));
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A one-shot event, like absl::Notification, with steady timed waits.
class SteadyNotification {
 public:
  void Notify() {
    SteadyMutexLock lock(&mu_);
    notified_ = true;
    cv_.SignalAll();
  }
  bool HasBeenNotified() const {
    SteadyMutexLock lock(&mu_);
    return notified_;
  }
  // Returns true if notified before `deadline` or `timeout`.
  bool WaitForNotificationWithDeadline(SteadyTime deadline) {
    SteadyMutexLock lock(&mu_);
    return cv_.WaitUntil(
        &lock, deadline,
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notified_; });
  }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    return WaitForNotificationWithDeadline(SteadyDeadline(timeout));
  }

 private:
  mutable SteadyMutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  SteadyCondVar cv_;
};

}  // namespace idem

#endif  // IDEM_COMMON_STEADY_WAIT_H_
