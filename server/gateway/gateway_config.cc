#include "server/gateway/gateway_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/wire/snapshot_validation.h"
#include "server/base/yaml_fields.h"

namespace idem::gateway {
namespace {

// The largest request body a route may accept (docs/gateway.md).
constexpr size_t kMaxBodyLimit = size_t{64} << 20;
// The longest wait and upstream timeout.
constexpr absl::Duration kMaxWait = absl::Hours(1);

// RFC 9110 token characters: methods and field names.
bool TokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) !=
             absl::string_view::npos;
}

bool IsToken(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), TokenChar);
}

absl::StatusOr<std::string> Scalar(const YAML::Node& node,
                                   const std::string& path) {
  if (!node.IsScalar()) return ConfigError(path, "must be a string");
  return node.Scalar();
}

// A sequence of RFC 9110 tokens, lower-cased unless `upper`.
absl::Status ParseTokens(const YAML::Node& node, const std::string& path,
                         bool upper, std::vector<std::string>* out) {
  if (!node.IsSequence()) return ConfigError(path, "must be a list");
  out->clear();
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item = absl::StrCat(path, "[", i, "]");
    absl::StatusOr<std::string> text = Scalar(node[i], item);
    if (!text.ok()) return text.status();
    if (!IsToken(*text)) {
      return ConfigError(item,
                         absl::StrCat("\"", *text, "\" is not an HTTP token"));
    }
    out->push_back(upper ? absl::AsciiStrToUpper(*text)
                         : absl::AsciiStrToLower(*text));
  }
  return absl::OkStatus();
}

absl::Status ParsePath(const YAML::Node& node, const std::string& path,
                       std::vector<std::string>* out) {
  absl::StatusOr<std::string> text = Scalar(node, path);
  if (!text.ok()) return text.status();
  if (text->empty() || (*text)[0] != '/' ||
      text->find_first_of("?# \t") != std::string::npos) {
    return ConfigError(path,
                       "must start with / and hold no query, fragment or "
                       "space (e.g. /payments/*)");
  }
  // Patterns are matched against PathSegments, which has no empty
  // segments: "/" is no segment, "/a/" is ["a"].
  *out = absl::StrSplit(absl::string_view(*text).substr(1), '/',
                        absl::SkipEmpty());
  for (size_t i = 0; i + 1 < out->size(); ++i) {
    if ((*out)[i] == "**") {
      return ConfigError(path, "** may only be the last segment");
    }
  }
  return absl::OkStatus();
}

// "500-599" or "503".
absl::Status ParseStatuses(const YAML::Node& node, const std::string& path,
                           std::vector<StatusRange>* out) {
  if (!node.IsSequence()) return ConfigError(path, "must be a list");
  out->clear();
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item = absl::StrCat(path, "[", i, "]");
    absl::StatusOr<std::string> text = Scalar(node[i], item);
    if (!text.ok()) return text.status();
    std::vector<std::string> bounds = absl::StrSplit(*text, '-');
    StatusRange range;
    if (bounds.size() > 2 || !absl::SimpleAtoi(bounds[0], &range.low) ||
        !absl::SimpleAtoi(bounds.back(), &range.high) || range.low < 100 ||
        range.high > 599 || range.low > range.high) {
      return ConfigError(item, absl::StrCat("\"", *text,
                                            "\" is not a status or range "
                                            "of statuses within 100-599"));
    }
    out->push_back(range);
  }
  return absl::OkStatus();
}

