// The HTTP gateway's request handling (server/gateway/, docs/gateway.md):
// the bytes a client sends, read by Boost.Beast's request parser with the
// gateway's limits, then the gateway's header handling: the route, the
// Idempotency-Key fields, the scoped record key, the fingerprint and the
// problem document of a refusal. server/gateway/gateway.cc does this over
// sockets; its steps are repeated here over one buffer.
//
// Input: one or more pipelined HTTP/1.1 requests (read while the previous
// one keeps the connection alive); the whole input is also an
// Idempotency-Key field value. Properties:
//   - nothing crashes or throws, whatever the bytes;
//   - ParseIdempotencyKey agrees with an independent model of the contract
//     (sf-string or bare; 1-200 visible ASCII), refusals are
//     INVALID_ARGUMENT "Idempotency-Key: ...", and an accepted key parses
//     again, unchanged, quoted as an sf-string and (if it can be) bare;
//   - a header never fails on its Content-Length (a body too large is the
//     route's 413, not a 400);
//   - the gateway's two ways of seeing the field in a header (find() for
//     "is there a key", a case-insensitive walk for "how many") agree, as
//     does count() once the request is whole;
//   - MatchRoute returns the first route the model matches, whose methods
//     hold the request's method;
//   - the record key is the key, or 22 base64url characters, ':' and the
//     key, within the 255 bytes of a record key; scope values that join
//     alike scope apart;
//   - the fingerprint is 64 lower-case hex digits and deterministic;
//   - a problem document is JSON whose type, status, detail and
//     idempotency_key are the ones given.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/gateway_model.h"
#include "server/gateway/gateway_config.h"
#include "server/gateway/problem.h"
#include "server/gateway/request_identity.h"

