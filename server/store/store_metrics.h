// What a store decorator reports: the time and failures of each operation.
// Implemented by the sidecar's Prometheus metrics (server/metrics/).
#ifndef IDEM_SERVER_STORE_STORE_METRICS_H_
#define IDEM_SERVER_STORE_STORE_METRICS_H_

#include <string>

#include "absl/time/time.h"

namespace idem {

class StoreMetrics {
 public:
  virtual ~StoreMetrics() = default;
  // idem_store_duration_seconds{store,op}; `store`: "postgres", "redis", ...
  virtual void ObserveStore(const std::string& store, const std::string& op,
                            absl::Duration d) = 0;
  // idem_store_errors_total{store,kind}; `kind`: "unavailable", "aborted",
  // "internal", ...
  virtual void StoreError(const std::string& store,
                          const std::string& kind) = 0;
};

}  // namespace idem

#endif  // IDEM_SERVER_STORE_STORE_METRICS_H_