absl::Status ParseSnapshotHeaders(const YAML::Node& node,
                                  const std::string& path, Route* route) {
  if (!node.IsMap()) return ConfigError(path, "must be a map (allow, deny)");
  for (const auto& item : node) {
    absl::StatusOr<std::string> name = KeyText(item.first, path);
    if (!name.ok()) return name.status();
    const std::string field = absl::StrCat(path, ".", *name);
    absl::Status s;
    if (*name == "allow") {
      s = ParseTokens(item.second, field, false, &route->snapshot_allow);
    } else if (*name == "deny") {
      s = ParseTokens(item.second, field, false, &route->snapshot_deny);
    } else {
      s = ConfigError(field, "unknown field (known: allow, deny)");
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ParseRoute(const YAML::Node& node, const std::string& path,
                        Route* route) {
  if (!node.IsMap()) return ConfigError(path, "must be a map");
  bool named = false;
  for (const auto& item : node) {
    absl::StatusOr<std::string> name = KeyText(item.first, path);
    if (!name.ok()) return name.status();
    const std::string field = absl::StrCat(path, ".", *name);
    const YAML::Node& v = item.second;
    absl::Status s;
    if (*name == "name") {
      absl::StatusOr<std::string> text = Scalar(v, field);
      if (!text.ok()) return text.status();
      if (!IsRecordName(*text)) {
        return ConfigError(field, "must be 1-128 bytes of [A-Za-z0-9._:-]");
      }
      route->name = *text;
      named = true;
    } else if (*name == "methods") {
      s = ParseTokens(v, field, true, &route->methods);
      if (s.ok() && route->methods.empty()) {
        s = ConfigError(field, "must name at least one method");
      }
    } else if (*name == "path") {
      s = ParsePath(v, field, &route->path);
    } else if (*name == "key") {
      absl::StatusOr<std::string> text = Scalar(v, field);
      if (!text.ok()) return text.status();
      if (*text == "required") {
        route->key = KeyRule::kRequired;
      } else if (*text == "optional") {
        route->key = KeyRule::kOptional;
      } else if (*text == "off") {
        route->key = KeyRule::kOff;
      } else {
        s = ConfigError(field, "must be required, optional or off");
      }
    } else if (*name == "wait") {
      s = ParseDurationField(v, field, &route->wait, /*zero_ok=*/true);
      if (s.ok() && route->wait > kMaxWait) {
        s = ConfigError(field, "must be at most 1h");
      }
    } else if (*name == "lease" || *name == "timeout" || *name == "retention") {
      absl::Duration d;
      s = ParseDurationField(v, field, &d);
      if (s.ok() && *name == "timeout" && d > kMaxWait) {
        s = ConfigError(field, "must be at most 1h");
      }
      (*name == "lease"     ? route->lease
       : *name == "timeout" ? route->timeout
                            : route->retention) = d;
    } else if (*name == "retry_statuses") {
      s = ParseStatuses(v, field, &route->retry_statuses);
    } else if (*name == "fingerprint_headers") {
      s = ParseTokens(v, field, false, &route->fingerprint_headers);
    } else if (*name == "snapshot_headers") {
      s = ParseSnapshotHeaders(v, field, route);
    } else if (*name == "max_body") {
      size_t bytes = 0;
      if (!v.IsScalar() || !absl::SimpleAtoi(v.Scalar(), &bytes) ||
          bytes > kMaxBodyLimit) {
        s = ConfigError(field, absl::StrCat("must be a number of bytes, 0 to ",
                                            kMaxBodyLimit));
      } else {
        route->max_body = bytes;
      }
    } else {
      s = ConfigError(field,
                      "unknown field (known: name, methods, path, key, wait, "
                      "lease, timeout, retention, retry_statuses, "
                      "fingerprint_headers, snapshot_headers, max_body)");
    }
    if (!s.ok()) return s;
  }
  if (!named) return ConfigError(path + ".name", "required");
  return absl::OkStatus();
}

absl::StatusOr<GatewayConfig> ParseSection(const YAML::Node& node) {
  GatewayConfig config;
  if (!node.IsDefined() || node.IsNull()) return config;
  if (!node.IsMap()) return ConfigError("gateway", "must be a map");
  for (const auto& item : node) {
    absl::StatusOr<std::string> name = KeyText(item.first, "gateway");
    if (!name.ok()) return name.status();
    const std::string field = absl::StrCat("gateway.", *name);
    if (*name == "scope_headers") {
      absl::Status s =
          ParseTokens(item.second, field, false, &config.scope_headers);
      if (!s.ok()) return s;
    } else if (*name == "routes") {
      if (!item.second.IsSequence() || item.second.size() == 0) {
        return ConfigError(field, "must be a list of at least one route");
      }
      config.routes.clear();
      for (size_t i = 0; i < item.second.size(); ++i) {
        Route route;
        absl::Status s = ParseRoute(item.second[i],
                                    absl::StrCat(field, "[", i, "]"), &route);
        if (!s.ok()) return s;
        config.routes.push_back(std::move(route));
      }
    } else {
      return ConfigError(field, "unknown field (known: scope_headers, routes)");
    }
  }
  return config;
}

// The value of a hexadecimal digit, or -1.
int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Whether `segments` (PathSegments of a path) match `pattern`.
bool PathMatches(const std::vector<std::string>& pattern,
                 const std::vector<std::string>& segments) {
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == "**") return true;
    if (i >= segments.size()) return false;
    if (pattern[i] != "*" && pattern[i] != segments[i]) return false;
  }
  return pattern.size() == segments.size();
}

}  // namespace

