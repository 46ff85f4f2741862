// The gRPC services: thin layers that check who is calling, validate and
// convert messages, call core (Calls) and map absl::Status to grpc::Status
// (same numeric codes).
#ifndef IDEM_SERVER_RPC_SERVICES_H_
#define IDEM_SERVER_RPC_SERVICES_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "server/core/calls.h"
#include "server/rpc/async_server.h"
#include "server/rpc/auth.h"
#include "server/rpc/rate_limit.h"
#include "server/rpc/rpc_metrics.h"
#include "server/rpc/validation.h"
#include "server/store/store.h"

namespace idem {

// Same code, same message.
grpc::Status ToGrpc(const absl::Status& status);

// What both services use. Nothing is owned; a null pointer turns its feature
// off.
struct ServiceContext {
  // Where every call goes; required.
  Calls* calls = nullptr;
  AdminStore* admin_store = nullptr;  // admin reads (List, History)
  Limits limits;
  RpcMetrics* metrics = nullptr;
  // Set: every call needs an identity (bearer token or client certificate)
  // whose role and tenants allow it.
  Authenticator* auth = nullptr;
  // Set: business calls are rate-limited per tenant.
  TenantRateLimiter* rate = nullptr;
};

// Authorize, counting a refusal in idem_auth_failures_total.
absl::Status Allowed(const ServiceContext& c, const Principal& caller,
                     bool admin, const std::string& tenant);

// The caller's principal, from a bearer token ("authorization: Bearer ...")
// or the SANs of a verified client certificate; UNAUTHENTICATED (counted in
// idem_auth_failures_total) when neither names one. With auth off, an
// anonymous operator of every tenant.
absl::StatusOr<Principal> Identify(const ServiceContext& c,
                                   const grpc::ServerContextBase& ctx);

// `idempotency.v1.Idempotency`, on the completion-queue API (async_server.h):
// a call is taken on one of the sidecar's RPC threads, which must not block.
// The caches answer a replay there, in place (one Redis round trip for every
// Begin a thread had ready); everything else goes on to core (Calls), whose
// store calls run on the store's threads, and the call is finished from the
// thread that learns its answer. A Begin with `wait` carries a Calls::Wait
// that the caller's hang-up cancels. No call holds a thread while it waits.
class IdempotencyService final : public pb::Idempotency::AsyncService {
 public:
  using BeginRpc = AsyncCall<pb::BeginRequest, pb::BeginResponse>;
  using HeartbeatRpc = AsyncCall<pb::HeartbeatRequest, pb::HeartbeatResponse>;
  using CompleteRpc = AsyncCall<pb::CompleteRequest, pb::CompleteResponse>;
  using FailRpc = AsyncCall<pb::FailRequest, pb::FailResponse>;
  using GetRpc = AsyncCall<pb::GetRequest, pb::GetResponse>;

  explicit IdempotencyService(ServiceContext c) : c_(c) {}

  // Serves every method on `server`'s threads; this service must be
  // registered with the same builder.
  void ServeOn(AsyncServer* server);

  // The handlers: each finishes every call it is given, now or later.
  // HandleBegins' cache lookups share one round trip on this thread; what the
  // caches cannot answer goes on to the store.
  void HandleBegins(const std::vector<BeginRpc*>& calls);
  void HandleHeartbeat(HeartbeatRpc* call);
  void HandleComplete(CompleteRpc* call);
  void HandleFail(FailRpc* call);
  void HandleGet(GetRpc* call);

 private:
  // Identity, key, tenant access and rate limit: the checks every call makes
  // before its own validation.
  absl::StatusOr<RecordKey> Admit(const grpc::ServerContextBase& ctx,
                                  const pb::RecordKey& key, bool has_key);

  // A holder's call (Heartbeat, Complete, Fail) `method`, its command
  // parsed by `parse`: admitted and parsed on the RPC thread, then run by
  // core (`run`); `respond` fills the response from the record written.
  template <typename Cmd>
  struct HolderMethods {
    const char* method;
    std::function<absl::StatusOr<Cmd>()> parse;
    std::function<void(const RecordKey&, Cmd, Calls::RecordFn)> run;
    std::function<void(const Record&)> respond;
  };
  template <typename Req, typename Resp, typename Cmd>
  void Holder(AsyncCall<Req, Resp>* rpc, HolderMethods<Cmd> m);

  const ServiceContext c_;
};

// `idempotency.v1.IdempotencyAdmin`, on the same completion-queue threads:
// Resolve runs through core (Calls), History and List on the store's
// admin threads (AdminStore), and each call is finished from there.
class IdempotencyAdminService final
    : public pb::IdempotencyAdmin::AsyncService {
 public:
  using ResolveRpc = AsyncCall<pb::ResolveRequest, pb::ResolveResponse>;
  using HistoryRpc = AsyncCall<pb::HistoryRequest, pb::HistoryResponse>;
  using ListRpc = AsyncCall<pb::ListRequest, pb::ListResponse>;

  // Past `max_in_flight` calls taken and not yet answered (0: no bound), a
  // call is answered RESOURCE_EXHAUSTED at once: operators' tools cannot
  // pile up store work, and business calls do not count here.
  explicit IdempotencyAdminService(ServiceContext c, int64_t max_in_flight = 0)
      : c_(c), max_in_flight_(max_in_flight) {}

  // Serves every method on `server`'s threads; this service must be
  // registered with the same builder.
  void ServeOn(AsyncServer* server);

  void HandleResolve(ResolveRpc* rpc);
  void HandleHistory(HistoryRpc* rpc);
  void HandleList(ListRpc* rpc);

 private:
  class InFlight;
  // A slot under max_in_flight_ for a call of `method`, held until the call
  // is answered; null past the bound.
  std::shared_ptr<InFlight> Admit(const char* method);
  // A call of `method` about one record, admitted, its caller identified
  // and allowed on the record's tenant.
  struct KeyCall {
    std::shared_ptr<InFlight> slot;
    std::string caller;
    RecordKey key;
  };
  // Starts a KeyCall for the record named by `key` in a call with `context`:
  // OK and `out` filled, or the status to answer the call with.
  grpc::Status StartKeyCall(const char* method,
                            const grpc::ServerContextBase& context,
                            const pb::RecordKey& key, bool has_key,
                            KeyCall* out);

  const ServiceContext c_;
  const int64_t max_in_flight_;
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_SERVICES_H_
