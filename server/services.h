// The gRPC services: thin layers that validate and convert messages, call the
// coordinator and map absl::Status to grpc::Status (same numeric codes).
#ifndef IDEM_SERVER_SERVICES_H_
#define IDEM_SERVER_SERVICES_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/store.h"
#include "server/validation.h"

namespace idem {

// Same code, same message.
grpc::Status ToGrpc(const absl::Status& status);

// `idempotency.v1.Idempotency`. Does not own the coordinator.
class IdempotencyService final : public pb::Idempotency::Service {
 public:
  // `metrics` may be null.
  IdempotencyService(Coordinator* coordinator, Limits limits,
                     Metrics* metrics = nullptr)
      : coordinator_(coordinator), limits_(limits), metrics_(metrics) {}

  grpc::Status Begin(grpc::ServerContext* ctx, const pb::BeginRequest* req,
                     pb::BeginResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx,
                         const pb::HeartbeatRequest* req,
                         pb::HeartbeatResponse* resp) override;
  grpc::Status Complete(grpc::ServerContext* ctx,
                        const pb::CompleteRequest* req,
                        pb::CompleteResponse* resp) override;
  grpc::Status Fail(grpc::ServerContext* ctx, const pb::FailRequest* req,
                    pb::FailResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const pb::GetRequest* req,
                   pb::GetResponse* resp) override;

 private:
  Coordinator* const coordinator_;
  const Limits limits_;
  Metrics* const metrics_;
};

// `idempotency.v1.IdempotencyAdmin`. Does not own its arguments.
class IdempotencyAdminService final : public pb::IdempotencyAdmin::Service {
 public:
  // `metrics` may be null.
  IdempotencyAdminService(Coordinator* coordinator, Store* store, Limits limits,
                          Metrics* metrics = nullptr)
      : coordinator_(coordinator),
        store_(store),
        limits_(limits),
        metrics_(metrics) {}

  grpc::Status Resolve(grpc::ServerContext* ctx, const pb::ResolveRequest* req,
                       pb::ResolveResponse* resp) override;
  grpc::Status History(grpc::ServerContext* ctx, const pb::HistoryRequest* req,
                       pb::HistoryResponse* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const pb::ListRequest* req,
                    pb::ListResponse* resp) override;

 private:
  Coordinator* const coordinator_;
  Store* const store_;
  const Limits limits_;
  Metrics* const metrics_;
};

}  // namespace idem

#endif  // IDEM_SERVER_SERVICES_H_
