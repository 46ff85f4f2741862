#include "server/core/calls.h"

#include <utility>

#include "server/core/begin_waiters.h"

namespace idem {

// Known only here: callers hold it, the waiters see its ticket.
class Calls::Wait {
 public:
  explicit Wait(SteadyTime until) : until(until) {}

  const SteadyTime until;
  BeginWaiters::Ticket ticket;
};

namespace {

// The ticket inside `wait`, sharing its ownership: one allocation for both.
std::shared_ptr<BeginWaiters::Ticket> TicketOf(
    const std::shared_ptr<Calls::Wait>& wait) {
  return std::shared_ptr<BeginWaiters::Ticket>(wait, &wait->ticket);
}

}  // namespace

Calls::Calls(RecordStore* records, ChangeFeed* feed, const PolicySet* policies,
             CoreMetrics* metrics, CallsOptions options)
    : coordinator_(records, policies, metrics, options.coordinator),
      waiters_(std::make_unique<BeginWaiters>(&coordinator_, records, feed,
                                              options.waiters, metrics)) {}

Calls::~Calls() = default;

std::shared_ptr<Calls::Wait> Calls::NewWait(SteadyTime until) const {
  return std::make_shared<Wait>(until);
}

void Calls::Cancel(const std::shared_ptr<Wait>& wait) {
  if (wait != nullptr) waiters_->Cancel(TicketOf(wait));
}

void Calls::Begin(const RecordKey& key, BeginCommand cmd,
                  std::shared_ptr<Wait> wait, BeginFn done,
                  bool cache_checked) {
  if (wait == nullptr) {
    coordinator_.Begin(key, std::move(cmd), std::move(done), cache_checked);
    return;
  }
  // The waiters take the first answer: they pass it on, or park on it.
  coordinator_.Begin(
      key, cmd,
      [this, key, cmd, wait = std::move(wait),
       done = std::move(done)](absl::StatusOr<BeginResult> result) mutable {
        waiters_->Settle(
            TicketOf(wait), key, cmd, std::move(result), wait->until,
            [done = std::move(done)](const absl::StatusOr<BeginResult>& r) {
              done(r);
            });
      },
      cache_checked);
}

void Calls::Shutdown() { waiters_->Shutdown(); }

int64_t Calls::parked() { return waiters_->parked(); }

}  // namespace idem
