#include "server/rpc/services.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/log.h"
#include "server/rpc/admin_calls.h"
#include "server/wire/convert.h"
#include "server/wire/snapshot_validation.h"

namespace idem {
namespace {

LogFields KeyFields(const RecordKey& key) {
  return {
      {"tenant", key.tenant}, {"operation", key.operation}, {"key", key.key}};
}

// Whether an authentication failure may be logged now: at most one line a
// second for the process, so that a scanner cannot flood the log (every one
// is counted in idem_auth_failures_total). Sets `*skipped` to the failures
// left out since the last line.
bool AuthLogDue(int64_t* skipped) {
  static OncePerSecond limiter;
  return limiter.Due(skipped);
}

// Logs a failed call (client errors, a caller that hung up and a call
// refused at a bound at debug: a storm of them must not flood the log;
// authentication failures at warn, at most once a second; the rest as
// errors) and converts it.
grpc::Status Failed(const char* method, const RecordKey& key,
                    const absl::Status& status) {
  const bool client_error =
      status.code() == absl::StatusCode::kInvalidArgument ||
      status.code() == absl::StatusCode::kNotFound ||
      status.code() == absl::StatusCode::kFailedPrecondition ||
      status.code() == absl::StatusCode::kCancelled ||
      status.code() == absl::StatusCode::kResourceExhausted;
  const bool auth_failure =
      status.code() == absl::StatusCode::kUnauthenticated ||
      status.code() == absl::StatusCode::kPermissionDenied;
  int64_t skipped = 0;
  if (auth_failure && !AuthLogDue(&skipped)) return ToGrpc(status);
  LogFields fields = KeyFields(key);
  fields.emplace_back("method", method);
  fields.emplace_back("code", absl::StatusCodeToString(status.code()));
  fields.emplace_back("error", std::string(status.message()));
  if (auth_failure) {
    fields.emplace_back("auth_failures_not_logged", absl::StrCat(skipped));
  }
  Log(client_error   ? LogLevel::kDebug
      : auth_failure ? LogLevel::kWarn
                     : LogLevel::kError,
      "call failed", fields);
  return ToGrpc(status);
}

// The answer to an admin call past --max-admin-calls-in-flight.
grpc::Status Refused(const char* method, int64_t bound) {
  return Failed(method, {},
                absl::ResourceExhaustedError(absl::StrCat(
                    "too many admin calls in flight in this instance "
                    "(--max-admin-calls-in-flight=",
                    bound, ")")));
}

void LogTransition(const char* event, const Record& r) {
  LogFields fields = KeyFields(r.key);
  fields.emplace_back("status", StatusName(r.status));
  fields.emplace_back("fencing_token", absl::StrCat(r.fencing_token));
  Log(LogLevel::kInfo, event, fields);
}

// Fills Begin's response from `result` and counts it.
void RespondBegin(RpcMetrics* metrics, const RecordKey& key,
                  const BeginResult& result, pb::BeginResponse* resp) {
  if (metrics != nullptr) {
    metrics->BeginOutcome(key.operation, result.outcome);
    if (result.outcome == Outcome::kCompleted ||
        result.outcome == Outcome::kFailed) {
      metrics->Replay(result.cached ? result.cache_source : "postgres");
    }
  }
  resp->set_outcome(ToProto(result.outcome));
  ToProto(*result.record, result.outcome != Outcome::kMismatch,
          resp->mutable_record());
  if (result.outcome == Outcome::kAcquired) {
    resp->set_fencing_token(result.record->fencing_token);
    LogTransition("acquired", *result.record);
  } else if (result.outcome == Outcome::kInProgress) {
    *resp->mutable_retry_after() = DurationToProto(result.retry_after);
  }
}

// A Begin in flight: taken on an RPC thread (async_server.h), finished there
// or on the thread that core answers it from (Calls).
struct BeginCall {
  BeginCall(IdempotencyService::BeginRpc* c, RpcMetrics* m)
      : rpc(c), metrics(m), timer(m, "Begin") {}

