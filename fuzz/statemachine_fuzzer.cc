// The pure state machine (statemachine/transitions.h) driven by random
// sequences of operations on one record, checking the guarantees of
// docs/spec.md (#transitions, #guarantees) after every step.
//
// The input picks a policy (expiry policy, retention, tombstone retention),
// then up to kMaxSteps operations: Begin (hash, attempt_id, lease),
// Heartbeat, Complete, Fail (retryable or final), Get, Resolve (every
// option), time running on, the reaper, the purger, and races: a Decide* on
// a read taken some steps earlier, whose write the model store applies only
// if its guard still holds (the way every store does; a lost guard means the
// coordinator reads and decides again).
//
// The model store below mirrors the contract of Store::Apply and
// Store::Purge (server/store/store.h): guards on status, token and lease
// expiry; lease, retention and timestamps from the store's clock; tombstones.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_check.h"
#include "statemachine/record.h"
#include "statemachine/transitions.h"

namespace idem {
namespace {

constexpr int kMaxSteps = 96;

bool Terminal(Status s) {
  return s == Status::kSucceeded || s == Status::kFailed;
}

std::string Describe(const std::optional<Record>& r) {
  if (!r) return "absent";
  return absl::StrCat(
      StatusName(r->status), " token=", r->fencing_token,
      " attempt=", r->attempt, " attempt_id=", r->attempt_id,
      " hash=", r->request_hash, r->retryable ? " retryable" : "",
      r->tombstone ? " tombstone" : "",
      r->result ? " result=" + r->result->body : "",
      " lease_expires_at=", absl::FormatTime(r->lease_expires_at),
      r->expires_at ? " expires_at=" + absl::FormatTime(*r->expires_at) : "");
}

// One record in a store: the record and what the store keeps beside it.
struct ModelStore {
  std::optional<Record> record;
  absl::Duration tombstone_retention = absl::ZeroDuration();
  int audit_rows = 0;

  // Store::Apply: applies `w` at `now` iff its guard holds.
  bool Apply(const Write& w, absl::Time now) {
    if (!w.guard) {
      if (record) return false;
    } else {
      if (!record) return false;
      const Guard& g = *w.guard;
      if (record->status != g.status ||
          record->fencing_token != g.fencing_token ||
          (g.lease_expired && record->lease_expires_at > now)) {
        return false;
      }
    }
    Record next = w.next;
    if (w.lease) {
      next.lease_expires_at = now + *w.lease;
    } else if (record) {
      next.lease_expires_at = record->lease_expires_at;
    }
    next.expires_at.reset();
    if (w.retention) next.expires_at = now + *w.retention;
    next.created_at = record ? record->created_at : now;
    next.updated_at = now;
    if (w.audit) ++audit_rows;
    tombstone_retention = w.tombstone_retention;
    record = next;
    return true;
  }

  // Store::Purge for this record: a terminal record past its expires_at
  // becomes a tombstone, or is deleted when it leaves none or is one.
  void Purge(absl::Time now) {
    if (!record || !Terminal(record->status) || !record->expires_at ||
        *record->expires_at > now) {
      return;
    }
    if (!record->tombstone && tombstone_retention > absl::ZeroDuration()) {
      record->tombstone = true;
      record->result.reset();
      record->expires_at = *record->expires_at + tombstone_retention;
    } else {
      record.reset();
    }
  }
};

// Who made a decision; the properties differ.
enum class Op { kBegin, kHeartbeat, kComplete, kFail, kGet, kResolve, kExpire };

const char* OpName(Op op) {
  switch (op) {
    case Op::kBegin:
      return "Begin";
    case Op::kHeartbeat:
      return "Heartbeat";
    case Op::kComplete:
      return "Complete";
    case Op::kFail:
      return "Fail";
    case Op::kGet:
      return "Get";
    case Op::kResolve:
      return "Resolve";
    case Op::kExpire:
      return "Expire";
  }
  return "?";
}

class Machine {
 public:
  explicit Machine(FuzzedDataProvider* in) : in_(*in) {
    policy_.on_lease_expiry =
        in_.ConsumeBool() ? ExpiryPolicy::kRelease : ExpiryPolicy::kUnknown;
    policy_.retention = absl::Seconds(in_.ConsumeIntegralInRange(1, 1000));
    policy_.tombstone_retention =
        in_.ConsumeBool() ? absl::ZeroDuration()
                          : absl::Seconds(in_.ConsumeIntegralInRange(1, 1000));
    key_ = RecordKey{"tenant", "operation", "key"};
  }

