#include "server/base/periodic.h"

#include <utility>

#include "common/steady_wait.h"
#include "common/timer_queue.h"
#include "server/base/thread_names.h"

namespace idem {
namespace {

// Started with the first job and never stopped: jobs come and go with the
// parts that own them (and with tests), the thread stays until exit.
TimerQueue& SharedTimer() {
  static TimerQueue* const timer = new TimerQueue(thread_names::kTimer);
  return *timer;
}

}  // namespace

struct PeriodicJob::State {
  State(absl::Duration p, std::function<void()> t)
      : period(p), turn(std::move(t)) {}

  const absl::Duration period;
  const std::function<void()> turn;
  SteadyMutex mu;
  // Signalled when a turn ends.
  SteadyCondVar idle;
  SteadyTime due ABSL_GUARDED_BY(mu) = SteadyClock::now();
  TimerQueue::Id timer ABSL_GUARDED_BY(mu) = 0;
  bool running ABSL_GUARDED_BY(mu) = false;
  bool stopped ABSL_GUARDED_BY(mu) = false;
};

PeriodicJob::PeriodicJob(absl::Duration period, std::function<void()> turn)
    : state_(std::make_shared<State>(period, std::move(turn))) {
  Schedule(state_);
}

PeriodicJob::~PeriodicJob() {
  SteadyMutexLock lock(&state_->mu);
  state_->stopped = true;
  SharedTimer().Cancel(state_->timer);
  while (state_->running) state_->idle.Wait(&lock);
}

void PeriodicJob::Schedule(const std::shared_ptr<State>& state) {
  SteadyMutexLock lock(&state->mu);
  if (state->stopped) return;
  const SteadyTime now = SteadyClock::now();
  state->due = SteadyDeadline(state->period, state->due);
  if (state->due <= now) state->due = SteadyDeadline(state->period, now);
  state->timer = SharedTimer().Schedule(state->due, [state] { Turn(state); });
}

void PeriodicJob::Turn(const std::shared_ptr<State>& state) {
  {
    SteadyMutexLock lock(&state->mu);
    if (state->stopped) return;
    state->running = true;
  }
  state->turn();
  {
    SteadyMutexLock lock(&state->mu);
    state->running = false;
    state->idle.SignalAll();
  }
  Schedule(state);
}

}  // namespace idem