  IdempotencyService::BeginRpc* const rpc;
  RpcMetrics* const metrics;
  const RpcTimer timer;
  RecordKey key;
  BeginCommand cmd;
  // Set for a Begin that may wait.
  std::shared_ptr<Calls::Wait> wait;
};

void FinishBegin(BeginCall& call, const absl::StatusOr<BeginResult>& result) {
  if (!result.ok()) {
    call.rpc->Finish(Failed("Begin", call.key, result.status()));
    return;
  }
  RespondBegin(call.metrics, call.key, *result, call.rpc->response());
  call.rpc->Finish(grpc::Status::OK);
}

// The principal named by the call's bearer token or client certificate.
absl::StatusOr<Principal> IdentifyCaller(const ServiceContext& c,
                                         const grpc::ServerContextBase& ctx) {
  std::string bearer;
  auto it = ctx.client_metadata().find("authorization");
  if (it != ctx.client_metadata().end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    if (!absl::StartsWith(value, "Bearer ")) {
      return absl::UnauthenticatedError(
          "authorization: expected \"Bearer <token>\"");
    }
    bearer = std::string(value.substr(7));
  }
  std::vector<std::string> sans;
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& san :
         auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
      sans.emplace_back(san.data(), san.size());
    }
  }
  return c.auth->Identify(bearer, sans);
}

}  // namespace

absl::StatusOr<Principal> Identify(const ServiceContext& c,
                                   const grpc::ServerContextBase& ctx) {
  if (c.auth == nullptr) return Principal{"anonymous", Role::kOperator, {"*"}};
  absl::StatusOr<Principal> caller = IdentifyCaller(c, ctx);
  if (!caller.ok() && c.metrics != nullptr) {
    c.metrics->AuthFailed("unauthenticated");
  }
  return caller;
}