  void Run() {
    for (int step = 0; step < kMaxSteps && in_.remaining_bytes() > 0; ++step) {
      Step();
    }
  }

  const std::string& log() const { return log_; }

 private:
  void Log(const std::string& line) { log_ += absl::StrCat("  ", line, "\n"); }

  // Fails with the history of the run.
  void Check(bool ok, const std::string& what) {
    if (ok) return;
    fuzz::Violated(absl::StrCat(
        what, "\npolicy ", ExpiryPolicyName(policy_.on_lease_expiry),
        "; steps:\n", log_, "now: ", Describe(store_.record)));
  }

  std::string PickHash() {
    // Mostly the request of the record; sometimes another one.
    return in_.ConsumeIntegralInRange(0, 7) == 0 ? "hash-2" : "hash-1";
  }

  // A token: the record's, one either side, or a small number.
  int64_t PickToken(const std::optional<Record>& r) {
    const int64_t cur = r ? r->fencing_token : 0;
    switch (in_.ConsumeIntegralInRange(0, 4)) {
      case 0:
      case 1:
        return cur;
      case 2:
        return cur - 1;
      case 3:
        return cur + 1;
      default:
        return in_.ConsumeIntegralInRange<int64_t>(0, 4);
    }
  }

  // One of a few snapshots, so that identical repeats happen.
  Snapshot PickSnapshot() {
    Snapshot s;
    switch (in_.ConsumeIntegralInRange(0, 3)) {
      case 0:
        s.code = 200;
        s.body = "ok";
        break;
      case 1:
        s.code = 201;
        s.body = "created";
        s.content_type = "application/json";
        s.headers["x-a"] = "1";
        break;
      case 2:
        s.code = 500;
        s.body = "error";
        break;
      default:
        s.code = 200;
        s.body = in_.ConsumeRandomLengthString(8);
        break;
    }
    return s;
  }

  absl::Duration PickLease() {
    return absl::Milliseconds(in_.ConsumeIntegralInRange(1, 120000));
  }

  void Step() {
    switch (in_.ConsumeIntegralInRange(0, 11)) {
      case 0:
      case 1:
        Decide(Op::kBegin, store_.record, now_, /*raced=*/false);
        break;
      case 2:
        Decide(Op::kHeartbeat, store_.record, now_, false);
        break;
      case 3:
        Decide(Op::kComplete, store_.record, now_, false);
        break;
      case 4:
        Decide(Op::kFail, store_.record, now_, false);
        break;
      case 5:
        Decide(Op::kGet, store_.record, now_, false);
        break;
      case 6:
        Decide(Op::kResolve, store_.record, now_, false);
        break;
      case 7: {
        const absl::Duration d =
            absl::Milliseconds(in_.ConsumeIntegralInRange(0, 200000));
        now_ += d;
        Log(absl::StrCat("time +", absl::FormatDuration(d)));
        break;
      }
      case 8:
        // The reaper only looks at PROCESSING records whose lease is over.
        if (store_.record && store_.record->status == Status::kProcessing &&
            store_.record->lease_expires_at <= now_) {
          Decide(Op::kExpire, store_.record, now_, false);
        }
        break;
      case 9: {
        const std::optional<Record> before = store_.record;
        store_.Purge(now_);
        Log("purge");
        if (!store_.record) {
          if (before) Forget();
        } else if (store_.record->tombstone != before->tombstone) {
          AfterStep(before, "purge", /*purged=*/true, false);
        }
        break;
      }
      case 10:
        stale_ = store_.record;
        stale_now_ = now_;
        have_stale_ = true;
        Log(absl::StrCat("read (for a race): ", Describe(stale_)));
        break;
      default: {
        if (!have_stale_) break;
        const Op op = static_cast<Op>(in_.ConsumeIntegralInRange(0, 6));
        if (op == Op::kExpire &&
            !(stale_ && stale_->status == Status::kProcessing)) {
          break;
        }
        Decide(op, stale_, stale_now_, /*raced=*/true);
        break;
      }
    }
  }

