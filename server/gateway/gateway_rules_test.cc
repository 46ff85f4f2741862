#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "server/gateway/gateway_config.h"
#include "server/gateway/problem.h"
#include "server/gateway/request_identity.h"

namespace idem::gateway {
namespace {

TEST(IdempotencyKeyTest, AcceptsStringsAndBareTokens) {
  EXPECT_EQ(*ParseIdempotencyKey("\"8e03978e-40d5\""), "8e03978e-40d5");
  EXPECT_EQ(*ParseIdempotencyKey("8e03978e-40d5"), "8e03978e-40d5");
  EXPECT_EQ(*ParseIdempotencyKey("  \"a\\\"b\\\\c\"\t"), "a\"b\\c");
  EXPECT_EQ(*ParseIdempotencyKey(std::string(200, 'k')), std::string(200, 'k'));
}

TEST(IdempotencyKeyTest, RefusesWhatIsNotOneVisibleKey) {
  for (const char* bad : {"", "  ", "\"\"", "\"abc", "\"a\\nb\"", "\"a\";p=1",
                          "\"a b\"", "a b", "\"\x01\"", "caf\xc3\xa9"}) {
    absl::StatusOr<std::string> key = ParseIdempotencyKey(bad);
    ASSERT_FALSE(key.ok()) << bad;
    EXPECT_TRUE(absl::StartsWith(key.status().message(), "Idempotency-Key: "))
        << key.status();
  }
  EXPECT_FALSE(ParseIdempotencyKey(std::string(201, 'k')).ok());
}

TEST(RequestIdentityTest, ScopeSeparatesCallersAndStaysVisible) {
  EXPECT_EQ(ScopedKey({}, "k1"), "k1");
  const std::string alice = ScopedKey({"Bearer alice"}, "k1");
  const std::string bob = ScopedKey({"Bearer bob"}, "k1");
  EXPECT_NE(alice, bob);
  EXPECT_EQ(alice, ScopedKey({"Bearer alice"}, "k1"));
  EXPECT_EQ(alice.size(), 22 + 1 + 2);
  EXPECT_TRUE(absl::EndsWith(alice, ":k1"));
  // The parts are length-prefixed: moving a byte between them changes it.
  EXPECT_NE(ScopedKey({"ab", "c"}, "k"), ScopedKey({"a", "bc"}, "k"));
}

TEST(RequestIdentityTest, FingerprintCoversEveryPart) {
  const std::string base = Fingerprint("POST", "/p?x=1", "{}", {});
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, Fingerprint("POST", "/p?x=1", "{}", {}));
  EXPECT_NE(base, Fingerprint("PATCH", "/p?x=1", "{}", {}));
  EXPECT_NE(base, Fingerprint("POST", "/p?x=2", "{}", {}));
  EXPECT_NE(base, Fingerprint("POST", "/p?x=1", "{ }", {}));
  EXPECT_NE(base, Fingerprint("POST", "/p?x=1", "{}", {{"a", "b"}}));
  EXPECT_NE(Fingerprint("POST", "/p", "", {{"a", "bc"}}),
            Fingerprint("POST", "/p", "", {{"ab", "c"}}));
}

TEST(GatewayConfigTest, NoSectionGivesTheDefaultRoute) {
  absl::StatusOr<GatewayConfig> config =
      ParseGatewayConfig("defaults: {lease: 10s}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->routes.size(), 1u);
  const Route* route = MatchRoute(*config, "POST", "/a/b?c=d");
  ASSERT_NE(route, nullptr);
  EXPECT_EQ(route->name, "http");
  EXPECT_EQ(route->key, KeyRule::kOptional);
  EXPECT_NE(MatchRoute(*config, "PATCH", "/"), nullptr);
  EXPECT_EQ(MatchRoute(*config, "GET", "/a"), nullptr);
  EXPECT_EQ(MatchRoute(*config, "PUT", "/a"), nullptr);
}

TEST(GatewayConfigTest, RoutesMatchInOrderBySegments) {
  absl::StatusOr<GatewayConfig> config = ParseGatewayConfig(R"(
gateway:
  scope_headers: [Authorization]
  routes:
    - name: create-payment
      methods: [post]
      path: /payments
      key: required
      wait: 2s
      lease: 40s
      timeout: 20s
      retry_statuses: [500-599, 409]
      fingerprint_headers: [Content-Type]
      snapshot_headers: {allow: [location, x-id], deny: []}
      max_body: 65536
    - name: orders
      methods: [PATCH, PUT]
      path: /orders/*/items/**
    - name: skip
      methods: [POST]
      path: /payments/*
      key: off
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->scope_headers, std::vector<std::string>{"authorization"});
  const Route* pay = MatchRoute(*config, "POST", "/payments?x");
  ASSERT_NE(pay, nullptr);
  EXPECT_EQ(pay->name, "create-payment");
  EXPECT_EQ(pay->key, KeyRule::kRequired);
  EXPECT_EQ(pay->wait, absl::Seconds(2));
  EXPECT_EQ(LeaseOf(*pay, absl::Seconds(30)), absl::Seconds(40));
  EXPECT_TRUE(pay->Retries(503));
  EXPECT_TRUE(pay->Retries(409));
  EXPECT_FALSE(pay->Retries(429));
  EXPECT_TRUE(pay->Records("location"));
  EXPECT_FALSE(pay->Records("x-other"));
  EXPECT_FALSE(pay->Records("connection"));
  EXPECT_EQ(*pay->max_body, 65536u);
  EXPECT_EQ(MatchRoute(*config, "POST", "/payments/p1")->name, "skip");
  EXPECT_EQ(MatchRoute(*config, "POST", "/payments/p1/x"), nullptr);
  EXPECT_EQ(MatchRoute(*config, "PUT", "/orders/7/items")->name, "orders");
  EXPECT_EQ(MatchRoute(*config, "PUT", "/orders/7/items/1/2")->name, "orders");
  EXPECT_EQ(MatchRoute(*config, "PUT", "/orders/7"), nullptr);
  EXPECT_EQ(MatchRoute(*config, "POST", "payments"), nullptr);
}

TEST(GatewayConfigTest, PathsAreMatchedNormalised) {
  absl::StatusOr<GatewayConfig> config = ParseGatewayConfig(
      "gateway: {routes: [{name: pay, methods: [POST], path: /payments/, "
      "key: required}, {name: root, methods: [POST], path: /}]}");
  ASSERT_TRUE(config.ok()) << config.status();
  for (const char* target :
       {"/payments", "/payments/", "//payments", "/%70ayments", "/%70%61yments",
        "/./payments/.", "/x/../payments?q=1", "http://h/payments",
        "HTTPS://h:8/payments?x"}) {
    const Route* route = MatchRoute(*config, "POST", target);
    ASSERT_NE(route, nullptr) << target;
    EXPECT_EQ(route->name, "pay") << target;
  }
  // Decoding does not fold case.
  EXPECT_EQ(MatchRoute(*config, "POST", "/%70AYMENTS"), nullptr);
  // Reserved characters stay encoded: %2F is not a separator.
  EXPECT_EQ(MatchRoute(*config, "POST", "/pay%2Fments"), nullptr);
  EXPECT_EQ(MatchRoute(*config, "POST", "/")->name, "root");
  EXPECT_EQ(MatchRoute(*config, "POST", "http://h")->name, "root");
  EXPECT_EQ(MatchRoute(*config, "POST", "*"), nullptr);
  EXPECT_EQ(MatchRoute(*config, "POST", "ftp://h/payments"), nullptr);
}

TEST(GatewayConfigTest, OriginFormOfTargets) {
  EXPECT_EQ(*OriginForm("/a?b"), "/a?b");
  EXPECT_EQ(*OriginForm("*"), "*");
  EXPECT_EQ(*OriginForm("http://h:80/a/b?c"), "/a/b?c");
  EXPECT_EQ(*OriginForm("Http://h"), "/");
  EXPECT_EQ(*OriginForm("http://h?x=1"), "/?x=1");
  EXPECT_FALSE(OriginForm("a/b").ok());
  EXPECT_FALSE(OriginForm("ftp://h/a").ok());
}

TEST(GatewayConfigTest, DefaultsOfARoute) {
  Route route;
  EXPECT_EQ(LeaseOf(route, absl::Seconds(30)), absl::Seconds(35));
  EXPECT_TRUE(route.Retries(408));
  EXPECT_TRUE(route.Retries(429));
  EXPECT_TRUE(route.Retries(500));
  EXPECT_FALSE(route.Retries(404));
  EXPECT_FALSE(route.Retries(201));
  EXPECT_TRUE(route.Records("location"));
  EXPECT_FALSE(route.Records("set-cookie"));
  EXPECT_FALSE(route.Records("transfer-encoding"));
  EXPECT_FALSE(route.Records("content-length"));
}

TEST(GatewayConfigTest, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"gateway: [1]", "config gateway:"},
      {"gateway: {routes: []}", "config gateway.routes:"},
      {"gateway: {routes: [{path: /a}]}", "config gateway.routes[0].name:"},
      {"gateway: {routes: [{name: a, path: a}]}",
       "config gateway.routes[0].path:"},
      {"gateway: {routes: [{name: a, path: /**/x}]}",
       "config gateway.routes[0].path:"},
      {"gateway: {routes: [{name: 'a b'}]}", "config gateway.routes[0].name:"},
      {"gateway: {routes: [{name: a, key: maybe}]}",
       "config gateway.routes[0].key:"},
      {"gateway: {routes: [{name: a, methods: ['GE T']}]}",
       "config gateway.routes[0].methods[0]:"},
      {"gateway: {routes: [{name: a, retry_statuses: [600]}]}",
       "config gateway.routes[0].retry_statuses[0]:"},
      {"gateway: {routes: [{name: a, retry_statuses: [599-500]}]}",
       "config gateway.routes[0].retry_statuses[0]:"},
      {"gateway: {routes: [{name: a, wait: 2h}]}",
       "config gateway.routes[0].wait:"},
      {"gateway: {routes: [{name: a, max_body: -1}]}",
       "config gateway.routes[0].max_body:"},
      {"gateway: {routes: [{name: a, snapshot_headers: {keep: []}}]}",
       "config gateway.routes[0].snapshot_headers.keep:"},
      {"gateway: {routes: [{name: a, colour: red}]}",
       "config gateway.routes[0].colour:"},
      {"gateway: {scope: []}", "config gateway.scope:"},
      {"gateway: {routes: [{name: a}]", "config gateway: not valid YAML"},
  };
  for (const auto& [yaml, prefix] : cases) {
    absl::StatusOr<GatewayConfig> config = ParseGatewayConfig(yaml);
    ASSERT_FALSE(config.ok()) << yaml;
    EXPECT_TRUE(absl::StartsWith(config.status().message(), prefix))
        << yaml << " -> " << config.status();
  }
}

