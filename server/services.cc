#include "server/services.h"

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/log.h"
#include "server/page_token.h"

namespace idem {
namespace {

LogFields KeyFields(const RecordKey& key) {
  return {
      {"tenant", key.tenant}, {"operation", key.operation}, {"key", key.key}};
}

// Logs a failed call (client errors at debug, the rest as errors) and
// converts it.
grpc::Status Failed(const char* method, const RecordKey& key,
                    const absl::Status& status) {
  const bool client_error =
      status.code() == absl::StatusCode::kInvalidArgument ||
      status.code() == absl::StatusCode::kNotFound ||
      status.code() == absl::StatusCode::kFailedPrecondition;
  LogFields fields = KeyFields(key);
  fields.emplace_back("method", method);
  fields.emplace_back("code", absl::StatusCodeToString(status.code()));
  fields.emplace_back("error", std::string(status.message()));
  Log(client_error ? LogLevel::kDebug : LogLevel::kError, "call failed",
      fields);
  return ToGrpc(status);
}

void LogTransition(const char* event, const Record& r) {
  LogFields fields = KeyFields(r.key);
  fields.emplace_back("status", StatusName(r.status));
  fields.emplace_back("fencing_token", absl::StrCat(r.fencing_token));
  Log(LogLevel::kInfo, event, fields);
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status IdempotencyService::Begin(grpc::ServerContext*,
                                       const pb::BeginRequest* req,
                                       pb::BeginResponse* resp) {
  RpcTimer timer(metrics_, "Begin");
  absl::StatusOr<RecordKey> key = ParseKey(req->key(), req->has_key());
  if (!key.ok()) return Failed("Begin", {}, key.status());
  absl::StatusOr<BeginCommand> cmd = ParseBegin(*req, coordinator_->policies());
  if (!cmd.ok()) return Failed("Begin", *key, cmd.status());
  absl::StatusOr<BeginResult> result = coordinator_->Begin(*key, *cmd);
  if (!result.ok()) return Failed("Begin", *key, result.status());
  if (metrics_ != nullptr) {
    metrics_->BeginOutcome(key->operation, result->outcome);
    if (result->outcome == Outcome::kCompleted ||
        result->outcome == Outcome::kFailed) {
      metrics_->Replay(result->cached ? "redis" : "postgres");
    }
  }
  resp->set_outcome(ToProto(result->outcome));
  ToProto(result->record, result->outcome != Outcome::kMismatch,
          resp->mutable_record());
  if (result->outcome == Outcome::kAcquired) {
    resp->set_fencing_token(result->record.fencing_token);
    LogTransition("acquired", result->record);
  } else if (result->outcome == Outcome::kInProgress) {
    *resp->mutable_retry_after() = DurationToProto(result->retry_after);
  }
  return grpc::Status::OK;
}

grpc::Status IdempotencyService::Heartbeat(grpc::ServerContext*,
                                           const pb::HeartbeatRequest* req,
                                           pb::HeartbeatResponse* resp) {
  RpcTimer timer(metrics_, "Heartbeat");
  absl::StatusOr<RecordKey> key = ParseKey(req->key(), req->has_key());
  if (!key.ok()) return Failed("Heartbeat", {}, key.status());
  absl::StatusOr<HeartbeatCommand> cmd =
      ParseHeartbeat(*req, coordinator_->policies());
  if (!cmd.ok()) return Failed("Heartbeat", *key, cmd.status());
  absl::StatusOr<Record> record = coordinator_->Heartbeat(*key, *cmd);
  if (!record.ok()) return Failed("Heartbeat", *key, record.status());
  *resp->mutable_lease_expires_at() = ToProto(record->lease_expires_at);
  return grpc::Status::OK;
}

grpc::Status IdempotencyService::Complete(grpc::ServerContext*,
                                          const pb::CompleteRequest* req,
                                          pb::CompleteResponse* resp) {
  RpcTimer timer(metrics_, "Complete");
  absl::StatusOr<RecordKey> key = ParseKey(req->key(), req->has_key());
  if (!key.ok()) return Failed("Complete", {}, key.status());
  absl::StatusOr<CompleteCommand> cmd = ParseComplete(*req, limits_);
  if (!cmd.ok()) return Failed("Complete", *key, cmd.status());
  absl::StatusOr<Record> record = coordinator_->Complete(*key, *cmd);
  if (!record.ok()) return Failed("Complete", *key, record.status());
  LogTransition("completed", *record);
  ToProto(*record, /*with_result=*/true, resp->mutable_record());
  return grpc::Status::OK;
}

grpc::Status IdempotencyService::Fail(grpc::ServerContext*,
                                      const pb::FailRequest* req,
                                      pb::FailResponse* resp) {
  RpcTimer timer(metrics_, "Fail");
  absl::StatusOr<RecordKey> key = ParseKey(req->key(), req->has_key());
  if (!key.ok()) return Failed("Fail", {}, key.status());
  absl::StatusOr<FailCommand> cmd = ParseFail(*req, limits_);
  if (!cmd.ok()) return Failed("Fail", *key, cmd.status());
  absl::StatusOr<Record> record = coordinator_->Fail(*key, *cmd);
  if (!record.ok()) return Failed("Fail", *key, record.status());
  LogTransition("failed", *record);
  ToProto(*record, /*with_result=*/true, resp->mutable_record());
  return grpc::Status::OK;
}

grpc::Status IdempotencyService::Get(grpc::ServerContext*,
                                     const pb::GetRequest* req,
                                     pb::GetResponse* resp) {
  RpcTimer timer(metrics_, "Get");
  absl::StatusOr<RecordKey> key = ParseKey(req->key(), req->has_key());
  if (!key.ok()) return Failed("Get", {}, key.status());
  absl::StatusOr<Record> record = coordinator_->Get(*key);
  if (!record.ok()) return Failed("Get", *key, record.status());
  ToProto(*record, /*with_result=*/true, resp->mutable_record());
  return grpc::Status::OK;
}

grpc::Status IdempotencyAdminService::Resolve(grpc::ServerContext*,
                                              const pb::ResolveRequest* req,
                                              pb::ResolveResponse* resp) {
  RpcTimer timer(metrics_, "Resolve");
  absl::StatusOr<RecordKey> key = ParseKey(req->key(), req->has_key());
  if (!key.ok()) return Failed("Resolve", {}, key.status());
  absl::StatusOr<ResolveCommand> cmd = ParseResolve(*req, limits_);
  if (!cmd.ok()) return Failed("Resolve", *key, cmd.status());
  absl::StatusOr<Record> record = coordinator_->Resolve(*key, *cmd);
  if (!record.ok()) return Failed("Resolve", *key, record.status());
  if (metrics_ != nullptr) metrics_->Resolved("operator");
  LogFields fields = KeyFields(*key);
  fields.emplace_back("status", StatusName(record->status));
  fields.emplace_back("actor", cmd->actor);
  fields.emplace_back("reason", cmd->reason);
  Log(LogLevel::kInfo, "resolved", fields);
  ToProto(*record, /*with_result=*/true, resp->mutable_record());
  return grpc::Status::OK;
}

grpc::Status IdempotencyAdminService::History(grpc::ServerContext*,
                                              const pb::HistoryRequest* req,
                                              pb::HistoryResponse* resp) {
  RpcTimer timer(metrics_, "History");
  absl::StatusOr<RecordKey> key = ParseKey(req->key(), req->has_key());
  if (!key.ok()) return Failed("History", {}, key.status());
  absl::StatusOr<std::vector<AuditEntry>> entries = store_->History(*key);
  if (!entries.ok()) return Failed("History", *key, entries.status());
  for (const AuditEntry& e : *entries) ToProto(e, resp->add_entries());
  return grpc::Status::OK;
}

grpc::Status IdempotencyAdminService::List(grpc::ServerContext*,
                                           const pb::ListRequest* req,
                                           pb::ListResponse* resp) {
  RpcTimer timer(metrics_, "List");
  absl::StatusOr<ListQuery> query = ParseList(*req);
  if (!query.ok()) return Failed("List", {}, query.status());
  if (!req->page_token().empty()) {
    absl::StatusOr<ListCursor> after =
        DecodePageToken(req->page_token(), *query);
    if (!after.ok()) return Failed("List", {}, after.status());
    query->after = *after;
  }
  absl::StatusOr<std::vector<Record>> records = store_->List(*query);
  if (!records.ok()) return Failed("List", {}, records.status());
  for (const Record& r : *records) {
    ToProto(r, /*with_result=*/true, resp->add_records());
  }
  if (static_cast<int>(records->size()) == query->limit) {
    const Record& last = records->back();
    resp->set_next_page_token(
        EncodePageToken(*query, ListCursor{last.updated_at, last.key}));
  }
  return grpc::Status::OK;
}

}  // namespace idem
