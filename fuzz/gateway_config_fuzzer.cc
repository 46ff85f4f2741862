// The gateway's routes (server/gateway/gateway_config.h, docs/gateway.md
// #routes) and the choice of a route for a request.
//
// Input: a --config YAML text; after a NUL byte, requests as lines
// "METHOD TARGET" (without one, a fixed set). Properties:
//   - ParseGatewayConfig never crashes or throws, whatever the text; a
//     refusal is INVALID_ARGUMENT starting with "config gateway";
//   - an accepted config has at least one route; route names are record
//     names; methods a non-empty list of upper-case tokens; header names
//     lower-case tokens; "**" only as the last path segment; retry statuses
//     within 100-599; wait and timeout at most 1h; max_body at most 64 MiB;
//     hop-by-hop and denied headers are never recorded;
//   - parsing is deterministic;
//   - MatchRoute picks the first route an independent model matches, and
//     its methods hold the request's method;
//   - WithRoutePolicies never crashes; when it accepts, every route's lease
//     lies within its operation's [min_lease, max_lease] and a route's
//     retention is its operation's.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/gateway_model.h"
#include "server/base/config.h"
#include "server/wire/snapshot_validation.h"
#include "server/gateway/gateway_config.h"

namespace idem {
namespace {

using gateway::GatewayConfig;
using gateway::Route;

constexpr char kDefaultRequests[] =
    "POST /payments\nPATCH /orders/1?x=y\nGET /\nPOST /\nPOST /a/b/c\n"
    "PUT /orders/1/items\nPOST *\nPOST http://h/payments\nPATCH //x\n";

bool TokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) !=
             absl::string_view::npos;
}

void CheckTokens(const std::vector<std::string>& names, bool upper,
                 const std::string& where) {
  for (const std::string& n : names) {
    IDEM_FUZZ_CHECK(!n.empty() && std::all_of(n.begin(), n.end(), TokenChar),
                    where + ": \"" + n + "\"");
    IDEM_FUZZ_CHECK(
        n == (upper ? absl::AsciiStrToUpper(n) : absl::AsciiStrToLower(n)),
        where + ": \"" + n + "\"");
  }
}

void CheckRouteFields(const Route& r) {
  const std::string where = "route " + r.name;
  IDEM_FUZZ_CHECK(IsRecordName(r.name), where);
  IDEM_FUZZ_CHECK(!r.methods.empty(), where + ": no methods");
  CheckTokens(r.methods, true, where + " methods");
  CheckTokens(r.fingerprint_headers, false, where + " fingerprint_headers");
  CheckTokens(r.snapshot_allow, false, where + " snapshot_headers.allow");
  CheckTokens(r.snapshot_deny, false, where + " snapshot_headers.deny");
  for (const std::string& segment : r.path) {
    IDEM_FUZZ_CHECK(!segment.empty(), where + ": an empty path segment");
  }
  for (size_t i = 0; i + 1 < r.path.size(); ++i) {
    IDEM_FUZZ_CHECK(r.path[i] != "**", where + ": ** before the end");
  }
  for (const gateway::StatusRange& s : r.retry_statuses) {
    IDEM_FUZZ_CHECK(100 <= s.low && s.low <= s.high && s.high <= 599,
                    absl::StrCat(where, ": statuses ", s.low, "-", s.high));
    IDEM_FUZZ_CHECK(r.Retries(s.low) && r.Retries(s.high), where);
  }
  IDEM_FUZZ_CHECK(!r.Retries(99) && !r.Retries(600), where);
  IDEM_FUZZ_CHECK(r.wait >= absl::ZeroDuration() && r.wait <= absl::Hours(1),
                  where + ": wait " + absl::FormatDuration(r.wait));
  if (r.timeout) {
    IDEM_FUZZ_CHECK(
        *r.timeout > absl::ZeroDuration() && *r.timeout <= absl::Hours(1),
        where + ": timeout " + absl::FormatDuration(*r.timeout));
  }
  if (r.lease) IDEM_FUZZ_CHECK(*r.lease > absl::ZeroDuration(), where);
  if (r.retention) IDEM_FUZZ_CHECK(*r.retention > absl::ZeroDuration(), where);
  if (r.max_body) IDEM_FUZZ_CHECK(*r.max_body <= (size_t{64} << 20), where);
  for (const char* hop : {"connection", "keep-alive", "transfer-encoding",
                          "upgrade", "content-length", "te", "trailer"}) {
    IDEM_FUZZ_CHECK(gateway::IsHopByHop(hop) && !r.Records(hop),
                    where + " records " + hop);
  }
  for (const std::string& denied : r.snapshot_deny) {
    IDEM_FUZZ_CHECK(!r.Records(denied), where + " records " + denied);
  }
  IDEM_FUZZ_CHECK(gateway::LeaseOf(r, absl::Seconds(30)) > absl::ZeroDuration(),
                  where);
}

