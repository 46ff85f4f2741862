// Request validation (server/rpc/validation.h) against docs/spec.md#validation.
//
// Input: byte 0 picks the request type, byte 1 the limits; the rest is the
// request in protobuf wire format. The request goes through the Parse*
// functions in the order the gRPC services call them. Properties:
//   - nothing crashes, whatever the bytes;
//   - an independent model of the section 4 rules (plus the implementation's
//     own limits where the design is silent: attempt_id, wait, reason, actor,
//     page_size) lists the bad fields; the request is accepted iff there is
//     none;
//   - a duration is not negative, and its nanos are 0-999999999 as
//     google.protobuf.Duration wants (bad nanos are the bad field
//     "<field>.nanos");
//   - a refusal is INVALID_ARGUMENT and its message starts with
//     "<field>: " for one of the bad fields;
//   - an accepted request converts faithfully (same key, hash, lease or the
//     policy's default, token, snapshot, ...).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"
#include "idempotency/v1/idempotency.pb.h"
#include "server/base/config.h"
#include "server/wire/convert.h"
#include "server/rpc/page_token.h"
#include "server/rpc/validation.h"

namespace idem {
namespace {

using BadFields = std::set<std::string>;

// Operations with their own lease bounds; every other one has the defaults.
const PolicySet& Policies() {
  static const PolicySet* policies = [] {
    Policy defaults;
    Policy narrow = defaults;
    narrow.lease = absl::Seconds(10);
    narrow.min_lease = absl::Seconds(5);
    narrow.max_lease = absl::Seconds(20);
    Policy wide = defaults;
    wide.lease = absl::Minutes(1);
    wide.min_lease = absl::Milliseconds(1);
    wide.max_lease = absl::Hours(48);
    return new PolicySet(defaults, {{"narrow", narrow}, {"wide", wide}});
  }();
  return *policies;
}

bool NameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' || c == '-';
}

// Spec: tenant and operation are 1-128 bytes of [A-Za-z0-9._:-].
bool GoodName(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (!NameChar(c)) return false;
  }
  return true;
}

// Visible ASCII: '!' to '~' (no space, no control bytes, nothing >= 0x80).
bool Visible(const std::string& s) {
  for (char c : s) {
    if (c < '!' || c > '~') return false;
  }
  return true;
}

void ModelKey(const pb::RecordKey& key, bool present, BadFields* bad) {
  if (!present) {
    bad->insert("key");
    return;
  }
  if (!GoodName(key.tenant())) bad->insert("key.tenant");
  if (!GoodName(key.operation())) bad->insert("key.operation");
  // Spec: key is 1-255 bytes of visible ASCII.
  if (key.key().empty() || key.key().size() > 255 || !Visible(key.key())) {
    bad->insert("key.key");
  }
}

// Duration field `field` (when present) against [min, max]: a negative
// one (by google.protobuf.Duration's spec, the sign of seconds, or of nanos
// when seconds is 0) is bad "<field>"; nanos outside [0, 10^9) (invalid
// for a duration that is not negative) bad "<field>.nanos"; a valid
// duration out of bounds bad "<field>".
void ModelDuration(bool present, const google::protobuf::Duration& d,
                   const std::string& field, absl::Duration min,
                   absl::Duration max, BadFields* bad) {
  if (!present) return;
  const bool negative = d.seconds() < 0 || (d.seconds() == 0 && d.nanos() < 0);
  const bool bad_nanos = d.nanos() < 0 || d.nanos() >= 1000000000;
  if (negative) bad->insert(field);
  if (bad_nanos) bad->insert(field + ".nanos");
  if (negative || bad_nanos) return;
  const absl::Duration v =
      absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
  if (v < min || v > max) bad->insert(field);
}

// RFC 9110 tchar: "!#$%&'*+-.^_`|~", digits and letters.
bool Tchar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
         (c >= 'a' && c <= 'z') || c == '!' || c == '#' || c == '$' ||
         c == '%' || c == '&' || c == '\'' || c == '*' || c == '+' ||
         c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' ||
         c == '~';
}

// No CR, LF (a replayed header line would split) or NUL.
bool OneLine(const std::string& s) {
  for (char c : s) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  return true;
}

