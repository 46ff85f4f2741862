// Waits for a call that answers through a completion. For tests and tools
// that run on threads of their own: never on a thread that serves calls or
// runs a store's completions (it would wait for itself).
#ifndef IDEM_COMMON_AWAIT_H_
#define IDEM_COMMON_AWAIT_H_

#include <optional>
#include <utility>

#include "common/steady_wait.h"

namespace idem {

// Calls `start(done)` and returns the value `done` is called with (exactly
// once, on any thread).
template <typename T, typename Start>
T Await(Start&& start) {
  SteadyMutex mu;
  SteadyCondVar cv;
  std::optional<T> out;
  std::forward<Start>(start)([&](T value) {
    SteadyMutexLock lock(&mu);
    out.emplace(std::move(value));
    cv.SignalAll();
  });
  SteadyMutexLock lock(&mu);
  while (!out) cv.Wait(&lock);
  return *std::move(out);
}

}  // namespace idem

#endif  // IDEM_COMMON_AWAIT_H_
