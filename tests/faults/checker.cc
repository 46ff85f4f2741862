#include "tests/faults/checker.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace idem::faults {
namespace {

constexpr int kFailedPrecondition = 9;

bool FinalStatus(const pb::Record& r) {
  return r.status() == pb::STATUS_SUCCEEDED ||
         (r.status() == pb::STATUS_FAILED && !r.retryable());
}

bool Released(const pb::Record& r) {
  return r.status() == pb::STATUS_FAILED &&
         (r.resolved_by() == "reaper" || r.resolved_by() == "lazy-expiry");
}

// "<operation>/<key>" of a record.
std::string KeyOf(const pb::Record& r) {
  return absl::StrCat(r.key().operation(), "/", r.key().key());
}

class Checker {
 public:
  Checker(const std::vector<Op>& history, const FinalState& final_state,
          const CheckOptions& options)
      : history_(history), final_(final_state), options_(options) {}

  Report Run() {
    for (const Op& op : history_) by_key_[op.key].push_back(&op);
    for (auto& [key, ops] : by_key_) {
      std::sort(ops.begin(), ops.end(), [](const Op* a, const Op* b) {
        return a->invoke_ns < b->invoke_ns;
      });
    }
    Counts();
    Grants();
    Unknowns();
    Answers();
    Acknowledged();
    Effects();
    Resolves();
    Audit();
    Cache();
    return std::move(report_);
  }

 private:
  void Add(const std::string& kind, const std::string& key,
           const std::string& detail) {
    report_.violations.push_back({kind, key, detail});
  }

  const FinalRecord* Final(const std::string& key) const {
    auto it = final_.records.find(key);
    return it == final_.records.end() ? nullptr : &it->second;
  }

  static bool Acquired(const Op& op) {
    return op.type == OpType::kBegin && op.result == Result::kOk &&
           op.outcome == pb::OUTCOME_ACQUIRED;
  }

  void Counts() {
    CheckStats& s = report_.stats;
    std::set<std::pair<std::string, int64_t>> grants;
    for (const Op& op : history_) {
      ++s.ops;
      if (op.result == Result::kOk) ++s.ok;
      if (op.result == Result::kFail) ++s.fail;
      if (op.result == Result::kInfo) ++s.info;
      if (Acquired(op)) grants.insert({op.key, op.granted_token});
      if (op.type == OpType::kComplete && op.result == Result::kOk) {
        ++s.completes;
      }
      if (op.type == OpType::kBegin && op.result == Result::kOk) {
        if (op.outcome == pb::OUTCOME_COMPLETED ||
            op.outcome == pb::OUTCOME_FAILED) {
          ++s.replays;
        }
        if (op.outcome == pb::OUTCOME_MISMATCH) ++s.mismatches;
      }
      if (op.result == Result::kOk && op.has_record &&
          op.record.status() == pb::STATUS_UNKNOWN) {
        ++s.unknown_seen;
      }
      if (op.type == OpType::kResolve && op.result == Result::kOk) {
        ++s.resolves;
      }
      if (op.type == OpType::kEffect && op.result == Result::kFail) {
        ++s.fenced;
      }
      if ((op.type == OpType::kComplete || op.type == OpType::kFail) &&
          op.result == Result::kFail && op.code == kFailedPrecondition) {
        ++s.stale_rejected;
      }
    }
    s.grants = static_cast<int64_t>(grants.size());
    s.records = static_cast<int64_t>(final_.records.size());
    for (const auto& [key, tokens] : final_.effects) {
      s.effects += static_cast<int64_t>(tokens.size());
    }
  }

  // G1: one owner per (key, token); tokens grow with real time.
  void Grants() {
    for (const auto& [key, ops] : by_key_) {
      std::map<int64_t, const Op*> owner;
      std::vector<const Op*> grants;
      for (const Op* op : ops) {
        if (!Acquired(*op)) continue;
        grants.push_back(op);
        if (op->granted_token <= 0 || !op->has_record ||
            op->record.fencing_token() != op->granted_token ||
            op->record.status() != pb::STATUS_PROCESSING) {
          Add("bad-grant-answer", key, DescribeOp(*op));
        }
        auto [it, inserted] = owner.emplace(op->granted_token, op);
        const std::string& a = it->second->attempt_id;
        if (!inserted && (a.empty() || a != op->attempt_id)) {
          Add("double-grant", key,
              absl::StrCat("token ", op->granted_token, " granted to ",
                           DescribeOp(*it->second), " and ", DescribeOp(*op)));
        }
      }
      for (const Op* a : grants) {
        for (const Op* b : grants) {
          if (a->complete_ns < b->invoke_ns && a->attempt_id != b->attempt_id &&
              b->granted_token <= a->granted_token) {
            Add("token-regression", key,
                absl::StrCat(DescribeOp(*a), " then ", DescribeOp(*b)));
          }
        }
      }
    }
  }

