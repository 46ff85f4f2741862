#include "server/base/yaml_fields.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/base/config.h"

namespace idem {

absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status ConfigError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", what));
}

// The text of a map key in `where`. A sequence, map or null key is refused:
// yaml-cpp's as<std::string>() would throw on it.
absl::StatusOr<std::string> KeyText(const YAML::Node& key,
                                    const std::string& where) {
  if (key.IsScalar()) return key.Scalar();
  return ConfigError(where, absl::StrCat("a key must be a string, not ",
                                         key.IsSequence() ? "a sequence"
                                         : key.IsMap()    ? "a map"
                                                          : "null (quote a key "
                                                            "named null or ~)"));
}

absl::Status ParseDurationField(const YAML::Node& node, const std::string& path,
                                absl::Duration* out, bool zero_ok) {
  if (!node.IsScalar())
    return ConfigError(path, "must be a duration like 30s or 5m");
  const std::string& text = node.Scalar();
  absl::Duration d;
  if (!absl::ParseDuration(text, &d)) {
    return ConfigError(path,
                       absl::StrCat("bad duration \"", text,
                                    "\" (want e.g. 30s, 5m or 72h; units ns, "
                                    "us, ms, s, m, h)"));
  }
  if (d < absl::ZeroDuration() || (d == absl::ZeroDuration() && !zero_ok)) {
    return ConfigError(path, absl::StrCat("duration \"", text, "\" must be ",
                                          zero_ok ? "0s or more" : "positive"));
  }
  if (d > kMaxPolicyDuration) {
    return ConfigError(
        path,
        absl::StrCat("duration \"", text, "\" is longer than the maximum, ",
                     absl::FormatDuration(kMaxPolicyDuration), " (100 years)"));
  }
  *out = d;
  return absl::OkStatus();
}

}  // namespace idem
