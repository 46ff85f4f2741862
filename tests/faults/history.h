// The history of a fault run: every operation a client invoked, with its
// outcome (ok / fail / info) and monotonic timestamps, and the final state
// read from PostgreSQL and Redis afterwards. The checker (checker.h) judges
// both.
#ifndef IDEM_TESTS_FAULTS_HISTORY_H_
#define IDEM_TESTS_FAULTS_HISTORY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "idempotency/v1/idempotency.pb.h"

namespace idem::faults {

namespace pb = ::idempotency::v1;

// One tenant per run. Lease expiry policies (the sidecars' --config):
// kUnknownOp -> UNKNOWN, kReleaseOp -> FAILED retryable.
inline constexpr char kTenant[] = "acme";
inline constexpr char kUnknownOp[] = "create-payment";
inline constexpr char kReleaseOp[] = "send-email";

enum class OpType {
  kBegin,
  kComplete,
  kFail,
  kGet,
  kResolve,
  kList,
  // The business write: one row (key, token) in faults_effect, refused by the
  // business table's fence when a higher token already wrote.
  kEffect,
};

// ok: the call was answered and applied (or was a definite answer);
// fail: definitely not applied (INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, a fenced-off effect); info: the outcome is unknown
// (deadline, UNAVAILABLE, a reset, ...): it may or may not have happened.
enum class Result { kOk, kFail, kInfo };

const char* OpTypeName(OpType t);
const char* ResultName(Result r);

struct Op {
  int64_t id = 0;
  // The worker (thread or process) that made the call; -1 for the operator.
  int worker = 0;
  OpType type = OpType::kBegin;
  // "<operation>/<key>" (one tenant per run).
  std::string key;
  // steady_clock (CLOCK_MONOTONIC) nanoseconds, comparable across processes.
  int64_t invoke_ns = 0;
  int64_t complete_ns = 0;
  Result result = Result::kInfo;
  // The gRPC status code (0 when ok); for kEffect 0 or 9 (fenced).
  int code = 0;
  std::string error;

  // Request.
  std::string attempt_id;    // Begin
  std::string request_hash;  // Begin
  int64_t lease_ms = 0;      // Begin
  int64_t token = 0;         // Complete/Fail/Effect; Resolve: expected
  pb::Snapshot snapshot;     // Complete/Fail/Resolve
  bool retryable = false;    // Fail/Resolve
  pb::Status resolve_to = pb::STATUS_UNSPECIFIED;  // Resolve
  std::string actor;                               // Resolve

  // Response (when ok).
  pb::Outcome outcome = pb::OUTCOME_UNSPECIFIED;  // Begin
  int64_t granted_token = 0;                      // Begin, when ACQUIRED
  bool has_record = false;
  pb::Record record;  // the record answered (Begin/Get/Complete/Fail/Resolve)
};

// One line per op (tab-separated, binary fields hex-encoded), and back.
std::string FormatOp(const Op& op);
absl::StatusOr<Op> ParseOp(const std::string& line);
// A readable one-line summary for violation reports.
std::string DescribeOp(const Op& op);

// A record as PostgreSQL holds it at the end.
struct FinalRecord {
  std::string key;  // "<operation>/<key>"
  pb::Status status = pb::STATUS_UNSPECIFIED;
  int64_t token = 0;
  int32_t attempt = 0;
  std::string request_hash;
  bool has_result = false;
  pb::Snapshot result;
  bool retryable = false;
  std::string resolved_by;
};

struct AuditRow {
  std::string key;
  pb::Status from = pb::STATUS_UNSPECIFIED;
  pb::Status to = pb::STATUS_UNSPECIFIED;
  std::string actor;
  int64_t token = 0;
};

// A Redis entry under idem:{...} at the end.
struct CacheEntry {
  std::string redis_key;
  std::string value;
  int64_t pttl_ms = -1;
};

struct FinalState {
  std::map<std::string, FinalRecord> records;
  // key -> tokens with an effect row.
  std::map<std::string, std::vector<int64_t>> effects;
  std::vector<AuditRow> audit;
  std::vector<CacheEntry> cache;
  std::string tenant;
  // The key the sidecars sign cache values with (--redis-mac-key-file).
  std::string cache_mac_key;
  // Longest allowed cache TTL (the records' retention).
  int64_t max_cache_ttl_ms = 0;
};

// What a worker encodes in the snapshots it stores: the record's key, the
// token it wrote with and who wrote it ("w3", "holder", "operator-1").
struct SnapshotTag {
  std::string key;
  int64_t token = 0;
  std::string writer;
};

// Builds a snapshot whose body starts with the tag in text and goes on with
// binary bytes (every byte value, shuffled by `salt`), with headers.
pb::Snapshot TaggedSnapshot(const SnapshotTag& tag, int code, uint64_t salt);
// Parses the tag back; false if the body does not start with one.
bool ParseSnapshotTag(const pb::Snapshot& s, SnapshotTag* tag);

// Whether two snapshots are byte for byte the same (maps compared as maps).
bool SameSnapshot(const pb::Snapshot& a, const pb::Snapshot& b);

}  // namespace idem::faults

#endif  // IDEM_TESTS_FAULTS_HISTORY_H_