  // G2: an UNKNOWN record is granted again only after a release of that
  // token (Resolve FAILED retryable, or the holder's retryable Fail).
  // Also: no lease runs out before it could have (PostgreSQL's clock).
  void Unknowns() {
    for (const auto& [key, ops] : by_key_) {
      for (const Op* seen : ops) {
        if (seen->result != Result::kOk || !seen->has_record ||
            seen->record.status() != pb::STATUS_UNKNOWN) {
          continue;
        }
        const int64_t t = seen->record.fencing_token();
        for (const Op* g : ops) {
          if (!Acquired(*g) || g->granted_token <= t ||
              g->invoke_ns <= seen->complete_ns) {
            continue;
          }
          bool released = false;
          for (const Op* r : ops) {
            if (r->result == Result::kFail || r->invoke_ns >= g->complete_ns) {
              continue;
            }
            if (r->type == OpType::kResolve &&
                r->resolve_to == pb::STATUS_FAILED && r->retryable &&
                (r->token == 0 || r->token == t)) {
              released = true;
            }
            if (r->type == OpType::kFail && r->retryable && r->token == t) {
              released = true;
            }
          }
          if (!released) {
            Add("unknown-regranted", key,
                absl::StrCat("seen UNKNOWN at token ", t, " by ",
                             DescribeOp(*seen), ", then ", DescribeOp(*g),
                             " with no release of token ", t));
          }
        }
      }
      // Lease expiry: PostgreSQL's now() is at least the grant's invoke time,
      // so the lease cannot run out before invoke + lease.
      std::map<std::string, int64_t> first_invoke;  // attempt -> ns
      for (const Op* op : ops) {
        if (op->type != OpType::kBegin || op->attempt_id.empty()) continue;
        auto [it, inserted] =
            first_invoke.emplace(op->attempt_id, op->invoke_ns);
        if (!inserted) it->second = std::min(it->second, op->invoke_ns);
      }
      for (const Op* g : ops) {
        if (!Acquired(*g) || g->lease_ms <= 0) continue;
        int64_t start = g->invoke_ns;
        auto it = first_invoke.find(g->attempt_id);
        if (it != first_invoke.end()) start = std::min(start, it->second);
        const int64_t live_until =
            start + (g->lease_ms - options_.lease_margin_ms) * 1000000;
        for (const Op* o : ops) {
          if (o->result != Result::kOk || !o->has_record ||
              o->complete_ns >= live_until ||
              o->record.fencing_token() != g->granted_token) {
            continue;
          }
          if (o->record.status() == pb::STATUS_UNKNOWN || Released(o->record)) {
            Add("lease-expired-early", key,
                absl::StrCat(DescribeOp(*g), " with a ", g->lease_ms,
                             "ms lease, yet ", DescribeOp(*o), " ",
                             (o->complete_ns - start) / 1000000,
                             "ms after the first Begin"));
          }
        }
      }
    }
  }

