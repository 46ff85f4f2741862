// The gateway's routes: which HTTP requests go through a record, under which
// operation, and how the upstream's answers settle it (docs/gateway.md#routes).
// Pure: parsed from the `gateway:` section of the --config YAML.
#ifndef IDEM_SERVER_GATEWAY_GATEWAY_CONFIG_H_
#define IDEM_SERVER_GATEWAY_GATEWAY_CONFIG_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/base/config.h"

namespace idem::gateway {

enum class KeyRule {
  kRequired,  // without Idempotency-Key: 400
  kOptional,  // without it: proxied untouched
  kOff,       // proxied untouched, with or without it
};

struct StatusRange {
  int low = 0;
  int high = 0;
};

struct Route {
  // The records' operation.
  std::string name = "http";
  // Upper-case; a request whose method is not here does not match.
  std::vector<std::string> methods = {"POST", "PATCH"};
  // The path pattern's segments: "*" is one segment, "**" (last only) any
  // rest, itself included when empty.
  std::vector<std::string> path = {"**"};
  KeyRule key = KeyRule::kOptional;
  // How long a duplicate waits for the first attempt; zero: 409 at once.
  absl::Duration wait = absl::ZeroDuration();
  // Unset: timeout + 5s. Unset timeout: --http-upstream-timeout.
  std::optional<absl::Duration> lease;
  std::optional<absl::Duration> timeout;
  // Set: the operation's policy retention.
  std::optional<absl::Duration> retention;
  // Statuses that fail the record retryable; any other completes it.
  std::vector<StatusRange> retry_statuses = {
      {408, 408}, {429, 429}, {500, 599}};
  // Lower-case names, in the fingerprint after the body.
  std::vector<std::string> fingerprint_headers;
  // Lower-case names of the answer's headers to record: empty allow means
  // all but the denied (and never the hop-by-hop ones).
  std::vector<std::string> snapshot_allow;
  std::vector<std::string> snapshot_deny = {"set-cookie"};
  // Unset: --http-max-body.
  std::optional<size_t> max_body;

  // Whether the upstream's `status` lets the request run again.
  bool Retries(int status) const;
  // Whether an answer header named `lower_name` is recorded.
  bool Records(absl::string_view lower_name) const;
};

struct GatewayConfig {
  // Lower-case names whose values scope keys (docs/gateway.md).
  std::vector<std::string> scope_headers;
  // Tried in order; never empty (a missing section gives the default route).
  std::vector<Route> routes = {Route{}};
};

// The `gateway:` section of the --config YAML text (the rest of the file is
// config.h's). No section: the default route. Errors are INVALID_ARGUMENT
// naming the field (e.g. "config gateway.routes[1].path: ..."). Never throws.
absl::StatusOr<GatewayConfig> ParseGatewayConfig(const std::string& yaml);

// ParseGatewayConfig of the file at `path`; errors also name the file.
absl::StatusOr<GatewayConfig> LoadGatewayConfig(const std::string& path);

// The origin form (RFC 9112 section 3.2.1) of a request target: `target`
// itself when it starts with "/" (or is "*"), the path and query of an
// absolute-form "http://host/path?q" (at least "/"); INVALID_ARGUMENT for
// anything else.
absl::StatusOr<std::string> OriginForm(absl::string_view target);

// The segments a path is matched by: split at "/", percent-encoded
// unreserved characters decoded (RFC 3986 section 6.2.2.2), empty and "."
// segments dropped, ".." taking the one before back (section 5.2.4). So
// "/%70ayments//./" is ["payments"]: a client cannot step around a route
// by spelling its path otherwise.
std::vector<std::string> PathSegments(absl::string_view path);

// The first route whose methods hold `method` and whose pattern matches the
// path of `target` (origin or absolute form; PathSegments of it, its query
// ignored); null if none does.
const Route* MatchRoute(const GatewayConfig& config, absl::string_view method,
                        absl::string_view target);

// `policies` with the routes' retentions as their operations' policies.
// INVALID_ARGUMENT when a route sets a retention for an operation that
// `policies` sets too, or its lease lies outside the operation's
// [min_lease, max_lease].
absl::StatusOr<PolicySet> WithRoutePolicies(const PolicySet& policies,
                                            const GatewayConfig& config,
                                            absl::Duration default_timeout);

// The lease of a Begin through `route`.
absl::Duration LeaseOf(const Route& route, absl::Duration default_timeout);

// Whether `lower_name` is a hop-by-hop field (RFC 9110 section 7.6.1) or one
// the gateway sets itself (Content-Length): never forwarded as is, never
// recorded.
bool IsHopByHop(absl::string_view lower_name);

}  // namespace idem::gateway

#endif  // IDEM_SERVER_GATEWAY_GATEWAY_CONFIG_H_
