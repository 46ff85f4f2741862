// Every rule a sidecar's configuration must meet, one row each: the flags
// as given on the command line and the start of the message, which names
// the flag. Validate is pure: no process starts and no file is read.
#include "server/main/config_validation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/main/sidecar_flags.h"

namespace idem {
namespace {

const std::vector<std::string> kRedis = {"--redis=127.0.0.1:6379",
                                         "--redis-mac-key-file=mac.key"};
const std::vector<std::string> kGateway = {
    "--http-listen=127.0.0.1:8080", "--http-upstream=http://127.0.0.1:9090"};

// `base`, then `more`.
std::vector<std::string> With(std::vector<std::string> base,
                              const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// The config of a command line: --postgres=dbname=idem (unless `args`
// name --store), then `args`. An argument IDEM_REDIS_...=value sets that
// secret's environment variable instead.
SidecarConfig Parse(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"idempotency-sidecar"};
  if (std::none_of(args.begin(), args.end(), [](const std::string& arg) {
        return absl::StartsWith(arg, "--store=");
      })) {
    argv.emplace_back("--postgres=dbname=idem");
  }
  SidecarConfig env;
  for (const std::string& arg : args) {
    const std::string value = arg.substr(arg.find('=') + 1);
    if (absl::StartsWith(arg, "IDEM_REDIS_PASSWORD=")) {
      env.redis_password_env = value;
    } else if (absl::StartsWith(arg, "IDEM_REDIS_MAC_KEY=")) {
      env.redis_mac_key_env = value;
    } else if (absl::StartsWith(arg, "IDEM_REDIS_MAC_PREVIOUS_KEY=")) {
      env.redis_mac_previous_key_env = value;
    } else {
      argv.push_back(arg);
    }
  }
  std::vector<char*> pointers;
  pointers.reserve(argv.size());
  for (std::string& arg : argv) pointers.push_back(arg.data());
  CommandLine command_line;
  EXPECT_EQ(ParseCommandLine(static_cast<int>(pointers.size()), pointers.data(),
                             &command_line),
            std::nullopt);
  SidecarConfig c = command_line.config;
  c.redis_password_env = env.redis_password_env;
  c.redis_mac_key_env = env.redis_mac_key_env;
  c.redis_mac_previous_key_env = env.redis_mac_previous_key_env;
  return c;
}

struct Rule {
  std::vector<std::string> args;
  std::string message;  // the start of it
};

std::vector<Rule> Rules() {
  std::vector<Rule> rules = {
      {{"--log-level=loud"}, "--log-level: must be debug, info, warn or error"},
      {{"--pg-prepared=yes"}, "--pg-prepared: must be on or off"},
      {{"--pg-lone-lane=1"}, "--pg-lone-lane: must be on or off"},
      {{"--maintenance-batch=0"}, "--maintenance-batch: must be 1-100000"},
      {{"--maintenance-batch=100001"}, "--maintenance-batch: must be 1-100000"},
      {{"--pg-pool-size=0"}, "--pg-pool-size: must be 1-1000"},
      {{"--pg-pool-size=1001"}, "--pg-pool-size: must be 1-1000"},
      {{"--local-cache-mib=-1"}, "--local-cache-mib: must be 0-65536"},
      {{"--local-cache-mib=65537"}, "--local-cache-mib: must be 0-65536"},
      {{"--pg-max-batch=0"}, "--pg-max-batch: must be 1-1000"},
      {{"--pg-max-batch=1001"}, "--pg-max-batch: must be 1-1000"},
      {{"--pg-batch-inflight=0"},
       "--pg-batch-inflight: must be 1 to --pg-pool-size"},
      {{"--pg-pool-size=4", "--pg-batch-inflight=5"},
       "--pg-batch-inflight: must be 1 to --pg-pool-size"},
      {{"--listen=0.0.0.0:50051"},
       "--listen=0.0.0.0:50051 is not a loopback address, and nothing "
       "identifies callers"},
      {{"--listen=10.0.0.1:1", "--tls-cert=c.pem", "--tls-key=k.pem"},
       "--listen=10.0.0.1:1 is not a loopback address"},
      {{"--tls-cert=c.pem"},
       "--tls-cert and --tls-key: both are required for TLS"},
      {{"--tls-key=k.pem"},
       "--tls-cert and --tls-key: both are required for TLS"},
      {{"--tls-client-ca=ca.pem", "--auth-tokens=t.json"},
       "--tls-cert and --tls-key: both are required for TLS"},
      {{"--tls-cert=c.pem", "--tls-key=k.pem", "--tls-client-ca=ca.pem"},
       "--tls-client-ca: needs --auth-tokens to map certificate SANs"},
      {{"--tenant-rate=-1"}, "--tenant-rate and --tenant-burst"},
      {{"--tenant-burst=-1"}, "--tenant-rate and --tenant-burst"},
      {{"--tenant-rate=10", "--tenant-burst=0.5"},
       "--tenant-rate and --tenant-burst: a rate needs a burst of at least 1"},
      {{"--max-processing-per-tenant=-1"},
       "--max-processing-per-tenant: must not be negative"},
      {{"--max-concurrent-streams=0"},
       "--max-concurrent-streams: must be positive"},
      {{"--rpc-threads=-1"},
       "--rpc-threads: must be 0 (one per two cores) to 256"},
      {{"--rpc-threads=257"},
       "--rpc-threads: must be 0 (one per two cores) to 256"},
      {{"--redis=nowhere", kRedis[1]},
       "--redis=nowhere: expected HOST:PORT or unix:/path/to.sock"},
      {With(kRedis, {"--redis-password-file=p", "IDEM_REDIS_PASSWORD=p"}),
       "--redis-password-file and IDEM_REDIS_PASSWORD are both set; use one"},
      {With(kRedis, {"IDEM_REDIS_MAC_KEY=k"}),
       "--redis-mac-key-file and IDEM_REDIS_MAC_KEY are both set; use one"},
      {With(kRedis, {"--redis-mac-previous-key-file=k",
                     "IDEM_REDIS_MAC_PREVIOUS_KEY=k"}),
       "--redis-mac-previous-key-file and IDEM_REDIS_MAC_PREVIOUS_KEY are "
       "both set; use one"},
      {With(kRedis, {"--redis-user=idem"}), "--redis-user: needs a password"},
      {With(kRedis, {"--redis-pool-size=0"}),
       "--redis-pool-size: must be 1-1000"},
      {With(kRedis, {"--redis-pool-size=1001"}),
       "--redis-pool-size: must be 1-1000"},
      {With(kRedis, {"--redis-backoff-min=2s", "--redis-backoff-max=1s"}),
       "--redis-backoff-max: must not be below --redis-backoff-min"},
      {{"--console-listen=0.0.0.0:8081"},
       "--console-listen=0.0.0.0:8081 is not a loopback address"},
      {{kGateway[0]}, "--http-upstream: required with --http-listen"},
      {With(kGateway, {"--http-threads=0"}), "--http-threads: must be 1-64"},
      {With(kGateway, {"--http-threads=65"}), "--http-threads: must be 1-64"},
      {With(kGateway, {"--http-upstream-keepalive=-1"}),
       "--http-upstream-keepalive: must be 0-4096"},
      {With(kGateway, {"--http-upstream-keepalive=4097"}),
       "--http-upstream-keepalive: must be 0-4096"},
      {With(kGateway, {"--http-max-connections=0"}),
       "--http-max-connections: must be 1-1000000"},
      {With(kGateway, {"--http-max-body=67108865"}),
       "--http-max-body: must be at most 67108864 (64 MiB)"},
      {With(kGateway, {"--http-tenant=a tenant"}),
       "--http-tenant: must be 1-128 bytes of [A-Za-z0-9._:-]"},
      {{"--store=disk"}, "--store: must be postgres or memory"},
      {{"--store=postgres"}, "--postgres: required (or IDEM_POSTGRES)"},
  };
  rules.push_back(
      {{kRedis[0]},
       "--redis needs --redis-mac-key-file (or IDEM_REDIS_MAC_KEY)"});
  rules.push_back({{kRedis[0], "--redis-mac-previous-key-file=k"},
                   "--redis needs --redis-mac-key-file"});
  for (const char* flag : {"max-waiters", "max-waiters-per-tenant",
                           "max-waiters-per-key", "max-calls-in-flight",
                           "max-admin-calls-in-flight", "max-health-watches"}) {
    for (const char* value : {"-1", "1000001"}) {
      rules.push_back({{absl::StrCat("--", flag, "=", value)},
                       absl::StrCat("--", flag, ": must be 0 to 1000000")});
    }
  }
  // Every duration flag refuses what does not parse, a negative or zero
  // duration (--drain-delay allows 0) and more than a day.
  for (const auto& [flag, base] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"pg-connect-timeout", {}},
           {"pg-statement-timeout", {}},
           {"grace-period", {}},
           {"drain-delay", {}},
           {"reaper-interval", {}},
           {"purge-interval", {}},
           {"reconcile-interval", {}},
           {"redis-timeout", kRedis},
           {"redis-backoff-min", kRedis},
           {"redis-backoff-max", kRedis},
           {"http-upstream-timeout", kGateway},
           {"http-idle-timeout", kGateway},
           {"http-upstream-keepalive-timeout", kGateway}}) {
    std::vector<std::string> bad = {"soon", "-1s", "25h", "inf"};
    if (flag != "drain-delay") bad.emplace_back("0s");
    for (const std::string& value : bad) {
      std::vector<std::string> args = base;
      args.push_back(absl::StrCat("--", flag, "=", value));
      rules.push_back(
          {args, absl::StrCat("--", flag, ": bad duration \"", value,
                              "\" (e.g. 500ms, 5s, 1m; "
                              "at most 24h)")});
    }
  }
  return rules;
}

