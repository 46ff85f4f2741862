// Keeps grpc.health.v1 in step with the store: NOT_SERVING while the store
// does not answer a ping, SERVING once it does again.
#ifndef IDEM_SERVER_RPC_HEALTH_H_
#define IDEM_SERVER_RPC_HEALTH_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "server/store/store.h"

namespace idem {

// SERVING while the process runs and is not shutting down, whatever the
// store's state: for liveness probes, which must not restart a sidecar
// because PostgreSQL is down.
inline constexpr char kLivenessService[] = "liveness";

// The services whose health follows the store, besides the overall "" entry.
inline const std::vector<std::string>& HealthServiceNames() {
  static const std::vector<std::string>* names = new std::vector<std::string>{
      "", "idempotency.v1.Idempotency", "idempotency.v1.IdempotencyAdmin"};
  return *names;
}

// Pings `store` every `interval` on its own thread and sets the serving
// status of every name in HealthServiceNames(): NOT_SERVING from
// construction until the first ping answers. Stop() (or the destructor)
// marks everything NOT_SERVING at once, for a graceful shutdown, even while a
// ping hangs on an unresponsive store; then it ends the thread.
class HealthMonitor {
 public:
  HealthMonitor(AdminStore* store, grpc::HealthCheckServiceInterface* health,
                absl::Duration interval);
  ~HealthMonitor();
  void Stop();

 private:
  void Check();

  AdminStore* const store_;
  grpc::HealthCheckServiceInterface* const health_;
  const absl::Duration interval_;
  SteadyNotification stop_;
  std::thread thread_;
  // Orders Check()'s status updates with Stop(): none lands after Stop().
  SteadyMutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Only touched by Check(), on one thread at a time.
  bool serving_ = false;
  bool checked_ = false;
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_HEALTH_H_