namespace idem {
namespace {

namespace http = boost::beast::http;
using gateway::GatewayConfig;
using gateway::KeyRule;
using gateway::ProblemKind;
using gateway::Route;

// server/gateway/gateway.cc's header limit and --http-max-body's default.
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;
constexpr size_t kMaxBody = 1 << 20;
// Pipelined requests read from one input.
constexpr int kMaxRequests = 8;

// Routes of every kind: a required key with a small body limit and
// fingerprint headers, an optional one on a wildcard segment, a route with
// keys off, and the default route last; keys scoped by two headers.
constexpr char kConfig[] = R"(gateway:
  scope_headers: [authorization, x-tenant]
  routes:
    - name: create-payment
      methods: [POST]
      path: /payments
      key: required
      fingerprint_headers: [content-type, x-request-class]
      max_body: 64
    - name: update-order
      methods: [PATCH, PUT]
      path: /orders/*
      key: optional
    - name: files
      methods: [POST]
      path: /files/**
      key: off
    - name: http
      methods: [POST, PATCH]
      path: /**
      key: optional
)";

const GatewayConfig& Config() {
  static const GatewayConfig* config = [] {
    absl::StatusOr<GatewayConfig> parsed = gateway::ParseGatewayConfig(kConfig);
    IDEM_FUZZ_CHECK(parsed.ok(), parsed.status().ToString());
    return new GatewayConfig(*std::move(parsed));
  }();
  return *config;
}

absl::string_view View(boost::beast::string_view s) {
  return absl::string_view(s.data(), s.size());
}

void CheckProblem(ProblemKind kind, int status, const std::string& detail,
                  const std::string& key) {
  const std::string body = gateway::ProblemBody(kind, status, detail, key);
  const nlohmann::json doc = nlohmann::json::parse(body, nullptr, false);
  IDEM_FUZZ_CHECK(!doc.is_discarded() && doc.is_object(), body);
  IDEM_FUZZ_CHECK(doc.value("type", "") == gateway::ProblemType(kind) &&
                      doc.value("status", 0) == status &&
                      doc.value("detail", "") == detail &&
                      !doc.value("title", "").empty(),
                  body);
  IDEM_FUZZ_CHECK(key.empty() ? !doc.contains("idempotency_key")
                              : doc.value("idempotency_key", "") == key,
                  body);
}

// The gateway's Admit: one Idempotency-Key field, its key, the record key
// and the fingerprint.
void Admit(const http::request<http::string_body>& request,
           const Route& route) {
  int keys = 0;
  std::string value;
  for (const auto& field : request) {
    if (absl::EqualsIgnoreCase(View(field.name_string()), "idempotency-key")) {
      ++keys;
      value = std::string(View(field.value()));
    }
  }
  IDEM_FUZZ_CHECK(request.count("idempotency-key") == static_cast<size_t>(keys),
                  "count() and the walk disagree");
  if (keys == 0) {
    IDEM_FUZZ_CHECK(route.key == KeyRule::kRequired,
                    "a recorded request without a key on route " + route.name);
    return;
  }
  if (keys > 1) return;
  const absl::StatusOr<std::string> parsed =
      gateway::ParseIdempotencyKey(value);
  if (!parsed.ok()) {
    CheckProblem(ProblemKind::kKeyInvalid, 400,
                 std::string(parsed.status().message()), "");
    return;
  }
  const std::optional<std::string> key = fuzz::CheckKey(value);
  std::vector<std::string> scope;
  for (const std::string& name : Config().scope_headers) {
    scope.emplace_back(View(request[name]));
  }
  fuzz::CheckScopedKey(scope, *key);
  std::vector<std::pair<std::string, std::string>> headers;
  for (const std::string& name : route.fingerprint_headers) {
    headers.emplace_back(name, std::string(View(request[name])));
  }
  fuzz::CheckFingerprint(View(request.method_string()), View(request.target()),
                         request.body(), headers);
  CheckProblem(ProblemKind::kKeyReused, 422,
               "this key was used with another request", *key);
}

// Reads one request from the front of `rest` as the gateway does (header,
// then the body under the route's limit) and handles it. False when the
// connection would not carry another request: an error, a refusal, a
// request not yet whole, or no keep-alive.
bool OneRequest(absl::string_view* rest) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  // As gateway.cc: no body limit until the route is known.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  boost::beast::error_code ec;
  size_t used = parser.put(boost::asio::buffer(rest->data(), rest->size()), ec);
  // A Content-Length past a limit is the route's 413, never a failed header
  // (a 400).
  IDEM_FUZZ_CHECK(ec != http::error::body_limit,
                  "the header failed on its Content-Length");
  if (ec || !parser.is_header_done()) return false;
  rest->remove_prefix(used);

  const auto& header = parser.get();
  std::vector<const void*> header_fields;
  for (const auto& field : header) header_fields.push_back(&field);
  IDEM_FUZZ_CHECK(!header.method_string().empty() && !header.target().empty(),
                  "a header without method or target");
  const Route* route = fuzz::CheckRoute(Config(), View(header.method_string()),
                                        View(header.target()));
  const bool has_key = header.find("idempotency-key") != header.end();
  int keys = 0;
  for (const auto& field : header) {
    if (absl::EqualsIgnoreCase(View(field.name_string()), "idempotency-key")) {
      ++keys;
    }
  }
  IDEM_FUZZ_CHECK(has_key == (keys > 0),
                  "find() and the case-insensitive walk disagree");
  const bool recorded =
      route != nullptr && (route->key == KeyRule::kRequired ||
                           (route->key == KeyRule::kOptional && has_key));
  const size_t limit = recorded ? route->max_body.value_or(kMaxBody) : kMaxBody;
  parser.body_limit(limit);
  if (parser.content_length() && *parser.content_length() > limit) {
    return false;  // 413
  }
  parser.eager(true);
  while (!parser.is_done()) {
    if (rest->empty()) return false;
    used = parser.put(boost::asio::buffer(rest->data(), rest->size()), ec);
    if (ec || used == 0) return false;
    rest->remove_prefix(used);
  }
  // Beast adds a chunked body's trailer fields to the header's; the gateway
  // drops them (gateway.cc, DropTrailer), so that the key, scope and
  // fingerprint come from the header its route was chosen on.
  http::request<http::string_body> request = parser.release();
  for (auto it = request.begin(); it != request.end();) {
    const bool from_header =
        std::find(header_fields.begin(), header_fields.end(), &*it) !=
        header_fields.end();
    it = from_header ? std::next(it) : request.erase(it);
  }
  IDEM_FUZZ_CHECK((request.find("idempotency-key") != request.end()) == has_key,
                  "the key's presence changed after the header");
  IDEM_FUZZ_CHECK(request.body().size() <= limit, "a body past the limit");
  if (recorded) Admit(request, *route);
  return request.keep_alive();
}

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  idem::fuzz::CheckKey(input);
  for (int i = 0; i < idem::kMaxRequests && !input.empty(); ++i) {
    if (!idem::OneRequest(&input)) break;
  }
  return 0;
}