void ModelSnapshot(const pb::Snapshot& s, const std::string& field,
                   const Limits& limits, BadFields* bad) {
  size_t size = s.body().size() + s.content_type().size();
  // Decision 18: content type at most 255 bytes on one line; at most 64
  // headers, names 1-256 bytes of tchar, values at most 8192 bytes on one
  // line.
  if (s.content_type().size() > 255 || !OneLine(s.content_type())) {
    bad->insert(field + ".content_type");
  }
  if (s.headers().size() > 64) bad->insert(field + ".headers");
  for (const auto& [name, value] : s.headers()) {
    bool good_name = !name.empty() && name.size() <= 256;
    for (char c : name) good_name = good_name && Tchar(c);
    if (!good_name || value.size() > 8192 || !OneLine(value)) {
      bad->insert(field + ".headers");
    }
    size += name.size() + value.size();
  }
  // Spec: a snapshot is at most the configured size.
  if (size > limits.max_snapshot_bytes) bad->insert(field);
}

// The snapshot converted by validation equals the request's.
void CheckSameSnapshot(const Snapshot& got, const pb::Snapshot& want,
                       const Limits& limits) {
  IDEM_FUZZ_CHECK(
      got.code == want.code() && got.body == want.body() &&
          got.content_type == want.content_type() &&
          got.headers.size() == static_cast<size_t>(want.headers().size()),
      "snapshot converted wrongly");
  size_t size = got.body.size() + got.content_type.size();
  for (const auto& [name, value] : got.headers) {
    auto it = want.headers().find(name);
    IDEM_FUZZ_CHECK(it != want.headers().end() && it->second == value,
                    "header " + name + " converted wrongly");
    size += name.size() + value.size();
  }
  IDEM_FUZZ_CHECK(size <= limits.max_snapshot_bytes,
                  absl::StrCat("accepted a snapshot of ", size, " bytes"));
}

// `status` is the verdict of validation; `bad` the model's bad fields.
void CheckVerdict(const absl::Status& status, const BadFields& bad,
                  const std::string& what) {
  const std::string fields = absl::StrJoin(bad, ", ");
  if (status.ok()) {
    IDEM_FUZZ_CHECK(bad.empty(), what + " accepted with bad fields: " + fields);
    return;
  }
  IDEM_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument,
                  what + " refused with " + status.ToString());
  const std::string message(status.message());
  IDEM_FUZZ_CHECK(!bad.empty(),
                  what + " refused but every field is good: " + message);
  bool names_a_bad_field = false;
  for (const std::string& field : bad) {
    if (message.rfind(field + ": ", 0) == 0) names_a_bad_field = true;
  }
  IDEM_FUZZ_CHECK(names_a_bad_field, what + " refused with \"" + message +
                                         "\", which names none of: " + fields);
}

void CheckKey(const absl::StatusOr<RecordKey>& key, const pb::RecordKey& req,
              bool present, const std::string& what) {
  BadFields bad;
  ModelKey(req, present, &bad);
  CheckVerdict(key.status(), bad, what + " key");
  if (!key.ok()) return;
  IDEM_FUZZ_CHECK(key->tenant == req.tenant() &&
                      key->operation == req.operation() &&
                      key->key == req.key(),
                  "key converted wrongly");
}

void FuzzBegin(const pb::BeginRequest& req, const Limits&) {
  absl::StatusOr<RecordKey> key = ParseKey(req.key(), req.has_key());
  CheckKey(key, req.key(), req.has_key(), "Begin");
  // The services stop at a bad key; ParseBegin must still not crash.
  absl::StatusOr<BeginCommand> cmd = ParseBegin(req, Policies());
  if (!key.ok()) return;
  const Policy& policy = Policies().For(req.key().operation());
  BadFields bad;
  // Spec: request_hash is 1-64 bytes.
  if (req.request_hash().empty() || req.request_hash().size() > 64) {
    bad.insert("request_hash");
  }
  if (req.attempt_id().size() > 128 || !Visible(req.attempt_id())) {
    bad.insert("attempt_id");
  }
  // Spec: the lease lies within the configured bounds.
  ModelDuration(req.has_lease(), req.lease(), "lease", policy.min_lease,
                policy.max_lease, &bad);
  ModelDuration(req.has_wait(), req.wait(), "wait", absl::ZeroDuration(),
                absl::Hours(1), &bad);
  CheckVerdict(cmd.status(), bad, "Begin");
  if (!cmd.ok()) return;
  IDEM_FUZZ_CHECK(cmd->request_hash == req.request_hash() &&
                      cmd->attempt_id == req.attempt_id(),
                  "Begin converted wrongly");
  const absl::Duration lease =
      req.has_lease() ? FromProto(req.lease()) : policy.lease;
  IDEM_FUZZ_CHECK(cmd->lease == lease && cmd->lease >= policy.min_lease &&
                      cmd->lease <= policy.max_lease,
                  absl::StrCat("Begin lease ", absl::FormatDuration(cmd->lease),
                               " outside the policy's bounds"));
}