bool Route::Retries(int status) const {
  return std::any_of(retry_statuses.begin(), retry_statuses.end(),
                     [status](const StatusRange& r) {
                       return r.low <= status && status <= r.high;
                     });
}

bool Route::Records(absl::string_view lower_name) const {
  if (IsHopByHop(lower_name)) return false;
  if (std::find(snapshot_deny.begin(), snapshot_deny.end(), lower_name) !=
      snapshot_deny.end()) {
    return false;
  }
  return snapshot_allow.empty() ||
         std::find(snapshot_allow.begin(), snapshot_allow.end(), lower_name) !=
             snapshot_allow.end();
}

absl::StatusOr<GatewayConfig> ParseGatewayConfig(const std::string& yaml) {
  try {
    const YAML::Node root = YAML::Load(yaml);
    if (!root.IsMap()) return GatewayConfig{};
    return ParseSection(root["gateway"]);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config gateway: not valid YAML: ", e.what()));
  }
}

absl::StatusOr<GatewayConfig> LoadGatewayConfig(const std::string& path) {
  absl::StatusOr<std::string> text = ReadConfigFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<GatewayConfig> config = ParseGatewayConfig(*text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.status().message(), " (in ", path, ")"));
  }
  return config;
}

absl::StatusOr<std::string> OriginForm(absl::string_view target) {
  if (absl::StartsWith(target, "/") || target == "*") {
    return std::string(target);
  }
  absl::string_view rest = target;
  if (!absl::ConsumePrefix(&rest, "http://") &&
      !absl::ConsumePrefix(&rest, "https://")) {
    // Scheme names are case-insensitive (RFC 3986 section 3.1).
    const size_t colon = target.find("://");
    const absl::string_view scheme =
        colon == absl::string_view::npos ? "" : target.substr(0, colon);
    if (!absl::EqualsIgnoreCase(scheme, "http") &&
        !absl::EqualsIgnoreCase(scheme, "https")) {
      return absl::InvalidArgumentError(
          "the request target must be a path or an http URI");
    }
    rest = target.substr(colon + 3);
  }
  const size_t start = rest.find_first_of("/?");
  if (start == absl::string_view::npos) return std::string("/");
  if (rest[start] == '?') return absl::StrCat("/", rest.substr(start));
  return std::string(rest.substr(start));
}

