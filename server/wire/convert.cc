#include "server/wire/convert.h"

namespace idem {

RecordKey FromProto(const pb::RecordKey& key) {
  return RecordKey{key.tenant(), key.operation(), key.key()};
}

Snapshot FromProto(const pb::Snapshot& snapshot) {
  Snapshot s;
  s.code = snapshot.code();
  s.body = snapshot.body();
  s.content_type = snapshot.content_type();
  s.headers.insert(snapshot.headers().begin(), snapshot.headers().end());
  return s;
}

pb::Status ToProto(Status status) {
  switch (status) {
    case Status::kProcessing:
      return pb::STATUS_PROCESSING;
    case Status::kSucceeded:
      return pb::STATUS_SUCCEEDED;
    case Status::kFailed:
      return pb::STATUS_FAILED;
    case Status::kUnknown:
      return pb::STATUS_UNKNOWN;
  }
  return pb::STATUS_UNSPECIFIED;
}

bool FromProto(pb::Status status, Status* out) {
  switch (status) {
    case pb::STATUS_PROCESSING:
      *out = Status::kProcessing;
      return true;
    case pb::STATUS_SUCCEEDED:
      *out = Status::kSucceeded;
      return true;
    case pb::STATUS_FAILED:
      *out = Status::kFailed;
      return true;
    case pb::STATUS_UNKNOWN:
      *out = Status::kUnknown;
      return true;
    default:
      return false;
  }
}

pb::Outcome ToProto(Outcome outcome) {
  switch (outcome) {
    case Outcome::kAcquired:
      return pb::OUTCOME_ACQUIRED;
    case Outcome::kInProgress:
      return pb::OUTCOME_IN_PROGRESS;
    case Outcome::kCompleted:
      return pb::OUTCOME_COMPLETED;
    case Outcome::kFailed:
      return pb::OUTCOME_FAILED;
    case Outcome::kUnknown:
      return pb::OUTCOME_UNKNOWN;
    case Outcome::kMismatch:
      return pb::OUTCOME_MISMATCH;
    case Outcome::kExpired:
      return pb::OUTCOME_EXPIRED;
  }
  return pb::OUTCOME_UNSPECIFIED;
}

void ToProto(const Record& record, bool with_result, pb::Record* out) {
  pb::RecordKey* key = out->mutable_key();
  key->set_tenant(record.key.tenant);
  key->set_operation(record.key.operation);
  key->set_key(record.key.key);
  out->set_status(ToProto(record.status));
  out->set_request_hash(record.request_hash);
  out->set_fencing_token(record.fencing_token);
  out->set_attempt(record.attempt);
  ToProto(record.lease_expires_at, out->mutable_lease_expires_at());
  if (with_result && record.result) {
    pb::Snapshot* s = out->mutable_result();
    s->set_code(record.result->code);
    s->set_body(record.result->body);
    s->set_content_type(record.result->content_type);
    s->mutable_headers()->insert(record.result->headers.begin(),
                                 record.result->headers.end());
  }
  out->set_retryable(record.retryable);
  ToProto(record.created_at, out->mutable_created_at());
  ToProto(record.updated_at, out->mutable_updated_at());
  if (record.expires_at) ToProto(*record.expires_at, out->mutable_expires_at());
  out->set_resolved_by(record.resolved_by);
  out->set_resolve_reason(record.resolve_reason);
}

void ToProto(const AuditEntry& entry, pb::AuditEntry* out) {
  ToProto(entry.at, out->mutable_at());
  out->set_from(ToProto(entry.from));
  out->set_to(ToProto(entry.to));
  out->set_actor(entry.actor);
  out->set_reason(entry.reason);
  out->set_fencing_token(entry.fencing_token);
}

}  // namespace idem