void FuzzHeartbeat(const pb::HeartbeatRequest& req, const Limits&) {
  absl::StatusOr<RecordKey> key = ParseKey(req.key(), req.has_key());
  CheckKey(key, req.key(), req.has_key(), "Heartbeat");
  absl::StatusOr<HeartbeatCommand> cmd = ParseHeartbeat(req, Policies());
  if (!key.ok()) return;
  const Policy& policy = Policies().For(req.key().operation());
  BadFields bad;
  if (req.fencing_token() < 1) bad.insert("fencing_token");
  ModelDuration(req.has_extend(), req.extend(), "extend", policy.min_lease,
                policy.max_lease, &bad);
  CheckVerdict(cmd.status(), bad, "Heartbeat");
  if (!cmd.ok()) return;
  const absl::Duration extend =
      req.has_extend() ? FromProto(req.extend()) : policy.lease;
  IDEM_FUZZ_CHECK(
      cmd->fencing_token == req.fencing_token() && cmd->extend == extend,
      "Heartbeat converted wrongly");
}

void FuzzComplete(const pb::CompleteRequest& req, const Limits& limits) {
  absl::StatusOr<RecordKey> key = ParseKey(req.key(), req.has_key());
  CheckKey(key, req.key(), req.has_key(), "Complete");
  absl::StatusOr<CompleteCommand> cmd = ParseComplete(req, limits);
  if (!key.ok()) return;
  BadFields bad;
  if (req.fencing_token() < 1) bad.insert("fencing_token");
  if (!req.has_result()) {
    bad.insert("result");
  } else {
    ModelSnapshot(req.result(), "result", limits, &bad);
  }
  CheckVerdict(cmd.status(), bad, "Complete");
  if (!cmd.ok()) return;
  IDEM_FUZZ_CHECK(cmd->fencing_token == req.fencing_token(),
                  "Complete converted wrongly");
  CheckSameSnapshot(cmd->result, req.result(), limits);
}

void FuzzFail(const pb::FailRequest& req, const Limits& limits) {
  absl::StatusOr<RecordKey> key = ParseKey(req.key(), req.has_key());
  CheckKey(key, req.key(), req.has_key(), "Fail");
  absl::StatusOr<FailCommand> cmd = ParseFail(req, limits);
  if (!key.ok()) return;
  BadFields bad;
  if (req.fencing_token() < 1) bad.insert("fencing_token");
  ModelSnapshot(req.error(), "error", limits, &bad);
  CheckVerdict(cmd.status(), bad, "Fail");
  if (!cmd.ok()) return;
  IDEM_FUZZ_CHECK(cmd->fencing_token == req.fencing_token() &&
                      cmd->retryable == req.retryable(),
                  "Fail converted wrongly");
  CheckSameSnapshot(cmd->error, req.error(), limits);
}

void FuzzResolve(const pb::ResolveRequest& req, const Limits& limits) {
  absl::StatusOr<RecordKey> key = ParseKey(req.key(), req.has_key());
  CheckKey(key, req.key(), req.has_key(), "Resolve");
  absl::StatusOr<ResolveCommand> cmd = ParseResolve(req, limits);
  if (!key.ok()) return;
  BadFields bad;
  const bool to_succeeded = req.to() == pb::STATUS_SUCCEEDED;
  if (!to_succeeded && req.to() != pb::STATUS_FAILED) bad.insert("to");
  // Spec: a Resolve without a reason is INVALID_ARGUMENT.
  // PostgreSQL text holds no NUL: neither may contain one.
  if (req.reason().empty() || req.reason().size() > 1024 ||
      req.reason().find('\0') != std::string::npos) {
    bad.insert("reason");
  }
  if (req.actor().size() > 128 || req.actor().find('\0') != std::string::npos) {
    bad.insert("actor");
  }
  if (req.expected_fencing_token() < 0) bad.insert("expected_fencing_token");
  if (to_succeeded && !req.has_result()) bad.insert("result");
  if (req.has_result()) ModelSnapshot(req.result(), "result", limits, &bad);
  CheckVerdict(cmd.status(), bad, "Resolve");
  if (!cmd.ok()) return;
  IDEM_FUZZ_CHECK(
      cmd->to == (to_succeeded ? Status::kSucceeded : Status::kFailed) &&
          cmd->reason == req.reason() && cmd->retryable == req.retryable() &&
          cmd->force == req.force() &&
          cmd->expected_fencing_token == req.expected_fencing_token() &&
          cmd->result.has_value() == req.has_result() && !cmd->actor.empty(),
      "Resolve converted wrongly");
  if (cmd->result) CheckSameSnapshot(*cmd->result, req.result(), limits);
}

