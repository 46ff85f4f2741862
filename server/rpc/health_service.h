// grpc.health.v1.Health on gRPC's synchronous API, in place of gRPC's default
// health service. That one is a callback service in gRPC 1.51: its mere
// presence starts callback threads that poll and take requests meant for our
// completion-queue threads; a synchronous service does not.
#ifndef IDEM_SERVER_RPC_HEALTH_SERVICE_H_
#define IDEM_SERVER_RPC_HEALTH_SERVICE_H_

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "common/steady_wait.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/base/metrics.h"

namespace idem {

// Behaves like gRPC's default health service: "" starts SERVING; Check on a
// name never set fails with NOT_FOUND; Watch sends the current status
// (SERVICE_UNKNOWN for a name never set), then each change. Changes closer
// together than a Watch can send them may be coalesced: a watcher always gets
// the latest status, not necessarily every one in between.
//
// Shutdown() sets every name NOT_SERVING (one never set stays unknown),
// ignores later SetServingStatus calls, and ends every Watch with OK (after it
// sent the final status), so that grpc::Server::Shutdown need not wait for
// them; a Watch started later sends the status and ends at once. Each open
// Watch holds a sync-server thread; it returns within about 100 ms of its
// client going away. Past `max_watches` open at once, a Watch is refused
// with RESOURCE_EXHAUSTED, so that open streams cannot take the threads
// that Check and the admin service need.
//
// Thread-safe. Must outlive the grpc::Server it is registered with.
class HealthService final : public grpc::health::v1::Health::Service,
                            public grpc::HealthCheckServiceInterface {
 public:
  // `metrics` may be null.
  explicit HealthService(int max_watches = 64, Metrics* metrics = nullptr);
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*
                         writer) override;

  // Sets (and registers, on first use) the status of `service_name`.
  void SetServingStatus(const std::string& service_name, bool serving) override;
  // Sets the status of every name set so far, "" included.
  void SetServingStatus(bool serving) override;
  // Every name NOT_SERVING for good; ends open Watch calls.
  void Shutdown() override;

 private:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  ServingStatus StatusLocked(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SteadyMutex mu_;
  // Signalled on every change of a status and on Shutdown().
  SteadyCondVar changed_;
  // Serving or not, by name; a name absent was never set.
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  const int max_watches_;
  Metrics* const metrics_;
  int watches_ ABSL_GUARDED_BY(mu_) = 0;  // open Watch streams
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_HEALTH_SERVICE_H_
