// Readers of --config fields shared by the policies (config.h) and the
// gateway's routes (server/gateway/gateway_config.h): every error names the
// field's path (e.g. "config operations.refund.lease: ...").
#ifndef IDEM_SERVER_BASE_YAML_FIELDS_H_
#define IDEM_SERVER_BASE_YAML_FIELDS_H_

#include <yaml-cpp/yaml.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace idem {

// The text of the --config file at `path`; INVALID_ARGUMENT "config:
// cannot read <path>" when it cannot be read.
absl::StatusOr<std::string> ReadConfigFile(const std::string& path);

// INVALID_ARGUMENT "config <path>: <what>".
absl::Status ConfigError(const std::string& path, const std::string& what);

// The text of a map key in `where`. A sequence, map or null key is refused:
// yaml-cpp's as<std::string>() would throw on it.
absl::StatusOr<std::string> KeyText(const YAML::Node& key,
                                    const std::string& where);

// A duration such as 30s, positive (or 0 when `zero_ok`) and at most
// kMaxPolicyDuration (config.h).
absl::Status ParseDurationField(const YAML::Node& node, const std::string& path,
                                absl::Duration* out, bool zero_ok = false);

}  // namespace idem

#endif  // IDEM_SERVER_BASE_YAML_FIELDS_H_