void FuzzList(const pb::ListRequest& req, const Limits&) {
  absl::StatusOr<ListQuery> query = ParseList(req);
  BadFields bad;
  if (!req.tenant().empty() && !GoodName(req.tenant())) bad.insert("tenant");
  if (!req.operation().empty() && !GoodName(req.operation())) {
    bad.insert("operation");
  }
  Status status;
  if (req.status() != pb::STATUS_UNSPECIFIED &&
      !FromProto(req.status(), &status)) {
    bad.insert("status");
  }
  ModelDuration(req.has_older_than(), req.older_than(), "older_than",
                absl::ZeroDuration(), absl::Hours(24 * 366 * 10), &bad);
  if (req.page_size() < 0) bad.insert("page_size");
  CheckVerdict(query.status(), bad, "List");
  if (!query.ok()) return;
  IDEM_FUZZ_CHECK(query->limit >= 1 && query->limit <= kMaxPageSize,
                  absl::StrCat("page size ", query->limit));
  IDEM_FUZZ_CHECK(
      query->tenant == req.tenant() && query->operation == req.operation() &&
          query->status.has_value() == (req.status() != pb::STATUS_UNSPECIFIED),
      "List converted wrongly");
  if (req.page_token().empty()) return;
  absl::StatusOr<ListCursor> after = DecodePageToken(req.page_token(), *query);
  if (!after.ok()) {
    CheckVerdict(after.status(), {"page_token"}, "List page token");
    return;
  }
  // A token that decodes is one EncodePageToken could have made.
  absl::StatusOr<ListCursor> again =
      DecodePageToken(EncodePageToken(*query, *after), *query);
  IDEM_FUZZ_CHECK(again.ok() && again->key == after->key &&
                      again->updated_at == after->updated_at,
                  "page token does not survive a round trip");
}

void FuzzHistory(const pb::HistoryRequest& req, const Limits&) {
  absl::StatusOr<RecordKey> key = ParseKey(req.key(), req.has_key());
  CheckKey(key, req.key(), req.has_key(), "History");
  if (!key.ok()) return;
  absl::StatusOr<HistoryQuery> query = ParseHistory(req, *key);
  BadFields bad;
  if (req.page_size() < 0) bad.insert("page_size");
  if (!req.page_token().empty() &&
      !DecodeHistoryToken(req.page_token(), *key).ok()) {
    bad.insert("page_token");
  }
  CheckVerdict(query.status(), bad, "History");
  if (!query.ok()) return;
  IDEM_FUZZ_CHECK(query->limit >= 1 && query->limit <= kMaxPageSize,
                  absl::StrCat("page size ", query->limit));
  IDEM_FUZZ_CHECK(query->key == *key, "History converted wrongly");
  if (req.page_token().empty()) return;
  // A token that decodes is one EncodeHistoryToken could have made.
  absl::StatusOr<int64_t> again =
      DecodeHistoryToken(EncodeHistoryToken(*key, query->after_id), *key);
  IDEM_FUZZ_CHECK(again.ok() && *again == query->after_id,
                  "History page token does not survive a round trip");
}

template <typename Message>
void Run(const uint8_t* data, size_t size, const Limits& limits,
         void (*fuzz)(const Message&, const Limits&)) {
  Message req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return;
  fuzz(req, limits);
}

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in string fields is logged by the parser; keep quiet.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace idem;  // NOLINT(build/namespaces)
  if (size < 2) return 0;
  const uint8_t kind = data[0];
  Limits limits;
  // A small limit now and then, so the size check is reachable.
  if (data[1] & 1) limits.max_snapshot_bytes = 64;
  data += 2;
  size -= 2;
  switch (kind % 8) {
    case 0:
      Run<pb::BeginRequest>(data, size, limits, FuzzBegin);
      break;
    case 1:
      Run<pb::HeartbeatRequest>(data, size, limits, FuzzHeartbeat);
      break;
    case 2:
      Run<pb::CompleteRequest>(data, size, limits, FuzzComplete);
      break;
    case 3:
      Run<pb::FailRequest>(data, size, limits, FuzzFail);
      break;
    case 4:
      Run<pb::ResolveRequest>(data, size, limits, FuzzResolve);
      break;
    case 5:
      Run<pb::ListRequest>(data, size, limits, FuzzList);
      break;
    case 6:
      Run<pb::HistoryRequest>(data, size, limits, FuzzHistory);
      break;
    default: {
      pb::GetRequest req;
      if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
      CheckKey(ParseKey(req.key(), req.has_key()), req.key(), req.has_key(),
               "Get");
      break;
    }
  }
  return 0;
}
