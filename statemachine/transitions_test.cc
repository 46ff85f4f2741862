// Unit tests of the pure state machine against the transition table of
// docs/spec.md#transitions. The table test has one row per (stored state,
// command) cell; focused tests below cover the rules behind the table.
#include "statemachine/transitions.h"

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "statemachine/record.h"

namespace idem {
namespace {

// ---------------------------------------------------------------------------
// Fixtures shared by all tests.

const absl::Time kNow = absl::FromUnixSeconds(1700000000);
constexpr int64_t kToken = 3;
constexpr int32_t kAttempt = 2;
constexpr char kHash[] = "hash-1";
constexpr char kOtherHash[] = "hash-2";
constexpr char kHolderAttemptId[] = "attempt-a";
constexpr char kNewAttemptId[] = "attempt-b";
constexpr char kOperator[] = "alice";
constexpr char kReason[] = "checked the ledger";
constexpr absl::Duration kBeginLease = absl::Seconds(20);
constexpr absl::Duration kHeartbeatExtend = absl::Seconds(15);
constexpr absl::Duration kRetention = absl::Hours(72);

RecordKey Key() { return RecordKey{"tenant-a", "create-payment", "order-42"}; }

Snapshot MakeSnapshot(int32_t code, const std::string& body) {
  Snapshot s;
  s.code = code;
  s.body = body;
  s.content_type = "application/json";
  s.headers["x-request-id"] = "r-1";
  return s;
}

// The snapshots stored in the fixture records.
Snapshot StoredSuccess() { return MakeSnapshot(200, "{\"id\":7}"); }
Snapshot StoredFinalError() { return MakeSnapshot(402, "declined"); }
Snapshot StoredRetryableError() { return MakeSnapshot(503, "try later"); }
// The snapshots carried by commands.
Snapshot NewResult() { return MakeSnapshot(201, "{\"id\":8}"); }
Snapshot NewError() { return MakeSnapshot(500, "boom"); }
Snapshot ResolvedResult() { return MakeSnapshot(200, "{\"from\":\"ledger\"}"); }

Policy MakePolicy(ExpiryPolicy on_lease_expiry) {
  Policy p;
  p.retention = kRetention;
  p.on_lease_expiry = on_lease_expiry;
  return p;
}

// The rows of the transition table.
enum class From {
  kAbsent,
  kProcessingLive,
  kProcessingOver,
  kSucceeded,
  kFailedFinal,
  kFailedRetryable,
  kUnknown,
};

const char* FromName(From f) {
  switch (f) {
    case From::kAbsent:
      return "Absent";
    case From::kProcessingLive:
      return "ProcessingLeaseLive";
    case From::kProcessingOver:
      return "ProcessingLeaseOver";
    case From::kSucceeded:
      return "Succeeded";
    case From::kFailedFinal:
      return "FailedNotRetryable";
    case From::kFailedRetryable:
      return "FailedRetryable";
    case From::kUnknown:
      return "Unknown";
  }
  return "?";
}

Record BaseRecord() {
  Record r;
  r.key = Key();
  r.request_hash = kHash;
  r.fencing_token = kToken;
  r.attempt = kAttempt;
  r.attempt_id = kHolderAttemptId;
  r.created_at = kNow - absl::Minutes(5);
  r.updated_at = kNow - absl::Minutes(1);
  return r;
}

Record Terminal(Status status, const Snapshot& result, bool retryable) {
  Record r = BaseRecord();
  r.status = status;
  r.lease_expires_at = kNow - absl::Minutes(1);
  r.result = result;
  r.retryable = retryable;
  r.expires_at = kNow + absl::Hours(23);
  return r;
}

// The stored record for a table row; nullopt for kAbsent.
std::optional<Record> Stored(From from) {
  Record r = BaseRecord();
  switch (from) {
    case From::kAbsent:
      return std::nullopt;
    case From::kProcessingLive:
      r.lease_expires_at = kNow + absl::Seconds(10);
      return r;
    case From::kProcessingOver:
      r.lease_expires_at = kNow - absl::Seconds(1);
      return r;
    case From::kSucceeded:
      return Terminal(Status::kSucceeded, StoredSuccess(), false);
    case From::kFailedFinal:
      return Terminal(Status::kFailed, StoredFinalError(), false);
    case From::kFailedRetryable:
      return Terminal(Status::kFailed, StoredRetryableError(), true);
    case From::kUnknown:
      r.status = Status::kUnknown;
      r.lease_expires_at = kNow - absl::Minutes(1);
      return r;
  }
  return std::nullopt;
}

// Applies `w` the way a store does, with `now` as the store's clock.
Record Applied(const Write& w, absl::Time now) {
  Record r = w.next;
  if (w.lease) r.lease_expires_at = now + *w.lease;
  if (w.retention) {
    r.expires_at = now + *w.retention;
  } else {
    r.expires_at.reset();
  }
  r.updated_at = now;
  return r;
}

BeginCommand Begin(const std::string& hash, const std::string& attempt_id) {
  BeginCommand c;
  c.request_hash = hash;
  c.lease = kBeginLease;
  c.attempt_id = attempt_id;
  return c;
}

HeartbeatCommand Heartbeat(int64_t token) {
  HeartbeatCommand c;
  c.fencing_token = token;
  c.extend = kHeartbeatExtend;
  return c;
}

CompleteCommand Complete(int64_t token, const Snapshot& result) {
  CompleteCommand c;
  c.fencing_token = token;
  c.result = result;
  return c;
}

FailCommand Fail(int64_t token, const Snapshot& error, bool retryable) {
  FailCommand c;
  c.fencing_token = token;
  c.error = error;
  c.retryable = retryable;
  return c;
}

ResolveCommand Resolve(Status to) {
  ResolveCommand c;
  c.to = to;
  if (to == Status::kSucceeded) c.result = ResolvedResult();
  c.reason = kReason;
  c.actor = kOperator;
  return c;
}

// ---------------------------------------------------------------------------
// The transition table.

// The columns of the table. Conditional cells ("if tok=cur", "OK if
// identical") get one command per branch.
enum class Cmd {
  kBeginSameHash,
  kBeginOtherHash,
  kHeartbeat,            // with the current token
  kHeartbeatStaleToken,  // with the current token - 1
  kComplete,             // current token, new content
  kCompleteStaleToken,   // current token - 1
  kCompleteIdentical,    // exactly what is stored
  kFail,                 // current token, new content, not retryable
  kFailStaleToken,       // current token - 1
  kFailIdentical,        // exactly what is stored
  kLeaseRunsOut,         // DecideExpire by the reaper (Get when absent)
  kResolve,              // to SUCCEEDED, no force
  kResolveToFailed,      // to FAILED, no force
  kResolveForced,        // to SUCCEEDED, force
};

const char* CmdName(Cmd c) {
  switch (c) {
    case Cmd::kBeginSameHash:
      return "BeginSameHash";
    case Cmd::kBeginOtherHash:
      return "BeginOtherHash";
    case Cmd::kHeartbeat:
      return "Heartbeat";
    case Cmd::kHeartbeatStaleToken:
      return "HeartbeatStaleToken";
    case Cmd::kComplete:
      return "Complete";
    case Cmd::kCompleteStaleToken:
      return "CompleteStaleToken";
    case Cmd::kCompleteIdentical:
      return "CompleteIdentical";
    case Cmd::kFail:
      return "Fail";
    case Cmd::kFailStaleToken:
      return "FailStaleToken";
    case Cmd::kFailIdentical:
      return "FailIdentical";
    case Cmd::kLeaseRunsOut:
      return "LeaseRunsOut";
    case Cmd::kResolve:
      return "Resolve";
    case Cmd::kResolveToFailed:
      return "ResolveToFailed";
    case Cmd::kResolveForced:
      return "ResolveForced";
  }
  return "?";
}

Decision RunCmd(Cmd cmd, const std::optional<Record>& stored,
                const Policy& policy) {
  const int64_t token = stored ? stored->fencing_token : kToken;
  const Snapshot stored_result =
      stored ? stored->result.value_or(Snapshot{}) : Snapshot{};
  const bool stored_retryable = stored && stored->retryable;
  switch (cmd) {
    case Cmd::kBeginSameHash:
      return DecideBegin(stored, Key(), Begin(kHash, kNewAttemptId), kNow,
                         policy);
    case Cmd::kBeginOtherHash:
      return DecideBegin(stored, Key(), Begin(kOtherHash, kNewAttemptId), kNow,
                         policy);
    case Cmd::kHeartbeat:
      return DecideHeartbeat(stored, Heartbeat(token));
    case Cmd::kHeartbeatStaleToken:
      return DecideHeartbeat(stored, Heartbeat(token - 1));
    case Cmd::kComplete:
      return DecideComplete(stored, Complete(token, NewResult()), policy);
    case Cmd::kCompleteStaleToken:
      return DecideComplete(stored, Complete(token - 1, NewResult()), policy);
    case Cmd::kCompleteIdentical:
      return DecideComplete(stored, Complete(token, stored_result), policy);
    case Cmd::kFail:
      return DecideFail(stored, Fail(token, NewError(), false), policy);
    case Cmd::kFailStaleToken:
      return DecideFail(stored, Fail(token - 1, NewError(), false), policy);
    case Cmd::kFailIdentical:
      return DecideFail(stored, Fail(token, stored_result, stored_retryable),
                        policy);
    case Cmd::kLeaseRunsOut:
      // Nothing can run out on an absent record; Get tells NOT_FOUND.
      if (!stored) return DecideGet(stored, kNow, policy);
      return DecideExpire(*stored, kNow, policy, kActorReaper);
    case Cmd::kResolve:
      return DecideResolve(stored, Resolve(Status::kSucceeded), policy);
    case Cmd::kResolveToFailed:
      return DecideResolve(stored, Resolve(Status::kFailed), policy);
    case Cmd::kResolveForced: {
      ResolveCommand c = Resolve(Status::kSucceeded);
      c.force = true;
      return DecideResolve(stored, c, policy);
    }
  }
  return Decision{};
}

struct AuditWant {
  std::string actor;
  Status to = Status::kProcessing;
};

// The expected decision of one cell.
struct Want {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::optional<Outcome> outcome;  // unset: not Begin's or Resolve's business
  bool writes = false;
  // The rest applies only when `writes`.
  Status status = Status::kProcessing;
  int64_t token = 0;
  int32_t attempt = 0;
  std::optional<Guard> guard;           // unset: create (no guard)
  std::optional<absl::Duration> lease;  // unset: lease not reset
  bool retention = false;
  std::optional<AuditWant> audit;  // unset: no audit row
};

constexpr std::nullopt_t kAnyOutcome = std::nullopt;
constexpr std::nullopt_t kCreate = std::nullopt;
constexpr std::nullopt_t kKeepLease = std::nullopt;
constexpr std::nullopt_t kNoAudit = std::nullopt;
constexpr bool kRetain = true;
constexpr bool kNoRetention = false;
constexpr bool kLeaseMustBeOver = true;
constexpr bool kAnyLease = false;

Want Refused(absl::StatusCode code) {
  Want w;
  w.code = code;
  return w;
}

Want Answers(std::optional<Outcome> outcome) {
  Want w;
  w.outcome = outcome;
  return w;
}

Want Writes(std::optional<Outcome> outcome, Status status, int64_t token,
            int32_t attempt, std::optional<Guard> guard,
            std::optional<absl::Duration> lease, bool retention,
            std::optional<AuditWant> audit) {
  Want w;
  w.outcome = outcome;
  w.writes = true;
  w.status = status;
  w.token = token;
  w.attempt = attempt;
  w.guard = guard;
  w.lease = lease;
  w.retention = retention;
  w.audit = std::move(audit);
  return w;
}

Guard Expects(Status status, bool lease_expired) {
  return Guard{status, kToken, lease_expired};
}

AuditWant AuditBy(const std::string& actor, Status to) {
  return AuditWant{actor, to};
}

// Which expiry policies a row is checked under.
enum class Policies { kBoth, kUnknownOnly, kReleaseOnly };

struct Row {
  From from;
  Cmd cmd;
  Policies policies;
  Want want;
};

std::vector<Row> TransitionTable() {
  using S = Status;
  using O = Outcome;
  const absl::StatusCode kNotFound = absl::StatusCode::kNotFound;
  const absl::StatusCode kPrecondition = absl::StatusCode::kFailedPrecondition;
  const Policies kBoth = Policies::kBoth;
  return {
      // absent
      {From::kAbsent, Cmd::kBeginSameHash, kBoth,
       Writes(O::kAcquired, S::kProcessing, 1, 1, kCreate, kBeginLease,
              kNoRetention, kNoAudit)},
      {From::kAbsent, Cmd::kBeginOtherHash, kBoth,
       Writes(O::kAcquired, S::kProcessing, 1, 1, kCreate, kBeginLease,
              kNoRetention, kNoAudit)},
      {From::kAbsent, Cmd::kHeartbeat, kBoth, Refused(kNotFound)},
      {From::kAbsent, Cmd::kComplete, kBoth, Refused(kNotFound)},
      {From::kAbsent, Cmd::kFail, kBoth, Refused(kNotFound)},
      {From::kAbsent, Cmd::kLeaseRunsOut, kBoth, Refused(kNotFound)},
      {From::kAbsent, Cmd::kResolve, kBoth, Refused(kNotFound)},
      {From::kAbsent, Cmd::kResolveForced, kBoth, Refused(kNotFound)},

      // PROCESSING, lease live
      {From::kProcessingLive, Cmd::kBeginSameHash, kBoth,
       Answers(O::kInProgress)},
      {From::kProcessingLive, Cmd::kBeginOtherHash, kBoth,
       Answers(O::kMismatch)},
      {From::kProcessingLive, Cmd::kHeartbeat, kBoth,
       Writes(kAnyOutcome, S::kProcessing, kToken, kAttempt,
              Expects(S::kProcessing, kAnyLease), kHeartbeatExtend,
              kNoRetention, kNoAudit)},
      {From::kProcessingLive, Cmd::kHeartbeatStaleToken, kBoth,
       Refused(kPrecondition)},
      {From::kProcessingLive, Cmd::kComplete, kBoth,
       Writes(kAnyOutcome, S::kSucceeded, kToken, kAttempt,
              Expects(S::kProcessing, kAnyLease), kKeepLease, kRetain,
              kNoAudit)},
      {From::kProcessingLive, Cmd::kCompleteStaleToken, kBoth,
       Refused(kPrecondition)},
      {From::kProcessingLive, Cmd::kFail, kBoth,
       Writes(kAnyOutcome, S::kFailed, kToken, kAttempt,
              Expects(S::kProcessing, kAnyLease), kKeepLease, kRetain,
              kNoAudit)},
      {From::kProcessingLive, Cmd::kFailStaleToken, kBoth,
       Refused(kPrecondition)},
      {From::kProcessingLive, Cmd::kLeaseRunsOut, kBoth, Answers(kAnyOutcome)},
      {From::kProcessingLive, Cmd::kResolve, kBoth, Refused(kPrecondition)},
      {From::kProcessingLive, Cmd::kResolveForced, kBoth,
       Writes(O::kCompleted, S::kSucceeded, kToken, kAttempt,
              Expects(S::kProcessing, kAnyLease), kKeepLease, kRetain,
              AuditBy(kOperator, S::kSucceeded))},

      // PROCESSING, lease over
      {From::kProcessingOver, Cmd::kBeginSameHash, Policies::kUnknownOnly,
       Writes(O::kUnknown, S::kUnknown, kToken, kAttempt,
              Expects(S::kProcessing, kLeaseMustBeOver), kKeepLease,
              kNoRetention, AuditBy(kActorLazyExpiry, S::kUnknown))},
      {From::kProcessingOver, Cmd::kBeginSameHash, Policies::kReleaseOnly,
       Writes(O::kAcquired, S::kProcessing, kToken + 1, kAttempt + 1,
              Expects(S::kProcessing, kLeaseMustBeOver), kBeginLease,
              kNoRetention, AuditBy(kActorLazyExpiry, S::kFailed))},
      {From::kProcessingOver, Cmd::kBeginOtherHash, kBoth,
       Answers(O::kMismatch)},
      {From::kProcessingOver, Cmd::kHeartbeat, kBoth,
       Writes(kAnyOutcome, S::kProcessing, kToken, kAttempt,
              Expects(S::kProcessing, kAnyLease), kHeartbeatExtend,
              kNoRetention, kNoAudit)},
      {From::kProcessingOver, Cmd::kHeartbeatStaleToken, kBoth,
       Refused(kPrecondition)},
      {From::kProcessingOver, Cmd::kComplete, kBoth,
       Writes(kAnyOutcome, S::kSucceeded, kToken, kAttempt,
              Expects(S::kProcessing, kAnyLease), kKeepLease, kRetain,
              kNoAudit)},
      {From::kProcessingOver, Cmd::kCompleteStaleToken, kBoth,
       Refused(kPrecondition)},
      {From::kProcessingOver, Cmd::kFail, kBoth,
       Writes(kAnyOutcome, S::kFailed, kToken, kAttempt,
              Expects(S::kProcessing, kAnyLease), kKeepLease, kRetain,
              kNoAudit)},
      {From::kProcessingOver, Cmd::kFailStaleToken, kBoth,
       Refused(kPrecondition)},
      {From::kProcessingOver, Cmd::kLeaseRunsOut, Policies::kUnknownOnly,
       Writes(kAnyOutcome, S::kUnknown, kToken, kAttempt,
              Expects(S::kProcessing, kLeaseMustBeOver), kKeepLease,
              kNoRetention, AuditBy(kActorReaper, S::kUnknown))},
      {From::kProcessingOver, Cmd::kLeaseRunsOut, Policies::kReleaseOnly,
       Writes(kAnyOutcome, S::kFailed, kToken, kAttempt,
              Expects(S::kProcessing, kLeaseMustBeOver), kKeepLease, kRetain,
              AuditBy(kActorReaper, S::kFailed))},
      {From::kProcessingOver, Cmd::kResolve, kBoth, Refused(kPrecondition)},
      {From::kProcessingOver, Cmd::kResolveForced, kBoth,
       Writes(O::kCompleted, S::kSucceeded, kToken, kAttempt,
              Expects(S::kProcessing, kAnyLease), kKeepLease, kRetain,
              AuditBy(kOperator, S::kSucceeded))},

      // SUCCEEDED
      {From::kSucceeded, Cmd::kBeginSameHash, kBoth, Answers(O::kCompleted)},
      {From::kSucceeded, Cmd::kBeginOtherHash, kBoth, Answers(O::kMismatch)},
      {From::kSucceeded, Cmd::kHeartbeat, kBoth, Refused(kPrecondition)},
      {From::kSucceeded, Cmd::kCompleteIdentical, kBoth, Answers(kAnyOutcome)},
      {From::kSucceeded, Cmd::kComplete, kBoth, Refused(kPrecondition)},
      {From::kSucceeded, Cmd::kCompleteStaleToken, kBoth,
       Refused(kPrecondition)},
      {From::kSucceeded, Cmd::kFailIdentical, kBoth, Refused(kPrecondition)},
      {From::kSucceeded, Cmd::kFail, kBoth, Refused(kPrecondition)},
      {From::kSucceeded, Cmd::kLeaseRunsOut, kBoth, Answers(kAnyOutcome)},
      {From::kSucceeded, Cmd::kResolve, kBoth, Refused(kPrecondition)},
      {From::kSucceeded, Cmd::kResolveForced, kBoth, Refused(kPrecondition)},

      // FAILED, not retryable
      {From::kFailedFinal, Cmd::kBeginSameHash, kBoth, Answers(O::kFailed)},
      {From::kFailedFinal, Cmd::kBeginOtherHash, kBoth, Answers(O::kMismatch)},
      {From::kFailedFinal, Cmd::kHeartbeat, kBoth, Refused(kPrecondition)},
      {From::kFailedFinal, Cmd::kFailIdentical, kBoth, Answers(kAnyOutcome)},
      {From::kFailedFinal, Cmd::kFail, kBoth, Refused(kPrecondition)},
      {From::kFailedFinal, Cmd::kFailStaleToken, kBoth, Refused(kPrecondition)},
      {From::kFailedFinal, Cmd::kCompleteIdentical, kBoth,
       Refused(kPrecondition)},
      {From::kFailedFinal, Cmd::kComplete, kBoth, Refused(kPrecondition)},
      {From::kFailedFinal, Cmd::kLeaseRunsOut, kBoth, Answers(kAnyOutcome)},
      {From::kFailedFinal, Cmd::kResolve, kBoth, Refused(kPrecondition)},
      {From::kFailedFinal, Cmd::kResolveToFailed, kBoth,
       Refused(kPrecondition)},

      // FAILED, retryable
      {From::kFailedRetryable, Cmd::kBeginSameHash, kBoth,
       Writes(O::kAcquired, S::kProcessing, kToken + 1, kAttempt + 1,
              Expects(S::kFailed, kAnyLease), kBeginLease, kNoRetention,
              kNoAudit)},
      {From::kFailedRetryable, Cmd::kBeginOtherHash, kBoth,
       Answers(O::kMismatch)},
      {From::kFailedRetryable, Cmd::kHeartbeat, kBoth, Refused(kPrecondition)},
      {From::kFailedRetryable, Cmd::kFailIdentical, kBoth,
       Answers(kAnyOutcome)},
      {From::kFailedRetryable, Cmd::kFail, kBoth, Refused(kPrecondition)},
      {From::kFailedRetryable, Cmd::kFailStaleToken, kBoth,
       Refused(kPrecondition)},
      {From::kFailedRetryable, Cmd::kCompleteIdentical, kBoth,
       Refused(kPrecondition)},
      {From::kFailedRetryable, Cmd::kComplete, kBoth, Refused(kPrecondition)},
      {From::kFailedRetryable, Cmd::kLeaseRunsOut, kBoth, Answers(kAnyOutcome)},
      {From::kFailedRetryable, Cmd::kResolve, kBoth, Refused(kPrecondition)},
      {From::kFailedRetryable, Cmd::kResolveToFailed, kBoth,
       Refused(kPrecondition)},

      // UNKNOWN
      {From::kUnknown, Cmd::kBeginSameHash, kBoth, Answers(O::kUnknown)},
      {From::kUnknown, Cmd::kBeginOtherHash, kBoth, Answers(O::kMismatch)},
      {From::kUnknown, Cmd::kHeartbeat, kBoth, Refused(kPrecondition)},
      {From::kUnknown, Cmd::kComplete, kBoth,
       Writes(kAnyOutcome, S::kSucceeded, kToken, kAttempt,
              Expects(S::kUnknown, kAnyLease), kKeepLease, kRetain,
              AuditBy(kActorLateReport, S::kSucceeded))},
      {From::kUnknown, Cmd::kCompleteStaleToken, kBoth, Refused(kPrecondition)},
      {From::kUnknown, Cmd::kFail, kBoth,
       Writes(kAnyOutcome, S::kFailed, kToken, kAttempt,
              Expects(S::kUnknown, kAnyLease), kKeepLease, kRetain,
              AuditBy(kActorLateReport, S::kFailed))},
      {From::kUnknown, Cmd::kFailStaleToken, kBoth, Refused(kPrecondition)},
      {From::kUnknown, Cmd::kLeaseRunsOut, kBoth, Answers(kAnyOutcome)},
      {From::kUnknown, Cmd::kResolve, kBoth,
       Writes(O::kCompleted, S::kSucceeded, kToken, kAttempt,
              Expects(S::kUnknown, kAnyLease), kKeepLease, kRetain,
              AuditBy(kOperator, S::kSucceeded))},
      {From::kUnknown, Cmd::kResolveToFailed, kBoth,
       Writes(O::kFailed, S::kFailed, kToken, kAttempt,
              Expects(S::kUnknown, kAnyLease), kKeepLease, kRetain,
              AuditBy(kOperator, S::kFailed))},
  };
}

struct Case {
  Row row;
  ExpiryPolicy policy;
};

std::vector<Case> TableCases() {
  std::vector<Case> cases;
  for (const Row& row : TransitionTable()) {
    if (row.policies != Policies::kReleaseOnly) {
      cases.push_back(Case{row, ExpiryPolicy::kUnknown});
    }
    if (row.policies != Policies::kUnknownOnly) {
      cases.push_back(Case{row, ExpiryPolicy::kRelease});
    }
  }
  return cases;
}

std::string CaseName(const Case& c) {
  return std::string(FromName(c.row.from)) + "_" + CmdName(c.row.cmd) +
         (c.policy == ExpiryPolicy::kRelease ? "_ReleasePolicy"
                                             : "_UnknownPolicy");
}

void PrintTo(const Case& c, std::ostream* os) { *os << CaseName(c); }

class TransitionTableTest : public testing::TestWithParam<Case> {};

TEST_P(TransitionTableTest, Cell) {
  const Case& c = GetParam();
  const Want& want = c.row.want;
  const std::optional<Record> stored = Stored(c.row.from);
  const Decision d = RunCmd(c.row.cmd, stored, MakePolicy(c.policy));

  EXPECT_EQ(d.error.code(), want.code) << d.error;
  if (!d.error.ok()) {
    EXPECT_FALSE(d.write.has_value()) << "an error never writes";
  }
  if (want.outcome) {
    EXPECT_STREQ(OutcomeName(d.outcome), OutcomeName(*want.outcome));
  }
  ASSERT_EQ(d.write.has_value(), want.writes);
  if (!want.writes) return;

  const Write& w = *d.write;
  EXPECT_TRUE(w.next.key == Key());
  // A created record takes the caller's hash; an existing one keeps its own.
  EXPECT_EQ(w.next.request_hash,
            stored || c.row.cmd != Cmd::kBeginOtherHash ? kHash : kOtherHash);
  EXPECT_STREQ(StatusName(w.next.status), StatusName(want.status));
  EXPECT_EQ(w.next.fencing_token, want.token);
  EXPECT_EQ(w.next.attempt, want.attempt);

  if (want.guard) {
    ASSERT_TRUE(w.guard.has_value()) << "an update must be conditional";
    EXPECT_STREQ(StatusName(w.guard->status), StatusName(want.guard->status));
    EXPECT_EQ(w.guard->fencing_token, want.guard->fencing_token);
    EXPECT_EQ(w.guard->lease_expired, want.guard->lease_expired);
  } else {
    EXPECT_FALSE(w.guard.has_value()) << "a create has no guard";
  }

  EXPECT_EQ(w.lease, want.lease);

  EXPECT_EQ(w.retention.has_value(), want.retention);
  if (w.retention) {
    EXPECT_EQ(*w.retention, kRetention);
  }
  // Retention only on terminal records; PROCESSING and UNKNOWN are never
  // purged.
  const bool terminal =
      w.next.status == Status::kSucceeded || w.next.status == Status::kFailed;
  EXPECT_EQ(w.retention.has_value(), terminal);
  if (!terminal) {
    EXPECT_FALSE(w.next.expires_at.has_value());
  }

  if (want.audit) {
    ASSERT_TRUE(w.audit.has_value());
    EXPECT_EQ(w.audit->actor, want.audit->actor);
    EXPECT_STREQ(StatusName(w.audit->from), StatusName(stored->status));
    EXPECT_STREQ(StatusName(w.audit->to), StatusName(want.audit->to));
    EXPECT_EQ(w.audit->fencing_token, stored->fencing_token);
    EXPECT_FALSE(w.audit->reason.empty());
  } else {
    EXPECT_FALSE(w.audit.has_value());
  }
}

INSTANTIATE_TEST_SUITE_P(DesignSection3, TransitionTableTest,
                         testing::ValuesIn(TableCases()),
                         [](const testing::TestParamInfo<Case>& info) {
                           return CaseName(info.param);
                         });

// Every cell of docs/spec.md#transitions has at least one row, under both
// policies.
TEST(TransitionTableCoverageTest, EveryCellHasARowUnderBothPolicies) {
  // The columns of the table, each with the commands that exercise it.
  const std::vector<std::vector<Cmd>> columns = {
      {Cmd::kBeginSameHash},
      {Cmd::kBeginOtherHash},
      {Cmd::kHeartbeat},
      {Cmd::kComplete, Cmd::kCompleteIdentical, Cmd::kFail,
       Cmd::kFailIdentical},
      {Cmd::kLeaseRunsOut},
      {Cmd::kResolve},
  };
  const std::vector<Case> cases = TableCases();
  for (From from : {From::kAbsent, From::kProcessingLive, From::kProcessingOver,
                    From::kSucceeded, From::kFailedFinal,
                    From::kFailedRetryable, From::kUnknown}) {
    for (size_t col = 0; col < columns.size(); ++col) {
      for (ExpiryPolicy policy :
           {ExpiryPolicy::kUnknown, ExpiryPolicy::kRelease}) {
        bool found = false;
        for (const Case& c : cases) {
          for (Cmd cmd : columns[col]) {
            found |=
                c.row.from == from && c.row.cmd == cmd && c.policy == policy;
          }
        }
        EXPECT_TRUE(found) << FromName(from) << " column " << col << " "
                           << ExpiryPolicyName(policy);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Begin.

TEST(BeginTest, CreatesTheFirstRecord) {
  const Decision d =
      DecideBegin(std::nullopt, Key(), Begin(kHash, kNewAttemptId), kNow,
                  MakePolicy(ExpiryPolicy::kUnknown));
  ASSERT_TRUE(d.error.ok()) << d.error;
  EXPECT_EQ(d.outcome, Outcome::kAcquired);
  ASSERT_TRUE(d.write.has_value());
  const Write& w = *d.write;
  EXPECT_FALSE(w.guard.has_value());
  EXPECT_TRUE(w.next.key == Key());
  EXPECT_EQ(w.next.status, Status::kProcessing);
  EXPECT_EQ(w.next.request_hash, kHash);
  EXPECT_EQ(w.next.fencing_token, 1);
  EXPECT_EQ(w.next.attempt, 1);
  EXPECT_EQ(w.next.attempt_id, kNewAttemptId);
  EXPECT_FALSE(w.next.result.has_value());
  EXPECT_FALSE(w.next.retryable);
  EXPECT_FALSE(w.next.expires_at.has_value());
  EXPECT_EQ(w.lease, kBeginLease);
  EXPECT_FALSE(w.retention.has_value());
  EXPECT_FALSE(w.audit.has_value());
}

TEST(BeginTest, SameAttemptIdRegainsTheGrantWhileTheLeaseIsLive) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  const std::optional<Record> live = Stored(From::kProcessingLive);

  const Decision same =
      DecideBegin(live, Key(), Begin(kHash, kHolderAttemptId), kNow, policy);
  EXPECT_TRUE(same.error.ok()) << same.error;
  EXPECT_EQ(same.outcome, Outcome::kAcquired);
  // The grant is the existing one: nothing is written and the token stays.
  EXPECT_FALSE(same.write.has_value());

  const Decision other =
      DecideBegin(live, Key(), Begin(kHash, kNewAttemptId), kNow, policy);
  EXPECT_EQ(other.outcome, Outcome::kInProgress);
  EXPECT_FALSE(other.write.has_value());

  const Decision none =
      DecideBegin(live, Key(), Begin(kHash, ""), kNow, policy);
  EXPECT_EQ(none.outcome, Outcome::kInProgress);
  EXPECT_FALSE(none.write.has_value());
}

TEST(BeginTest, EmptyAttemptIdNeverRegains) {
  std::optional<Record> live = Stored(From::kProcessingLive);
  live->attempt_id.clear();
  const Decision d = DecideBegin(live, Key(), Begin(kHash, ""), kNow,
                                 MakePolicy(ExpiryPolicy::kUnknown));
  EXPECT_EQ(d.outcome, Outcome::kInProgress);
  EXPECT_FALSE(d.write.has_value());
}

TEST(BeginTest, AttemptIdIsStoredAndRegainsAfterTheGrantIsWritten) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  const Decision first = DecideBegin(std::nullopt, Key(),
                                     Begin(kHash, kNewAttemptId), kNow, policy);
  ASSERT_TRUE(first.write.has_value());
  EXPECT_EQ(first.write->next.attempt_id, kNewAttemptId);
  const Record stored = Applied(*first.write, kNow);

  const Decision again = DecideBegin(stored, Key(), Begin(kHash, kNewAttemptId),
                                     kNow + absl::Seconds(1), policy);
  EXPECT_EQ(again.outcome, Outcome::kAcquired);
  EXPECT_FALSE(again.write.has_value());
}

TEST(BeginTest, SameAttemptIdAfterTheLeaseRanOutGetsTheExpiryPolicy) {
  const std::optional<Record> over = Stored(From::kProcessingOver);

  const Decision unknown =
      DecideBegin(over, Key(), Begin(kHash, kHolderAttemptId), kNow,
                  MakePolicy(ExpiryPolicy::kUnknown));
  EXPECT_EQ(unknown.outcome, Outcome::kUnknown);
  ASSERT_TRUE(unknown.write.has_value());
  EXPECT_EQ(unknown.write->next.status, Status::kUnknown);

  const Decision release =
      DecideBegin(over, Key(), Begin(kHash, kHolderAttemptId), kNow,
                  MakePolicy(ExpiryPolicy::kRelease));
  EXPECT_EQ(release.outcome, Outcome::kAcquired);
  ASSERT_TRUE(release.write.has_value());
  // A new grant with a new token, not the old one regained.
  EXPECT_EQ(release.write->next.fencing_token, kToken + 1);
}

TEST(BeginTest, LeaseEndingExactlyNowIsOver) {
  std::optional<Record> r = Stored(From::kProcessingLive);
  r->lease_expires_at = kNow;
  const Decision d = DecideBegin(r, Key(), Begin(kHash, kNewAttemptId), kNow,
                                 MakePolicy(ExpiryPolicy::kUnknown));
  EXPECT_EQ(d.outcome, Outcome::kUnknown);
  ASSERT_TRUE(d.write.has_value());
  EXPECT_TRUE(d.write->guard->lease_expired);
}

TEST(BeginTest, MismatchNeverWrites) {
  for (From from :
       {From::kProcessingLive, From::kProcessingOver, From::kSucceeded,
        From::kFailedFinal, From::kFailedRetryable, From::kUnknown}) {
    for (ExpiryPolicy policy :
         {ExpiryPolicy::kUnknown, ExpiryPolicy::kRelease}) {
      for (const char* attempt_id : {"", kHolderAttemptId, kNewAttemptId}) {
        SCOPED_TRACE(::testing::Message()
                     << FromName(from) << " " << ExpiryPolicyName(policy)
                     << " attempt_id=" << attempt_id);
        const Decision d =
            DecideBegin(Stored(from), Key(), Begin(kOtherHash, attempt_id),
                        kNow, MakePolicy(policy));
        EXPECT_TRUE(d.error.ok()) << d.error;
        EXPECT_EQ(d.outcome, Outcome::kMismatch);
        EXPECT_FALSE(d.write.has_value());
      }
    }
  }
}

TEST(BeginTest, UnknownNeverGrants) {
  std::optional<Record> unknown = Stored(From::kUnknown);
  for (absl::Time lease_end :
       {kNow - absl::Hours(1), kNow, kNow + absl::Hours(1)}) {
    unknown->lease_expires_at = lease_end;
    for (ExpiryPolicy policy :
         {ExpiryPolicy::kUnknown, ExpiryPolicy::kRelease}) {
      for (const char* attempt_id : {"", kHolderAttemptId, kNewAttemptId}) {
        SCOPED_TRACE(::testing::Message()
                     << ExpiryPolicyName(policy) << " attempt_id=" << attempt_id
                     << " lease_end=" << lease_end);
        const Decision d = DecideBegin(unknown, Key(), Begin(kHash, attempt_id),
                                       kNow, MakePolicy(policy));
        EXPECT_TRUE(d.error.ok()) << d.error;
        EXPECT_EQ(d.outcome, Outcome::kUnknown);
        EXPECT_FALSE(d.write.has_value());

        const Decision get = DecideGet(unknown, kNow, MakePolicy(policy));
        EXPECT_TRUE(get.error.ok()) << get.error;
        EXPECT_FALSE(get.write.has_value());
      }
    }
  }
}

TEST(BeginTest, RetryableFailedReacquiresWithNextTokenAndAttempt) {
  std::optional<Record> failed = Stored(From::kFailedRetryable);
  failed->resolved_by = kOperator;
  failed->resolve_reason = kReason;
  const Decision d = DecideBegin(failed, Key(), Begin(kHash, kNewAttemptId),
                                 kNow, MakePolicy(ExpiryPolicy::kUnknown));
  ASSERT_TRUE(d.error.ok()) << d.error;
  EXPECT_EQ(d.outcome, Outcome::kAcquired);
  ASSERT_TRUE(d.write.has_value());
  const Write& w = *d.write;
  ASSERT_TRUE(w.guard.has_value());
  EXPECT_EQ(w.guard->status, Status::kFailed);
  EXPECT_EQ(w.guard->fencing_token, kToken);
  EXPECT_FALSE(w.guard->lease_expired);
  EXPECT_EQ(w.next.status, Status::kProcessing);
  EXPECT_EQ(w.next.fencing_token, kToken + 1);
  EXPECT_EQ(w.next.attempt, kAttempt + 1);
  EXPECT_EQ(w.next.attempt_id, kNewAttemptId);
  EXPECT_FALSE(w.next.result.has_value());
  EXPECT_FALSE(w.next.expires_at.has_value());
  EXPECT_FALSE(w.next.retryable);
  EXPECT_TRUE(w.next.resolved_by.empty());
  EXPECT_TRUE(w.next.resolve_reason.empty());
  EXPECT_EQ(w.lease, kBeginLease);
  EXPECT_FALSE(w.retention.has_value());
  EXPECT_FALSE(w.audit.has_value());

  const Record applied = Applied(w, kNow);
  EXPECT_EQ(applied.lease_expires_at, kNow + kBeginLease);
  EXPECT_FALSE(applied.expires_at.has_value());
}

TEST(BeginTest, ReplaysTerminalRecordsWithoutWriting) {
  for (From from :
       {From::kSucceeded, From::kFailedFinal, From::kFailedRetryable}) {
    SCOPED_TRACE(FromName(from));
    // Even the holder's own attempt id does not re-acquire a terminal record
    // other than by the retryable rule.
    const Decision d =
        DecideBegin(Stored(from), Key(), Begin(kHash, kHolderAttemptId), kNow,
                    MakePolicy(ExpiryPolicy::kUnknown));
    EXPECT_TRUE(d.error.ok()) << d.error;
    if (from == From::kSucceeded) {
      EXPECT_EQ(d.outcome, Outcome::kCompleted);
      EXPECT_FALSE(d.write.has_value());
    } else if (from == From::kFailedFinal) {
      EXPECT_EQ(d.outcome, Outcome::kFailed);
      EXPECT_FALSE(d.write.has_value());
    } else {
      EXPECT_EQ(d.outcome, Outcome::kAcquired);
      EXPECT_TRUE(d.write.has_value());
    }
  }
}

// ---------------------------------------------------------------------------
// Fencing.

TEST(FencingTest, OtherTokenIsFailedPreconditionAndNeverWrites) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  for (From from :
       {From::kProcessingLive, From::kProcessingOver, From::kUnknown}) {
    for (int64_t token : {int64_t{0}, kToken - 1, kToken + 1}) {
      SCOPED_TRACE(::testing::Message() << FromName(from) << " tok=" << token);
      const std::optional<Record> stored = Stored(from);
      const Decision hb = DecideHeartbeat(stored, Heartbeat(token));
      const Decision complete =
          DecideComplete(stored, Complete(token, NewResult()), policy);
      const Decision fail =
          DecideFail(stored, Fail(token, NewError(), true), policy);
      for (const Decision* d : {&hb, &complete, &fail}) {
        EXPECT_EQ(d->error.code(), absl::StatusCode::kFailedPrecondition)
            << d->error;
        EXPECT_FALSE(d->write.has_value());
      }
    }
  }
}

TEST(FencingTest, SlowHolderCannotOverwriteANewerHolder) {
  const Policy policy = MakePolicy(ExpiryPolicy::kRelease);
  // Holder 3's lease runs out; the reaper releases; holder 4 acquires.
  const Decision expire =
      DecideExpire(*Stored(From::kProcessingOver), kNow, policy, kActorReaper);
  ASSERT_TRUE(expire.write.has_value());
  const Record released = Applied(*expire.write, kNow);
  const Decision begin =
      DecideBegin(released, Key(), Begin(kHash, kNewAttemptId), kNow, policy);
  ASSERT_EQ(begin.outcome, Outcome::kAcquired);
  ASSERT_TRUE(begin.write.has_value());
  const Record newer = Applied(*begin.write, kNow);
  ASSERT_EQ(newer.fencing_token, kToken + 1);

  // Holder 3 wakes up.
  const Decision complete =
      DecideComplete(newer, Complete(kToken, NewResult()), policy);
  EXPECT_EQ(complete.error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(complete.write.has_value());
  const Decision hb = DecideHeartbeat(newer, Heartbeat(kToken));
  EXPECT_EQ(hb.error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(hb.write.has_value());

  // Holder 4 completes; holder 3 still cannot change the record.
  const Decision done =
      DecideComplete(newer, Complete(kToken + 1, NewResult()), policy);
  ASSERT_TRUE(done.write.has_value());
  const Record succeeded = Applied(*done.write, kNow);
  const Decision late =
      DecideFail(succeeded, Fail(kToken, NewError(), false), policy);
  EXPECT_EQ(late.error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(late.write.has_value());
}

TEST(FencingTest, HolderWritesAreGuardedByStatusAndToken) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  const std::optional<Record> live = Stored(From::kProcessingLive);
  const Decision hb = DecideHeartbeat(live, Heartbeat(kToken));
  const Decision complete =
      DecideComplete(live, Complete(kToken, NewResult()), policy);
  const Decision fail =
      DecideFail(live, Fail(kToken, NewError(), true), policy);
  for (const Decision* d : {&hb, &complete, &fail}) {
    ASSERT_TRUE(d->write.has_value());
    ASSERT_TRUE(d->write->guard.has_value());
    EXPECT_EQ(d->write->guard->status, Status::kProcessing);
    EXPECT_EQ(d->write->guard->fencing_token, kToken);
    EXPECT_FALSE(d->write->guard->lease_expired);
  }
  EXPECT_EQ(hb.write->lease, kHeartbeatExtend);
  EXPECT_EQ(hb.write->next.status, Status::kProcessing);
  EXPECT_EQ(Applied(*hb.write, kNow).lease_expires_at, kNow + kHeartbeatExtend);
}

// ---------------------------------------------------------------------------
// Complete and Fail.

TEST(FinishTest, CompleteWritesTheResultWithRetention) {
  const Decision d = DecideComplete(Stored(From::kProcessingLive),
                                    Complete(kToken, NewResult()),
                                    MakePolicy(ExpiryPolicy::kUnknown));
  ASSERT_TRUE(d.error.ok()) << d.error;
  ASSERT_TRUE(d.write.has_value());
  EXPECT_EQ(d.write->next.status, Status::kSucceeded);
  ASSERT_TRUE(d.write->next.result.has_value());
  EXPECT_EQ(*d.write->next.result, NewResult());
  EXPECT_FALSE(d.write->next.retryable);
  EXPECT_EQ(d.write->retention, kRetention);
  EXPECT_FALSE(d.write->audit.has_value());
  EXPECT_EQ(Applied(*d.write, kNow).expires_at, kNow + kRetention);
}

TEST(FinishTest, FailWritesTheErrorAndRetryable) {
  for (bool retryable : {false, true}) {
    SCOPED_TRACE(retryable);
    const Decision d = DecideFail(Stored(From::kProcessingLive),
                                  Fail(kToken, NewError(), retryable),
                                  MakePolicy(ExpiryPolicy::kUnknown));
    ASSERT_TRUE(d.error.ok()) << d.error;
    ASSERT_TRUE(d.write.has_value());
    EXPECT_EQ(d.write->next.status, Status::kFailed);
    ASSERT_TRUE(d.write->next.result.has_value());
    EXPECT_EQ(*d.write->next.result, NewError());
    EXPECT_EQ(d.write->next.retryable, retryable);
    EXPECT_EQ(d.write->retention, kRetention);
  }
}

TEST(FinishTest, RepeatedCompleteIsOkOnlyWhenIdentical) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  const Decision first = DecideComplete(Stored(From::kProcessingLive),
                                        Complete(kToken, NewResult()), policy);
  ASSERT_TRUE(first.write.has_value());
  const Record done = Applied(*first.write, kNow);

  const Decision repeat =
      DecideComplete(done, Complete(kToken, NewResult()), policy);
  EXPECT_TRUE(repeat.error.ok()) << repeat.error;
  EXPECT_FALSE(repeat.write.has_value());

  Snapshot other_body = NewResult();
  other_body.body += " ";
  Snapshot other_code = NewResult();
  other_code.code = 200;
  Snapshot other_type = NewResult();
  other_type.content_type = "text/plain";
  Snapshot other_headers = NewResult();
  other_headers.headers["x-extra"] = "1";
  for (const Snapshot& s :
       {other_body, other_code, other_type, other_headers}) {
    const Decision d = DecideComplete(done, Complete(kToken, s), policy);
    EXPECT_EQ(d.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(d.write.has_value());
  }
  const Decision other_token =
      DecideComplete(done, Complete(kToken + 1, NewResult()), policy);
  EXPECT_EQ(other_token.error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(other_token.write.has_value());
  const Decision as_fail =
      DecideFail(done, Fail(kToken, NewResult(), false), policy);
  EXPECT_EQ(as_fail.error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(as_fail.write.has_value());
}

TEST(FinishTest, RepeatedFailIsOkOnlyWhenIdentical) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  for (bool retryable : {false, true}) {
    SCOPED_TRACE(retryable);
    const Decision first =
        DecideFail(Stored(From::kProcessingLive),
                   Fail(kToken, NewError(), retryable), policy);
    ASSERT_TRUE(first.write.has_value());
    const Record failed = Applied(*first.write, kNow);

    const Decision repeat =
        DecideFail(failed, Fail(kToken, NewError(), retryable), policy);
    EXPECT_TRUE(repeat.error.ok()) << repeat.error;
    EXPECT_FALSE(repeat.write.has_value());

    const Decision other_retryable =
        DecideFail(failed, Fail(kToken, NewError(), !retryable), policy);
    EXPECT_EQ(other_retryable.error.code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(other_retryable.write.has_value());

    const Decision other_error =
        DecideFail(failed, Fail(kToken, NewResult(), retryable), policy);
    EXPECT_EQ(other_error.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(other_error.write.has_value());

    const Decision as_complete =
        DecideComplete(failed, Complete(kToken, NewError()), policy);
    EXPECT_EQ(as_complete.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(as_complete.write.has_value());
  }
}

TEST(FinishTest, LateReportOnUnknownIsAppliedAndAudited) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  // The lease ran out and the reaper made the record UNKNOWN.
  const Decision expire =
      DecideExpire(*Stored(From::kProcessingOver), kNow, policy, kActorReaper);
  ASSERT_TRUE(expire.write.has_value());
  const Record unknown = Applied(*expire.write, kNow);
  ASSERT_EQ(unknown.status, Status::kUnknown);

  struct LateReport {
    Decision decision;
    Status to;
    Snapshot snapshot;
  };
  const std::vector<LateReport> reports = {
      {DecideComplete(unknown, Complete(kToken, NewResult()), policy),
       Status::kSucceeded, NewResult()},
      {DecideFail(unknown, Fail(kToken, NewError(), false), policy),
       Status::kFailed, NewError()},
  };
  for (const LateReport& report : reports) {
    SCOPED_TRACE(StatusName(report.to));
    const Decision& d = report.decision;
    ASSERT_TRUE(d.error.ok()) << d.error;
    ASSERT_TRUE(d.write.has_value());
    const Write& w = *d.write;
    ASSERT_TRUE(w.guard.has_value());
    EXPECT_EQ(w.guard->status, Status::kUnknown);
    EXPECT_EQ(w.guard->fencing_token, kToken);
    EXPECT_EQ(w.next.status, report.to);
    ASSERT_TRUE(w.next.result.has_value());
    EXPECT_EQ(*w.next.result, report.snapshot);
    EXPECT_EQ(w.next.fencing_token, kToken);
    EXPECT_EQ(w.next.resolved_by, kActorLateReport);
    EXPECT_EQ(w.retention, kRetention);
    ASSERT_TRUE(w.audit.has_value());
    EXPECT_EQ(w.audit->actor, kActorLateReport);
    EXPECT_EQ(w.audit->from, Status::kUnknown);
    EXPECT_EQ(w.audit->to, report.to);
    EXPECT_EQ(w.audit->fencing_token, kToken);
    EXPECT_FALSE(w.audit->reason.empty());

    // Repeating the applied late report is OK and writes nothing.
    const Record reported = Applied(w, kNow);
    const Decision repeat =
        report.to == Status::kSucceeded
            ? DecideComplete(reported, Complete(kToken, NewResult()), policy)
            : DecideFail(reported, Fail(kToken, NewError(), false), policy);
    EXPECT_TRUE(repeat.error.ok()) << repeat.error;
    EXPECT_FALSE(repeat.write.has_value());
  }
}

// ---------------------------------------------------------------------------
// Lease expiry.

TEST(ExpiryTest, UnknownPolicyWritesUnknownWithAuditAndNoRetention) {
  const Decision d =
      DecideExpire(*Stored(From::kProcessingOver), kNow,
                   MakePolicy(ExpiryPolicy::kUnknown), kActorReaper);
  ASSERT_TRUE(d.error.ok()) << d.error;
  ASSERT_TRUE(d.write.has_value());
  const Write& w = *d.write;
  ASSERT_TRUE(w.guard.has_value());
  EXPECT_EQ(w.guard->status, Status::kProcessing);
  EXPECT_EQ(w.guard->fencing_token, kToken);
  EXPECT_TRUE(w.guard->lease_expired);
  EXPECT_EQ(w.next.status, Status::kUnknown);
  EXPECT_EQ(w.next.fencing_token, kToken);
  EXPECT_FALSE(w.next.result.has_value());
  EXPECT_FALSE(w.retention.has_value());
  EXPECT_FALSE(w.next.expires_at.has_value());
  ASSERT_TRUE(w.audit.has_value());
  EXPECT_EQ(w.audit->actor, kActorReaper);
  EXPECT_EQ(w.audit->from, Status::kProcessing);
  EXPECT_EQ(w.audit->to, Status::kUnknown);
  EXPECT_EQ(w.audit->fencing_token, kToken);
}

TEST(ExpiryTest, ReleasePolicyWritesRetryableLeaseExpiredFailure) {
  const Decision d =
      DecideExpire(*Stored(From::kProcessingOver), kNow,
                   MakePolicy(ExpiryPolicy::kRelease), kActorReaper);
  ASSERT_TRUE(d.error.ok()) << d.error;
  ASSERT_TRUE(d.write.has_value());
  const Write& w = *d.write;
  ASSERT_TRUE(w.guard.has_value());
  EXPECT_EQ(w.guard->status, Status::kProcessing);
  EXPECT_EQ(w.guard->fencing_token, kToken);
  EXPECT_TRUE(w.guard->lease_expired);
  EXPECT_EQ(w.next.status, Status::kFailed);
  EXPECT_TRUE(w.next.retryable);
  EXPECT_EQ(w.next.fencing_token, kToken);
  ASSERT_TRUE(w.next.result.has_value());
  EXPECT_EQ(w.next.result->body, kLeaseExpired);
  EXPECT_EQ(w.retention, kRetention);
  ASSERT_TRUE(w.audit.has_value());
  EXPECT_EQ(w.audit->actor, kActorReaper);
  EXPECT_EQ(w.audit->from, Status::kProcessing);
  EXPECT_EQ(w.audit->to, Status::kFailed);
  EXPECT_EQ(w.audit->fencing_token, kToken);

  // The next Begin re-acquires the released record.
  const Record released = Applied(w, kNow);
  const Decision begin =
      DecideBegin(released, Key(), Begin(kHash, kNewAttemptId), kNow,
                  MakePolicy(ExpiryPolicy::kRelease));
  EXPECT_EQ(begin.outcome, Outcome::kAcquired);
  ASSERT_TRUE(begin.write.has_value());
  EXPECT_EQ(begin.write->next.fencing_token, kToken + 1);
  EXPECT_EQ(begin.write->next.attempt, kAttempt + 1);
  EXPECT_FALSE(begin.write->next.result.has_value());
  EXPECT_FALSE(begin.write->next.expires_at.has_value());
}

TEST(ExpiryTest, BeginUnderReleaseReleasesAndAcquiresInOneWrite) {
  const Decision d = DecideBegin(Stored(From::kProcessingOver), Key(),
                                 Begin(kHash, kNewAttemptId), kNow,
                                 MakePolicy(ExpiryPolicy::kRelease));
  ASSERT_TRUE(d.error.ok()) << d.error;
  EXPECT_EQ(d.outcome, Outcome::kAcquired);
  ASSERT_TRUE(d.write.has_value());
  const Write& w = *d.write;
  ASSERT_TRUE(w.guard.has_value());
  EXPECT_EQ(w.guard->status, Status::kProcessing);
  EXPECT_EQ(w.guard->fencing_token, kToken);
  EXPECT_TRUE(w.guard->lease_expired);
  EXPECT_EQ(w.next.status, Status::kProcessing);
  EXPECT_EQ(w.next.fencing_token, kToken + 1);
  EXPECT_EQ(w.next.attempt, kAttempt + 1);
  EXPECT_EQ(w.next.attempt_id, kNewAttemptId);
  EXPECT_FALSE(w.next.result.has_value());
  EXPECT_FALSE(w.next.expires_at.has_value());
  EXPECT_EQ(w.lease, kBeginLease);
  EXPECT_FALSE(w.retention.has_value());
  ASSERT_TRUE(w.audit.has_value());
  EXPECT_EQ(w.audit->actor, kActorLazyExpiry);
  EXPECT_EQ(w.audit->from, Status::kProcessing);
  EXPECT_EQ(w.audit->to, Status::kFailed);
  EXPECT_EQ(w.audit->fencing_token, kToken);
}

TEST(ExpiryTest, GetAppliesADueExpiryLazily) {
  for (ExpiryPolicy policy : {ExpiryPolicy::kUnknown, ExpiryPolicy::kRelease}) {
    SCOPED_TRACE(ExpiryPolicyName(policy));
    const Decision over =
        DecideGet(Stored(From::kProcessingOver), kNow, MakePolicy(policy));
    ASSERT_TRUE(over.error.ok()) << over.error;
    ASSERT_TRUE(over.write.has_value());
    EXPECT_EQ(over.write->next.status, policy == ExpiryPolicy::kRelease
                                           ? Status::kFailed
                                           : Status::kUnknown);
    ASSERT_TRUE(over.write->audit.has_value());
    EXPECT_EQ(over.write->audit->actor, kActorLazyExpiry);
    EXPECT_TRUE(over.write->guard->lease_expired);

    for (From from :
         {From::kProcessingLive, From::kSucceeded, From::kFailedFinal,
          From::kFailedRetryable, From::kUnknown}) {
      SCOPED_TRACE(FromName(from));
      const Decision read = DecideGet(Stored(from), kNow, MakePolicy(policy));
      EXPECT_TRUE(read.error.ok()) << read.error;
      EXPECT_FALSE(read.write.has_value());
    }
  }
}

TEST(ExpiryTest, NothingIsDueBeforeTheLeaseEnds) {
  std::optional<Record> r = Stored(From::kProcessingLive);
  r->lease_expires_at = kNow + absl::Nanoseconds(1);
  for (ExpiryPolicy policy : {ExpiryPolicy::kUnknown, ExpiryPolicy::kRelease}) {
    const Decision d = DecideExpire(*r, kNow, MakePolicy(policy), kActorReaper);
    EXPECT_TRUE(d.error.ok()) << d.error;
    EXPECT_FALSE(d.write.has_value());
  }
}

// ---------------------------------------------------------------------------
// Resolve.

TEST(ResolveTest, ReasonIsRequired) {
  ResolveCommand cmd = Resolve(Status::kSucceeded);
  cmd.reason.clear();
  for (From from : {From::kAbsent, From::kUnknown, From::kProcessingLive}) {
    SCOPED_TRACE(FromName(from));
    const Decision d =
        DecideResolve(Stored(from), cmd, MakePolicy(ExpiryPolicy::kUnknown));
    EXPECT_EQ(d.error.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(d.error.message(), "reason"))
        << d.error.message();
    EXPECT_FALSE(d.write.has_value());
  }
}

TEST(ResolveTest, ToMustBeSucceededOrFailed) {
  for (Status to : {Status::kProcessing, Status::kUnknown}) {
    SCOPED_TRACE(StatusName(to));
    ResolveCommand cmd = Resolve(Status::kSucceeded);
    cmd.to = to;
    const Decision d = DecideResolve(Stored(From::kUnknown), cmd,
                                     MakePolicy(ExpiryPolicy::kUnknown));
    EXPECT_EQ(d.error.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(d.error.message(), "to"))
        << d.error.message();
    EXPECT_FALSE(d.write.has_value());
  }
}

TEST(ResolveTest, ResultIsRequiredForSucceeded) {
  ResolveCommand cmd = Resolve(Status::kSucceeded);
  cmd.result.reset();
  const Decision d = DecideResolve(Stored(From::kUnknown), cmd,
                                   MakePolicy(ExpiryPolicy::kUnknown));
  EXPECT_EQ(d.error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(d.error.message(), "result"))
      << d.error.message();
  EXPECT_FALSE(d.write.has_value());

  // FAILED needs no result.
  const Decision failed =
      DecideResolve(Stored(From::kUnknown), Resolve(Status::kFailed),
                    MakePolicy(ExpiryPolicy::kUnknown));
  EXPECT_TRUE(failed.error.ok()) << failed.error;
  ASSERT_TRUE(failed.write.has_value());
  EXPECT_EQ(failed.write->next.status, Status::kFailed);
}

TEST(ResolveTest, WritesTheOperatorsDecisionWithAuditAndRetention) {
  const Decision d =
      DecideResolve(Stored(From::kUnknown), Resolve(Status::kSucceeded),
                    MakePolicy(ExpiryPolicy::kUnknown));
  ASSERT_TRUE(d.error.ok()) << d.error;
  EXPECT_EQ(d.outcome, Outcome::kCompleted);
  ASSERT_TRUE(d.write.has_value());
  const Write& w = *d.write;
  ASSERT_TRUE(w.guard.has_value());
  EXPECT_EQ(w.guard->status, Status::kUnknown);
  EXPECT_EQ(w.guard->fencing_token, kToken);
  EXPECT_EQ(w.next.status, Status::kSucceeded);
  ASSERT_TRUE(w.next.result.has_value());
  EXPECT_EQ(*w.next.result, ResolvedResult());
  EXPECT_FALSE(w.next.retryable);
  EXPECT_EQ(w.next.resolved_by, kOperator);
  EXPECT_EQ(w.next.resolve_reason, kReason);
  EXPECT_EQ(w.next.fencing_token, kToken);
  EXPECT_EQ(w.retention, kRetention);
  ASSERT_TRUE(w.audit.has_value());
  EXPECT_EQ(w.audit->actor, kOperator);
  EXPECT_EQ(w.audit->reason, kReason);
  EXPECT_EQ(w.audit->from, Status::kUnknown);
  EXPECT_EQ(w.audit->to, Status::kSucceeded);
  EXPECT_EQ(w.audit->fencing_token, kToken);
}

TEST(ResolveTest, RetryableAppliesToFailed) {
  ResolveCommand to_failed = Resolve(Status::kFailed);
  to_failed.retryable = true;
  const Decision failed = DecideResolve(Stored(From::kUnknown), to_failed,
                                        MakePolicy(ExpiryPolicy::kUnknown));
  ASSERT_TRUE(failed.write.has_value());
  EXPECT_EQ(failed.outcome, Outcome::kFailed);
  EXPECT_EQ(failed.write->next.status, Status::kFailed);
  EXPECT_TRUE(failed.write->next.retryable);

  ResolveCommand to_succeeded = Resolve(Status::kSucceeded);
  to_succeeded.retryable = true;
  const Decision succeeded = DecideResolve(Stored(From::kUnknown), to_succeeded,
                                           MakePolicy(ExpiryPolicy::kUnknown));
  ASSERT_TRUE(succeeded.write.has_value());
  EXPECT_FALSE(succeeded.write->next.retryable);
}

TEST(ResolveTest, ProcessingNeedsForce) {
  for (From from : {From::kProcessingLive, From::kProcessingOver}) {
    SCOPED_TRACE(FromName(from));
    ResolveCommand cmd = Resolve(Status::kFailed);
    const Decision refused =
        DecideResolve(Stored(from), cmd, MakePolicy(ExpiryPolicy::kUnknown));
    EXPECT_EQ(refused.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(refused.write.has_value());

    cmd.force = true;
    const Decision forced =
        DecideResolve(Stored(from), cmd, MakePolicy(ExpiryPolicy::kUnknown));
    ASSERT_TRUE(forced.error.ok()) << forced.error;
    ASSERT_TRUE(forced.write.has_value());
    ASSERT_TRUE(forced.write->guard.has_value());
    EXPECT_EQ(forced.write->guard->status, Status::kProcessing);
    EXPECT_EQ(forced.write->guard->fencing_token, kToken);
    EXPECT_EQ(forced.write->next.status, Status::kFailed);
    ASSERT_TRUE(forced.write->audit.has_value());
    EXPECT_EQ(forced.write->audit->actor, kOperator);
    EXPECT_EQ(forced.write->audit->from, Status::kProcessing);
  }
}

TEST(ResolveTest, ExpectedFencingTokenGuard) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  for (int64_t expected : {kToken - 1, kToken + 1}) {
    SCOPED_TRACE(expected);
    ResolveCommand cmd = Resolve(Status::kSucceeded);
    cmd.expected_fencing_token = expected;
    const Decision d = DecideResolve(Stored(From::kUnknown), cmd, policy);
    EXPECT_EQ(d.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(d.write.has_value());

    cmd.force = true;
    const Decision forced =
        DecideResolve(Stored(From::kProcessingLive), cmd, policy);
    EXPECT_EQ(forced.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(forced.write.has_value());
  }
  for (int64_t expected : {int64_t{0}, kToken}) {
    SCOPED_TRACE(expected);
    ResolveCommand cmd = Resolve(Status::kSucceeded);
    cmd.expected_fencing_token = expected;
    const Decision d = DecideResolve(Stored(From::kUnknown), cmd, policy);
    EXPECT_TRUE(d.error.ok()) << d.error;
    ASSERT_TRUE(d.write.has_value());
    EXPECT_EQ(d.write->guard->fencing_token, kToken);
  }
}

TEST(ResolveTest, RepeatOfAnAppliedResolveIsOk) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  for (Status to : {Status::kSucceeded, Status::kFailed}) {
    SCOPED_TRACE(StatusName(to));
    ResolveCommand cmd = Resolve(to);
    const Decision first = DecideResolve(Stored(From::kUnknown), cmd, policy);
    ASSERT_TRUE(first.write.has_value());
    const Record resolved = Applied(*first.write, kNow);

    const Decision repeat = DecideResolve(resolved, cmd, policy);
    EXPECT_TRUE(repeat.error.ok()) << repeat.error;
    EXPECT_EQ(repeat.outcome, to == Status::kSucceeded ? Outcome::kCompleted
                                                       : Outcome::kFailed);
    EXPECT_FALSE(repeat.write.has_value());

    ResolveCommand with_token = cmd;
    with_token.expected_fencing_token = kToken;
    const Decision guarded = DecideResolve(resolved, with_token, policy);
    EXPECT_TRUE(guarded.error.ok()) << guarded.error;
    EXPECT_FALSE(guarded.write.has_value());

    ResolveCommand other_to = Resolve(
        to == Status::kSucceeded ? Status::kFailed : Status::kSucceeded);
    const Decision flipped = DecideResolve(resolved, other_to, policy);
    EXPECT_EQ(flipped.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(flipped.write.has_value());

    ResolveCommand other_result = cmd;
    other_result.result = NewResult();
    const Decision changed = DecideResolve(resolved, other_result, policy);
    EXPECT_EQ(changed.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(changed.write.has_value());

    ResolveCommand other_token = cmd;
    other_token.expected_fencing_token = kToken + 1;
    const Decision stale = DecideResolve(resolved, other_token, policy);
    EXPECT_EQ(stale.error.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(stale.write.has_value());
  }
}

TEST(ResolveTest, TerminalRecordsAreRefused) {
  for (From from :
       {From::kSucceeded, From::kFailedFinal, From::kFailedRetryable}) {
    for (Status to : {Status::kSucceeded, Status::kFailed}) {
      for (bool force : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << FromName(from) << " to=" << StatusName(to)
                     << " force=" << force);
        ResolveCommand cmd = Resolve(to);
        cmd.force = force;
        const Decision d = DecideResolve(Stored(from), cmd,
                                         MakePolicy(ExpiryPolicy::kUnknown));
        EXPECT_EQ(d.error.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_FALSE(d.write.has_value());
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Retention.

TEST(RetentionTest, TerminalWritesCarryThePolicysRetention) {
  Policy policy = MakePolicy(ExpiryPolicy::kRelease);
  policy.retention = absl::Hours(5);
  const std::vector<Decision> terminal = {
      DecideComplete(Stored(From::kProcessingLive),
                     Complete(kToken, NewResult()), policy),
      DecideFail(Stored(From::kProcessingLive), Fail(kToken, NewError(), false),
                 policy),
      DecideComplete(Stored(From::kUnknown), Complete(kToken, NewResult()),
                     policy),
      DecideResolve(Stored(From::kUnknown), Resolve(Status::kFailed), policy),
      DecideExpire(*Stored(From::kProcessingOver), kNow, policy, kActorReaper),
  };
  for (const Decision& d : terminal) {
    ASSERT_TRUE(d.write.has_value());
    EXPECT_EQ(d.write->retention, absl::Hours(5));
    EXPECT_EQ(Applied(*d.write, kNow).expires_at, kNow + absl::Hours(5));
  }

  // The default policy keeps terminal records for 24 hours.
  const Decision by_default = DecideComplete(
      Stored(From::kProcessingLive), Complete(kToken, NewResult()), Policy{});
  ASSERT_TRUE(by_default.write.has_value());
  EXPECT_EQ(by_default.write->retention, absl::Hours(24));
}

TEST(RetentionTest, ProcessingAndUnknownWritesHaveNoRetention) {
  const Policy policy = MakePolicy(ExpiryPolicy::kUnknown);
  const std::vector<Decision> live = {
      DecideBegin(std::nullopt, Key(), Begin(kHash, ""), kNow, policy),
      DecideBegin(Stored(From::kFailedRetryable), Key(), Begin(kHash, ""), kNow,
                  policy),
      DecideHeartbeat(Stored(From::kProcessingLive), Heartbeat(kToken)),
      DecideExpire(*Stored(From::kProcessingOver), kNow, policy, kActorReaper),
  };
  for (const Decision& d : live) {
    ASSERT_TRUE(d.write.has_value());
    EXPECT_FALSE(d.write->retention.has_value());
    EXPECT_FALSE(Applied(*d.write, kNow).expires_at.has_value());
  }
}

// ---------------------------------------------------------------------------
// RetryAfter and names.

TEST(RetryAfterTest, IsTheRestOfTheLeaseClampedTo50msAnd1s) {
  struct Row {
    absl::Time lease_expires_at;
    absl::Duration want;
  };
  const std::vector<Row> rows = {
      {kNow + absl::Milliseconds(300), absl::Milliseconds(300)},
      {kNow + absl::Milliseconds(50), absl::Milliseconds(50)},
      {kNow + absl::Milliseconds(49), absl::Milliseconds(50)},
      {kNow + absl::Milliseconds(1), absl::Milliseconds(50)},
      {kNow, absl::Milliseconds(50)},
      {kNow - absl::Seconds(5), absl::Milliseconds(50)},
      {absl::InfinitePast(), absl::Milliseconds(50)},
      {kNow + absl::Seconds(1), absl::Seconds(1)},
      {kNow + absl::Milliseconds(1001), absl::Seconds(1)},
      {kNow + absl::Hours(1), absl::Seconds(1)},
      {absl::InfiniteFuture(), absl::Seconds(1)},
  };
  for (const Row& row : rows) {
    Record r = *Stored(From::kProcessingLive);
    r.lease_expires_at = row.lease_expires_at;
    EXPECT_EQ(RetryAfter(r, kNow), row.want) << row.lease_expires_at;
  }
}

TEST(NamesTest, StatusNameAndParseStatusRoundTrip) {
  const std::vector<std::pair<Status, std::string>> names = {
      {Status::kProcessing, "PROCESSING"},
      {Status::kSucceeded, "SUCCEEDED"},
      {Status::kFailed, "FAILED"},
      {Status::kUnknown, "UNKNOWN"},
  };
  for (const auto& [status, name] : names) {
    EXPECT_EQ(StatusName(status), name);
    Status parsed = Status::kProcessing;
    if (status == Status::kProcessing) parsed = Status::kUnknown;
    ASSERT_TRUE(ParseStatus(name, &parsed)) << name;
    EXPECT_EQ(parsed, status);
  }
  for (const char* bad :
       {"", "processing", "Succeeded", "STATUS_FAILED", "UNKNOWN ", "?"}) {
    Status out = Status::kSucceeded;
    EXPECT_FALSE(ParseStatus(bad, &out)) << bad;
    EXPECT_EQ(out, Status::kSucceeded) << "untouched on failure";
  }
}

TEST(NamesTest, OutcomeAndPolicyNames) {
  EXPECT_STREQ(OutcomeName(Outcome::kAcquired), "ACQUIRED");
  EXPECT_STREQ(OutcomeName(Outcome::kInProgress), "IN_PROGRESS");
  EXPECT_STREQ(OutcomeName(Outcome::kCompleted), "COMPLETED");
  EXPECT_STREQ(OutcomeName(Outcome::kFailed), "FAILED");
  EXPECT_STREQ(OutcomeName(Outcome::kUnknown), "UNKNOWN");
  EXPECT_STREQ(OutcomeName(Outcome::kMismatch), "MISMATCH");
  EXPECT_STREQ(ExpiryPolicyName(ExpiryPolicy::kUnknown), "unknown");
  EXPECT_STREQ(ExpiryPolicyName(ExpiryPolicy::kRelease), "release");
}

}  // namespace
}  // namespace idem