  // G3: answers against the stored record.
  void Answers() {
    for (const Op& op : history_) {
      if (op.result != Result::kOk) continue;
      const FinalRecord* f = Final(op.key);
      if (op.type == OpType::kBegin) {
        if (op.outcome == pb::OUTCOME_MISMATCH) {
          if (op.record.has_result()) {
            Add("mismatch-leaks-result", op.key, DescribeOp(op));
          }
          if (f != nullptr && op.request_hash == f->request_hash) {
            Add("other-hash-answered", op.key,
                absl::StrCat("MISMATCH for the record's own hash: ",
                             DescribeOp(op)));
          }
          continue;
        }
        if (f != nullptr && op.request_hash != f->request_hash) {
          Add("other-hash-answered", op.key,
              absl::StrCat("another request hash got ",
                           pb::Outcome_Name(op.outcome), ": ", DescribeOp(op)));
        }
      }
      const bool replay =
          (op.type == OpType::kBegin && (op.outcome == pb::OUTCOME_COMPLETED ||
                                         op.outcome == pb::OUTCOME_FAILED)) ||
          (op.type != OpType::kBegin && op.has_record &&
           FinalStatus(op.record));
      if (!replay) continue;
      if (op.type == OpType::kBegin && !FinalStatus(op.record)) {
        Add("replay-differs", op.key,
            absl::StrCat("replay of a record that may still change: ",
                         DescribeOp(op)));
        continue;
      }
      if (KeyOf(op.record) != op.key) {
        Add("replay-differs", op.key,
            absl::StrCat("answered with the record of ", KeyOf(op.record), ": ",
                         DescribeOp(op)));
        continue;
      }
      if (f == nullptr) {
        Add("replay-differs", op.key,
            absl::StrCat("record missing at the end: ", DescribeOp(op)));
        continue;
      }
      SnapshotTag tag;
      if (ParseSnapshotTag(op.record.result(), &tag) && tag.key != op.key) {
        Add("replay-differs", op.key,
            absl::StrCat("snapshot of ", tag.key, ": ", DescribeOp(op)));
      }
      if (op.record.status() != f->status ||
          op.record.fencing_token() != f->token ||
          op.record.retryable() != f->retryable ||
          op.record.has_result() != f->has_result ||
          !SameSnapshot(op.record.result(), f->result)) {
        Add("replay-differs", op.key,
            absl::StrCat(DescribeOp(op), " answered ",
                         pb::Status_Name(op.record.status()), "/",
                         op.record.fencing_token(), " body ",
                         op.record.result().body().size(), " bytes; stored ",
                         pb::Status_Name(f->status), "/", f->token, " body ",
                         f->result.body().size(), " bytes"));
      }
    }
  }

  // G4 and G5: acknowledged writes are there at the end, unchanged.
  void Acknowledged() {
    std::set<int64_t> lost;
    for (const Op& op : history_) {
      if (op.result != Result::kOk) continue;
      const FinalRecord* f = Final(op.key);
      auto lose = [&](const std::string& kind, const std::string& why) {
        Add(kind, op.key, absl::StrCat(why, ": ", DescribeOp(op)));
        lost.insert(op.id);
      };
      switch (op.type) {
        case OpType::kBegin:
          if (op.outcome != pb::OUTCOME_ACQUIRED) break;
          if (f == nullptr) {
            lose("lost-grant", "record missing");
          } else if (f->token < op.granted_token) {
            lose("lost-grant",
                 absl::StrCat("final token ", f->token, " < granted"));
          }
          break;
        case OpType::kComplete:
          if (f == nullptr || f->status != pb::STATUS_SUCCEEDED ||
              !SameSnapshot(f->result, op.snapshot)) {
            lose("lost-complete",
                 f == nullptr
                     ? "record missing"
                     : absl::StrCat("final is ", pb::Status_Name(f->status),
                                    "/", f->token));
          }
          if (f != nullptr && f->token != op.token) {
            lose("complete-token-not-final",
                 absl::StrCat("final token ", f->token));
          }
          break;
        case OpType::kFail:
        case OpType::kResolve: {
          const pb::Status to =
              op.type == OpType::kFail ? pb::STATUS_FAILED : op.resolve_to;
          const bool reopens = to == pb::STATUS_FAILED && op.retryable;
          const char* kind =
              op.type == OpType::kFail ? "lost-fail" : "lost-resolve";
          if (f == nullptr) {
            lose(kind, "record missing");
          } else if (op.token != 0 && f->token < op.token) {
            lose(kind, absl::StrCat("final token ", f->token, " lower"));
          } else if ((!reopens || op.token == 0 || f->token == op.token) &&
                     (f->status != to || f->retryable != op.retryable ||
                      !SameSnapshot(f->result, op.snapshot) ||
                      (op.token != 0 && f->token != op.token))) {
            lose(kind, absl::StrCat("final is ", pb::Status_Name(f->status),
                                    "/", f->token));
          }
          break;
        }
        case OpType::kEffect: {
          auto it = final_.effects.find(op.key);
          if (it == final_.effects.end() ||
              std::find(it->second.begin(), it->second.end(), op.token) ==
                  it->second.end()) {
            lose("lost-effect", "effect row missing");
          }
          break;
        }
        default:
          break;
      }
    }
    report_.stats.lost_acknowledged = static_cast<int64_t>(lost.size());

    // Stale tokens: once a higher token was acknowledged, nothing with a
    // lower one may be acknowledged; and the stored snapshot carries the
    // final token.
    for (const auto& [key, ops] : by_key_) {
      for (const Op* w : ops) {
        if (w->result != Result::kOk ||
            (w->type != OpType::kComplete && w->type != OpType::kFail)) {
          continue;
        }
        for (const Op* g : ops) {
          if (Acquired(*g) && g->granted_token > w->token &&
              g->complete_ns < w->invoke_ns) {
            Add("stale-token-accepted", key,
                absl::StrCat(DescribeOp(*w), " after ", DescribeOp(*g)));
            break;
          }
        }
      }
    }
    for (const auto& [key, f] : final_.records) {
      SnapshotTag tag;
      if ((f.status == pb::STATUS_SUCCEEDED || f.status == pb::STATUS_FAILED) &&
          f.has_result && ParseSnapshotTag(f.result, &tag) &&
          (tag.token != f.token || tag.key != key)) {
        Add("stale-write-applied", key,
            absl::StrCat("final ", pb::Status_Name(f.status), "/", f.token,
                         " holds the snapshot of ", tag.key, " token ",
                         tag.token, " by ", tag.writer));
      }
    }
  }

