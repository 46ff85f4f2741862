// The sidecar's short periodic jobs share one thread (thread_names::kTimer)
// instead of sleeping on one thread each: the statement watchdog of every
// PostgreSQL pool, the console's vitals sampler and the tokens file watch.
// Turns run one at a time, so a job's turn delays the others' by its own
// length: a job belongs here only if its turn is short and bounded (no
// network wait, no Await); docs/threading.md gives each job's bound. Jobs
// that may wait (the health ping, the reaper, the reconciler's probes) keep
// threads of their own.
#ifndef IDEM_SERVER_BASE_PERIODIC_H_
#define IDEM_SERVER_BASE_PERIODIC_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"

namespace idem {

class PeriodicJob {
 public:
  // Runs `turn` every `period` on the shared thread, the first time one
  // period from now. A turn that ends late is not made up for: the next one
  // is due a period after the one missed.
  PeriodicJob(absl::Duration period, std::function<void()> turn);
  // No turn starts after this returns, and one running has ended. Not from
  // a turn.
  ~PeriodicJob();
  PeriodicJob(const PeriodicJob&) = delete;
  PeriodicJob& operator=(const PeriodicJob&) = delete;

 private:
  struct State;
  static void Schedule(const std::shared_ptr<State>& state);
  static void Turn(const std::shared_ptr<State>& state);

  const std::shared_ptr<State> state_;
};

}  // namespace idem

#endif  // IDEM_SERVER_BASE_PERIODIC_H_
