// The command line: flags and their IDEM_* environment twins into a
// SidecarConfig, and which conninfo the migrate subcommand takes.
#include "server/main/sidecar_flags.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "server/main/flag_groups.h"

namespace idem {
namespace {

// Parses `args` after the program's name; the test fails on a parse error.
CommandLine Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "idempotency-sidecar");
  std::vector<char*> pointers;
  pointers.reserve(args.size());
  for (std::string& arg : args) pointers.push_back(arg.data());
  CommandLine command_line;
  EXPECT_EQ(ParseCommandLine(static_cast<int>(pointers.size()), pointers.data(),
                             &command_line),
            std::nullopt)
      << absl::StrJoin(args, " ");
  return command_line;
}

TEST(EnvNameTest, IsTheFlagInCapitals) {
  EXPECT_EQ(EnvName("pg-pool-size"), "IDEM_PG_POOL_SIZE");
  EXPECT_EQ(EnvName("postgres"), "IDEM_POSTGRES");
}

// Each flag may come from its twin; a flag given wins over it. The secrets'
// variables are read too, though they have no flag.
TEST(ParseCommandLineTest, TheEnvironmentTwins) {
  const std::vector<std::pair<const char*, const char*>> env = {
      {"IDEM_POSTGRES", "dbname=env"}, {"IDEM_PG_POOL_SIZE", "7"},
      {"IDEM_INSECURE", "1"},          {"IDEM_TLS_CERT", "c.pem"},
      {"IDEM_HTTP_MAX_BODY", "1000"},  {"IDEM_REDIS_MAC_KEY", "mac"},
      {"IDEM_LISTEN", "127.0.0.1:1"}};
  for (const auto& [name, value] : env) setenv(name, value, 1);
  const SidecarConfig c = Parse({"--listen=127.0.0.1:2"}).config;
  for (const auto& [name, value] : env) unsetenv(name);
  EXPECT_EQ(c.postgres.conninfo, "dbname=env");
  EXPECT_EQ(c.pg_pool_size, 7);
  EXPECT_TRUE(c.insecure);
  EXPECT_EQ(c.tls.cert, "c.pem");
  EXPECT_EQ(c.http_max_body, 1000u);
  EXPECT_EQ(c.redis_mac_key_env, "mac");
  EXPECT_EQ(c.listen, "127.0.0.1:2");
}

TEST(ParseCommandLineTest, TheDefaults) {
  const CommandLine command_line = Parse({});
  EXPECT_FALSE(command_line.migrate_only);
  EXPECT_EQ(command_line.config.listen, "127.0.0.1:50051");
  EXPECT_EQ(command_line.config.store, "postgres");
  EXPECT_EQ(command_line.config.pg_pool_size, 16);
}

TEST(ParseCommandLineTest, ABadFlagEndsTheProgram) {
  std::vector<std::string> args = {"idempotency-sidecar", "--pg-pool-size=x"};
  std::vector<char*> pointers;
  pointers.reserve(args.size());
  for (std::string& arg : args) pointers.push_back(arg.data());
  CommandLine command_line;
  std::optional<int> exit_code =
      ParseCommandLine(2, pointers.data(), &command_line);
  ASSERT_TRUE(exit_code.has_value());
  EXPECT_NE(*exit_code, 0);
}

// The migrate subcommand's conninfo: its --postgres-direct, else the
// sidecar's, else its --postgres, else the sidecar's.
TEST(ParseCommandLineTest, MigrateTakesTheMostDirectConninfo) {
  for (const auto& [args, want] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--postgres=a", "migrate"}, "a"},
           {{"--postgres=a", "migrate", "--postgres=b"}, "b"},
           {{"--postgres-direct=c", "migrate", "--postgres=b"}, "c"},
           {{"--postgres-direct=c", "migrate", "--postgres-direct=d"}, "d"},
       }) {
    const CommandLine command_line = Parse(args);
    EXPECT_TRUE(command_line.migrate_only);
    EXPECT_EQ(command_line.migrate_conninfo, want) << absl::StrJoin(args, " ");
  }
}

}  // namespace
}  // namespace idem
