// An in-memory Store with the PostgreSQL store's semantics, for unit tests and
// --store=memory. Single process, not durable.
#ifndef IDEM_SERVER_STORE_MEMORY_STORE_H_
#define IDEM_SERVER_STORE_MEMORY_STORE_H_

#include <functional>
#include <memory>

#include "absl/time/clock.h"
#include "server/store/store.h"

namespace idem {

// Returns a new, empty store whose "now" is `clock()` (tests pass a fake).
std::unique_ptr<Store> NewMemoryStore(std::function<absl::Time()> clock = [] {
  return absl::Now();
});

}  // namespace idem

#endif  // IDEM_SERVER_STORE_MEMORY_STORE_H_