  // Business effects never exceed grants.
  void Effects() {
    std::map<std::string, std::set<int64_t>> granted;
    for (const Op& op : history_) {
      if (Acquired(op)) granted[op.key].insert(op.granted_token);
    }
    for (const auto& [key, tokens] : final_.effects) {
      const std::set<int64_t>& g = granted[key];
      if (tokens.size() > g.size()) {
        Add("effects-exceed-grants", key,
            absl::StrCat(tokens.size(), " effects, ", g.size(), " grants"));
      }
      for (int64_t t : tokens) {
        if (g.count(t) == 0) {
          Add("effect-without-grant", key, absl::StrCat("token ", t));
        }
      }
    }
    for (const Op& op : history_) {
      if (op.type != OpType::kComplete || op.result != Result::kOk) continue;
      auto it = final_.effects.find(op.key);
      if (it == final_.effects.end() ||
          std::find(it->second.begin(), it->second.end(), op.token) ==
              it->second.end()) {
        Add("complete-without-effect", op.key, DescribeOp(op));
      }
    }
  }

  // One resolution per (key, token).
  void Resolves() {
    std::map<std::pair<std::string, int64_t>, const Op*> first;
    for (const Op& op : history_) {
      if (op.type != OpType::kResolve || op.result != Result::kOk ||
          op.token == 0) {
        continue;
      }
      auto [it, inserted] =
          first.emplace(std::make_pair(op.key, op.token), &op);
      const Op& a = *it->second;
      if (!inserted &&
          (a.resolve_to != op.resolve_to || a.retryable != op.retryable ||
           !SameSnapshot(a.snapshot, op.snapshot))) {
        Add("conflicting-resolves", op.key,
            absl::StrCat(DescribeOp(a), " and ", DescribeOp(op)));
      }
    }
  }

  // The audit table: every UNKNOWN that was granted again was released
  // first, and only an operator or the holder moved a record off UNKNOWN.
  void Audit() {
    std::map<std::string, std::set<int64_t>> unknown_at, released_at;
    for (const AuditRow& row : final_.audit) {
      if (row.to == pb::STATUS_UNKNOWN) unknown_at[row.key].insert(row.token);
      if (row.from == pb::STATUS_UNKNOWN) {
        if (row.to == pb::STATUS_FAILED) released_at[row.key].insert(row.token);
        if (row.actor == "reaper" || row.actor == "lazy-expiry") {
          Add("unknown-changed", row.key,
              absl::StrCat("UNKNOWN -> ", pb::Status_Name(row.to), " by ",
                           row.actor, " at token ", row.token));
        }
      }
    }
    for (const auto& [key, tokens] : unknown_at) {
      const FinalRecord* f = Final(key);
      if (f == nullptr) continue;
      for (int64_t t : tokens) {
        if (f->token > t && released_at[key].count(t) == 0) {
          Add("unknown-regranted-audit", key,
              absl::StrCat("UNKNOWN at token ", t, ", final token ", f->token,
                           ", no UNKNOWN -> FAILED at ", t));
        }
      }
    }
  }

