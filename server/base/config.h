// Per-operation policies (lease default and bounds, retention, expiry policy)
// from the --config YAML file (docs/spec.md#config).
#ifndef IDEM_SERVER_BASE_CONFIG_H_
#define IDEM_SERVER_BASE_CONFIG_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "statemachine/record.h"

namespace idem {

// Immutable after loading; safe to share between threads.
class PolicySet {
 public:
  PolicySet() = default;
  PolicySet(Policy defaults, std::map<std::string, Policy> operations)
      : defaults_(std::move(defaults)), operations_(std::move(operations)) {}

  // The policy of `operation`: its own entry, or the defaults.
  const Policy& For(const std::string& operation) const {
    auto it = operations_.find(operation);
    return it == operations_.end() ? defaults_ : it->second;
  }
  const Policy& defaults() const { return defaults_; }
  const std::map<std::string, Policy>& operations() const {
    return operations_;
  }

 private:
  Policy defaults_;
  std::map<std::string, Policy> operations_;
};

// The longest duration a policy may set (100 years): the PostgreSQL store
// adds them to now() as int64 microseconds, so "inf" or 3000000h would fail
// every write that uses them.
inline constexpr absl::Duration kMaxPolicyDuration =
    absl::Hours(24 * 365 * 100);

// Parses the YAML text of a config file. Every field is optional; an
// operation's missing fields come from `defaults`. An unknown field, a key
// that is not a string or a bad value is INVALID_ARGUMENT naming where it is
// (e.g. "operations.refund.lease"); durations lie within
// (0, kMaxPolicyDuration] (tombstone_retention may be 0). Never throws.
absl::StatusOr<PolicySet> ParsePolicies(const std::string& yaml);

// Reads and parses the file at `path`, and checks that the files probe_tls
// names can be read; errors also name the file.
absl::StatusOr<PolicySet> LoadPolicies(const std::string& path);

}  // namespace idem

#endif  // IDEM_SERVER_BASE_CONFIG_H_
