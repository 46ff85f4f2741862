#include "tests/faults/history.h"

#include <algorithm>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"

namespace idem::faults {
namespace {

constexpr int kFields = 21;

std::string Hex(const std::string& s) { return absl::BytesToHexString(s); }

// Serialises with map entries in key order, so equal messages give equal
// lines.
std::string Deterministic(const google::protobuf::MessageLite& m) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return out;
}

bool Unhex(absl::string_view hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  *out = absl::HexStringToBytes(hex);
  return true;
}

}  // namespace

const char* OpTypeName(OpType t) {
  switch (t) {
    case OpType::kBegin:
      return "begin";
    case OpType::kComplete:
      return "complete";
    case OpType::kFail:
      return "fail";
    case OpType::kGet:
      return "get";
    case OpType::kResolve:
      return "resolve";
    case OpType::kList:
      return "list";
    case OpType::kEffect:
      return "effect";
  }
  return "?";
}

const char* ResultName(Result r) {
  switch (r) {
    case Result::kOk:
      return "ok";
    case Result::kFail:
      return "fail";
    case Result::kInfo:
      return "info";
  }
  return "?";
}

std::string FormatOp(const Op& op) {
  std::vector<std::string> f = {
      absl::StrCat(op.id),
      absl::StrCat(op.worker),
      absl::StrCat(static_cast<int>(op.type)),
      Hex(op.key),
      absl::StrCat(op.invoke_ns),
      absl::StrCat(op.complete_ns),
      absl::StrCat(static_cast<int>(op.result)),
      absl::StrCat(op.code),
      Hex(op.error),
      Hex(op.attempt_id),
      Hex(op.request_hash),
      absl::StrCat(op.lease_ms),
      absl::StrCat(op.token),
      Hex(Deterministic(op.snapshot)),
      op.retryable ? "1" : "0",
      absl::StrCat(static_cast<int>(op.resolve_to)),
      Hex(op.actor),
      absl::StrCat(static_cast<int>(op.outcome)),
      absl::StrCat(op.granted_token),
      op.has_record ? "1" : "0",
      Hex(op.has_record ? Deterministic(op.record) : ""),
  };
  return absl::StrJoin(f, "\t");
}

absl::StatusOr<Op> ParseOp(const std::string& line) {
  std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
  auto bad = [&](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("history line: bad ", what, ": ", line.substr(0, 200)));
  };
  if (f.size() != kFields) return bad("field count");
  Op op;
  int type, result, resolve_to, outcome;
  std::string snapshot, record;
  if (!absl::SimpleAtoi(f[0], &op.id) || !absl::SimpleAtoi(f[1], &op.worker) ||
      !absl::SimpleAtoi(f[2], &type) || !Unhex(f[3], &op.key) ||
      !absl::SimpleAtoi(f[4], &op.invoke_ns) ||
      !absl::SimpleAtoi(f[5], &op.complete_ns) ||
      !absl::SimpleAtoi(f[6], &result) || !absl::SimpleAtoi(f[7], &op.code) ||
      !Unhex(f[8], &op.error) || !Unhex(f[9], &op.attempt_id) ||
      !Unhex(f[10], &op.request_hash) ||
      !absl::SimpleAtoi(f[11], &op.lease_ms) ||
      !absl::SimpleAtoi(f[12], &op.token) || !Unhex(f[13], &snapshot) ||
      !absl::SimpleAtoi(f[15], &resolve_to) || !Unhex(f[16], &op.actor) ||
      !absl::SimpleAtoi(f[17], &outcome) ||
      !absl::SimpleAtoi(f[18], &op.granted_token) || !Unhex(f[20], &record)) {
    return bad("field");
  }
  if (type < 0 || type > static_cast<int>(OpType::kEffect)) return bad("type");
  if (result < 0 || result > 2) return bad("result");
  op.type = static_cast<OpType>(type);
  op.result = static_cast<Result>(result);
  op.retryable = f[14] == "1";
  op.resolve_to = static_cast<pb::Status>(resolve_to);
  op.outcome = static_cast<pb::Outcome>(outcome);
  op.has_record = f[19] == "1";
  if (!op.snapshot.ParseFromString(snapshot) ||
      !op.record.ParseFromString(record)) {
    return bad("message");
  }
  return op;
}

std::string DescribeOp(const Op& op) {
  std::string s =
      absl::StrCat("#", op.id, " w", op.worker, " ", OpTypeName(op.type), " ",
                   op.key, " t=", op.invoke_ns / 1000000, "..",
                   op.complete_ns / 1000000, "ms ", ResultName(op.result));
  if (op.result != Result::kOk) absl::StrAppend(&s, "(", op.code, ")");
  if (!op.attempt_id.empty()) absl::StrAppend(&s, " attempt=", op.attempt_id);
  if (op.token != 0) absl::StrAppend(&s, " token=", op.token);
  if (op.type == OpType::kBegin && op.result == Result::kOk) {
    absl::StrAppend(&s, " -> ", pb::Outcome_Name(op.outcome));
    if (op.granted_token != 0)
      absl::StrAppend(&s, " granted=", op.granted_token);
  }
  if (op.type == OpType::kResolve) {
    absl::StrAppend(&s, " to=", pb::Status_Name(op.resolve_to),
                    op.retryable ? " retryable" : "");
  }
  if (op.has_record) {
    absl::StrAppend(&s, " record=", pb::Status_Name(op.record.status()), "/",
                    op.record.fencing_token());
  }
  return s;
}

pb::Snapshot TaggedSnapshot(const SnapshotTag& tag, int code, uint64_t salt) {
  pb::Snapshot s;
  s.set_code(code);
  std::string bytes(256, '\0');
  for (int i = 0; i < 256; ++i) bytes[i] = static_cast<char>(i);
  std::mt19937_64 rng(salt);
  std::shuffle(bytes.begin(), bytes.end(), rng);
  s.set_body(absl::StrCat("key=", tag.key, ";token=", tag.token,
                          ";by=", tag.writer, "\n", bytes));
  s.set_content_type("application/x-faults");
  (*s.mutable_headers())["x-token"] = absl::StrCat(tag.token);
  (*s.mutable_headers())["x-writer"] = tag.writer;
  return s;
}

bool ParseSnapshotTag(const pb::Snapshot& s, SnapshotTag* tag) {
  const std::string& body = s.body();
  size_t nl = body.find('\n');
  if (nl == std::string::npos) return false;
  std::vector<std::string> parts = absl::StrSplit(body.substr(0, nl), ';');
  if (parts.size() != 3 || parts[0].rfind("key=", 0) != 0 ||
      parts[1].rfind("token=", 0) != 0 || parts[2].rfind("by=", 0) != 0) {
    return false;
  }
  tag->key = parts[0].substr(4);
  tag->writer = parts[2].substr(3);
  return absl::SimpleAtoi(parts[1].substr(6), &tag->token);
}

bool SameSnapshot(const pb::Snapshot& a, const pb::Snapshot& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

}  // namespace idem::faults
