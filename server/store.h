// The storage interface behind the coordinator. Implementations: PostgreSQL
// (the source of truth), memory (unit tests and --store=memory) and, later, a
// Redis cache decorator. All methods are thread-safe.
#ifndef IDEM_SERVER_STORE_H_
#define IDEM_SERVER_STORE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "statemachine/record.h"
#include "statemachine/transitions.h"

namespace idem {

// A record (absent: nullopt) read together with the store's clock.
struct StoreRead {
  std::optional<Record> record;
  absl::Time now;
};

// Errors: UNAVAILABLE when the store cannot be reached or did not answer in
// time (the caller may retry the same call); INTERNAL for anything else.
class Store {
 public:
  virtual ~Store() = default;

  // Reads the record named by `key` and the store's current time.
  virtual absl::StatusOr<StoreRead> Read(const RecordKey& key) = 0;

  // Applies `write` atomically if its guard still holds (without a guard: if
  // the record does not exist yet), with the store's clock as "now", and
  // writes its audit row in the same transaction. Returns the record as
  // written, or nullopt when the guard did not hold (read again and decide
  // again). An acknowledged write is durable.
  virtual absl::StatusOr<std::optional<Record>> Apply(const Write& write) = 0;

  // Returns OK when the store answers.
  virtual absl::Status Ping() = 0;

  // The audit entries of one record, oldest first.
  virtual absl::StatusOr<std::vector<AuditEntry>> History(
      const RecordKey& key) = 0;
};

}  // namespace idem

#endif  // IDEM_SERVER_STORE_H_
