// Background work every sidecar runs: the reaper (leases that ran out ->
// the operation's expiry policy, audited with actor "reaper") and the purger
// (terminal records past expires_at). Both work in batches with
// FOR UPDATE SKIP LOCKED, so any number of instances may run them at once.
#ifndef IDEM_SERVER_CORE_MAINTENANCE_H_
#define IDEM_SERVER_CORE_MAINTENANCE_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "server/base/config.h"
#include "server/store/store.h"

namespace idem {

struct MaintenanceOptions {
  absl::Duration reaper_interval = absl::Seconds(1);
  absl::Duration purge_interval = absl::Seconds(60);
  absl::Duration stats_interval = absl::Seconds(15);
  int batch_size = 500;
};

// Observers of what the loops did (metrics, logs); all optional.
struct MaintenanceHooks {
  std::function<void(const Record&)> expired;
  std::function<void(const std::vector<RecordKey>&)> purged;
  std::function<void(const StoreStats&)> stats;
};

// Runs one reaper pass: batches until a batch comes back short. Returns the
// number of records expired.
absl::StatusOr<int> ReapOnce(MaintenanceStore* store, const PolicySet& policies,
                             int batch_size, const MaintenanceHooks& hooks);

// Runs one purge pass; returns the number of records deleted.
absl::StatusOr<int> PurgeOnce(MaintenanceStore* store, int batch_size,
                              const MaintenanceHooks& hooks);

// Runs ReapOnce, PurgeOnce and Stats on their intervals on one background
// thread until destroyed. Does not own its arguments.
class Maintenance {
 public:
  Maintenance(MaintenanceStore* store, const PolicySet* policies,
              MaintenanceOptions options, MaintenanceHooks hooks);
  ~Maintenance();
  Maintenance(const Maintenance&) = delete;
  Maintenance& operator=(const Maintenance&) = delete;

 private:
  void Loop();

  MaintenanceStore* const store_;
  const PolicySet* const policies_;
  const MaintenanceOptions options_;
  const MaintenanceHooks hooks_;
  SteadyNotification stop_;
  std::thread thread_;
};

}  // namespace idem

#endif  // IDEM_SERVER_CORE_MAINTENANCE_H_