TEST(GatewayConfigTest, RouteRetentionBecomesThePolicy) {
  absl::StatusOr<GatewayConfig> config = ParseGatewayConfig(
      "gateway: {routes: [{name: pay, retention: 2h}, {name: other}]}");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<PolicySet> merged =
      WithRoutePolicies(PolicySet(), *config, absl::Seconds(30));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->For("pay").retention, absl::Hours(2));
  EXPECT_EQ(merged->For("other").retention, Policy().retention);

  PolicySet own(Policy{}, {{"pay", Policy{}}});
  absl::StatusOr<PolicySet> clash =
      WithRoutePolicies(own, *config, absl::Seconds(30));
  ASSERT_FALSE(clash.ok());
  EXPECT_TRUE(absl::StrContains(clash.status().message(),
                                "gateway.routes[0].retention"));

  Policy short_leases;
  short_leases.max_lease = absl::Seconds(10);
  short_leases.lease = absl::Seconds(5);
  absl::StatusOr<PolicySet> too_long = WithRoutePolicies(
      PolicySet(short_leases, {}), *config, absl::Seconds(30));
  ASSERT_FALSE(too_long.ok());
  EXPECT_TRUE(absl::StrContains(too_long.status().message(), ".lease"));
}

TEST(ProblemTest, StableTypesAndJson) {
  EXPECT_EQ(ProblemType(ProblemKind::kKeyReused),
            "tag:idempotency-sidecar,2026:key-reused");
  EXPECT_EQ(ProblemBody(ProblemKind::kInProgress, 409, "wait \"a\"", "k"),
            "{\"type\":\"tag:idempotency-sidecar,2026:request-in-progress\","
            "\"title\":\"A request with this Idempotency-Key is in progress\","
            "\"status\":409,\"detail\":\"wait \\\"a\\\"\","
            "\"idempotency_key\":\"k\"}");
  EXPECT_FALSE(absl::StrContains(
      ProblemBody(ProblemKind::kKeyMissing, 400, "d"), "idempotency_key"));
}

}  // namespace
}  // namespace idem::gateway
