#include "server/core/maintenance.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/thread_name.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "statemachine/transitions.h"

namespace idem {

absl::StatusOr<int> ReapOnce(MaintenanceStore* store, const PolicySet& policies,
                             int batch_size, const MaintenanceHooks& hooks) {
  const ExpireFn expire = [&policies](const Record& r, absl::Time now) {
    return DecideExpire(r, now, policies.For(r.key.operation), kActorReaper);
  };
  int total = 0;
  while (true) {
    absl::StatusOr<std::vector<Record>> batch =
        store->ExpireLeases(batch_size, expire);
    if (!batch.ok()) return batch.status();
    for (const Record& r : *batch) {
      Log(LogLevel::kInfo, "lease expired",
          {{"tenant", r.key.tenant},
           {"operation", r.key.operation},
           {"key", r.key.key},
           {"status", StatusName(r.status)},
           {"fencing_token", absl::StrCat(r.fencing_token)},
           {"actor", kActorReaper}});
      if (hooks.expired) hooks.expired(r);
    }
    total += static_cast<int>(batch->size());
    if (static_cast<int>(batch->size()) < batch_size) return total;
  }
}

absl::StatusOr<int> PurgeOnce(MaintenanceStore* store, int batch_size,
                              const MaintenanceHooks& hooks) {
  int total = 0;
  while (true) {
    absl::StatusOr<std::vector<RecordKey>> batch = store->Purge(batch_size);
    if (!batch.ok()) return batch.status();
    if (hooks.purged && !batch->empty()) hooks.purged(*batch);
    total += static_cast<int>(batch->size());
    if (static_cast<int>(batch->size()) < batch_size) return total;
  }
}

Maintenance::Maintenance(MaintenanceStore* store, const PolicySet* policies,
                         MaintenanceOptions options, MaintenanceHooks hooks)
    : store_(store),
      policies_(policies),
      options_(options),
      hooks_(std::move(hooks)),
      thread_([this] { Loop(); }) {}

Maintenance::~Maintenance() {
  stop_.Notify();
  thread_.join();
}

void Maintenance::Loop() {
  NameThisThread(thread_names::kMaintenance);
  SteadyTime next_reap = SteadyClock::now();
  SteadyTime next_purge = next_reap;
  SteadyTime next_stats = next_reap;
  while (true) {
    const SteadyTime wake = std::min({next_reap, next_purge, next_stats});
    if (stop_.WaitForNotificationWithDeadline(wake)) return;
    const SteadyTime now = SteadyClock::now();
    if (now >= next_reap) {
      absl::StatusOr<int> n =
          ReapOnce(store_, *policies_, options_.batch_size, hooks_);
      if (!n.ok()) {
        Log(LogLevel::kWarn, "reaper pass failed",
            {{"error", std::string(n.status().message())}});
      }
      next_reap = SteadyDeadline(options_.reaper_interval);
    }
    if (now >= next_purge) {
      absl::StatusOr<int> n = PurgeOnce(store_, options_.batch_size, hooks_);
      if (!n.ok()) {
        Log(LogLevel::kWarn, "purge pass failed",
            {{"error", std::string(n.status().message())}});
      } else if (*n > 0) {
        Log(LogLevel::kInfo, "purged expired records",
            {{"count", absl::StrCat(*n)}});
      }
      next_purge = SteadyDeadline(options_.purge_interval);
    }
    if (now >= next_stats) {
      absl::StatusOr<StoreStats> stats = store_->Stats();
      if (stats.ok() && hooks_.stats) hooks_.stats(*stats);
      next_stats = SteadyDeadline(options_.stats_interval);
    }
  }
}

}  // namespace idem