std::vector<std::string> PathSegments(absl::string_view path) {
  std::vector<std::string> segments;
  for (absl::string_view raw : absl::StrSplit(path, '/')) {
    std::string segment;
    for (size_t i = 0; i < raw.size(); ++i) {
      int decoded = -1;
      if (raw[i] == '%' && i + 2 < raw.size() && HexDigit(raw[i + 1]) >= 0 &&
          HexDigit(raw[i + 2]) >= 0) {
        decoded = HexDigit(raw[i + 1]) * 16 + HexDigit(raw[i + 2]);
      }
      const bool unreserved =
          decoded >= 0 &&
          (absl::ascii_isalnum(static_cast<unsigned char>(decoded)) ||
           decoded == '-' || decoded == '.' || decoded == '_' ||
           decoded == '~');
      if (unreserved) {
        segment.push_back(static_cast<char>(decoded));
        i += 2;
      } else {
        segment.push_back(raw[i]);
      }
    }
    if (segment.empty() || segment == ".") continue;
    if (segment == "..") {
      if (!segments.empty()) segments.pop_back();
      continue;
    }
    segments.push_back(std::move(segment));
  }
  return segments;
}

const Route* MatchRoute(const GatewayConfig& config, absl::string_view method,
                        absl::string_view target) {
  absl::StatusOr<std::string> origin = OriginForm(target);
  if (!origin.ok() || !absl::StartsWith(*origin, "/")) return nullptr;
  const absl::string_view path =
      absl::string_view(*origin).substr(0, origin->find('?'));
  const std::vector<std::string> segments = PathSegments(path);
  for (const Route& route : config.routes) {
    if (std::find(route.methods.begin(), route.methods.end(), method) ==
        route.methods.end()) {
      continue;
    }
    if (PathMatches(route.path, segments)) return &route;
  }
  return nullptr;
}

absl::Duration LeaseOf(const Route& route, absl::Duration default_timeout) {
  if (route.lease) return *route.lease;
  return route.timeout.value_or(default_timeout) + absl::Seconds(5);
}

absl::StatusOr<PolicySet> WithRoutePolicies(const PolicySet& policies,
                                            const GatewayConfig& config,
                                            absl::Duration default_timeout) {
  std::map<std::string, Policy> operations = policies.operations();
  for (size_t i = 0; i < config.routes.size(); ++i) {
    const Route& route = config.routes[i];
    const std::string path = absl::StrCat("gateway.routes[", i, "]");
    if (route.retention) {
      if (policies.operations().count(route.name) != 0) {
        return ConfigError(path + ".retention",
                           absl::StrCat("operation ", route.name,
                                        " has a policy under operations: "
                                        "set its retention there"));
      }
      auto [it, added] = operations.emplace(route.name, policies.defaults());
      if (!added && it->second.retention != *route.retention) {
        return ConfigError(path + ".retention",
                           absl::StrCat("another route of operation ",
                                        route.name, " sets another one"));
      }
      it->second.retention = *route.retention;
    }
  }
  PolicySet merged(policies.defaults(), std::move(operations));
  for (size_t i = 0; i < config.routes.size(); ++i) {
    const Route& route = config.routes[i];
    const Policy& policy = merged.For(route.name);
    const absl::Duration lease = LeaseOf(route, default_timeout);
    if (lease < policy.min_lease || lease > policy.max_lease) {
      return ConfigError(
          absl::StrCat("gateway.routes[", i, "].lease"),
          absl::StrCat(absl::FormatDuration(lease),
                       " (the lease, by default timeout + 5s) must lie within "
                       "the operation's [min_lease, max_lease] = [",
                       absl::FormatDuration(policy.min_lease), ", ",
                       absl::FormatDuration(policy.max_lease), "]"));
    }
  }
  return merged;
}

bool IsHopByHop(absl::string_view lower_name) {
  static constexpr absl::string_view kFields[] = {
      "connection", "keep-alive",        "proxy-connection", "te",
      "trailer",    "transfer-encoding", "upgrade",          "content-length"};
  return std::find(std::begin(kFields), std::end(kFields), lower_name) !=
         std::end(kFields);
}

}  // namespace idem::gateway
