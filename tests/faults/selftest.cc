#include "tests/faults/selftest.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace idem::faults {
namespace {

constexpr char kPaid[] = "create-payment/k1";
constexpr char kUnsure[] = "create-payment/u1";
constexpr int64_t kMs = 1000000;

pb::Record RecordOf(const std::string& key, pb::Status status, int64_t token,
                    const std::string& hash) {
  pb::Record r;
  r.mutable_key()->set_tenant(kTenant);
  r.mutable_key()->set_operation(key.substr(0, key.find('/')));
  r.mutable_key()->set_key(key.substr(key.find('/') + 1));
  r.set_status(status);
  r.set_fencing_token(token);
  r.set_request_hash(hash);
  return r;
}

Op MakeOp(int64_t id, OpType type, const std::string& key, int64_t from_ms,
          int64_t to_ms) {
  Op op;
  op.id = id;
  op.worker = static_cast<int>(id % 3);
  op.type = type;
  op.key = key;
  op.invoke_ns = from_ms * kMs;
  op.complete_ns = to_ms * kMs;
  op.result = Result::kOk;
  return op;
}

Op BeginOp(int64_t id, const std::string& key, int64_t from_ms, int64_t to_ms,
           const std::string& attempt, const std::string& hash,
           pb::Outcome outcome, const pb::Record& record, int64_t lease_ms) {
  Op op = MakeOp(id, OpType::kBegin, key, from_ms, to_ms);
  op.attempt_id = attempt;
  op.request_hash = hash;
  op.lease_ms = lease_ms;
  op.outcome = outcome;
  if (outcome == pb::OUTCOME_ACQUIRED)
    op.granted_token = record.fencing_token();
  op.has_record = true;
  op.record = record;
  return op;
}

pb::Snapshot Tagged(const std::string& key, int64_t token,
                    const std::string& writer) {
  return TaggedSnapshot({key, token, writer}, 201, token * 7 + key.size());
}

constexpr char kMacKey[] = "the self-test's key of 32+ bytes";

std::string Envelope(const pb::Record& r) {
  return CacheEnvelope(r,
                       CacheKeyOf(kTenant, absl::StrCat(r.key().operation(),
                                                        "/", r.key().key())),
                       kMacKey);
}

FinalRecord FinalOf(const pb::Record& r) {
  FinalRecord f;
  f.key = absl::StrCat(r.key().operation(), "/", r.key().key());
  f.status = r.status();
  f.token = r.fencing_token();
  f.request_hash = r.request_hash();
  f.has_result = r.has_result();
  f.result = r.result();
  f.retryable = r.retryable();
  return f;
}

Op* Find(Planted& p, int64_t id) {
  for (Op& op : p.history) {
    if (op.id == id) return &op;
  }
  return nullptr;
}

}  // namespace

