#include "server/base/config.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace idem {
namespace {

// ParsePolicies(yaml) is INVALID_ARGUMENT and its message contains each of
// `parts`.
void ExpectRefused(const std::string& yaml,
                   std::initializer_list<std::string> parts) {
  absl::StatusOr<PolicySet> p = ParsePolicies(yaml);
  ASSERT_FALSE(p.ok()) << yaml;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
  for (const std::string& part : parts) {
    EXPECT_NE(p.status().message().find(part), std::string::npos)
        << yaml << ": " << p.status() << " should contain " << part;
  }
}

TEST(ConfigTest, ParsesTheDesignExample) {
  absl::StatusOr<PolicySet> p = ParsePolicies(R"(
defaults:   {lease: 30s, min_lease: 1s, max_lease: 1h, retention: 24h, on_lease_expiry: unknown}
operations:
  create-payment: {retention: 72h, on_lease_expiry: unknown}
  send-email:     {lease: 5m, on_lease_expiry: release}
  refund:         {probe: "refunds.internal:9090", reconcile_attempts: 5, tombstone_retention: 720h}
)");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->defaults().lease, absl::Seconds(30));
  EXPECT_EQ(p->For("create-payment").retention, absl::Hours(72));
  EXPECT_EQ(p->For("send-email").lease, absl::Minutes(5));
  EXPECT_EQ(p->For("send-email").on_lease_expiry, ExpiryPolicy::kRelease);
  EXPECT_EQ(p->For("refund").tombstone_retention, absl::Hours(720));
  EXPECT_EQ(p->For("refund").reconcile_attempts, 5);
  EXPECT_EQ(p->For("other").lease, absl::Seconds(30));
  EXPECT_TRUE(ParsePolicies("").ok());
}

// yaml-cpp throws on as<std::string>() of such keys; they are refused
// naming where they are (fuzz/corpus/regressions/config_fuzzer).
TEST(ConfigTest, KeysThatAreNotStringsNameWhereTheyAre) {
  ExpectRefused("? :\n", {"config (top level): a key must be a string"});
  ExpectRefused("[a]: 1\n", {"(top level)", "not a sequence"});
  ExpectRefused("{a: 1}: 1\n", {"(top level)", "not a map"});
  ExpectRefused("defaults:\n  [lease]: 30s\n",
                {"config defaults: a key must be a string, not a sequence"});
  ExpectRefused("defaults: {~: 30s}\n", {"config defaults:", "null"});
  ExpectRefused("operations:\n  [a, b]: {lease: 5s}\n",
                {"config operations: a key must be a string"});
  ExpectRefused("operations: {{a: b}: {}}\n", {"config operations:", "map"});
  ExpectRefused("operations: {null: {}}\n", {"config operations:", "null"});
  ExpectRefused("operations:\n  refund:\n    ? [x]\n    : 1\n",
                {"config operations.refund: a key must be a string"});
  // Quoted, such names are strings.
  absl::StatusOr<PolicySet> p =
      ParsePolicies("operations: {\"null\": {lease: 5s}}\n");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->For("null").lease, absl::Seconds(5));
}

TEST(ConfigTest, DurationsAreFiniteAndAtMostAHundredYears) {
  const std::pair<std::string, std::string> refused[] = {
      {"defaults: {retention: inf}", "config defaults.retention:"},
      {"defaults: {retention: -inf}", "config defaults.retention:"},
      {"defaults: {max_lease: inf, lease: inf}", "config defaults.max_lease:"},
      {"operations:\n  refund: {max_lease: 3000000h, lease: 2999999h}",
       "config operations.refund.max_lease:"},
      {"defaults: {retention: 876001h}", "config defaults.retention:"},
      {"defaults: {tombstone_retention: 1000000h}",
       "config defaults.tombstone_retention:"},
      {"defaults: {lease: -5s}", "config defaults.lease:"},
      {"defaults: {retention: 0s}", "config defaults.retention:"},
      {"defaults: {tombstone_retention: -1s}",
       "config defaults.tombstone_retention:"},
      {"defaults: {retention: 30d}", "config defaults.retention:"},
      {"defaults: {retention: [1h]}", "config defaults.retention:"},
  };
  for (const auto& [yaml, field] : refused) ExpectRefused(yaml, {field});
  ExpectRefused("defaults: {retention: inf}", {"longer than the maximum"});
  ExpectRefused("defaults: {lease: -5s}", {"must be positive"});

  absl::StatusOr<PolicySet> p = ParsePolicies(
      "defaults: {retention: 876000h, tombstone_retention: 0s, "
      "max_lease: 876000h}");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->defaults().retention, kMaxPolicyDuration);
  EXPECT_EQ(p->defaults().max_lease, kMaxPolicyDuration);
  EXPECT_EQ(p->defaults().tombstone_retention, absl::ZeroDuration());
  EXPECT_EQ(kMaxPolicyDuration, absl::Hours(876000));
}

