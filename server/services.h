// The gRPC services: thin layers that check who is calling, validate and
// convert messages, call the coordinator and map absl::Status to
// grpc::Status (same numeric codes).
#ifndef IDEM_SERVER_SERVICES_H_
#define IDEM_SERVER_SERVICES_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "common/thread_pool.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "server/arena_messages.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/rate_limit.h"
#include "server/store.h"
#include "server/validation.h"

namespace idem {

// Same code, same message.
grpc::Status ToGrpc(const absl::Status& status);

// What both services use. Nothing is owned; a null pointer turns its feature
// off.
struct ServiceContext {
  Coordinator* coordinator = nullptr;
  Store* store = nullptr;  // admin reads (List, History)
  Limits limits;
  Metrics* metrics = nullptr;
  // Set: every call needs an identity (bearer token or client certificate)
  // whose role and tenants allow it.
  Authenticator* auth = nullptr;
  // Set: business calls are rate-limited per tenant.
  TenantRateLimiter* rate = nullptr;
  // Where the business calls' blocking work (database, Redis, Begin's wait)
  // runs; required by IdempotencyService.
  ThreadPool* blocking = nullptr;
};

// The caller's principal, from a bearer token ("authorization: Bearer ...")
// or the SANs of a verified client certificate; UNAUTHENTICATED when neither
// names one. With auth off, an anonymous operator of every tenant.
absl::StatusOr<Principal> Identify(const ServiceContext& c,
                                   const grpc::ServerContextBase& ctx);

// `idempotency.v1.Idempotency`, on gRPC's callback API: a handler runs on one
// of gRPC's few event threads and must not block, so each call hands its
// blocking part to ServiceContext::blocking and finishes from there. Most
// Begins never reach that pool: the in-process cache answers on the event
// thread, Redis on its lookup threads, and Begin's first statement (which
// settles a new key and a replay) runs and finishes on the PostgreSQL
// store's batch threads. So do the holder's Heartbeat, Complete and Fail
// when this instance granted the record (Coordinator::CompleteAsync).
class IdempotencyService final : public pb::Idempotency::CallbackService {
 public:
  explicit IdempotencyService(ServiceContext c) : c_(c) {
    if (!kProtoArenas) return;
    SetMessageAllocatorFor_Begin(&begin_messages_);
    SetMessageAllocatorFor_Heartbeat(&heartbeat_messages_);
    SetMessageAllocatorFor_Complete(&complete_messages_);
    SetMessageAllocatorFor_Fail(&fail_messages_);
  }

  grpc::ServerUnaryReactor* Begin(grpc::CallbackServerContext* ctx,
                                  const pb::BeginRequest* req,
                                  pb::BeginResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const pb::HeartbeatRequest* req,
                                      pb::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* Complete(grpc::CallbackServerContext* ctx,
                                     const pb::CompleteRequest* req,
                                     pb::CompleteResponse* resp) override;
  grpc::ServerUnaryReactor* Fail(grpc::CallbackServerContext* ctx,
                                 const pb::FailRequest* req,
                                 pb::FailResponse* resp) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx,
                                const pb::GetRequest* req,
                                pb::GetResponse* resp) override;

 private:
  // Identity, key, tenant access and rate limit: the checks every call makes
  // before its own validation.
  absl::StatusOr<RecordKey> Admit(const grpc::ServerContextBase& ctx,
                                  const pb::RecordKey& key, bool has_key);
  // Runs `call` on the blocking pool and finishes the RPC with its status;
  // its latency, queueing included, is observed as `method`.
  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx,
                                    const char* method,
                                    std::function<grpc::Status()> call);

  // A holder's call (Heartbeat, Complete, Fail) `method` on `key`, its
  // command parsed by `parse`: admitted and parsed on gRPC's thread, then
  // run by the coordinator's non-blocking form `async` or, when that cannot
  // settle it, by `blocking` on the pool; `respond` fills the response from
  // the record written.
  template <typename Cmd>
  struct HolderMethods {
    const char* method;
    std::function<absl::StatusOr<Cmd>()> parse;
    std::function<bool(const RecordKey&, const Cmd&, Coordinator::HolderFn)>
        async;
    std::function<absl::StatusOr<Record>(const RecordKey&, const Cmd&)>
        blocking;
    std::function<void(const Record&)> respond;
  };
  template <typename Cmd>
  grpc::ServerUnaryReactor* Holder(grpc::CallbackServerContext* ctx,
                                   const pb::RecordKey& key, bool has_key,
                                   HolderMethods<Cmd> m);

  grpc::Status DoGet(const grpc::ServerContextBase& ctx,
                     const pb::GetRequest* req, pb::GetResponse* resp);

  const ServiceContext c_;
  // The hot methods' messages live on per-call arenas.
  ArenaMessages<pb::BeginRequest, pb::BeginResponse> begin_messages_;
  ArenaMessages<pb::HeartbeatRequest, pb::HeartbeatResponse>
      heartbeat_messages_;
  ArenaMessages<pb::CompleteRequest, pb::CompleteResponse> complete_messages_;
  ArenaMessages<pb::FailRequest, pb::FailResponse> fail_messages_;
};

// `idempotency.v1.IdempotencyAdmin`.
class IdempotencyAdminService final : public pb::IdempotencyAdmin::Service {
 public:
  explicit IdempotencyAdminService(ServiceContext c) : c_(c) {}

  grpc::Status Resolve(grpc::ServerContext* ctx, const pb::ResolveRequest* req,
                       pb::ResolveResponse* resp) override;
  grpc::Status History(grpc::ServerContext* ctx, const pb::HistoryRequest* req,
                       pb::HistoryResponse* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const pb::ListRequest* req,
                    pb::ListResponse* resp) override;

 private:
  const ServiceContext c_;
};

}  // namespace idem

#endif  // IDEM_SERVER_SERVICES_H_
