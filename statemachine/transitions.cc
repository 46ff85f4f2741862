#include "statemachine/transitions.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace idem {
namespace {

Decision Error(absl::Status status) {
  Decision d;
  d.error = std::move(status);
  return d;
}

Decision NotFound() { return Error(absl::NotFoundError("record not found")); }

Decision StaleToken(int64_t token, const Record& cur) {
  Decision d = Error(absl::FailedPreconditionError(absl::StrCat(
      "stale fencing token ", token, "; current is ", cur.fencing_token)));
  d.stale_token = true;
  return d;
}

Decision Answer(Outcome outcome) {
  Decision d;
  d.outcome = outcome;
  return d;
}

Decision Apply(Outcome outcome, Write write) {
  Decision d;
  d.outcome = outcome;
  d.write = std::move(write);
  return d;
}

Guard Expect(const Record& r, bool lease_expired = false) {
  return Guard{r.status, r.fencing_token, lease_expired};
}

bool LeaseOver(const Record& r, absl::Time now) {
  return r.lease_expires_at <= now;
}

bool Terminal(Status s) {
  return s == Status::kSucceeded || s == Status::kFailed;
}

Outcome TerminalOutcome(const Record& r) {
  return r.status == Status::kSucceeded ? Outcome::kCompleted
                                        : Outcome::kFailed;
}

// A new acquisition of `base` (absent, retryable FAILED or released).
Write Acquire(const Record* base, const RecordKey& key,
              const BeginCommand& cmd) {
  Write w;
  Record& n = w.next;
  if (base != nullptr) {
    n = *base;
    w.guard = Expect(*base);
  } else {
    n.key = key;
  }
  n.status = Status::kProcessing;
  n.request_hash = cmd.request_hash;
  n.fencing_token = base ? base->fencing_token + 1 : 1;
  n.attempt = base ? base->attempt + 1 : 1;
  n.attempt_id = cmd.attempt_id;
  n.result.reset();
  n.retryable = false;
  n.expires_at.reset();
  n.resolved_by.clear();
  n.resolve_reason.clear();
  w.lease = cmd.lease;
  return w;
}

// Makes `w` a terminal write: it expires after the retention, and leaves a
// tombstone unless it is a retryable failure (which may run again anyway).
void Terminate(Write* w, const Policy& policy) {
  w->retention = policy.retention;
  const bool retryable = w->next.status == Status::kFailed && w->next.retryable;
  w->tombstone_retention =
      retryable ? absl::ZeroDuration() : policy.tombstone_retention;
}

AuditEntry Audit(const Record& from, Status to, const std::string& actor,
                 const std::string& reason) {
  AuditEntry a;
  a.from = from.status;
  a.to = to;
  a.actor = actor;
  a.reason = reason;
  a.fencing_token = from.fencing_token;
  return a;
}

// The expiry write for `cur`, whose lease ran out: to UNKNOWN, or to FAILED
// retryable under the release policy.
Write ExpiryWrite(const Record& cur, const Policy& policy,
                  const std::string& actor) {
  Write w;
  w.guard = Expect(cur, /*lease_expired=*/true);
  w.next = cur;
  if (policy.on_lease_expiry == ExpiryPolicy::kRelease) {
    w.next.status = Status::kFailed;
    w.next.retryable = true;
    Snapshot s;
    s.body = kLeaseExpired;
    s.content_type = "text/plain";
    w.next.result = s;
    w.next.resolved_by = actor;
    w.next.resolve_reason = kLeaseExpired;
    Terminate(&w, policy);
  } else {
    w.next.status = Status::kUnknown;
  }
  w.audit = Audit(cur, w.next.status, actor, "lease expired");
  return w;
}

// Complete and Fail: the holder reports a terminal state.
Decision DecideFinish(const std::optional<Record>& current, int64_t token,
                      Status to, const Snapshot& snapshot, bool retryable,
                      const Policy& policy) {
  if (!current) return NotFound();
  const Record& cur = *current;
  if (Terminal(cur.status)) {
    bool identical = cur.status == to && cur.fencing_token == token &&
                     cur.result == snapshot && cur.retryable == retryable;
    if (identical) return Answer(Outcome::kCompleted);
    return Error(absl::FailedPreconditionError(
        absl::StrCat("record is already ", StatusName(cur.status),
                     " with other content or another fencing token")));
  }
  if (token != cur.fencing_token) return StaleToken(token, cur);
  Write w;
  w.guard = Expect(cur);
  w.next = cur;
  w.next.status = to;
  w.next.result = snapshot;
  w.next.retryable = retryable;
  Terminate(&w, policy);
  if (cur.status == Status::kUnknown) {
    std::string reason = to == Status::kSucceeded ? "late Complete by holder"
                                                  : "late Fail by holder";
    w.audit = Audit(cur, to, kActorLateReport, reason);
    w.next.resolved_by = kActorLateReport;
    w.next.resolve_reason = reason;
  }
  return Apply(Outcome::kCompleted, std::move(w));
}

}  // namespace