bool SameRoute(const Route& a, const Route& b) {
  auto ranges = [](const Route& r) {
    std::vector<std::pair<int, int>> out;
    for (const auto& s : r.retry_statuses) out.emplace_back(s.low, s.high);
    return out;
  };
  return a.name == b.name && a.methods == b.methods && a.path == b.path &&
         a.key == b.key && a.wait == b.wait && a.lease == b.lease &&
         a.timeout == b.timeout && a.retention == b.retention &&
         ranges(a) == ranges(b) &&
         a.fingerprint_headers == b.fingerprint_headers &&
         a.snapshot_allow == b.snapshot_allow &&
         a.snapshot_deny == b.snapshot_deny && a.max_body == b.max_body;
}

void CheckPolicies(const GatewayConfig& config) {
  const absl::Duration timeout = absl::Seconds(30);
  const absl::StatusOr<PolicySet> merged =
      gateway::WithRoutePolicies(PolicySet(), config, timeout);
  if (!merged.ok()) {
    IDEM_FUZZ_CHECK(
        merged.status().code() == absl::StatusCode::kInvalidArgument &&
            absl::StartsWith(merged.status().message(), "config gateway"),
        merged.status().ToString());
    return;
  }
  for (const Route& r : config.routes) {
    const Policy& p = merged->For(r.name);
    const absl::Duration lease = gateway::LeaseOf(r, timeout);
    IDEM_FUZZ_CHECK(p.min_lease <= lease && lease <= p.max_lease,
                    "route " + r.name + ": lease " +
                        absl::FormatDuration(lease) + " outside its bounds");
    if (r.retention) {
      IDEM_FUZZ_CHECK(p.retention == *r.retention,
                      "route " + r.name + ": retention not its operation's");
    }
  }
}

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace idem;  // NOLINT(build/namespaces)
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  const std::string requests =
      nul == std::string::npos ? kDefaultRequests : input.substr(nul + 1);
  absl::StatusOr<GatewayConfig> config;
  try {
    config = gateway::ParseGatewayConfig(yaml);
  } catch (...) {
    fuzz::Violated("ParseGatewayConfig threw");
  }
  if (!config.ok()) {
    IDEM_FUZZ_CHECK(
        config.status().code() == absl::StatusCode::kInvalidArgument &&
            absl::StartsWith(config.status().message(), "config gateway"),
        config.status().ToString());
    return 0;
  }
  IDEM_FUZZ_CHECK(!config->routes.empty(), "no routes");
  CheckTokens(config->scope_headers, false, "scope_headers");
  for (const Route& r : config->routes) CheckRouteFields(r);
  const absl::StatusOr<GatewayConfig> again = gateway::ParseGatewayConfig(yaml);
  IDEM_FUZZ_CHECK(again.ok() && again->scope_headers == config->scope_headers &&
                      again->routes.size() == config->routes.size() &&
                      std::equal(again->routes.begin(), again->routes.end(),
                                 config->routes.begin(), SameRoute),
                  "parsing is not deterministic");
  for (absl::string_view line : absl::StrSplit(requests, '\n')) {
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos) continue;
    fuzz::CheckRoute(*config, line.substr(0, space), line.substr(space + 1));
  }
  CheckPolicies(*config);
  return 0;
}