TEST(ValidateTest, EachRuleRefusesWithTheFlagNamed) {
  for (const Rule& rule : Rules()) {
    const std::string name = absl::StrJoin(rule.args, " ");
    absl::StatusOr<SidecarOptions> options = Validate(Parse(rule.args));
    ASSERT_FALSE(options.ok()) << name;
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_TRUE(absl::StartsWith(options.status().message(), rule.message))
        << name << ": " << options.status();
  }
}

TEST(ValidateTest, TheDefaultsAndTheBoundsAreValid) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {},
           {"--store=memory"},
           {"--maintenance-batch=100000", "--pg-pool-size=1000",
            "--pg-batch-inflight=1000", "--pg-max-batch=1000",
            "--local-cache-mib=65536", "--rpc-threads=256",
            "--max-waiters=1000000", "--max-calls-in-flight=1000000",
            "--grace-period=24h"},
           {"--local-cache-mib=0", "--max-waiters=0", "--max-calls-in-flight=0",
            "--drain-delay=0s"},
           {"--tenant-rate=10", "--tenant-burst=1"},
           {"--listen=0.0.0.0:1", "--auth-tokens=t.json"},
           {"--listen=0.0.0.0:1", "--insecure"},
           {"--tls-cert=c.pem", "--tls-key=k.pem", "--tls-client-ca=ca.pem",
            "--auth-tokens=t.json"},
           kRedis,
           {kRedis[0], "IDEM_REDIS_MAC_KEY=k", "--redis-user=idem",
            "IDEM_REDIS_PASSWORD=p"},
           {kRedis[0], kRedis[1], "--redis-user=idem",
            "--redis-password-file=p"},
           kGateway,
           With(kGateway,
                {"--http-threads=64", "--http-max-connections=1000000",
                 "--http-max-body=67108864", "--http-upstream-keepalive=0"}),
       }) {
    absl::StatusOr<SidecarOptions> options = Validate(Parse(args));
    EXPECT_TRUE(options.ok())
        << absl::StrJoin(args, " ") << ": " << options.status();
  }
}

