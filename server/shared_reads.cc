#include "server/shared_reads.h"

#include <utility>

namespace idem {

absl::StatusOr<StoreRead> SharedReads::Read(
    const RecordKey& key, uint64_t event,
    const ChangeFeed::Subscription& watch) {
  std::shared_ptr<Flight> flight;
  {
    SteadyMutexLock lock(&mu_);
    auto it = flights_.find(key);
    if (it != flights_.end() && it->second->began_after >= event) {
      flight = it->second;
      // The leader's Read always returns (the store bounds its statements);
      // the deadline only stands in for an untimed wait.
      while (!flight->done) {
        flight->done_cv.WaitUntil(
            &lock, SteadyDeadline(absl::Hours(1)),
            [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return flight->done; });
      }
      return flight->result;
    }
    flight = std::make_shared<Flight>();
    // Taken before the read starts: every event up to this number was
    // published before the read, so the read sees its change.
    flight->began_after = watch.LatestEvent();
    flights_[key] = flight;
  }
  absl::StatusOr<StoreRead> result = store_->Read(key);
  SteadyMutexLock lock(&mu_);
  flight->result = result;
  flight->done = true;
  flight->done_cv.SignalAll();
  auto it = flights_.find(key);
  if (it != flights_.end() && it->second == flight) flights_.erase(it);
  return result;
}

}  // namespace idem
