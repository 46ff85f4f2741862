// Record counts of a store, read cheaply for the metrics.
#ifndef IDEM_SERVER_STORE_STORE_STATS_H_
#define IDEM_SERVER_STORE_STORE_STATS_H_

#include <cstdint>
#include <map>

#include "absl/time/time.h"
#include "statemachine/record.h"

namespace idem {

// Counts for metrics, read cheaply in one statement.
struct StoreStats {
  std::map<Status, int64_t> records;
  // Age of the oldest UNKNOWN record (by updated_at); zero when none.
  absl::Duration oldest_unknown_age = absl::ZeroDuration();
};

}  // namespace idem

#endif  // IDEM_SERVER_STORE_STORE_STATS_H_
