#include "server/rpc/validation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/wire/convert.h"
#include "server/wire/snapshot_validation.h"
#include "server/rpc/page_token.h"

namespace idem {
namespace {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

bool VisibleAscii(char c) { return c >= '!' && c <= '~'; }

template <typename Pred>
bool All(const std::string& s, Pred pred) {
  for (char c : s) {
    if (!pred(c)) return false;
  }
  return true;
}

absl::Status CheckName(const std::string& value, const std::string& field) {
  if (!IsRecordName(value)) {
    return Invalid(field, "must be 1-128 bytes of [A-Za-z0-9._:-]");
  }
  return absl::OkStatus();
}

absl::Status CheckToken(int64_t token) {
  if (token < 1) return Invalid("fencing_token", "must be positive");
  return absl::OkStatus();
}

// A duration field: `fallback` when unset, else within [min, max]. A
// negative one is "<field>: ..."; then nanos must be 0-999999999, as
// google.protobuf.Duration wants when seconds >= 0 (nanos of 2e9 would
// otherwise read as 2 extra seconds), else "<field>.nanos: ...".
absl::StatusOr<absl::Duration> CheckDuration(
    bool present, const google::protobuf::Duration& d, const std::string& field,
    absl::Duration fallback, absl::Duration min, absl::Duration max) {
  if (!present) return fallback;
  if (d.seconds() < 0 || (d.seconds() == 0 && d.nanos() < 0)) {
    return Invalid(field, "must not be negative");
  }
  if (d.nanos() < 0 || d.nanos() > 999999999) {
    return Invalid(field + ".nanos",
                   "must be 0-999999999 (and never of the opposite sign to "
                   "seconds)");
  }
  const absl::Duration value = FromProto(d);
  if (value < min || value > max) {
    return Invalid(field,
                   absl::StrCat("must lie within [", absl::FormatDuration(min),
                                ", ", absl::FormatDuration(max), "]"));
  }
  return value;
}

absl::StatusOr<Snapshot> ParseSnapshot(const pb::Snapshot& s,
                                       const std::string& field,
                                       const Limits& limits) {
  absl::Status valid = CheckSnapshot(s, field, limits.max_snapshot_bytes);
  if (!valid.ok()) return valid;
  return FromProto(s);
}

}  // namespace

absl::StatusOr<RecordKey> ParseKey(const pb::RecordKey& key, bool present) {
  if (!present) return Invalid("key", "required");
  absl::Status s = CheckName(key.tenant(), "key.tenant");
  if (!s.ok()) return s;
  s = CheckName(key.operation(), "key.operation");
  if (!s.ok()) return s;
  if (key.key().empty() || key.key().size() > 255 ||
      !All(key.key(), VisibleAscii)) {
    return Invalid("key.key", "must be 1-255 bytes of visible ASCII");
  }
  return FromProto(key);
}

absl::StatusOr<BeginCommand> ParseBegin(const pb::BeginRequest& req,
                                        const PolicySet& policies) {
  if (req.request_hash().empty() || req.request_hash().size() > 64) {
    return Invalid("request_hash", "must be 1-64 bytes");
  }
  if (req.attempt_id().size() > 128 || !All(req.attempt_id(), VisibleAscii)) {
    return Invalid("attempt_id", "must be 0-128 bytes of visible ASCII");
  }
  const Policy& policy = policies.For(req.key().operation());
  absl::StatusOr<absl::Duration> lease =
      CheckDuration(req.has_lease(), req.lease(), "lease", policy.lease,
                    policy.min_lease, policy.max_lease);
  if (!lease.ok()) return lease.status();
  absl::StatusOr<absl::Duration> wait =
      CheckDuration(req.has_wait(), req.wait(), "wait", absl::ZeroDuration(),
                    absl::ZeroDuration(), absl::Hours(1));
  if (!wait.ok()) return wait.status();
  BeginCommand cmd;
  cmd.request_hash = req.request_hash();
  cmd.lease = *lease;
  cmd.attempt_id = req.attempt_id();
  return cmd;
}

absl::StatusOr<HeartbeatCommand> ParseHeartbeat(const pb::HeartbeatRequest& req,
                                                const PolicySet& policies) {
  absl::Status s = CheckToken(req.fencing_token());
  if (!s.ok()) return s;
  const Policy& policy = policies.For(req.key().operation());
  absl::StatusOr<absl::Duration> extend =
      CheckDuration(req.has_extend(), req.extend(), "extend", policy.lease,
                    policy.min_lease, policy.max_lease);
  if (!extend.ok()) return extend.status();
  return HeartbeatCommand{req.fencing_token(), *extend};
}

absl::StatusOr<CompleteCommand> ParseComplete(const pb::CompleteRequest& req,
                                              const Limits& limits) {
  absl::Status s = CheckToken(req.fencing_token());
  if (!s.ok()) return s;
  if (!req.has_result()) return Invalid("result", "required");
  absl::StatusOr<Snapshot> result =
      ParseSnapshot(req.result(), "result", limits);
  if (!result.ok()) return result.status();
  return CompleteCommand{req.fencing_token(), *std::move(result)};
}

absl::StatusOr<FailCommand> ParseFail(const pb::FailRequest& req,
                                      const Limits& limits) {
  absl::Status s = CheckToken(req.fencing_token());
  if (!s.ok()) return s;
  absl::StatusOr<Snapshot> error = ParseSnapshot(req.error(), "error", limits);
  if (!error.ok()) return error.status();
  return FailCommand{req.fencing_token(), *std::move(error), req.retryable()};
}

absl::StatusOr<ListQuery> ParseList(const pb::ListRequest& req) {
  ListQuery q;
  if (!req.tenant().empty()) {
    absl::Status s = CheckName(req.tenant(), "tenant");
    if (!s.ok()) return s;
  }
  if (!req.operation().empty()) {
    absl::Status s = CheckName(req.operation(), "operation");
    if (!s.ok()) return s;
  }
  q.tenant = req.tenant();
  q.operation = req.operation();
  if (req.status() != pb::STATUS_UNSPECIFIED) {
    Status status;
    if (!FromProto(req.status(), &status)) {
      return Invalid("status", "not a known status");
    }
    q.status = status;
  }
  absl::StatusOr<absl::Duration> older_than = CheckDuration(
      req.has_older_than(), req.older_than(), "older_than",
      absl::ZeroDuration(), absl::ZeroDuration(), absl::Hours(24 * 366 * 10));
  if (!older_than.ok()) return older_than.status();
  q.older_than = *older_than;
  if (req.page_size() < 0) return Invalid("page_size", "must not be negative");
  q.limit = req.page_size() == 0 ? kDefaultPageSize
                                 : std::min(req.page_size(), kMaxPageSize);
  return q;
}

absl::StatusOr<HistoryQuery> ParseHistory(const pb::HistoryRequest& req,
                                          const RecordKey& key) {
  if (req.page_size() < 0) return Invalid("page_size", "must not be negative");
  HistoryQuery q;
  q.key = key;
  q.limit = req.page_size() == 0 ? kDefaultPageSize
                                 : std::min(req.page_size(), kMaxPageSize);
  if (!req.page_token().empty()) {
    absl::StatusOr<int64_t> after = DecodeHistoryToken(req.page_token(), key);
    if (!after.ok()) return after.status();
    q.after_id = *after;
  }
  return q;
}

absl::StatusOr<ResolveCommand> ParseResolve(const pb::ResolveRequest& req,
                                            const Limits& limits) {
  ResolveCommand cmd;
  if (req.to() != pb::STATUS_SUCCEEDED && req.to() != pb::STATUS_FAILED) {
    return Invalid("to", "must be STATUS_SUCCEEDED or STATUS_FAILED");
  }
  FromProto(req.to(), &cmd.to);
  absl::Status s = CheckText(req.reason(), "reason", kMaxReasonBytes,
                             /*required=*/true);
  if (!s.ok()) return s;
  s = CheckText(req.actor(), "actor", kMaxActorBytes, /*required=*/false);
  if (!s.ok()) return s;
  if (req.expected_fencing_token() < 0) {
    return Invalid("expected_fencing_token", "must not be negative");
  }
  if (cmd.to == Status::kSucceeded && !req.has_result()) {
    return Invalid("result", "required when resolving to STATUS_SUCCEEDED");
  }
  if (req.has_result()) {
    absl::StatusOr<Snapshot> result =
        ParseSnapshot(req.result(), "result", limits);
    if (!result.ok()) return result.status();
    cmd.result = *std::move(result);
  }
  cmd.retryable = req.retryable();
  cmd.reason = req.reason();
  cmd.actor = req.actor().empty() ? "operator" : req.actor();
  cmd.expected_fencing_token = req.expected_fencing_token();
  cmd.force = req.force();
  return cmd;
}

}  // namespace idem
