// The transition table of docs/spec.md#transitions as pure functions:
// (stored record, command, now, policy) -> decision. No I/O, no clock (time is
// an argument), no threads. A store applies a decision's Write conditionally;
// if the guard no longer holds, the caller reads again and decides again.
#ifndef IDEM_STATEMACHINE_TRANSITIONS_H_
#define IDEM_STATEMACHINE_TRANSITIONS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "statemachine/record.h"

namespace idem {

// Actors written to the audit table for changes not made by the holder.
inline constexpr char kActorLazyExpiry[] = "lazy-expiry";
inline constexpr char kActorReaper[] = "reaper";
inline constexpr char kActorLateReport[] = "late-report";
inline constexpr char kActorReconciler[] = "reconciler";
// Body and reason of the error stored by the `release` expiry policy.
inline constexpr char kLeaseExpired[] = "LEASE_EXPIRED";

// The state a conditional write expects to find.
struct Guard {
  Status status = Status::kProcessing;
  int64_t fencing_token = 0;
  // The lease must also have run out by the store's clock at write time.
  bool lease_expired = false;
};

// A write a store applies atomically, using its own clock as "now".
struct Write {
  // Unset: create the record; it must not exist yet.
  std::optional<Guard> guard;
  // The new value of every field, except the times set below from "now".
  // created_at and updated_at are the store's to set.
  Record next;
  // Set: lease_expires_at = now + lease. Unset: the stored lease stays
  // (next.lease_expires_at is ignored, so a decision on a record whose lease
  // another writer extended since cannot shorten it; a new record takes
  // next.lease_expires_at).
  std::optional<absl::Duration> lease;
  // Set: expires_at = now + retention. Unset: no expires_at.
  std::optional<absl::Duration> retention;
  // With retention: how long a tombstone outlives it (zero: none).
  absl::Duration tombstone_retention = absl::ZeroDuration();
  // Set: one audit row written in the same transaction (its `at` is now).
  std::optional<AuditEntry> audit;
};

// What to answer and what to write. A non-OK `error` means: answer with it
// and write nothing. Otherwise apply `write` (if any) and answer with the
// written record, or with the current record when there is no write.
struct Decision {
  absl::Status error;
  // Begin's answer; kAcquired means the fencing token is the record's token
  // after the write.
  Outcome outcome = Outcome::kInProgress;
  std::optional<Write> write;
  // The error is a fencing rejection: the caller's token is not current.
  bool stale_token = false;
};

struct BeginCommand {
  std::string request_hash;
  absl::Duration lease = absl::Seconds(30);
  std::string attempt_id;

  // Equal commands get equal decisions on one record (parked Begins woken
  // together share one): a new field belongs here too.
  friend bool operator==(const BeginCommand& a, const BeginCommand& b) {
    return a.request_hash == b.request_hash && a.lease == b.lease &&
           a.attempt_id == b.attempt_id;
  }
};

struct HeartbeatCommand {
  int64_t fencing_token = 0;
  absl::Duration extend = absl::Seconds(30);
};

struct CompleteCommand {
  int64_t fencing_token = 0;
  Snapshot result;
};

struct FailCommand {
  int64_t fencing_token = 0;
  Snapshot error;
  bool retryable = false;
};

struct ResolveCommand {
  Status to = Status::kSucceeded;  // kSucceeded or kFailed
  std::optional<Snapshot> result;  // required for kSucceeded
  bool retryable = false;          // with kFailed
  std::string reason;              // required
  std::string actor;
  int64_t expected_fencing_token = 0;  // 0: no guard
  bool force = false;                  // allow a PROCESSING record
};

// Begin on `current` (null when absent) for `key`. By pointer, so that a
// shared cached record is decided on without a copy.
Decision DecideBegin(const Record* current, const RecordKey& key,
                     const BeginCommand& cmd, absl::Time now,
                     const Policy& policy);
inline Decision DecideBegin(const std::optional<Record>& current,
                            const RecordKey& key, const BeginCommand& cmd,
                            absl::Time now, const Policy& policy) {
  return DecideBegin(current ? &*current : nullptr, key, cmd, now, policy);
}

Decision DecideHeartbeat(const std::optional<Record>& current,
                         const HeartbeatCommand& cmd);

Decision DecideComplete(const std::optional<Record>& current,
                        const CompleteCommand& cmd, const Policy& policy);

Decision DecideFail(const std::optional<Record>& current,
                    const FailCommand& cmd, const Policy& policy);

// Get applies a due lease expiry (actor lazy-expiry); otherwise reads.
// `current` is null when absent.
Decision DecideGet(const Record* current, absl::Time now, const Policy& policy);
inline Decision DecideGet(const std::optional<Record>& current, absl::Time now,
                          const Policy& policy) {
  return DecideGet(current ? &*current : nullptr, now, policy);
}

// The expiry policy for a PROCESSING record whose lease ran out by `now`;
// a decision without a write when nothing is due.
Decision DecideExpire(const Record& current, absl::Time now,
                      const Policy& policy, const std::string& actor);

Decision DecideResolve(const std::optional<Record>& current,
                       const ResolveCommand& cmd, const Policy& policy);

// How long an IN_PROGRESS caller should wait before retrying: the rest of the
// lease, clamped to [50ms, 1s] so callers neither spin nor oversleep.
absl::Duration RetryAfter(const Record& current, absl::Time now);

}  // namespace idem

#endif  // IDEM_STATEMACHINE_TRANSITIONS_H_
