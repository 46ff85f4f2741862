// The rules on the files the flags name (secrets, certificates, the tokens
// file, --config), on temporary files; no process starts.
#include "server/main/sidecar_resources.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "server/main/config_validation.h"

namespace idem {
namespace {

// A file in the temporary directory holding `text`.
std::string WriteFile(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") +
                     "/sidecar_resources_test." + std::to_string(getpid()) +
                     "." + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Valid, with --redis and its MAC key from the environment.
SidecarConfig WithRedis() {
  SidecarConfig c;
  c.store = "memory";
  c.redis = "127.0.0.1:6379";
  c.redis_mac_key_env = std::string(32, 'k');
  return c;
}

TEST(ReadSecretTest, FromTheFileOrTheEnvironment) {
  EXPECT_EQ(*ReadSecret("redis-password-file", "", "from-env"), "from-env");
  const std::string file = WriteFile("password", "from-file\r\n\n");
  EXPECT_EQ(*ReadSecret("redis-password-file", file, ""), "from-file");
  EXPECT_EQ(ReadSecret("redis-password-file", "/nonexistent/p", "")
                .status()
                .message(),
            "--redis-password-file=/nonexistent/p: cannot read");
  const std::string empty = WriteFile("empty", "\n");
  EXPECT_EQ(ReadSecret("redis-mac-key-file", empty, "").status().message(),
            "--redis-mac-key-file=" + empty + ": empty");
}

TEST(LoadResourcesTest, EachFileRuleRefusesWithTheFlagNamed) {
  const std::string good = WriteFile("good", std::string(32, 'g'));
  const std::string short_key = WriteFile("short", std::string(31, 's'));
  const std::string bad_yaml = WriteFile("bad.yaml", "defaults: [");
  struct Rule {
    std::string name;
    std::function<void(SidecarConfig&)> set;
    std::string message;  // the start of it
  };
  const std::vector<Rule> rules = {
      {"short MAC key", [](auto& c) { c.redis_mac_key_env = "short"; },
       "--redis-mac-key-file: the key has 5 bytes; at least 32 are needed"},
      {"short previous key",
       [&](auto& c) { c.redis_mac_previous_key_file = short_key; },
       "--redis-mac-previous-key-file: the key has 31 bytes"},
      {"the same key twice",
       [&](auto& c) {
         c.redis_mac_key_env.clear();
         c.redis_mac_key_file = good;
         c.redis_mac_previous_key_env = std::string(32, 'g');
       },
       "--redis-mac-previous-key-file: "},
      {"unreadable MAC key",
       [](auto& c) {
         c.redis_mac_key_env.clear();
         c.redis_mac_key_file = "/nonexistent/k";
       },
       "--redis-mac-key-file=/nonexistent/k: cannot read"},
      {"unreadable password",
       [](auto& c) { c.redis_password_file = "/nonexistent/p"; },
       "--redis-password-file=/nonexistent/p: cannot read"},
      {"unreadable certificate",
       [](auto& c) {
         c.tls = {"/nonexistent/c.pem", "/nonexistent/k.pem"};
       },
       "--tls-cert"},
      {"unreadable tokens",
       [](auto& c) { c.auth_tokens = "/nonexistent/t.json"; }, "auth tokens"},
      {"bad config file", [&](auto& c) { c.config = bad_yaml; },
       "config: not valid YAML"},
  };
  for (const Rule& rule : rules) {
    SidecarConfig c = WithRedis();
    rule.set(c);
    absl::StatusOr<SidecarOptions> options = Validate(c);
    ASSERT_TRUE(options.ok()) << rule.name << ": " << options.status();
    absl::StatusOr<SidecarResources> resources = LoadResources(&*options);
    ASSERT_FALSE(resources.ok()) << rule.name;
    EXPECT_EQ(resources.status().code(), absl::StatusCode::kInvalidArgument)
        << rule.name;
    EXPECT_TRUE(absl::StartsWith(resources.status().message(), rule.message))
        << rule.name << ": " << resources.status();
  }
}

TEST(LoadResourcesTest, RedisGetsItsPasswordAndKeys) {
  SidecarConfig c = WithRedis();
  c.redis_user = "idem";
  c.redis_password_file = WriteFile("redis-password", "secret\n");
  absl::StatusOr<SidecarOptions> options = Validate(c);
  ASSERT_TRUE(options.ok()) << options.status();
  absl::StatusOr<SidecarResources> resources = LoadResources(&*options);
  ASSERT_TRUE(resources.ok()) << resources.status();
  EXPECT_EQ(options->redis->password, "secret");
  EXPECT_NE(resources->cache_mac, nullptr);
  EXPECT_EQ(resources->auth, nullptr);
  EXPECT_NE(resources->credentials, nullptr);
}

TEST(LoadResourcesTest, TheGatewaysRoutesAddTheirPolicies) {
  SidecarConfig c;
  c.store = "memory";
  c.http_listen = "127.0.0.1:0";
  c.http_upstream = "http://127.0.0.1:1";
  c.config = WriteFile("routes.yaml",
                       "operations:\n  refund: {lease: 30s}\n"
                       "gateway:\n  routes:\n"
                       "    - {name: pay, methods: [POST], path: /pay}\n");
  absl::StatusOr<SidecarOptions> options = Validate(c);
  ASSERT_TRUE(options.ok()) << options.status();
  absl::StatusOr<SidecarResources> resources = LoadResources(&*options);
  ASSERT_TRUE(resources.ok()) << resources.status();
  EXPECT_EQ(resources->routes.routes.size(), 1u);
  EXPECT_EQ(resources->policies.For("refund").lease, absl::Seconds(30));
}

}  // namespace
}  // namespace idem