TEST(ConfigTest, OtherErrorsNameTheField) {
  ExpectRefused("operations:\n  refund: {leese: 5s}\n",
                {"config operations.refund.leese: unknown field"});
  ExpectRefused("defaultz: {}\n", {"config defaultz: unknown field"});
  ExpectRefused("- a\n- b\n", {"config (top level): must be a map"});
  ExpectRefused("operations: [a]\n", {"config operations: must be a map"});
  ExpectRefused("defaults: {lease: 2h}\n", {"config defaults.lease:"});
  ExpectRefused("defaults: {min_lease: 2h, lease: 3h, max_lease: 1h}\n",
                {"config defaults:", "min_lease"});
  ExpectRefused("operations: {refund: {probe: nohost}}\n",
                {"config operations.refund.probe:"});
  ExpectRefused("operations: {refund: {reconcile_attempts: 0}}\n",
                {"config operations.refund.reconcile_attempts:"});
  ExpectRefused("operations: {refund: {on_lease_expiry: never}}\n",
                {"config operations.refund.on_lease_expiry:"});
  ExpectRefused("defaults: {lease: 30s\n", {"config: not valid YAML"});
  // yaml-cpp refuses deep nesting instead of recursing without bound.
  ExpectRefused(std::string(5000, '['), {"config: not valid YAML"});
}

TEST(ConfigTest, ProbeTlsIsAMapOrABooleanAndOperationsReplaceIt) {
  absl::StatusOr<PolicySet> p = ParsePolicies(R"(
defaults: {probe_tls: {ca: /ca.pem, server_name: payments.internal}}
operations:
  create-payment: {probe: "payments:9090"}
  refund: {probe: "refunds:9090", probe_tls: {cert: /c.pem, key: /k.pem}}
  plain: {probe: "plain:9090", probe_tls: false}
  roots: {probe: "roots:9090", probe_tls: {}}
)");
  ASSERT_TRUE(p.ok()) << p.status();
  const ProbeTls& inherited = p->For("create-payment").probe_tls;
  EXPECT_TRUE(inherited.enabled);
  EXPECT_EQ(inherited.ca, "/ca.pem");
  EXPECT_EQ(inherited.server_name, "payments.internal");
  const ProbeTls& refund = p->For("refund").probe_tls;
  EXPECT_TRUE(refund.enabled);
  EXPECT_EQ(refund.ca, "");
  EXPECT_EQ(refund.cert, "/c.pem");
  EXPECT_EQ(refund.key, "/k.pem");
  EXPECT_FALSE(p->For("plain").probe_tls.enabled);
  EXPECT_TRUE(p->For("roots").probe_tls.enabled);
  EXPECT_EQ(p->For("roots").probe_tls.ca, "");

  ExpectRefused("operations: {refund: {probe_tls: {cert: /c.pem}}}\n",
                {"config operations.refund.probe_tls:", "cert and key"});
  ExpectRefused("operations: {refund: {probe_tls: {crt: /c.pem}}}\n",
                {"config operations.refund.probe_tls.crt: unknown field"});
  ExpectRefused("defaults: {probe_tls: {ca: [a]}}\n",
                {"config defaults.probe_tls.ca: must be a non-empty string"});
  ExpectRefused("defaults: {probe_tls: yes-please}\n",
                {"config defaults.probe_tls: must be a map"});
}

TEST(ConfigTest, LoadChecksTheProbeTlsFiles) {
  const std::string path = ::testing::TempDir() + "/idem-config-tls.yaml";
  const std::string missing = ::testing::TempDir() + "/idem-no-such-ca.pem";
  std::remove(missing.c_str());  // left by an earlier run
  std::ofstream(path) << "operations: {refund: {probe: \"r:1\", probe_tls: "
                         "{ca: "
                      << missing << "}}}\n";
  absl::StatusOr<PolicySet> p = LoadPolicies(path);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(
      p.status().message().find(
          "config operations.refund.probe_tls.ca: cannot read " + missing),
      std::string::npos)
      << p.status();
  std::ofstream(missing) << "not checked here\n";
  EXPECT_TRUE(LoadPolicies(path).ok());
}

TEST(ConfigTest, LoadNamesTheFile) {
  const std::string path = ::testing::TempDir() + "/idem-config-test.yaml";
  std::ofstream(path) << "defaults: {retention: inf}\n";
  absl::StatusOr<PolicySet> p = LoadPolicies(path);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("config defaults.retention:"),
            std::string::npos)
      << p.status();
  EXPECT_NE(p.status().message().find(path), std::string::npos) << p.status();
  EXPECT_FALSE(LoadPolicies(path + ".missing").ok());
}

}  // namespace
}  // namespace idem