Planted CleanCase() {
  Planted p;
  p.name = "clean";
  // k1: granted, effect, completed, replayed, probed with another hash.
  const pb::Snapshot s1 = Tagged(kPaid, 1, "w1");
  pb::Record k1 = RecordOf(kPaid, pb::STATUS_PROCESSING, 1, "h-k1");
  p.history.push_back(
      BeginOp(1, kPaid, 0, 10, "a1", "h-k1", pb::OUTCOME_ACQUIRED, k1, 3000));
  Op effect = MakeOp(2, OpType::kEffect, kPaid, 11, 12);
  effect.token = 1;
  p.history.push_back(effect);
  Op complete = MakeOp(3, OpType::kComplete, kPaid, 13, 15);
  complete.token = 1;
  complete.snapshot = s1;
  pb::Record k1_done = RecordOf(kPaid, pb::STATUS_SUCCEEDED, 1, "h-k1");
  *k1_done.mutable_result() = s1;
  complete.has_record = true;
  complete.record = k1_done;
  p.history.push_back(complete);
  p.history.push_back(BeginOp(4, kPaid, 20, 22, "a2", "h-k1",
                              pb::OUTCOME_COMPLETED, k1_done, 3000));
  pb::Record k1_bare = k1_done;
  k1_bare.clear_result();
  p.history.push_back(BeginOp(5, kPaid, 23, 24, "a3", "other",
                              pb::OUTCOME_MISMATCH, k1_bare, 3000));
  // u1: granted with a 1 s lease, seen UNKNOWN after it, resolved FAILED
  // retryable, granted again with token 2, completed.
  pb::Record u1 = RecordOf(kUnsure, pb::STATUS_PROCESSING, 1, "h-u1");
  p.history.push_back(
      BeginOp(6, kUnsure, 0, 5, "a4", "h-u1", pb::OUTCOME_ACQUIRED, u1, 1000));
  pb::Record u1_unknown = RecordOf(kUnsure, pb::STATUS_UNKNOWN, 1, "h-u1");
  p.history.push_back(BeginOp(7, kUnsure, 2000, 2005, "a5", "h-u1",
                              pb::OUTCOME_UNKNOWN, u1_unknown, 1000));
  Op resolve = MakeOp(8, OpType::kResolve, kUnsure, 2100, 2110);
  resolve.resolve_to = pb::STATUS_FAILED;
  resolve.retryable = true;
  resolve.token = 1;
  resolve.snapshot = Tagged(kUnsure, 1, "operator-0");
  resolve.actor = "operator-0";
  p.history.push_back(resolve);
  pb::Record u2 = RecordOf(kUnsure, pb::STATUS_PROCESSING, 2, "h-u1");
  p.history.push_back(BeginOp(9, kUnsure, 2200, 2210, "a6", "h-u1",
                              pb::OUTCOME_ACQUIRED, u2, 1000));
  Op effect2 = MakeOp(10, OpType::kEffect, kUnsure, 2211, 2212);
  effect2.token = 2;
  p.history.push_back(effect2);
  Op complete2 = MakeOp(11, OpType::kComplete, kUnsure, 2300, 2310);
  complete2.token = 2;
  complete2.snapshot = Tagged(kUnsure, 2, "w2");
  p.history.push_back(complete2);

  pb::Record u1_done = RecordOf(kUnsure, pb::STATUS_SUCCEEDED, 2, "h-u1");
  *u1_done.mutable_result() = complete2.snapshot;
  p.final_state.tenant = kTenant;
  p.final_state.cache_mac_key = kMacKey;
  p.final_state.max_cache_ttl_ms = 24 * 3600 * 1000;
  p.final_state.records[kPaid] = FinalOf(k1_done);
  p.final_state.records[kUnsure] = FinalOf(u1_done);
  p.final_state.effects[kPaid] = {1};
  p.final_state.effects[kUnsure] = {2};
  p.final_state.audit.push_back(
      {kUnsure, pb::STATUS_PROCESSING, pb::STATUS_UNKNOWN, "reaper", 1});
  p.final_state.audit.push_back(
      {kUnsure, pb::STATUS_UNKNOWN, pb::STATUS_FAILED, "operator-0", 1});
  p.final_state.cache.push_back(
      {CacheKeyOf(kTenant, kPaid), Envelope(k1_done), 3600 * 1000});
  // A corrupt entry is ignored, not a violation.
  p.final_state.cache.push_back(
      {CacheKeyOf(kTenant, kUnsure), "IDC2garbage", 1000});
  return p;
}

