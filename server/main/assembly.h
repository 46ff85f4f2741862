// The running sidecar, assembled from a validated configuration: the store
// and its caches, the coordinator, the gRPC and HTTP servers and the
// background loops, as parts that start in order and stop in reverse.
#ifndef IDEM_SERVER_MAIN_ASSEMBLY_H_
#define IDEM_SERVER_MAIN_ASSEMBLY_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/console/console.h"
#include "server/core/calls.h"
#include "server/core/maintenance.h"
#include "server/core/reconciler.h"
#include "server/gateway/gateway.h"
#include "server/main/config_validation.h"
#include "server/main/parts.h"
#include "server/main/sidecar_resources.h"
#include "server/metrics/metrics.h"
#include "server/rpc/async_server.h"
#include "server/rpc/health.h"
#include "server/rpc/health_service.h"
#include "server/rpc/rate_limit.h"
#include "server/rpc/services.h"
#include "server/store/store.h"

namespace idem {

// Applies the pending migrations to `conninfo`; logs what it applied.
absl::Status RunMigrations(const std::string& conninfo);

// Built and stopped on one thread (main's); the parts it starts run their
// own threads.
class Sidecar {
 public:
  // Builds every part and starts none; with --migrate (and the PostgreSQL
  // store) applies the migrations first.
  static absl::StatusOr<std::unique_ptr<Sidecar>> Build(
      SidecarOptions options, SidecarResources resources);
  // Stop().
  ~Sidecar();
  Sidecar(const Sidecar&) = delete;
  Sidecar& operator=(const Sidecar&) = delete;

  // Starts the parts in the order of PartNames(): metrics, the background
  // loops, the gRPC server, the gateway, the console, and last the health
  // monitor, which reports SERVING. On a failure stops those started, in
  // reverse, and returns why (e.g. "cannot listen on ...").
  absl::Status Start();

  // Stops the started parts in reverse: NOT_SERVING, --drain-delay of
  // serving on, parked calls answered; then the gateway and the gRPC server
  // (each given --grace-period), the background loops and the metrics.
  void Stop();

  // The parts in the order they start.
  std::vector<std::string> PartNames() const { return parts_.Names(); }

 private:
  Sidecar(SidecarOptions options, SidecarResources resources);
  // Makes the store, the caches, the coordinator and the services.
  void BuildCore();
  // Makes the gRPC server's services and queues; nothing listens yet.
  void BuildServers();
  // Lists the parts and what starting and stopping each does.
  void AddParts();
  void LogServing() const;

  const SidecarOptions options_;
  SidecarResources resources_;
  TenantRateLimiter rate_limiter_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<Store> store_;
  // The caches, each over the one below it (Redis over store_, the
  // in-process cache over Redis or store_); null when off.
  std::unique_ptr<RecordStore> redis_cache_;
  std::unique_ptr<RecordStore> local_cache_;
  // The coordinator's records: the top of that chain.
  RecordStore* records_ = nullptr;
  // Every call's entry point: the coordinator and the parked Begins.
  std::unique_ptr<Calls> calls_;
  std::unique_ptr<IdempotencyService> service_;
  std::unique_ptr<IdempotencyAdminService> admin_;
  std::unique_ptr<HealthService> health_service_;
  // Made after reflection's plugin is registered, which builders pick up
  // when constructed.
  std::unique_ptr<grpc::ServerBuilder> builder_;
  // The bound port, set by BuildAndStart (0: --listen could not be bound).
  int port_ = 0;
  grpc::ResourceQuota quota_{"idempotency-sidecar"};
  std::unique_ptr<AsyncServer> rpcs_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Maintenance> maintenance_;
  std::unique_ptr<Reconciler> reconciler_;
  std::unique_ptr<gateway::Gateway> gateway_;
  // What the admin service is given, for the console too.
  ServiceContext context_;
  std::unique_ptr<console::Vitals> vitals_;
  std::unique_ptr<console::Console> console_;
  std::unique_ptr<HealthMonitor> health_;
  Parts parts_;
};

}  // namespace idem

#endif  // IDEM_SERVER_MAIN_ASSEMBLY_H_