  // The record was deleted: a new one starts from token 1. Reads of the
  // old one are dropped: a coordinator's read-decide-write takes far less
  // than a retention period (a guard on status and token alone cannot tell
  // a record from an earlier one with the same key, status and token).
  void Forget() {
    grants_.clear();
    max_token_ = 0;
    have_stale_ = false;
  }

  // Decides `op` on `read` made at `read_now` (the current record, or an
  // earlier read when `raced`), checks the decision, applies its write at the
  // store's current time and checks the result.
  void Decide(Op op, const std::optional<Record>& read, absl::Time read_now,
              bool raced) {
    decide_now_ = read_now;
    Decision d;
    std::string what = absl::StrCat(raced ? "raced " : "", OpName(op));
    BeginCommand begin;
    int64_t token = 0;
    ResolveCommand resolve;
    switch (op) {
      case Op::kBegin:
        begin.request_hash = PickHash();
        begin.lease = PickLease();
        begin.attempt_id = std::vector<std::string>{
            "", "a", "b", "c"}[in_.ConsumeIntegralInRange(0, 3)];
        what += absl::StrCat(" hash=", begin.request_hash,
                             " attempt_id=", begin.attempt_id,
                             " lease=", absl::FormatDuration(begin.lease));
        d = DecideBegin(read, key_, begin, read_now, policy_);
        break;
      case Op::kHeartbeat: {
        HeartbeatCommand cmd{PickToken(read), PickLease()};
        token = cmd.fencing_token;
        what += absl::StrCat(" token=", token);
        d = DecideHeartbeat(read, cmd);
        break;
      }
      case Op::kComplete: {
        CompleteCommand cmd{PickToken(read), PickSnapshot()};
        token = cmd.fencing_token;
        what += absl::StrCat(" token=", token, " body=", cmd.result.body);
        d = DecideComplete(read, cmd, policy_);
        break;
      }
      case Op::kFail: {
        FailCommand cmd{PickToken(read), PickSnapshot(), in_.ConsumeBool()};
        token = cmd.fencing_token;
        what += absl::StrCat(" token=", token, " body=", cmd.error.body,
                             cmd.retryable ? " retryable" : " final");
        d = DecideFail(read, cmd, policy_);
        break;
      }
      case Op::kGet:
        d = DecideGet(read, read_now, policy_);
        break;
      case Op::kResolve: {
        static const Status kTo[] = {Status::kSucceeded, Status::kFailed,
                                     Status::kProcessing, Status::kUnknown};
        resolve.to = kTo[in_.ConsumeIntegralInRange(0, 3)];
        if (in_.ConsumeIntegralInRange(0, 3) != 0) {
          resolve.result = PickSnapshot();
        }
        resolve.retryable = in_.ConsumeBool();
        resolve.reason = std::vector<std::string>{
            "", "fixed", "checked"}[in_.ConsumeIntegralInRange(0, 2)];
        resolve.actor = std::vector<std::string>{
            "", "alice", "bob"}[in_.ConsumeIntegralInRange(0, 2)];
        resolve.expected_fencing_token =
            in_.ConsumeBool() ? 0 : PickToken(read);
        resolve.force = in_.ConsumeBool();
        what += absl::StrCat(" to=", StatusName(resolve.to),
                             resolve.result ? " with result" : "",
                             resolve.retryable ? " retryable" : "",
                             " reason=", resolve.reason,
                             " expected=", resolve.expected_fencing_token,
                             resolve.force ? " force" : "");
        d = DecideResolve(read, resolve, policy_);
        break;
      }
      case Op::kExpire:
        d = DecideExpire(*read, read_now, policy_, kActorReaper);
        break;
    }
    what += absl::StrCat(
        " -> ", d.error.ok() ? OutcomeName(d.outcome) : d.error.ToString(),
        d.write ? " (write)" : "");
    Log(what);
    CheckDecision(op, read, d, begin, token, resolve);

    const std::optional<Record> before = store_.record;
    bool applied = false;
    if (d.write) {
      applied = store_.Apply(*d.write, now_);
      // A decision on the record as it is must stick.
      Check(applied || raced,
            "a write decided on the current record was "
            "refused by its own guard: " +
                what);
      if (!applied) Log("  guard no longer holds: not written");
    }
    // The answer a coordinator gives: only after the write (if any) stuck.
    if (d.error.ok() && (applied || !d.write) && op == Op::kBegin &&
        d.outcome == Outcome::kAcquired) {
      const Record& granted = applied ? *store_.record : *read;
      Grant(granted.fencing_token, begin.attempt_id, !applied, what);
    }
    if (applied) {
      AfterStep(before, what, /*purged=*/false, op == Op::kBegin);
    }
  }