std::vector<Planted> PlantedCases() {
  std::vector<Planted> cases;
  auto plant = [&](const std::string& name, const std::string& kind,
                   const std::function<void(Planted&)>& change) {
    Planted p = CleanCase();
    p.name = name;
    p.kind = kind;
    change(p);
    cases.push_back(std::move(p));
  };
  plant("two attempts granted token 1", "double-grant", [](Planted& p) {
    p.history.push_back(
        BeginOp(100, kPaid, 5, 9, "intruder", "h-k1", pb::OUTCOME_ACQUIRED,
                RecordOf(kPaid, pb::STATUS_PROCESSING, 1, "h-k1"), 3000));
  });
  plant("a later grant with a lower token", "token-regression", [](Planted& p) {
    p.history.push_back(
        BeginOp(100, kUnsure, 2400, 2410, "late", "h-u1", pb::OUTCOME_ACQUIRED,
                RecordOf(kUnsure, pb::STATUS_PROCESSING, 1, "h-u1"), 1000));
  });
  plant("UNKNOWN granted again without a Resolve", "unknown-regranted",
        [](Planted& p) {
          p.history.erase(p.history.begin() + 7);  // the Resolve (id 8)
        });
  plant("UNKNOWN granted again, audit shows no release",
        "unknown-regranted-audit",
        [](Planted& p) { p.final_state.audit.pop_back(); });
  plant("UNKNOWN changed by the reaper", "unknown-changed",
        [](Planted& p) { p.final_state.audit.back().actor = "reaper"; });
  plant("a replay differs in one byte", "replay-differs", [](Planted& p) {
    std::string* body = Find(p, 4)->record.mutable_result()->mutable_body();
    (*body)[body->size() - 1] ^= 1;
  });
  plant("a replay carries another token", "replay-differs",
        [](Planted& p) { Find(p, 4)->record.set_fencing_token(2); });
  plant("MISMATCH carries the result", "mismatch-leaks-result", [](Planted& p) {
    *Find(p, 5)->record.mutable_result() = Tagged(kPaid, 1, "w1");
  });
  plant("another hash gets the replay", "other-hash-answered", [](Planted& p) {
    Op* probe = Find(p, 5);
    probe->outcome = pb::OUTCOME_COMPLETED;
    *probe->record.mutable_result() = Tagged(kPaid, 1, "w1");
  });
  plant("an acknowledged Complete is lost", "lost-complete", [](Planted& p) {
    FinalRecord& f = p.final_state.records[kPaid];
    f.status = pb::STATUS_PROCESSING;
    f.has_result = false;
    f.result.Clear();
  });
  plant("an acknowledged grant is lost", "lost-grant",
        [](Planted& p) { p.final_state.records.erase(kUnsure); });
  plant("an acknowledged Complete's token is not final",
        "complete-token-not-final",
        [](Planted& p) { p.final_state.records[kPaid].token = 2; });
  plant("an acknowledged Resolve is lost", "lost-resolve", [](Planted& p) {
    const std::string key = "create-payment/r1";
    Op r = MakeOp(100, OpType::kResolve, key, 100, 110);
    r.resolve_to = pb::STATUS_SUCCEEDED;
    r.token = 1;
    r.snapshot = Tagged(key, 1, "operator-0");
    p.history.push_back(r);
    p.final_state.records[key] =
        FinalOf(RecordOf(key, pb::STATUS_UNKNOWN, 1, "h-r1"));
  });
  plant("two effects for one grant", "effects-exceed-grants", [](Planted& p) {
    p.final_state.effects[kPaid] = {1, 1};
  });
  plant("an effect with a token never granted", "effect-without-grant",
        [](Planted& p) {
          p.final_state.effects[kPaid] = {1, 5};
        });
  plant("an acknowledged effect is lost", "lost-effect",
        [](Planted& p) { p.final_state.effects.erase(kPaid); });
  plant("a Complete acknowledged without its effect", "complete-without-effect",
        [](Planted& p) { p.final_state.effects.erase(kUnsure); });
  plant("a stale Complete acknowledged", "stale-token-accepted",
        [](Planted& p) {
          Op c = MakeOp(100, OpType::kComplete, kUnsure, 2400, 2410);
          c.token = 1;
          c.snapshot = Tagged(kUnsure, 1, "w0");
          p.history.push_back(c);
        });
  plant("the stored snapshot was written with a stale token",
        "stale-write-applied", [](Planted& p) {
          p.final_state.records[kUnsure].result = Tagged(kUnsure, 1, "w0");
        });
  plant("two different Resolves of one token", "conflicting-resolves",
        [](Planted& p) {
          Op r = *Find(p, 8);
          r.id = 100;
          r.resolve_to = pb::STATUS_SUCCEEDED;
          r.retryable = false;
          p.history.push_back(r);
        });
  plant("a lease seen expired before it could run out", "lease-expired-early",
        [](Planted& p) {
          Op* seen = Find(p, 7);
          seen->invoke_ns = 500 * kMs;
          seen->complete_ns = 505 * kMs;
        });
  plant("a cache entry differs from PostgreSQL", "stale-cache", [](Planted& p) {
    pb::Record r = RecordOf(kPaid, pb::STATUS_SUCCEEDED, 1, "h-k1");
    *r.mutable_result() = Tagged(kPaid, 1, "someone-else");
    p.final_state.cache[0].value = Envelope(r);
  });
  plant("a cache entry outlives the retention", "cache-ttl-too-long",
        [](Planted& p) {
          p.final_state.cache[0].pttl_ms = 10LL * 24 * 3600 * 1000;
        });
  plant("a grant answer without its token", "bad-grant-answer",
        [](Planted& p) { Find(p, 1)->granted_token = 0; });
  return cases;
}

std::string RunSelfTest(int* planted, int* detected) {
  std::string problems;
  Report clean = Check(CleanCase().history, CleanCase().final_state);
  for (const Violation& v : clean.violations) {
    absl::StrAppend(&problems, "clean history reported ", v.kind, " ", v.key,
                    ": ", v.detail, "\n");
  }
  *planted = 0;
  *detected = 0;
  for (const Planted& p : PlantedCases()) {
    ++*planted;
    Report r = Check(p.history, p.final_state);
    if (r.Count(p.kind) > 0) {
      ++*detected;
    } else {
      absl::StrAppend(&problems, "not detected: ", p.name, " (", p.kind, ")\n");
    }
  }
  return problems;
}

}  // namespace idem::faults