  void Cache() {
    for (const CacheEntry& e : final_.cache) {
      pb::Record r;
      if (!DecodeCacheEntry(final_.tenant, e.redis_key, e.value,
                            final_.cache_mac_key, &r)) {
        ++report_.stats.cache_ignored;
        continue;
      }
      ++report_.stats.cache_valid;
      const std::string key = KeyOf(r);
      const FinalRecord* f = Final(key);
      if (!FinalStatus(r)) {
        Add("stale-cache", key,
            absl::StrCat("cached ", pb::Status_Name(r.status()),
                         r.retryable() ? " retryable" : "",
                         ": a record that may still change"));
      } else if (f == nullptr || f->status != r.status() ||
                 f->token != r.fencing_token() ||
                 f->retryable != r.retryable() ||
                 f->request_hash != r.request_hash() ||
                 !SameSnapshot(f->result, r.result())) {
        Add("stale-cache", key,
            absl::StrCat("cached ", pb::Status_Name(r.status()), "/",
                         r.fencing_token(), " differs from PostgreSQL"));
      }
      if (final_.max_cache_ttl_ms > 0 &&
          e.pttl_ms > final_.max_cache_ttl_ms + 1000) {
        Add("cache-ttl-too-long", key,
            absl::StrCat("PTTL ", e.pttl_ms, "ms > retention ",
                         final_.max_cache_ttl_ms, "ms"));
      }
    }
  }

  const std::vector<Op>& history_;
  const FinalState& final_;
  const CheckOptions options_;
  std::map<std::string, std::vector<const Op*>> by_key_;
  Report report_;
};

}  // namespace

int Report::Count(absl::string_view kind) const {
  return static_cast<int>(
      std::count_if(violations.begin(), violations.end(),
                    [&](const Violation& v) { return v.kind == kind; }));
}

Report Check(const std::vector<Op>& history, const FinalState& final_state,
             const CheckOptions& options) {
  return Checker(history, final_state, options).Run();
}

namespace {

// HMAC-SHA256 of `data` with `key`, as raw bytes; empty if OpenSSL failed.
std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(),
           out, &size) == nullptr) {
    return "";
  }
  return std::string(reinterpret_cast<const char*>(out), size);
}

// The first 4 bytes of SHA-256 of `key`.
std::string MacKeyId(absl::string_view key) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(key.data(), key.size(), digest, &size, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), 4);
}

// What the MAC of an envelope under `redis_key` covers, after its header.
std::string MacInput(const std::string& header, const std::string& redis_key,
                     absl::string_view payload) {
  return absl::StrCat(header, redis_key.size(), ":", redis_key, payload);
}

}  // namespace

std::string CacheKeyOf(const std::string& tenant, const std::string& key) {
  const size_t slash = key.find('/');
  const std::string operation = key.substr(0, slash);
  const std::string k = slash == std::string::npos ? "" : key.substr(slash + 1);
  return absl::StrCat("idem:{", tenant.size(), ":", tenant, operation.size(),
                      ":", operation, k.size(), ":", k, "}");
}

std::string CacheEnvelope(const pb::Record& record,
                          const std::string& redis_key,
                          const std::string& mac_key) {
  const std::string payload = record.SerializeAsString();
  const std::string header = "IDC2" + MacKeyId(mac_key);
  return header + HmacSha256(mac_key, MacInput(header, redis_key, payload)) +
         payload;
}

bool DecodeCacheEntry(const std::string& tenant, const std::string& redis_key,
                      const std::string& value, const std::string& mac_key,
                      pb::Record* record) {
  if (value.size() < 40 || value.compare(0, 4, "IDC2") != 0) return false;
  const std::string header = value.substr(0, 8);
  if (header.substr(4) != MacKeyId(mac_key)) return false;
  absl::string_view payload(value.data() + 40, value.size() - 40);
  if (HmacSha256(mac_key, MacInput(header, redis_key, payload)) !=
      value.substr(8, 32)) {
    return false;
  }
  if (!record->ParseFromArray(payload.data(),
                              static_cast<int>(payload.size()))) {
    return false;
  }
  return record->key().tenant() == tenant &&
         CacheKeyOf(tenant, KeyOf(*record)) == redis_key &&
         record->fencing_token() > 0;
}

}  // namespace idem::faults