absl::Status Allowed(const ServiceContext& c, const Principal& caller,
                     bool admin, const std::string& tenant) {
  absl::Status allowed = Authorize(caller, admin, tenant);
  if (!allowed.ok() && c.metrics != nullptr) {
    c.metrics->AuthFailed("permission_denied");
  }
  return allowed;
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::StatusOr<RecordKey> IdempotencyService::Admit(
    const grpc::ServerContextBase& ctx, const pb::RecordKey& key,
    bool has_key) {
  // Identity first: an unauthenticated caller learns nothing, not even
  // which field is wrong.
  absl::StatusOr<Principal> caller = Identify(c_, ctx);
  if (!caller.ok()) return caller.status();
  absl::StatusOr<RecordKey> parsed = ParseKey(key, has_key);
  if (!parsed.ok()) return parsed.status();
  absl::Status allowed = Allowed(c_, *caller, /*admin=*/false, parsed->tenant);
  if (!allowed.ok()) return allowed;
  if (c_.rate != nullptr &&
      !c_.rate->Allow(parsed->tenant, SteadyClock::now())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant ", parsed->tenant, " is over its rate limit"));
  }
  return parsed;
}

void IdempotencyService::ServeOn(AsyncServer* server) {
  using Self = IdempotencyService;
  using Async = pb::Idempotency::AsyncService;
  // Begin, the hot method, with more calls requested ahead; a waiting one
  // must learn when its caller hangs up.
  server->Add(
      this, &Async::RequestBegin,
      [this](const std::vector<BeginRpc*>& calls) { HandleBegins(calls); },
      {/*ahead=*/64, /*notify_when_done=*/true});
  server->Add(this, &Async::RequestHeartbeat,
              AsyncServer::Each(this, &Self::HandleHeartbeat));
  server->Add(this, &Async::RequestComplete,
              AsyncServer::Each(this, &Self::HandleComplete), {/*ahead=*/64});
  server->Add(this, &Async::RequestFail,
              AsyncServer::Each(this, &Self::HandleFail));
  server->Add(this, &Async::RequestGet,
              AsyncServer::Each(this, &Self::HandleGet));
}

void IdempotencyService::HandleBegins(const std::vector<BeginRpc*>& rpcs) {
  std::vector<std::shared_ptr<BeginCall>> calls;
  calls.reserve(rpcs.size());
  for (BeginRpc* rpc : rpcs) {
    auto call = std::make_shared<BeginCall>(rpc, c_.metrics);
    const grpc::ServerContext& ctx = rpc->context();
    const pb::BeginRequest& req = rpc->request();
    absl::StatusOr<RecordKey> key = Admit(ctx, req.key(), req.has_key());
    if (!key.ok()) {
      rpc->Finish(Failed("Begin", {}, key.status()));
      continue;
    }
    call->key = *std::move(key);
    absl::StatusOr<BeginCommand> cmd = ParseBegin(req, c_.calls->policies());
    if (!cmd.ok()) {
      rpc->Finish(Failed("Begin", call->key, cmd.status()));
      continue;
    }
    call->cmd = *std::move(cmd);
    if (req.has_wait()) {
      absl::Duration wait = FromProto(req.wait());
      // Answer in time for the caller's deadline, with a margin to deliver
      // it (gRPC gives the deadline on the wall clock: read it once, here).
      if (ctx.deadline() != std::chrono::system_clock::time_point::max()) {
        wait =
            std::min(wait, absl::FromChrono(ctx.deadline() -
                                            std::chrono::system_clock::now()) -
                               absl::Milliseconds(50));
      }
      if (wait > absl::ZeroDuration()) {
        call->wait = c_.calls->NewWait(SteadyDeadline(wait));
        rpc->OnCancel(
            [calls = c_.calls, wait = call->wait] { calls->Cancel(wait); });
      }
    }
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return;
  // A replay is answered by the caches, here; the rest goes to the store.
  std::vector<const RecordKey*> keys;
  std::vector<const BeginCommand*> cmds;
  keys.reserve(calls.size());
  cmds.reserve(calls.size());
  for (const auto& call : calls) {
    keys.push_back(&call->key);
    cmds.push_back(&call->cmd);
  }
  std::vector<std::optional<BeginResult>> cached =
      c_.calls->BeginFromCacheMany(keys, cmds);
  for (size_t i = 0; i < calls.size(); ++i) {
    std::shared_ptr<BeginCall>& call = calls[i];
    if (cached[i]) {
      FinishBegin(*call, *std::move(cached[i]));
      continue;
    }
    c_.calls->Begin(
        call->key, call->cmd, call->wait,
        [call](const absl::StatusOr<BeginResult>& result) {
          FinishBegin(*call, result);
        },
        /*cache_checked=*/true);
  }
}

template <typename Req, typename Resp, typename Cmd>
void IdempotencyService::Holder(AsyncCall<Req, Resp>* rpc,
                                HolderMethods<Cmd> m) {
  auto timer = std::make_shared<RpcTimer>(c_.metrics, m.method);
  const Req& req = rpc->request();
  absl::StatusOr<RecordKey> parsed =
      Admit(rpc->context(), req.key(), req.has_key());
  if (!parsed.ok()) {
    rpc->Finish(Failed(m.method, {}, parsed.status()));
    return;
  }
  absl::StatusOr<Cmd> cmd = m.parse();
  if (!cmd.ok()) {
    rpc->Finish(Failed(m.method, *parsed, cmd.status()));
    return;
  }
  m.run(*parsed, *std::move(cmd),
        [rpc, timer, method = m.method, key = *parsed,
         respond = m.respond](absl::StatusOr<Record> record) {
          if (!record.ok()) {
            rpc->Finish(Failed(method, key, record.status()));
            return;
          }
          respond(*record);
          rpc->Finish(grpc::Status::OK);
        });
}

void IdempotencyService::HandleHeartbeat(HeartbeatRpc* rpc) {
  const pb::HeartbeatRequest* req = &rpc->request();
  pb::HeartbeatResponse* resp = rpc->response();
  Holder(
      rpc,
      HolderMethods<HeartbeatCommand>{
          "Heartbeat",
          [this, req] { return ParseHeartbeat(*req, c_.calls->policies()); },
          [this](const RecordKey& k, HeartbeatCommand c, Calls::RecordFn done) {
            c_.calls->Heartbeat(k, c, std::move(done));
          },
          [resp](const Record& record) {
            *resp->mutable_lease_expires_at() =
                ToProto(record.lease_expires_at);
          }});
}

void IdempotencyService::HandleComplete(CompleteRpc* rpc) {
  const pb::CompleteRequest* req = &rpc->request();
  pb::CompleteResponse* resp = rpc->response();
  Holder(
      rpc,
      HolderMethods<CompleteCommand>{
          "Complete", [this, req] { return ParseComplete(*req, c_.limits); },
          [this](const RecordKey& k, CompleteCommand c, Calls::RecordFn done) {
            c_.calls->Complete(k, std::move(c), std::move(done));
          },
          [resp](const Record& record) {
            LogTransition("completed", record);
            ToProto(record, /*with_result=*/true, resp->mutable_record());
          }});
}

void IdempotencyService::HandleFail(FailRpc* rpc) {
  const pb::FailRequest* req = &rpc->request();
  pb::FailResponse* resp = rpc->response();
  Holder(rpc,
         HolderMethods<FailCommand>{
             "Fail", [this, req] { return ParseFail(*req, c_.limits); },
             [this](const RecordKey& k, FailCommand c, Calls::RecordFn done) {
               c_.calls->Fail(k, std::move(c), std::move(done));
             },
             [resp](const Record& record) {
               LogTransition("failed", record);
               ToProto(record, /*with_result=*/true, resp->mutable_record());
             }});
}

void IdempotencyService::HandleGet(GetRpc* rpc) {
  auto timer = std::make_shared<RpcTimer>(c_.metrics, "Get");
  absl::StatusOr<RecordKey> key =
      Admit(rpc->context(), rpc->request().key(), rpc->request().has_key());
  if (!key.ok()) {
    rpc->Finish(Failed("Get", {}, key.status()));
    return;
  }
  c_.calls->Get(*key, [rpc, timer, key = *key](absl::StatusOr<Record> record) {
    if (!record.ok()) {
      rpc->Finish(Failed("Get", key, record.status()));
      return;
    }
    ToProto(*record, /*with_result=*/true, rpc->response()->mutable_record());
    rpc->Finish(grpc::Status::OK);
  });
}

// An admin call in flight: timed, and counted until it is answered.
class IdempotencyAdminService::InFlight {
 public:
  InFlight(RpcMetrics* metrics, const char* method,
           std::atomic<int64_t>* in_flight)
      : timer_(metrics, method), in_flight_(in_flight) {}
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() { in_flight_->fetch_sub(1, std::memory_order_relaxed); }

 private:
  const RpcTimer timer_;
  std::atomic<int64_t>* const in_flight_;
};

std::shared_ptr<IdempotencyAdminService::InFlight>
IdempotencyAdminService::Admit(const char* method) {
  const int64_t now = in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
  auto slot = std::make_shared<InFlight>(c_.metrics, method, &in_flight_);
  if (max_in_flight_ > 0 && now > max_in_flight_) {
    if (c_.metrics != nullptr) c_.metrics->Refused("admin_calls_in_flight");
    return nullptr;
  }
  return slot;
}

void IdempotencyAdminService::ServeOn(AsyncServer* server) {
  using Self = IdempotencyAdminService;
  using Async = pb::IdempotencyAdmin::AsyncService;
  // Not counted against the business service's bound: operators must be
  // able to look and resolve while it is saturated. Bounded by Admit.
  AsyncMethodOptions options;
  options.ahead = 4;
  options.bounded = false;
  server->Add(this, &Async::RequestResolve,
              AsyncServer::Each(this, &Self::HandleResolve), options);
  server->Add(this, &Async::RequestHistory,
              AsyncServer::Each(this, &Self::HandleHistory), options);
  server->Add(this, &Async::RequestList,
              AsyncServer::Each(this, &Self::HandleList), options);
}

grpc::Status IdempotencyAdminService::StartKeyCall(
    const char* method, const grpc::ServerContextBase& context,
    const pb::RecordKey& key, bool has_key, KeyCall* out) {
  out->slot = Admit(method);
  if (out->slot == nullptr) return Refused(method, max_in_flight_);
  absl::StatusOr<Principal> caller = Identify(c_, context);
  if (!caller.ok()) return Failed(method, {}, caller.status());
  absl::StatusOr<RecordKey> parsed = ParseKey(key, has_key);
  if (!parsed.ok()) return Failed(method, {}, parsed.status());
  absl::Status allowed = Allowed(c_, *caller, /*admin=*/true, parsed->tenant);
  if (!allowed.ok()) return Failed(method, *parsed, allowed);
  out->caller = std::move(caller->name);
  out->key = *std::move(parsed);
  return grpc::Status::OK;
}

void IdempotencyAdminService::HandleResolve(ResolveRpc* rpc) {
  const pb::ResolveRequest& req = rpc->request();
  KeyCall call;
  grpc::Status started =
      StartKeyCall("Resolve", rpc->context(), req.key(), req.has_key(), &call);
  if (!started.ok()) return rpc->Finish(started);
  absl::StatusOr<ResolveCommand> cmd = ParseResolve(req, c_.limits);
  if (!cmd.ok()) return rpc->Finish(Failed("Resolve", call.key, cmd.status()));
  ResolveRecord(
      c_, call.key, *std::move(cmd), call.caller, /*via=*/nullptr,
      rpc->response(),
      [rpc, slot = call.slot, key = call.key](const absl::Status& s) {
        rpc->Finish(s.ok() ? grpc::Status::OK : Failed("Resolve", key, s));
      });
}

void IdempotencyAdminService::HandleHistory(HistoryRpc* rpc) {
  const pb::HistoryRequest& req = rpc->request();
  KeyCall call;
  grpc::Status started =
      StartKeyCall("History", rpc->context(), req.key(), req.has_key(), &call);
  if (!started.ok()) return rpc->Finish(started);
  absl::StatusOr<HistoryQuery> query = ParseHistory(req, call.key);
  if (!query.ok()) {
    return rpc->Finish(Failed("History", call.key, query.status()));
  }
  HistoryPage(
      c_, *query, rpc->response(),
      [rpc, slot = call.slot, key = call.key](const absl::Status& s) {
        rpc->Finish(s.ok() ? grpc::Status::OK : Failed("History", key, s));
      });
}

void IdempotencyAdminService::HandleList(ListRpc* rpc) {
  std::shared_ptr<InFlight> slot = Admit("List");
  if (slot == nullptr) return rpc->Finish(Refused("List", max_in_flight_));
  const pb::ListRequest& req = rpc->request();
  absl::StatusOr<Principal> caller = Identify(c_, rpc->context());
  if (!caller.ok()) return rpc->Finish(Failed("List", {}, caller.status()));
  absl::StatusOr<ListQuery> query = ParseList(req);
  if (!query.ok()) return rpc->Finish(Failed("List", {}, query.status()));
  absl::Status allowed = Allowed(c_, *caller, /*admin=*/true, query->tenant);
  if (!allowed.ok()) return rpc->Finish(Failed("List", {}, allowed));
  ListPage(c_, *std::move(query), req.page_token(), rpc->response(),
           [rpc, slot](const absl::Status& s) {
             rpc->Finish(s.ok() ? grpc::Status::OK : Failed("List", {}, s));
           });
}

}  // namespace idem
