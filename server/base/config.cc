#include "server/base/config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/base/yaml_fields.h"

namespace idem {
namespace {

// probe_tls: a map of TLS settings (an empty map: TLS, verified with the
// system roots), or true / false.
absl::Status ParseProbeTls(const YAML::Node& node, const std::string& path,
                           ProbeTls* tls) {
  if (node.IsScalar() &&
      (node.Scalar() == "true" || node.Scalar() == "false")) {
    *tls = ProbeTls{};
    tls->enabled = node.Scalar() == "true";
    return absl::OkStatus();
  }
  if (!node.IsMap()) {
    return ConfigError(
        path, "must be a map (ca, cert, key, server_name) or a boolean");
  }
  ProbeTls out;
  out.enabled = true;
  for (const auto& item : node) {
    absl::StatusOr<std::string> key = KeyText(item.first, path);
    if (!key.ok()) return key.status();
    const std::string field = absl::StrCat(path, ".", *key);
    std::string* value = *key == "ca"            ? &out.ca
                         : *key == "cert"        ? &out.cert
                         : *key == "key"         ? &out.key
                         : *key == "server_name" ? &out.server_name
                                                 : nullptr;
    if (value == nullptr) {
      return ConfigError(field,
                         "unknown field (known: ca, cert, key, server_name)");
    }
    if (!item.second.IsScalar() || item.second.Scalar().empty()) {
      return ConfigError(field, "must be a non-empty string");
    }
    *value = item.second.Scalar();
  }
  if (out.cert.empty() != out.key.empty()) {
    return ConfigError(path, "cert and key go together (a client certificate)");
  }
  *tls = out;
  return absl::OkStatus();
}

// The files of one policy's probe_tls are readable.
absl::Status CheckProbeTlsFiles(const ProbeTls& tls, const std::string& path) {
  for (const auto& [name, file] :
       {std::pair{"ca", &tls.ca}, std::pair{"cert", &tls.cert},
        std::pair{"key", &tls.key}}) {
    if (!file->empty() && !std::ifstream(*file)) {
      return ConfigError(absl::StrCat(path, ".probe_tls.", name),
                         absl::StrCat("cannot read ", *file));
    }
  }
  return absl::OkStatus();
}

// Reads the fields of one policy map over `policy` (which holds the values
// inherited from the defaults).
absl::Status ParsePolicy(const YAML::Node& node, const std::string& path,
                         Policy* policy) {
  if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return ConfigError(path, "must be a map");
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
        s = ConfigError(field,
                        absl::StrCat("must be host:port, not \"", v, "\""));
      } else {
        policy->probe = v;
      }
    } else if (name == "probe_tls") {
      s = ParseProbeTls(item.second, field, &policy->probe_tls);
    } else if (name == "reconcile_attempts") {
      int n = 0;
      if (!item.second.IsScalar() ||
          !absl::SimpleAtoi(item.second.Scalar(), &n) || n < 1 || n > 1000) {
        s = ConfigError(field, "must be a whole number from 1 to 1000");
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
        s = ConfigError(
            field, absl::StrCat("must be \"unknown\" or \"release\", not \"", v,
                                "\""));
      }
    } else {
      s = ConfigError(
          field,
          "unknown field (known: lease, min_lease, max_lease, retention, "
          "tombstone_retention, on_lease_expiry, probe, probe_tls, "
          "reconcile_attempts)");
    }
    if (!s.ok()) return s;
  }
  if (policy->min_lease > policy->max_lease) {
    return ConfigError(path, "min_lease is greater than max_lease");
  }
  if (policy->lease < policy->min_lease || policy->lease > policy->max_lease) {
    return ConfigError(absl::StrCat(path, ".lease"),
                       "must lie within [min_lease, max_lease]");
  }
  return absl::OkStatus();
}

absl::StatusOr<PolicySet> ParseRoot(const YAML::Node& root) {
  if (root.IsNull()) return PolicySet();
  if (!root.IsMap()) return ConfigError("(top level)", "must be a map");
  Policy defaults;
  absl::Status s = ParsePolicy(root["defaults"], "defaults", &defaults);
  if (!s.ok()) return s;
  std::map<std::string, Policy> operations;
  for (const auto& item : root) {
    absl::StatusOr<std::string> name = KeyText(item.first, "(top level)");
    if (!name.ok()) return name.status();
    // The gateway's routes are the gateway layer's (gateway_config.h).
    if (*name == "defaults" || *name == "gateway") continue;
    if (*name != "operations") {
      return ConfigError(
          *name, "unknown field (known: defaults, operations, gateway)");
    }
    if (item.second.IsNull()) continue;
    if (!item.second.IsMap()) return ConfigError("operations", "must be a map");
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
  absl::StatusOr<std::string> text = ReadConfigFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<PolicySet> policies = ParsePolicies(*text);
  absl::Status s = policies.status();
  if (s.ok())
    s = CheckProbeTlsFiles(policies->defaults().probe_tls, "defaults");
  if (policies.ok()) {
    for (const auto& [name, policy] : policies->operations()) {
      if (!s.ok()) break;
      s = CheckProbeTlsFiles(policy.probe_tls,
                             absl::StrCat("operations.", name));
    }
  }
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (in ", path, ")"));
  }
  return policies;
}

}  // namespace idem