  // Properties of a decision, whatever the store does with it.
  void CheckDecision(Op op, const std::optional<Record>& read,
                     const Decision& d, const BeginCommand& begin,
                     int64_t token, const ResolveCommand& resolve) {
    if (!d.error.ok()) {
      Check(!d.write, "a refused call writes");
      Check(!d.stale_token ||
                d.error.code() == absl::StatusCode::kFailedPrecondition,
            "a stale token is not FAILED_PRECONDITION");
      if (op == Op::kResolve && resolve.reason.empty()) {
        Check(d.error.code() == absl::StatusCode::kInvalidArgument,
              "Resolve without a reason is not INVALID_ARGUMENT");
      }
      return;
    }
    if (op == Op::kResolve) {
      Check(!resolve.reason.empty(), "Resolve without a reason accepted");
    }
    if (op == Op::kBegin && d.outcome == Outcome::kInProgress && read) {
      const absl::Duration after = RetryAfter(*read, decide_now_);
      Check(after >= absl::Milliseconds(50) && after <= absl::Seconds(1),
            "retry_after out of [50ms, 1s]");
    }
    if (op == Op::kBegin && read && read->request_hash != begin.request_hash) {
      Check(d.outcome == Outcome::kMismatch, "another hash is not MISMATCH");
    }
    // G3: a request with another hash never gets the record, nor writes.
    if (d.outcome == Outcome::kMismatch && op == Op::kBegin) {
      Check(!d.write, "MISMATCH writes");
      Check(read && read->request_hash != begin.request_hash,
            "MISMATCH for the same hash");
    }
    if (!d.write) {
      if (op == Op::kBegin && d.outcome == Outcome::kAcquired) {
        // Only the same attempt regains a live grant without a write.
        Check(read && read->status == Status::kProcessing &&
                  read->lease_expires_at > decide_now_ &&
                  !begin.attempt_id.empty() &&
                  read->attempt_id == begin.attempt_id,
              "ACQUIRED without a write for another attempt or a dead lease");
      }
      if (op == Op::kBegin && !read) {
        Check(false, "Begin on an absent record does not create it");
      }
      return;
    }
    const Write& w = *d.write;
    const Record& next = w.next;
    Check(next.key == key_, "a write changes the identity");
    Check(w.guard.has_value() == read.has_value(),
          "a write's guard does not match the record's existence");
    if (read) {
      Check(w.guard->status == read->status &&
                w.guard->fencing_token == read->fencing_token,
            "a write's guard is not the state it was decided on");
      Check(!read->tombstone, "a write on a tombstone");
      Check(next.request_hash == read->request_hash,
            "a write changes the request hash");
      // G2: UNKNOWN is never acquired: only Resolve or the holder's late
      // report change it, and never back to PROCESSING.
      if (read->status == Status::kUnknown) {
        Check(op == Op::kResolve || op == Op::kComplete || op == Op::kFail,
              "UNKNOWN changed by something other than Resolve or a late "
              "report");
        Check(next.status != Status::kProcessing, "UNKNOWN acquired");
      }
      // Terminal records never change; a retryable failure may be
      // acquired again by Begin.
      if (Terminal(read->status)) {
        Check(op == Op::kBegin && read->status == Status::kFailed &&
                  read->retryable && next.status == Status::kProcessing,
              "a terminal record is written by " + std::string(OpName(op)));
      }
    }
    // G5: the holder's calls write only under the caller's own token.
    if (op == Op::kHeartbeat || op == Op::kComplete || op == Op::kFail) {
      Check(read && token == read->fencing_token,
            absl::StrCat("token ", token, " writes over token ",
                         read ? read->fencing_token : 0));
      Check(next.fencing_token == token, "the holder's write moves the token");
    }
    if (op == Op::kHeartbeat) {
      Check(next.status == Status::kProcessing && w.lease.has_value(),
            "Heartbeat writes something else than a lease");
    }
    // Acquisitions: the token grows by exactly one, the attempt too.
    const int64_t base_token = read ? read->fencing_token : 0;
    if (next.status == Status::kProcessing &&
        !(read && read->status == Status::kProcessing &&
          next.fencing_token == read->fencing_token)) {
      Check(op == Op::kBegin && d.outcome == Outcome::kAcquired,
            "PROCESSING written without an acquisition");
      Check(next.fencing_token == base_token + 1,
            absl::StrCat("acquired token ", next.fencing_token, " after ",
                         base_token));
      Check(next.attempt == (read ? read->attempt : 0) + 1,
            "attempt does not grow by one");
      Check(next.attempt_id == begin.attempt_id && w.lease &&
                *w.lease == begin.lease && !next.result && !next.retryable,
            "an acquisition does not hold the caller's grant");
    } else {
      Check(next.fencing_token == base_token,
            "a write other than an acquisition moves the token");
    }
    if (op == Op::kBegin && d.outcome == Outcome::kAcquired) {
      Check(next.status == Status::kProcessing, "ACQUIRED writes no grant");
    }
    // Retention exactly on terminal writes (expires_at iff terminal).
    Check(w.retention.has_value() == Terminal(next.status),
          "retention on a non-terminal write or none on a terminal one");
    Check(!w.lease || next.status == Status::kProcessing,
          "a lease on a record that is not PROCESSING");
    if (Terminal(next.status)) {
      Check(next.result.has_value(), "a terminal write without a snapshot");
      const bool leaves_none = next.status == Status::kFailed && next.retryable;
      Check(
          w.tombstone_retention == (leaves_none ? absl::ZeroDuration()
                                                : policy_.tombstone_retention),
          "tombstone retention is not the policy's");
    }
    // Changes not made by the holder itself are audited.
    const bool expiry = read && read->status == Status::kProcessing &&
                        read->lease_expires_at <= decide_now_ &&
                        next.status != Status::kProcessing;
    switch (op) {
      case Op::kGet:
      case Op::kExpire:
      case Op::kResolve:
        Check(w.audit.has_value(), "an operator or expiry write not audited");
        break;
      case Op::kComplete:
      case Op::kFail:
        Check(w.audit.has_value() == (read->status == Status::kUnknown),
              "a late report is not audited, or a holder's report is");
        break;
      case Op::kBegin:
        Check(w.audit.has_value() ==
                  (read && read->status == Status::kProcessing),
              "a lazy expiry by Begin is not audited");
        break;
      case Op::kHeartbeat:
        Check(!w.audit, "a heartbeat is audited");
        break;
    }
    if (expiry && op != Op::kResolve && op != Op::kComplete &&
        op != Op::kFail) {
      Check(next.status == (policy_.on_lease_expiry == ExpiryPolicy::kRelease
                                ? Status::kFailed
                                : Status::kUnknown),
            "the expiry policy is not applied");
    }
  }

