// Value types of the idempotency state machine: records, snapshots, policies.
// Pure data; no I/O. Mirrors the Record message of the public API.
#ifndef IDEM_STATEMACHINE_RECORD_H_
#define IDEM_STATEMACHINE_RECORD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace idem {

enum class Status { kProcessing, kSucceeded, kFailed, kUnknown };

enum class Outcome {
  kAcquired,
  kInProgress,
  kCompleted,
  kFailed,
  kUnknown,
  kMismatch,
  kExpired,  // only a tombstone is left: do not write
};

// What happens to a PROCESSING record whose lease ran out.
enum class ExpiryPolicy {
  kUnknown,  // -> UNKNOWN: the write may have happened; an operator decides.
  kRelease,  // -> FAILED retryable (LEASE_EXPIRED): the next Begin may run.
};

// Returns "PROCESSING", "SUCCEEDED", ... (the storage spelling).
const char* StatusName(Status s);
// Parses StatusName's output; false if `name` is none of them.
bool ParseStatus(const std::string& name, Status* out);
// Returns "ACQUIRED", "IN_PROGRESS", ...
const char* OutcomeName(Outcome o);
// Returns "unknown" or "release" (the configuration spelling).
const char* ExpiryPolicyName(ExpiryPolicy p);

// A stored result or error, opaque to the sidecar and replayed byte for byte.
struct Snapshot {
  int32_t code = 0;
  std::string body;
  std::string content_type;
  std::map<std::string, std::string> headers;

  friend bool operator==(const Snapshot& a, const Snapshot& b) {
    return a.code == b.code && a.body == b.body &&
           a.content_type == b.content_type && a.headers == b.headers;
  }
  friend bool operator!=(const Snapshot& a, const Snapshot& b) {
    return !(a == b);
  }
};

// Identity of a record: (tenant, operation, key).
struct RecordKey {
  std::string tenant;
  std::string operation;
  std::string key;

  friend bool operator==(const RecordKey& a, const RecordKey& b) {
    return a.tenant == b.tenant && a.operation == b.operation && a.key == b.key;
  }
  friend bool operator<(const RecordKey& a, const RecordKey& b) {
    if (a.tenant != b.tenant) return a.tenant < b.tenant;
    if (a.operation != b.operation) return a.operation < b.operation;
    return a.key < b.key;
  }
};

// One idempotency record as stored.
struct Record {
  RecordKey key;
  Status status = Status::kProcessing;
  std::string request_hash;
  int64_t fencing_token = 0;
  int32_t attempt = 0;
  // Set by the acquiring Begin; a later Begin with the same id regains the
  // grant while the lease is live. Empty when the caller gave none.
  std::string attempt_id;
  absl::Time lease_expires_at = absl::InfinitePast();
  std::optional<Snapshot> result;
  bool retryable = false;
  absl::Time created_at = absl::InfinitePast();
  absl::Time updated_at = absl::InfinitePast();
  // Set on terminal records only: when they may be purged.
  std::optional<absl::Time> expires_at;
  std::string resolved_by;
  std::string resolve_reason;
  // Past its retention: the result is gone; identity, request hash, final
  // status and token remain until expires_at (then the row is deleted).
  bool tombstone = false;
};

// Per-operation policy (the --config file; docs/spec.md#config).
// TLS of a probe's channel to the business service (docs/spec.md#config).
struct ProbeTls {
  bool enabled = false;
  // PEM CA bundle that verifies the business service; empty: system roots.
  std::string ca;
  // PEM client certificate chain and its key, for mutual TLS; both or none.
  std::string cert;
  std::string key;
  // The name the service's certificate must carry, when it is not the
  // probe address's host.
  std::string server_name;
};

struct Policy {
  absl::Duration lease = absl::Seconds(30);
  absl::Duration min_lease = absl::Seconds(1);
  absl::Duration max_lease = absl::Hours(1);
  absl::Duration retention = absl::Hours(24);
  // How long a tombstone outlives the retention (0: none, the key is new
  // again after the retention). Retryable failures never leave one.
  absl::Duration tombstone_retention = absl::Hours(24 * 7);
  ExpiryPolicy on_lease_expiry = ExpiryPolicy::kUnknown;
  // The Reconciler.Probe address (host:port) of the business service; empty:
  // UNKNOWN records wait for an operator.
  std::string probe;
  // Plaintext unless enabled.
  ProbeTls probe_tls;
  // Probes of one UNKNOWN record before it is left to an operator.
  int reconcile_attempts = 5;
};

// One audited transition (a change not made by the holder itself).
struct AuditEntry {
  absl::Time at = absl::InfinitePast();
  Status from = Status::kProcessing;
  Status to = Status::kProcessing;
  std::string actor;
  std::string reason;
  int64_t fencing_token = 0;
  // Set by the store: larger is later (History pages by it).
  int64_t id = 0;
};

}  // namespace idem

#endif  // IDEM_STATEMACHINE_RECORD_H_
