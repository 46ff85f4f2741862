#include "server/main/config_validation.h"

#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/wire/snapshot_validation.h"

namespace idem {
namespace {

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

// --`flag` (a file) and the environment variable `env` name one secret:
// only one may be set.
absl::Status OneSource(const char* flag, const std::string& file,
                       const char* env, const std::string& env_value) {
  if (!file.empty() && !env_value.empty()) {
    return Invalid(
        absl::StrCat("--", flag, " and ", env, " are both set; use one"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePostgres(const SidecarConfig& c, SidecarOptions* o) {
  if (c.pg_prepared != "on" && c.pg_prepared != "off") {
    return Invalid("--pg-prepared: must be on or off");
  }
  o->pg.conninfo = c.postgres.conninfo;
  o->pg.direct_conninfo = c.postgres.direct;
  o->pg.pool_size = c.pg_pool_size;
  o->pg.prepared = c.pg_prepared == "on";
  o->maintenance.batch_size = c.maintenance_batch;
  o->reconcile.max_snapshot_bytes = c.max_snapshot_bytes;
  for (const auto& [flag, value, out] :
       {std::tuple{"pg-connect-timeout", c.pg_connect_timeout,
                   &o->pg.connect_timeout},
        std::tuple{"pg-statement-timeout", c.pg_statement_timeout,
                   &o->pg.statement_timeout},
        std::tuple{"grace-period", c.grace_period, &o->grace_period},
        std::tuple{"drain-delay", c.drain_delay, &o->drain_delay},
        std::tuple{"reaper-interval", c.reaper_interval,
                   &o->maintenance.reaper_interval},
        std::tuple{"purge-interval", c.purge_interval,
                   &o->maintenance.purge_interval},
        std::tuple{"reconcile-interval", c.reconcile_interval,
                   &o->reconcile.interval}}) {
    absl::StatusOr<absl::Duration> d = ParseFlagDuration(flag, value);
    if (!d.ok()) return d.status();
    *out = *d;
  }
  o->pg.acquire_timeout = o->pg.statement_timeout;
  if (c.maintenance_batch < 1 || c.maintenance_batch > 100000) {
    return Invalid("--maintenance-batch: must be 1-100000");
  }
  if (c.pg_pool_size < 1 || c.pg_pool_size > 1000) {
    return Invalid("--pg-pool-size: must be 1-1000");
  }
  if (c.local_cache_mib < 0 || c.local_cache_mib > 65536) {
    return Invalid("--local-cache-mib: must be 0-65536");
  }
  if (c.pg_max_batch < 1 || c.pg_max_batch > 1000) {
    return Invalid("--pg-max-batch: must be 1-1000");
  }
  if (c.pg_batch_inflight < 1 || c.pg_batch_inflight > c.pg_pool_size) {
    return Invalid("--pg-batch-inflight: must be 1 to --pg-pool-size");
  }
  if (c.pg_lone_lane != "on" && c.pg_lone_lane != "off") {
    return Invalid("--pg-lone-lane: must be on or off");
  }
  o->batch = PgBatchOptions{c.pg_max_batch, c.pg_batch_inflight};
  o->batch.lone_lane = c.pg_lone_lane == "on";
  return absl::OkStatus();
}

absl::Status ValidateSecurity(const SidecarConfig& c, SidecarOptions* o) {
  o->tls = !c.tls.cert.empty() || !c.tls.key.empty();
  o->loopback = IsLoopback(c.listen);
  // Only the tokens file names callers (bearer tokens, and the SANs of
  // client certificates): TLS alone encrypts but says nobody's identity.
  if (c.auth_tokens.empty() && !o->loopback && !c.insecure) {
    return Invalid(absl::StrCat(
        "--listen=", c.listen,
        " is not a loopback address, and nothing identifies callers: "
        "pass --auth-tokens (bearer tokens, and client-certificate SANs "
        "with --tls-client-ca), or --insecure to let anyone who can reach "
        "it act as an operator of every tenant. TLS alone encrypts; it "
        "does not say who is calling."));
  }
  // The certificate files themselves are read later (sidecar_resources.h).
  if ((o->tls || !c.tls_client_ca.empty()) &&
      (c.tls.cert.empty() || c.tls.key.empty())) {
    return Invalid("--tls-cert and --tls-key: both are required for TLS");
  }
  // The console has no --insecure: without tokens, loopback or nothing.
  if (!c.console_listen.empty() && c.auth_tokens.empty() &&
      !IsLoopback(c.console_listen)) {
    return Invalid(absl::StrCat(
        "--console-listen=", c.console_listen,
        " is not a loopback address, and nothing identifies callers: pass "
        "--auth-tokens, whose operator tokens the console then asks for"));
  }
  // Client certificates alone identify nobody: principals come from the
  // --auth-tokens file (tokens and certificate SANs).
  if (!c.tls_client_ca.empty() && c.auth_tokens.empty()) {
    return Invalid(
        "--tls-client-ca: needs --auth-tokens to map certificate "
        "SANs to principals");
  }
  return absl::OkStatus();
}

absl::Status ValidateLimits(const SidecarConfig& c) {
  if (c.tenant_rate < 0 || c.tenant_burst < 0 ||
      (c.tenant_rate > 0 && c.tenant_burst < 1)) {
    return Invalid(
        "--tenant-rate and --tenant-burst: a rate needs a burst of "
        "at least 1; neither may be negative");
  }
  if (c.max_processing_per_tenant < 0) {
    return Invalid("--max-processing-per-tenant: must not be negative");
  }
  if (c.max_concurrent_streams < 1) {
    return Invalid("--max-concurrent-streams: must be positive");
  }
  if (c.rpc_threads < 0 || c.rpc_threads > 256) {
    return Invalid("--rpc-threads: must be 0 (one per two cores) to 256");
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, int64_t>{"max-waiters", c.max_waiters},
        {"max-waiters-per-tenant", c.max_waiters_per_tenant},
        {"max-waiters-per-key", c.max_waiters_per_key},
        {"max-calls-in-flight", c.max_calls_in_flight},
        {"max-admin-calls-in-flight", c.max_admin_calls_in_flight},
        {"max-health-watches", c.max_health_watches}}) {
    if (value < 0 || value > 1000000) {
      return Invalid(absl::StrCat("--", flag, ": must be 0 to 1000000"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRedis(const SidecarConfig& c, SidecarOptions* o) {
  if (c.redis.empty()) return absl::OkStatus();
  RedisOptions r;
  absl::StatusOr<RedisAddress> address = ParseRedisAddress(c.redis);
  if (!address.ok()) return address.status();
  r.address = *std::move(address);
  r.address_text = c.redis;
  r.user = c.redis_user;
  for (const auto& [flag, file, env, value] :
       {std::tuple{"redis-password-file", c.redis_password_file,
                   "IDEM_REDIS_PASSWORD", c.redis_password_env},
        std::tuple{"redis-mac-key-file", c.redis_mac_key_file,
                   "IDEM_REDIS_MAC_KEY", c.redis_mac_key_env},
        std::tuple{"redis-mac-previous-key-file", c.redis_mac_previous_key_file,
                   "IDEM_REDIS_MAC_PREVIOUS_KEY",
                   c.redis_mac_previous_key_env}}) {
    absl::Status s = OneSource(flag, file, env, value);
    if (!s.ok()) return s;
  }
  if (!r.user.empty() && c.redis_password_file.empty() &&
      c.redis_password_env.empty()) {
    return Invalid(
        "--redis-user: needs a password (--redis-password-file or "
        "IDEM_REDIS_PASSWORD)");
  }
  if (c.redis_pool_size < 1 || c.redis_pool_size > 1000) {
    return Invalid("--redis-pool-size: must be 1-1000");
  }
  r.pool_size = c.redis_pool_size;
  for (const auto& [flag, value, out] :
       {std::tuple{"redis-timeout", c.redis_timeout, &r.timeout},
        std::tuple{"redis-backoff-min", c.redis_backoff_min, &r.backoff_min},
        std::tuple{"redis-backoff-max", c.redis_backoff_max, &r.backoff_max}}) {
    absl::StatusOr<absl::Duration> d = ParseFlagDuration(flag, value);
    if (!d.ok()) return d.status();
    *out = *d;
  }
  if (r.backoff_max < r.backoff_min) {
    return Invalid(
        "--redis-backoff-max: must not be below --redis-backoff-min");
  }
  if (c.redis_mac_key_file.empty() && c.redis_mac_key_env.empty()) {
    return Invalid(
        "--redis needs --redis-mac-key-file (or IDEM_REDIS_MAC_KEY): the key "
        "that signs cached records, at least 32 bytes, the same on every "
        "instance (docs/redis.md)");
  }
  o->redis = std::move(r);
  return absl::OkStatus();
}

absl::Status ValidateGateway(const SidecarConfig& c, SidecarOptions* o) {
  if (c.http_listen.empty()) return absl::OkStatus();
  if (c.http_upstream.empty()) {
    return Invalid("--http-upstream: required with --http-listen");
  }
  gateway::GatewayOptions http;
  for (const auto& [flag, value, out] :
       {std::tuple{"http-upstream-timeout", c.http_upstream_timeout,
                   &http.upstream_timeout},
        std::tuple{"http-idle-timeout", c.http_idle_timeout,
                   &http.idle_timeout},
        std::tuple{"http-upstream-keepalive-timeout",
                   c.http_upstream_keepalive_timeout,
                   &http.upstream_keepalive_timeout}}) {
    absl::StatusOr<absl::Duration> d = ParseFlagDuration(flag, value);
    if (!d.ok()) return d.status();
    *out = *d;
  }
  if (c.http_threads < 1 || c.http_threads > 64) {
    return Invalid("--http-threads: must be 1-64");
  }
  if (c.http_max_connections < 1 || c.http_max_connections > 1000000) {
    return Invalid("--http-max-connections: must be 1-1000000");
  }
  if (c.http_upstream_keepalive < 0 || c.http_upstream_keepalive > 4096) {
    return Invalid("--http-upstream-keepalive: must be 0-4096");
  }
  if (c.http_max_body > (size_t{64} << 20)) {
    return Invalid("--http-max-body: must be at most 67108864 (64 MiB)");
  }
  if (!IsRecordName(c.http_tenant)) {
    return Invalid("--http-tenant: must be 1-128 bytes of [A-Za-z0-9._:-]");
  }
  http.listen = c.http_listen;
  http.upstream = c.http_upstream;
  http.tenant = c.http_tenant;
  http.threads = c.http_threads;
  http.max_connections = c.http_max_connections;
  http.max_body = c.http_max_body;
  http.upstream_keepalive = c.http_upstream_keepalive;
  http.max_snapshot_bytes = c.max_snapshot_bytes;
  o->http = std::move(http);
  return absl::OkStatus();
}

absl::Status ValidateStore(const SidecarConfig& c) {
  if (c.store == "memory") return absl::OkStatus();
  if (c.store != "postgres") {
    return Invalid("--store: must be postgres or memory");
  }
  if (c.postgres.conninfo.empty()) {
    return Invalid("--postgres: required (or IDEM_POSTGRES)");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLoopback(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:")) return true;
  std::string host = listen.substr(0, listen.rfind(':'));
  return absl::StartsWith(host, "127.") || host == "localhost" ||
         host == "[::1]";
}

absl::StatusOr<absl::Duration> ParseFlagDuration(const std::string& flag,
                                                 const std::string& value) {
  absl::Duration d;
  if (!absl::ParseDuration(value, &d) || d < absl::ZeroDuration() ||
      (d == absl::ZeroDuration() && flag != "drain-delay") ||
      d > kMaxFlagDuration) {
    return Invalid(absl::StrCat("--", flag, ": bad duration \"", value,
                                "\" (e.g. 500ms, 5s, 1m; at most 24h)"));
  }
  return d;
}

absl::StatusOr<SidecarOptions> Validate(const SidecarConfig& config) {
  SidecarOptions o;
  o.config = config;
  if (!ParseLogLevel(config.log_level, &o.log_level)) {
    return Invalid("--log-level: must be debug, info, warn or error");
  }
  absl::Status s = ValidatePostgres(config, &o);
  if (s.ok()) s = ValidateSecurity(config, &o);
  if (s.ok()) s = ValidateLimits(config);
  if (s.ok()) s = ValidateRedis(config, &o);
  if (s.ok()) s = ValidateGateway(config, &o);
  if (s.ok()) s = ValidateStore(config);
  if (!s.ok()) return s;
  return o;
}

}  // namespace idem
