#include "server/base/config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace idem {
namespace {

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", what));
}

// The text of a map key in `where`. A sequence, map or null key is refused:
// yaml-cpp's as<std::string>() would throw on it.
absl::StatusOr<std::string> KeyText(const YAML::Node& key,
                                    const std::string& where) {
  if (key.IsScalar()) return key.Scalar();
  return Bad(where, absl::StrCat("a key must be a string, not ",
                                 key.IsSequence() ? "a sequence"
                                 : key.IsMap()    ? "a map"
                                                  : "null (quote a key "
                                                    "named null or ~)"));
}

absl::Status ParseDurationField(const YAML::Node& node, const std::string& path,
                                absl::Duration* out, bool zero_ok = false) {
  if (!node.IsScalar()) return Bad(path, "must be a duration like 30s or 5m");
  const std::string& text = node.Scalar();
  absl::Duration d;
  if (!absl::ParseDuration(text, &d)) {
    return Bad(path, absl::StrCat("bad duration \"", text,
                                  "\" (want e.g. 30s, 5m or 72h; units ns, "
                                  "us, ms, s, m, h)"));
  }
  if (d < absl::ZeroDuration() || (d == absl::ZeroDuration() && !zero_ok)) {
    return Bad(path, absl::StrCat("duration \"", text, "\" must be ",
                                  zero_ok ? "0s or more" : "positive"));
  }
  if (d > kMaxPolicyDuration) {
    return Bad(
        path,
        absl::StrCat("duration \"", text, "\" is longer than the maximum, ",
                     absl::FormatDuration(kMaxPolicyDuration), " (100 years)"));
  }
  *out = d;
  return absl::OkStatus();
}

// Reads the fields of one policy map over `policy` (which holds the values
// inherited from the defaults).
absl::Status ParsePolicy(const YAML::Node& node, const std::string& path,
                         Policy* policy) {
  if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return Bad(path, "must be a map");
  for (const auto& item : node) {
    absl::StatusOr<std::string> key = KeyText(item.first, path);
    if (!key.ok()) return key.status();
    const std::string& name = *key;
    const std::string field = absl::StrCat(path, ".", name);
    absl::Status s;
    if (name == "lease") {
      s = ParseDurationField(item.second, field, &policy->lease);
    } else if (name == "min_lease") {
      s = ParseDurationField(item.second, field, &policy->min_lease);
    } else if (name == "max_lease") {
      s = ParseDurationField(item.second, field, &policy->max_lease);
    } else if (name == "retention") {
      s = ParseDurationField(item.second, field, &policy->retention);
    } else if (name == "tombstone_retention") {
      s = ParseDurationField(item.second, field, &policy->tombstone_retention,
                             /*zero_ok=*/true);
    } else if (name == "probe") {
      const std::string v =
          item.second.IsScalar() ? item.second.Scalar() : std::string();
      const size_t colon = v.rfind(':');
      int port = 0;
      if (colon == std::string::npos || colon == 0 ||
          !absl::SimpleAtoi(v.substr(colon + 1), &port) || port < 1 ||
          port > 65535) {
        s = Bad(field, absl::StrCat("must be host:port, not \"", v, "\""));
      } else {
        policy->probe = v;
      }
    } else if (name == "reconcile_attempts") {
      int n = 0;
      if (!item.second.IsScalar() ||
          !absl::SimpleAtoi(item.second.Scalar(), &n) || n < 1 || n > 1000) {
        s = Bad(field, "must be a whole number from 1 to 1000");
      } else {
        policy->reconcile_attempts = n;
      }
    } else if (name == "on_lease_expiry") {
      const std::string v =
          item.second.IsScalar() ? item.second.Scalar() : std::string();
      if (v == "unknown") {
        policy->on_lease_expiry = ExpiryPolicy::kUnknown;
      } else if (v == "release") {
        policy->on_lease_expiry = ExpiryPolicy::kRelease;
      } else {
        s = Bad(field,
                absl::StrCat("must be \"unknown\" or \"release\", not \"", v,
                             "\""));
      }
    } else {
      s = Bad(field,
              "unknown field (known: lease, min_lease, max_lease, retention, "
              "tombstone_retention, on_lease_expiry, probe, "
              "reconcile_attempts)");
    }
    if (!s.ok()) return s;
  }
  if (policy->min_lease > policy->max_lease) {
    return Bad(path, "min_lease is greater than max_lease");
  }
  if (policy->lease < policy->min_lease || policy->lease > policy->max_lease) {
    return Bad(absl::StrCat(path, ".lease"),
               "must lie within [min_lease, max_lease]");
  }
  return absl::OkStatus();
}

absl::StatusOr<PolicySet> ParseRoot(const YAML::Node& root) {
  if (root.IsNull()) return PolicySet();
  if (!root.IsMap()) return Bad("(top level)", "must be a map");
  Policy defaults;
  absl::Status s = ParsePolicy(root["defaults"], "defaults", &defaults);
  if (!s.ok()) return s;
  std::map<std::string, Policy> operations;
  for (const auto& item : root) {
    absl::StatusOr<std::string> name = KeyText(item.first, "(top level)");
    if (!name.ok()) return name.status();
    if (*name == "defaults") continue;
    if (*name != "operations") {
      return Bad(*name, "unknown field (known: defaults, operations)");
    }
    if (item.second.IsNull()) continue;
    if (!item.second.IsMap()) return Bad("operations", "must be a map");
    for (const auto& op : item.second) {
      absl::StatusOr<std::string> op_name = KeyText(op.first, "operations");
      if (!op_name.ok()) return op_name.status();
      Policy policy = defaults;
      s = ParsePolicy(op.second, absl::StrCat("operations.", *op_name),
                      &policy);
      if (!s.ok()) return s;
      operations[*op_name] = policy;
    }
  }
  return PolicySet(defaults, std::move(operations));
}

}  // namespace

absl::StatusOr<PolicySet> ParsePolicies(const std::string& yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: not valid YAML: ", e.what()));
  }
  // The fields are type-checked before they are read; this is the backstop
  // that turns a check missed into a refusal instead of an exception.
  try {
    return ParseRoot(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: unexpected YAML: ", e.what()));
  }
}

absl::StatusOr<PolicySet> LoadPolicies(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<PolicySet> policies = ParsePolicies(text.str());
  if (!policies.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(policies.status().message(), " (in ", path, ")"));
  }
  return policies;
}

}  // namespace idem
