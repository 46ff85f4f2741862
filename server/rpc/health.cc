#include "server/rpc/health.h"

#include "common/thread_name.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"

namespace idem {

HealthMonitor::HealthMonitor(AdminStore* store,
                             grpc::HealthCheckServiceInterface* health,
                             absl::Duration interval)
    : store_(store), health_(health), interval_(interval) {
  // gRPC starts "" as SERVING; nothing is ready until the store answered.
  // The first ping runs on the thread, so a hanging store cannot delay the
  // caller (the sidecar's main thread, which must still take SIGTERM).
  for (const std::string& name : HealthServiceNames()) {
    health_->SetServingStatus(name, false);
  }
  health_->SetServingStatus(kLivenessService, true);
  thread_ = std::thread([this] {
    NameThisThread(thread_names::kHealth);
    do {
      Check();
    } while (!stop_.WaitForNotificationWithTimeout(interval_));
  });
}

HealthMonitor::~HealthMonitor() { Stop(); }

void HealthMonitor::Stop() {
  {
    SteadyMutexLock lock(&mu_);
    if (!stopped_) {
      stopped_ = true;
      for (const std::string& name : HealthServiceNames()) {
        health_->SetServingStatus(name, false);
      }
      health_->SetServingStatus(kLivenessService, false);
    }
  }
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void HealthMonitor::Check() {
  absl::Status s = store_->Ping();
  const bool serving = s.ok();
  if (!checked_ || serving != serving_) {
    if (serving) {
      Log(LogLevel::kInfo, "store reachable: SERVING");
    } else {
      Log(LogLevel::kError, "store unreachable: NOT_SERVING",
          {{"error", std::string(s.message())}});
    }
  }
  serving_ = serving;
  checked_ = true;
  SteadyMutexLock lock(&mu_);
  if (stopped_) return;
  for (const std::string& name : HealthServiceNames()) {
    health_->SetServingStatus(name, serving);
  }
}

}  // namespace idem