  // G1: one owner per token (the same attempt_id may regain its grant).
  void Grant(int64_t token, const std::string& attempt_id, bool regain,
             const std::string& what) {
    auto [it, fresh] = grants_.emplace(token, attempt_id);
    if (fresh) {
      Check(!regain, "a regained grant nobody was given: " + what);
      return;
    }
    Check(regain && !attempt_id.empty() && it->second == attempt_id,
          absl::StrCat("token ", token, " granted to '", it->second,
                       "' and again to '", attempt_id, "': ", what));
  }

  // Properties of the record after a write or a purge, against `before`.
  void AfterStep(const std::optional<Record>& before, const std::string& what,
                 bool purged, bool by_begin) {
    const Record& r = *store_.record;
    // The token never decreases, and never skips.
    Check(r.fencing_token >= max_token_,
          absl::StrCat("token went down from ", max_token_, ": ", what));
    Check(r.fencing_token <= max_token_ + 1,
          absl::StrCat("token skipped from ", max_token_, ": ", what));
    max_token_ = r.fencing_token;
    Check(r.fencing_token >= 1, "a record without a token");
    // expires_at is set iff the record is terminal.
    Check(r.expires_at.has_value() == Terminal(r.status),
          "expires_at set on a non-terminal record or missing on a terminal "
          "one: " +
              what);
    switch (r.status) {
      case Status::kProcessing:
        Check(!r.result && !r.retryable && !r.tombstone,
              "a PROCESSING record with a result");
        break;
      case Status::kUnknown:
        Check(!r.result && !r.tombstone, "an UNKNOWN record with a result");
        break;
      case Status::kSucceeded:
      case Status::kFailed:
        Check(r.result.has_value() != r.tombstone,
              "a terminal record without its snapshot, or a tombstone with "
              "one");
        Check(!r.tombstone || !r.retryable, "a retryable tombstone");
        break;
    }
    if (!before) return;
    Check(r.request_hash == before->request_hash,
          "the request hash changed: " + what);
    // G2: an UNKNOWN record is never acquired.
    if (before->status == Status::kUnknown) {
      Check(r.status != Status::kProcessing, "UNKNOWN acquired: " + what);
    }
    // G3: a terminal record's snapshot never changes, except by the
    // retryable re-acquire (Begin) and the purge (tombstone).
    if (Terminal(before->status)) {
      const bool same = r.status == before->status &&
                        r.fencing_token == before->fencing_token &&
                        r.retryable == before->retryable;
      if (purged) {
        Check(same && !before->tombstone && r.tombstone,
              "purge changed more than the snapshot");
      } else {
        Check(by_begin && before->status == Status::kFailed &&
                  before->retryable && r.status == Status::kProcessing,
              "a terminal record changed: " + what);
      }
    }
  }

  FuzzedDataProvider& in_;
  Policy policy_;
  RecordKey key_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  ModelStore store_;
  // The time of the read a decision is made on.
  absl::Time decide_now_;
  std::optional<Record> stale_;
  absl::Time stale_now_;
  bool have_stale_ = false;
  // Grants answered, by token, since the record was created.
  std::map<int64_t, std::string> grants_;
  int64_t max_token_ = 0;
  std::string log_;
};

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  idem::Machine machine(&in);
  machine.Run();
  // IDEM_FUZZ_VERBOSE=1: print the steps of each input (to read a corpus).
  static const bool verbose = std::getenv("IDEM_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "%s\n", machine.log().c_str());
  return 0;
}
