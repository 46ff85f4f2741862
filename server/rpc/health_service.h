// grpc.health.v1.Health on the sidecar's completion-queue threads
// (async_server.h), in place of gRPC's default health service. That one is
// a callback service in gRPC 1.51: its mere presence starts callback
// threads that poll and take requests meant for our completion-queue
// threads. Here an open Watch is a stream's state on one of those threads,
// not a thread of its own (docs/decisions/0016-async-health-streams.md).
#ifndef IDEM_SERVER_RPC_HEALTH_SERVICE_H_
#define IDEM_SERVER_RPC_HEALTH_SERVICE_H_

#include <grpcpp/health_check_service_interface.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/steady_wait.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/rpc/async_server.h"
#include "server/rpc/rpc_metrics.h"

namespace idem {

// Behaves like gRPC's default health service: "" starts SERVING; Check on a
// name never set fails with NOT_FOUND; Watch sends the current status
// (SERVICE_UNKNOWN for a name never set), then each change. Changes closer
// together than a Watch can send them may be coalesced: a watcher always gets
// the latest status, not necessarily every one in between, and never the
// same one twice in a row.
//
// Shutdown() sets every name NOT_SERVING (one never set stays unknown),
// ignores later SetServingStatus calls, and ends every Watch with OK (after it
// sent the final status), so that grpc::Server::Shutdown need not wait for
// them; a Watch started later sends the status and ends at once. A Watch
// whose client goes away frees its slot as soon as gRPC notices. Past
// `max_watches` open at once, a Watch is refused with RESOURCE_EXHAUSTED.
// Neither method counts against the AsyncServer's in-flight bound, so
// Check answers while business calls saturate the instance.
//
// Thread-safe. Must outlive the grpc::Server it is registered with.
class HealthService final : public grpc::health::v1::Health::AsyncService,
                            public grpc::HealthCheckServiceInterface {
 public:
  // `metrics` may be null.
  explicit HealthService(int max_watches = 64, RpcMetrics* metrics = nullptr);
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // Serves Check and Watch on `server`'s threads: after registering this
  // service with the builder, before server->Start().
  void ServeOn(AsyncServer* server);

  // Sets (and registers, on first use) the status of `service_name`.
  void SetServingStatus(const std::string& service_name, bool serving) override;
  // Sets the status of every name set so far, "" included.
  void SetServingStatus(bool serving) override;
  // Every name NOT_SERVING for good; ends open Watch calls.
  void Shutdown() override;

 private:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
  using CheckRpc = AsyncCall<grpc::health::v1::HealthCheckRequest,
                             grpc::health::v1::HealthCheckResponse>;
  using WatchRpc = AsyncStream<grpc::health::v1::HealthCheckRequest,
                               grpc::health::v1::HealthCheckResponse>;

  void HandleCheck(CheckRpc* call);
  void HandleWatch(WatchRpc* stream);
  // Sets `name` to `serving` and wakes its watchers if that changed it.
  void SetLocked(const std::string& name, bool* value, bool serving)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ServingStatus StatusLocked(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountWatchesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SteadyMutex mu_;
  // Serving or not, by name; a name absent was never set.
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  const int max_watches_;
  RpcMetrics* const metrics_;
  // Open Watch streams by the name they watch. A stream is here until it is
  // finished, and alive while it is here.
  absl::flat_hash_map<std::string, absl::flat_hash_set<WatchRpc*>> watchers_
      ABSL_GUARDED_BY(mu_);
  int watches_ ABSL_GUARDED_BY(mu_) = 0;  // open Watch streams
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_HEALTH_SERVICE_H_