const char* StatusName(Status s) {
  switch (s) {
    case Status::kProcessing:
      return "PROCESSING";
    case Status::kSucceeded:
      return "SUCCEEDED";
    case Status::kFailed:
      return "FAILED";
    case Status::kUnknown:
      return "UNKNOWN";
  }
  return "?";
}

bool ParseStatus(const std::string& name, Status* out) {
  for (Status s : {Status::kProcessing, Status::kSucceeded, Status::kFailed,
                   Status::kUnknown}) {
    if (name == StatusName(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kAcquired:
      return "ACQUIRED";
    case Outcome::kInProgress:
      return "IN_PROGRESS";
    case Outcome::kCompleted:
      return "COMPLETED";
    case Outcome::kFailed:
      return "FAILED";
    case Outcome::kUnknown:
      return "UNKNOWN";
    case Outcome::kMismatch:
      return "MISMATCH";
    case Outcome::kExpired:
      return "EXPIRED";
  }
  return "?";
}

const char* ExpiryPolicyName(ExpiryPolicy p) {
  return p == ExpiryPolicy::kRelease ? "release" : "unknown";
}

Decision DecideBegin(const Record* current, const RecordKey& key,
                     const BeginCommand& cmd, absl::Time now,
                     const Policy& policy) {
  if (current == nullptr)
    return Apply(Outcome::kAcquired, Acquire(current, key, cmd));
  const Record& cur = *current;
  if (cur.request_hash != cmd.request_hash) return Answer(Outcome::kMismatch);
  if (cur.tombstone) return Answer(Outcome::kExpired);
  switch (cur.status) {
    case Status::kProcessing:
      if (!LeaseOver(cur, now)) {
        if (!cmd.attempt_id.empty() && cmd.attempt_id == cur.attempt_id) {
          return Answer(Outcome::kAcquired);
        }
        return Answer(Outcome::kInProgress);
      }
      if (policy.on_lease_expiry == ExpiryPolicy::kRelease) {
        // Released, then re-acquired by this Begin in the same write; the
        // audit row records the release.
        Write w = Acquire(current, key, cmd);
        w.guard->lease_expired = true;
        w.audit = ExpiryWrite(cur, policy, kActorLazyExpiry).audit;
        return Apply(Outcome::kAcquired, std::move(w));
      }
      return Apply(Outcome::kUnknown,
                   ExpiryWrite(cur, policy, kActorLazyExpiry));
    case Status::kSucceeded:
      return Answer(Outcome::kCompleted);
    case Status::kFailed:
      if (cur.retryable) {
        return Apply(Outcome::kAcquired, Acquire(current, key, cmd));
      }
      return Answer(Outcome::kFailed);
    case Status::kUnknown:
      return Answer(Outcome::kUnknown);
  }
  return Error(absl::InternalError("unhandled status"));
}

Decision DecideHeartbeat(const std::optional<Record>& current,
                         const HeartbeatCommand& cmd) {
  if (!current) return NotFound();
  const Record& cur = *current;
  if (cur.status != Status::kProcessing) {
    return Error(absl::FailedPreconditionError(absl::StrCat(
        "record is ", StatusName(cur.status), "; nothing to heartbeat")));
  }
  if (cmd.fencing_token != cur.fencing_token) {
    return StaleToken(cmd.fencing_token, cur);
  }
  Write w;
  w.guard = Expect(cur);
  w.next = cur;
  w.lease = cmd.extend;
  return Apply(Outcome::kAcquired, std::move(w));
}

Decision DecideComplete(const std::optional<Record>& current,
                        const CompleteCommand& cmd, const Policy& policy) {
  return DecideFinish(current, cmd.fencing_token, Status::kSucceeded,
                      cmd.result, /*retryable=*/false, policy);
}

Decision DecideFail(const std::optional<Record>& current,
                    const FailCommand& cmd, const Policy& policy) {
  return DecideFinish(current, cmd.fencing_token, Status::kFailed, cmd.error,
                      cmd.retryable, policy);
}

Decision DecideGet(const Record* current, absl::Time now,
                   const Policy& policy) {
  if (current == nullptr) return NotFound();
  if (current->tombstone) {
    return Error(absl::NotFoundError(
        "record expired: only a tombstone is kept (Begin answers EXPIRED)"));
  }
  return DecideExpire(*current, now, policy, kActorLazyExpiry);
}

Decision DecideExpire(const Record& current, absl::Time now,
                      const Policy& policy, const std::string& actor) {
  if (current.status != Status::kProcessing || !LeaseOver(current, now)) {
    return Answer(Outcome::kInProgress);
  }
  return Apply(Outcome::kInProgress, ExpiryWrite(current, policy, actor));
}

Decision DecideResolve(const std::optional<Record>& current,
                       const ResolveCommand& cmd, const Policy& policy) {
  if (cmd.reason.empty()) {
    return Error(absl::InvalidArgumentError("reason: required"));
  }
  if (cmd.to != Status::kSucceeded && cmd.to != Status::kFailed) {
    return Error(absl::InvalidArgumentError("to: must be SUCCEEDED or FAILED"));
  }
  if (cmd.to == Status::kSucceeded && !cmd.result) {
    return Error(absl::InvalidArgumentError(
        "result: required when resolving to SUCCEEDED"));
  }
  if (!current) return NotFound();
  const Record& cur = *current;
  Snapshot snapshot = cmd.result.value_or(Snapshot{});
  bool retryable = cmd.to == Status::kFailed && cmd.retryable;
  if (Terminal(cur.status)) {
    bool repeat = cur.resolved_by == cmd.actor &&
                  cur.resolve_reason == cmd.reason && cur.status == cmd.to &&
                  cur.result == snapshot && cur.retryable == retryable &&
                  (cmd.expected_fencing_token == 0 ||
                   cmd.expected_fencing_token == cur.fencing_token);
    if (repeat) return Answer(TerminalOutcome(cur));
    return Error(absl::FailedPreconditionError(
        absl::StrCat("record is already ", StatusName(cur.status))));
  }
  if (cur.status == Status::kProcessing && !cmd.force) {
    return Error(absl::FailedPreconditionError(
        "record is PROCESSING: its holder may still be writing; resolve it "
        "only with force"));
  }
  if (cmd.expected_fencing_token != 0 &&
      cmd.expected_fencing_token != cur.fencing_token) {
    return Error(absl::FailedPreconditionError(
        absl::StrCat("expected fencing token ", cmd.expected_fencing_token,
                     "; current is ", cur.fencing_token)));
  }
  Write w;
  w.guard = Expect(cur);
  w.next = cur;
  w.next.status = cmd.to;
  w.next.result = snapshot;
  w.next.retryable = retryable;
  w.next.resolved_by = cmd.actor;
  w.next.resolve_reason = cmd.reason;
  Terminate(&w, policy);
  w.audit = Audit(cur, cmd.to, cmd.actor, cmd.reason);
  Decision d = Apply(Outcome::kCompleted, std::move(w));
  d.outcome =
      cmd.to == Status::kSucceeded ? Outcome::kCompleted : Outcome::kFailed;
  return d;
}

absl::Duration RetryAfter(const Record& current, absl::Time now) {
  return std::clamp(current.lease_expires_at - now, absl::Milliseconds(50),
                    absl::Seconds(1));
}

}  // namespace idem
