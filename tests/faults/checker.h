// Judges a fault run's history and final state against the sidecar's
// guarantees (docs/spec.md#guarantees). Pure: no I/O, no clock.
//
// Checks (each violation has a kind):
//   double-grant            two attempts were ACQUIRED with one (key, token)
//   token-regression        a later grant got a token not above an earlier one
//   unknown-regranted       an UNKNOWN record was granted again without being
//                           resolved FAILED retryable (or failed retryable by
//                           its holder) first; from the history and, as
//                           unknown-regranted-audit, from the audit table
//   unknown-changed         an UNKNOWN record left UNKNOWN by the reaper or a
//                           lazy expiry (audit)
//   replay-differs          a replay (Begin COMPLETED/FAILED, Get of a final
//                           record) differs from the stored record in status,
//                           token or any byte of the snapshot
//   mismatch-leaks-result   a MISMATCH answer carried the result
//   other-hash-answered     a Begin with another request hash got anything
//                           but MISMATCH, or the record's own hash got one
//   lost-grant              an acknowledged grant is not in PostgreSQL
//   lost-complete / lost-fail / lost-resolve / lost-effect
//                           an acknowledged write is missing or different
//   complete-token-not-final an acknowledged Complete's token is not the
//                           record's final token
//   stale-token-accepted    Complete/Fail with a token older than a grant
//                           already acknowledged was acknowledged
//   stale-write-applied     the final snapshot was written with another token
//   effects-exceed-grants   more business effects for a key than grants
//   effect-without-grant    an effect row whose token was never granted
//   complete-without-effect an acknowledged Complete whose worker's effect is
//                           not in the business table
//   conflicting-resolves    two different Resolves of one (key, token) both
//                           acknowledged
//   lease-expired-early     a record seen expired (UNKNOWN, or released) before
//                           its lease could have run out (PostgreSQL time,
//                           not a sidecar's)
//   stale-cache             a well-formed Redis entry differs from PostgreSQL,
//                           or holds a record that may still change
//   cache-ttl-too-long      a Redis entry lives longer than the retention
//   bad-grant-answer        ACQUIRED without the token the record carries
#ifndef IDEM_TESTS_FAULTS_CHECKER_H_
#define IDEM_TESTS_FAULTS_CHECKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "tests/faults/history.h"

namespace idem::faults {

struct Violation {
  std::string kind;
  std::string key;
  std::string detail;
};

struct CheckStats {
  int64_t ops = 0;
  int64_t ok = 0;
  int64_t fail = 0;
  int64_t info = 0;
  int64_t grants = 0;     // acknowledged ACQUIRED (distinct key/token)
  int64_t completes = 0;  // acknowledged Complete
  int64_t replays = 0;    // Begin answered COMPLETED or FAILED
  int64_t mismatches = 0;
  int64_t unknown_seen = 0;    // answers showing an UNKNOWN record
  int64_t resolves = 0;        // acknowledged Resolve
  int64_t effects = 0;         // effect rows at the end
  int64_t fenced = 0;          // effect writes refused by the token fence
  int64_t stale_rejected = 0;  // Complete/Fail refused (FAILED_PRECONDITION)
  int64_t records = 0;
  int64_t cache_valid = 0;
  int64_t cache_ignored = 0;  // corrupt or foreign entries (never served)
  int64_t lost_acknowledged = 0;
};

struct CheckOptions {
  // Slack for "before the lease could have run out": clocks' granularity.
  int64_t lease_margin_ms = 250;
};

struct Report {
  std::vector<Violation> violations;
  CheckStats stats;
  bool ok() const { return violations.empty(); }
  // Number of violations of `kind`.
  int Count(absl::string_view kind) const;
};

Report Check(const std::vector<Op>& history, const FinalState& final_state,
             const CheckOptions& options = {});

// The Redis key of a record ("operation/key" of `tenant`); whether `value`
// is an intact cache envelope (magic "IDC2", the id of `mac_key` and its
// HMAC-SHA256 over the header, `redis_key` and the payload, a Record named by
// `redis_key`), filling `record`; and the envelope of `record` under
// `redis_key` (server/cache/redis_codec.h, rewritten here).
std::string CacheKeyOf(const std::string& tenant, const std::string& key);
bool DecodeCacheEntry(const std::string& tenant, const std::string& redis_key,
                      const std::string& value, const std::string& mac_key,
                      pb::Record* record);
std::string CacheEnvelope(const pb::Record& record,
                          const std::string& redis_key,
                          const std::string& mac_key);

}  // namespace idem::faults

#endif  // IDEM_TESTS_FAULTS_CHECKER_H_
