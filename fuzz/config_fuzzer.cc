// The --config YAML file (server/base/config.h, docs/spec.md#config).
//
// Input: the file's text. Properties:
//   - ParsePolicies never crashes, throws or hangs, whatever the text;
//   - a refusal is INVALID_ARGUMENT starting with "config";
//   - an accepted config has, for the defaults and every operation, positive
//     durations a store can add to its clock (at most kMaxPolicyDuration,
//     100 years, so not "inf") with min_lease <= lease <= max_lease, a
//     retention, a tombstone retention of zero or more, and 1-1000 reconcile
//     attempts;
//   - it is deterministic: parsing the same text again gives the same
//     policies.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_check.h"
#include "server/base/config.h"

namespace idem {
namespace {

// A duration a store can add to its clock: the PostgreSQL store passes
// durations as int64 microseconds (ToInt64Microseconds saturates, and
// now() + 2^63-1 us is "interval out of range"). The parser's documented
// cap is far below that.
bool Storable(absl::Duration d) { return d <= kMaxPolicyDuration; }

void CheckPolicy(const Policy& p, const std::string& name) {
  const std::string where = absl::StrCat(
      name, ": lease ", absl::FormatDuration(p.lease), " min_lease ",
      absl::FormatDuration(p.min_lease), " max_lease ",
      absl::FormatDuration(p.max_lease), " retention ",
      absl::FormatDuration(p.retention), " tombstone_retention ",
      absl::FormatDuration(p.tombstone_retention));
  IDEM_FUZZ_CHECK(p.min_lease > absl::ZeroDuration() &&
                      p.min_lease <= p.lease && p.lease <= p.max_lease,
                  where);
  IDEM_FUZZ_CHECK(p.retention > absl::ZeroDuration(), where);
  IDEM_FUZZ_CHECK(p.tombstone_retention >= absl::ZeroDuration(), where);
  // "inf" and "3000000h" parse as durations; no lease, bound or retention
  // may be beyond what a store can add to now.
  IDEM_FUZZ_CHECK(Storable(p.lease) && Storable(p.max_lease) &&
                      Storable(p.retention) && Storable(p.tombstone_retention),
                  "a duration beyond int64 microseconds accepted: " + where);
  IDEM_FUZZ_CHECK(p.reconcile_attempts >= 1 && p.reconcile_attempts <= 1000,
                  where);
}

bool Same(const Policy& a, const Policy& b) {
  return a.lease == b.lease && a.min_lease == b.min_lease &&
         a.max_lease == b.max_lease && a.retention == b.retention &&
         a.tombstone_retention == b.tombstone_retention &&
         a.on_lease_expiry == b.on_lease_expiry && a.probe == b.probe &&
         a.reconcile_attempts == b.reconcile_attempts;
}

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace idem;  // NOLINT(build/namespaces)
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<PolicySet> policies = ParsePolicies(text);
  if (!policies.ok()) {
    IDEM_FUZZ_CHECK(
        policies.status().code() == absl::StatusCode::kInvalidArgument &&
            policies.status().message().rfind("config", 0) == 0,
        "refused with " + policies.status().ToString());
    return 0;
  }
  CheckPolicy(policies->defaults(), "defaults");
  for (const auto& [name, policy] : policies->operations()) {
    CheckPolicy(policy, "operations." + name);
  }
  absl::StatusOr<PolicySet> again = ParsePolicies(text);
  IDEM_FUZZ_CHECK(
      again.ok() && Same(again->defaults(), policies->defaults()) &&
          again->operations().size() == policies->operations().size(),
      "parsing is not deterministic");
  return 0;
}