TEST(ValidateTest, TheOptionsSayWhatTheFlagsSay) {
  absl::StatusOr<SidecarOptions> o = Validate(Parse(With(
      With(kGateway, kRedis),
      {"--redis-pool-size=7", "--pg-prepared=off", "--pg-statement-timeout=3s",
       "--grace-period=4s", "--purge-interval=2m", "--pg-max-batch=8",
       "--pg-batch-inflight=2", "--pg-lone-lane=off", "--log-level=debug",
       "--http-upstream-timeout=9s", "--max-snapshot-bytes=1000",
       "--http-upstream-keepalive=5",
       "--http-upstream-keepalive-timeout=3s"})));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->log_level, LogLevel::kDebug);
  EXPECT_EQ(o->pg.conninfo, "dbname=idem");
  EXPECT_FALSE(o->pg.prepared);
  EXPECT_EQ(o->pg.statement_timeout, absl::Seconds(3));
  // A pooled connection is waited for as long as a statement may run.
  EXPECT_EQ(o->pg.acquire_timeout, absl::Seconds(3));
  EXPECT_EQ(o->batch.max_batch, 8);
  EXPECT_EQ(o->batch.inflight, 2);
  EXPECT_FALSE(o->batch.lone_lane);
  EXPECT_EQ(o->grace_period, absl::Seconds(4));
  EXPECT_EQ(o->drain_delay, absl::ZeroDuration());
  EXPECT_EQ(o->maintenance.purge_interval, absl::Minutes(2));
  EXPECT_EQ(o->reconcile.max_snapshot_bytes, 1000u);
  ASSERT_TRUE(o->redis.has_value());
  EXPECT_EQ(o->redis->address.port, 6379);
  EXPECT_EQ(o->redis->pool_size, 7);
  ASSERT_TRUE(o->http.has_value());
  EXPECT_EQ(o->http->upstream_timeout, absl::Seconds(9));
  EXPECT_EQ(o->http->max_snapshot_bytes, 1000u);
  EXPECT_EQ(o->http->upstream_keepalive, 5);
  EXPECT_EQ(o->http->upstream_keepalive_timeout, absl::Seconds(3));
  EXPECT_TRUE(o->loopback);
  EXPECT_FALSE(o->tls);
}

TEST(ValidateTest, LoopbackListenAddresses) {
  for (const char* listen : {"127.0.0.1:50051", "127.1.2.3:1", "localhost:1",
                             "[::1]:50051", "unix:/tmp/idem.sock"}) {
    EXPECT_TRUE(IsLoopback(listen)) << listen;
  }
  for (const char* listen :
       {"0.0.0.0:50051", "10.0.0.1:1", "[::]:50051", "example.com:1"}) {
    EXPECT_FALSE(IsLoopback(listen)) << listen;
  }
}

}  // namespace
}  // namespace idem
