// One store read for the callers woken by the same change. When a record
// that many Begins wait on settles (Begin with `wait`, a hot key), every
// waiter wakes at once and reads it again; without sharing, each read is a
// statement of its own (hundreds at once on one key), and the last waiter
// answers only after all of them.
#ifndef IDEM_SERVER_SHARED_READS_H_
#define IDEM_SERVER_SHARED_READS_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "common/steady_wait.h"
#include "server/change_feed.h"
#include "server/store.h"
#include "statemachine/record.h"

namespace idem {

// Thread-safe. Does not own the store.
class SharedReads {
 public:
  explicit SharedReads(Store* store) : store_(store) {}
  SharedReads(const SharedReads&) = delete;
  SharedReads& operator=(const SharedReads&) = delete;

  // Reads `key` for a caller that `watch` woke with event number `event`
  // (ChangeFeed::Subscription::WaitUntil): joins a read of `key` that began
  // after that event was published, and so sees the change, or starts one.
  // A read that began earlier is never joined: it may predate the change.
  absl::StatusOr<StoreRead> Read(const RecordKey& key, uint64_t event,
                                 const ChangeFeed::Subscription& watch);

 private:
  struct Flight {
    uint64_t began_after;  // the feed's latest event when the read began
    bool done = false;
    absl::StatusOr<StoreRead> result;
    SteadyCondVar done_cv;
  };

  Store* const store_;
  SteadyMutex mu_;
  // The latest read of each key in flight.
  std::map<RecordKey, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace idem

#endif  // IDEM_SERVER_SHARED_READS_H_
