// idempotency-sidecar: the gRPC server (docs/spec.md#product, #storage).
//
//   idempotency-sidecar [flags]                  serve
//   idempotency-sidecar --migrate [flags]        apply migrations, then serve
//   idempotency-sidecar migrate --postgres=DSN   apply migrations and exit
//
// Every flag has an IDEM_* environment twin (--pg-pool-size:
// IDEM_PG_POOL_SIZE). The Redis password and the keys of the Redis cache's
// MAC are never flags (they would show in ps): they come from
// --redis-password-file or IDEM_REDIS_PASSWORD, --redis-mac-key-file or
// IDEM_REDIS_MAC_KEY, --redis-mac-previous-key-file or
// IDEM_REDIS_MAC_PREVIOUS_KEY.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>
#include <signal.h>

#ifdef IDEM_TCMALLOC
#include <gperftools/malloc_extension.h>
#endif

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/base/config.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "server/cache/local_cache.h"
#include "server/cache/redis_client.h"
#include "server/cache/redis_store.h"
#include "server/core/calls.h"
#include "server/core/coordinator.h"
#include "server/core/maintenance.h"
#include "server/core/reconciler.h"
#include "server/gateway/gateway.h"
#include "server/gateway/gateway_config.h"
#include "server/metrics/metrics.h"
#include "server/postgres/migrate.h"
#include "server/postgres/postgres_store.h"
#include "server/rpc/async_server.h"
#include "server/rpc/health.h"
#include "server/rpc/health_service.h"
#include "server/rpc/services.h"
#include "server/rpc/tls.h"
#include "server/store/instrumented_store.h"
#include "server/store/memory_store.h"
#include "server/wire/snapshot_validation.h"

namespace idem {
namespace {

struct Flags {
  std::string listen = "127.0.0.1:50051";
  std::string postgres;
  std::string postgres_direct;
  std::string pg_prepared = "on";
  int pg_pool_size = 16;
  int pg_max_batch = 64;
  int local_cache_mib = 32;
  int pg_batch_inflight = 1;
  std::string pg_connect_timeout = "2s";
  std::string pg_statement_timeout = "5s";
  std::string metrics_listen = "127.0.0.1:9464";
  std::string config;
  bool migrate = false;
  std::string store = "postgres";
  bool insecure = false;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string auth_tokens;
  double tenant_rate = 0;
  double tenant_burst = 0;
  int64_t max_processing_per_tenant = 0;
  int max_concurrent_streams = 1000;
  int rpc_threads = 0;
  int max_waiters = 16384;
  int max_waiters_per_tenant = 4096;
  int max_waiters_per_key = 2048;
  int64_t max_calls_in_flight = 20000;
  int64_t max_admin_calls_in_flight = 64;
  int max_health_watches = 64;
  std::string log_level = "info";
  size_t max_snapshot_bytes = 256 * 1024;
  std::string grace_period = "10s";
  std::string drain_delay = "0s";
  std::string reaper_interval = "1s";
  std::string purge_interval = "60s";
  std::string reconcile_interval = "5s";
  int maintenance_batch = 500;
  std::string redis;
  std::string redis_user;
  std::string redis_password_file;
  std::string redis_mac_key_file;
  std::string redis_mac_previous_key_file;
  std::string redis_timeout = "5ms";
  int redis_pool_size = 32;
  std::string redis_backoff_min = "100ms";
  std::string redis_backoff_max = "1s";
  std::string http_listen;
  std::string http_upstream;
  std::string http_tenant = "http";
  int http_threads = 1;
  int http_max_connections = 4096;
  size_t http_max_body = 1 << 20;
  std::string http_upstream_timeout = "30s";
  std::string http_idle_timeout = "60s";
};

int Die(const std::string& message) {
  Log(LogLevel::kError, message);
  return 2;
}

// Whether `listen` (host:port, [v6]:port or unix:path) is loopback-only.
bool IsLoopback(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:")) return true;
  std::string host = listen.substr(0, listen.rfind(':'));
  return absl::StartsWith(host, "127.") || host == "localhost" ||
         host == "[::1]";
}

// No duration flag may be longer: "inf" or 9999999h would overflow the
// deadlines and PostgreSQL settings computed from them (statement_timeout
// is an int of milliseconds), and none needs more than a day.
constexpr absl::Duration kMaxFlagDuration = absl::Hours(24);

absl::Status ParseFlagDuration(const std::string& flag,
                               const std::string& value, absl::Duration* out) {
  if (!absl::ParseDuration(value, out) || *out < absl::ZeroDuration() ||
      (*out == absl::ZeroDuration() && flag != "drain-delay") ||
      *out > kMaxFlagDuration) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": bad duration \"", value,
                     "\" (e.g. 500ms, 5s, 1m; at most 24h)"));
  }
  return absl::OkStatus();
}

// A secret from the file named by --`flag` (trailing newlines ignored) or
// from the environment variable `env`; empty when neither is set. Both set,
// an unreadable file or an empty one are errors.
absl::StatusOr<std::string> ReadSecret(const char* flag,
                                       const std::string& file,
                                       const char* env) {
  const char* env_value = std::getenv(env);
  const bool has_env = env_value != nullptr && *env_value;
  if (!file.empty() && has_env) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " and ", env, " are both set; use one"));
  }
  if (file.empty()) return has_env ? std::string(env_value) : std::string();
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", file, ": cannot read"));
  }
  std::string secret{std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>()};
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) {
    secret.pop_back();
  }
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", file, ": empty"));
  }
  return secret;
}

// The Redis cache: how to reach Redis, and the keys of its values' MAC.
struct RedisCache {
  RedisOptions options;
  std::shared_ptr<const CacheMac> mac;
};

// The keys of the cache's MAC from --redis-mac-key-file or
// IDEM_REDIS_MAC_KEY (required) and --redis-mac-previous-key-file or
// IDEM_REDIS_MAC_PREVIOUS_KEY (optional, while keys rotate).
absl::StatusOr<std::shared_ptr<const CacheMac>> CacheMacFromFlags(
    const Flags& f) {
  absl::StatusOr<std::string> current = ReadSecret(
      "redis-mac-key-file", f.redis_mac_key_file, "IDEM_REDIS_MAC_KEY");
  if (!current.ok()) return current.status();
  absl::StatusOr<std::string> previous =
      ReadSecret("redis-mac-previous-key-file", f.redis_mac_previous_key_file,
                 "IDEM_REDIS_MAC_PREVIOUS_KEY");
  if (!previous.ok()) return previous.status();
  if (current->empty()) {
    return absl::InvalidArgumentError(
        "--redis needs --redis-mac-key-file (or IDEM_REDIS_MAC_KEY): the key "
        "that signs cached records, at least 32 bytes, the same on every "
        "instance (docs/redis.md)");
  }
  for (const auto& [flag, key] :
       {std::pair{"redis-mac-key-file", &*current},
        std::pair{"redis-mac-previous-key-file", &*previous}}) {
    if (!key->empty() && key->size() < CacheMac::kMinKeySize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, ": the key has ", key->size(), " bytes; at least ",
          CacheMac::kMinKeySize, " are needed"));
    }
  }
  absl::StatusOr<std::shared_ptr<const CacheMac>> mac =
      CacheMac::Create(*current, *previous);
  if (!mac.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--redis-mac-previous-key-file: ", mac.status().message()));
  }
  return mac;
}

// The Redis cache from the --redis* flags and their IDEM_REDIS_* twins;
// nullopt when --redis is not set.
absl::StatusOr<std::optional<RedisCache>> RedisCacheFromFlags(const Flags& f) {
  if (f.redis.empty()) {
    const char* env_password = std::getenv("IDEM_REDIS_PASSWORD");
    const char* env_key = std::getenv("IDEM_REDIS_MAC_KEY");
    if (!f.redis_user.empty() || !f.redis_password_file.empty() ||
        (env_password != nullptr && *env_password) ||
        !f.redis_mac_key_file.empty() || (env_key != nullptr && *env_key)) {
      Log(LogLevel::kWarn,
          "--redis-user, --redis-password-file, IDEM_REDIS_PASSWORD, "
          "--redis-mac-key-file or IDEM_REDIS_MAC_KEY set without --redis: "
          "ignored, no cache");
    }
    return std::nullopt;
  }
  RedisCache cache;
  RedisOptions& o = cache.options;
  absl::StatusOr<RedisAddress> address = ParseRedisAddress(f.redis);
  if (!address.ok()) return address.status();
  o.address = *std::move(address);
  o.address_text = f.redis;
  o.user = f.redis_user;
  absl::StatusOr<std::string> password = ReadSecret(
      "redis-password-file", f.redis_password_file, "IDEM_REDIS_PASSWORD");
  if (!password.ok()) return password.status();
  o.password = *std::move(password);
  if (!o.user.empty() && o.password.empty()) {
    return absl::InvalidArgumentError(
        "--redis-user: needs a password (--redis-password-file or "
        "IDEM_REDIS_PASSWORD)");
  }
  if (f.redis_pool_size < 1 || f.redis_pool_size > 1000) {
    return absl::InvalidArgumentError("--redis-pool-size: must be 1-1000");
  }
  o.pool_size = f.redis_pool_size;
  for (const auto& [flag, value, out] :
       {std::tuple{"redis-timeout", f.redis_timeout, &o.timeout},
        std::tuple{"redis-backoff-min", f.redis_backoff_min, &o.backoff_min},
        std::tuple{"redis-backoff-max", f.redis_backoff_max, &o.backoff_max}}) {
    absl::Status s = ParseFlagDuration(flag, value, out);
    if (!s.ok()) return s;
  }
  if (o.backoff_max < o.backoff_min) {
    return absl::InvalidArgumentError(
        "--redis-backoff-max: must not be below --redis-backoff-min");
  }
  absl::StatusOr<std::shared_ptr<const CacheMac>> mac = CacheMacFromFlags(f);
  if (!mac.ok()) return mac.status();
  cache.mac = *std::move(mac);
  return cache;
}

int RunMigrate(const std::string& postgres) {
  if (postgres.empty()) return Die("--postgres: required for migrations");
  std::vector<std::string> distributed;
  absl::StatusOr<std::vector<std::string>> applied =
      Migrate(postgres, &distributed);
  if (!applied.ok()) {
    return Die(absl::StrCat("migrate failed: ", applied.status().ToString()));
  }
  Log(LogLevel::kInfo, "migrations applied",
      {{"applied", applied->empty() ? "none (schema up to date)"
                                    : absl::StrJoin(*applied, ",")}});
  if (!distributed.empty()) {
    Log(LogLevel::kInfo, "Citus: tables distributed by tenant_id",
        {{"tables", absl::StrJoin(distributed, ",")}});
  }
  return 0;
}

// Blocks until SIGTERM or SIGINT (blocked in every thread by main).
int WaitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

int Serve(const Flags& f) {
  LogLevel level;
  if (!ParseLogLevel(f.log_level, &level)) {
    return Die("--log-level: must be debug, info, warn or error");
  }
  SetLogLevel(level);
  PgOptions pg;
  pg.conninfo = f.postgres;
  pg.direct_conninfo = f.postgres_direct;
  pg.pool_size = f.pg_pool_size;
  if (f.pg_prepared != "on" && f.pg_prepared != "off") {
    return Die("--pg-prepared: must be on or off");
  }
  pg.prepared = f.pg_prepared == "on";
  absl::Duration grace;
  absl::Duration drain;
  MaintenanceOptions maintenance;
  ReconcilerOptions reconcile;
  maintenance.batch_size = f.maintenance_batch;
  reconcile.max_snapshot_bytes = f.max_snapshot_bytes;
  for (const auto& [flag, value, out] :
       {std::tuple{"pg-connect-timeout", f.pg_connect_timeout,
                   &pg.connect_timeout},
        std::tuple{"pg-statement-timeout", f.pg_statement_timeout,
                   &pg.statement_timeout},
        std::tuple{"grace-period", f.grace_period, &grace},
        std::tuple{"drain-delay", f.drain_delay, &drain},
        std::tuple{"reaper-interval", f.reaper_interval,
                   &maintenance.reaper_interval},
        std::tuple{"purge-interval", f.purge_interval,
                   &maintenance.purge_interval},
        std::tuple{"reconcile-interval", f.reconcile_interval,
                   &reconcile.interval}}) {
    absl::Status s = ParseFlagDuration(flag, value, out);
    if (!s.ok()) return Die(std::string(s.message()));
  }
  pg.acquire_timeout = pg.statement_timeout;
  if (f.maintenance_batch < 1 || f.maintenance_batch > 100000) {
    return Die("--maintenance-batch: must be 1-100000");
  }
  if (f.pg_pool_size < 1 || f.pg_pool_size > 1000) {
    return Die("--pg-pool-size: must be 1-1000");
  }
  if (f.local_cache_mib < 0 || f.local_cache_mib > 65536) {
    return Die("--local-cache-mib: must be 0-65536");
  }
  if (f.pg_max_batch < 1 || f.pg_max_batch > 1000) {
    return Die("--pg-max-batch: must be 1-1000");
  }
  if (f.pg_batch_inflight < 1 || f.pg_batch_inflight > f.pg_pool_size) {
    return Die("--pg-batch-inflight: must be 1 to --pg-pool-size");
  }
  const bool tls = !f.tls_cert.empty() || !f.tls_key.empty();
  // Only the tokens file names callers (bearer tokens, and the SANs of
  // client certificates): TLS alone encrypts but says nobody's identity.
  const bool identified = !f.auth_tokens.empty();
  const bool loopback = IsLoopback(f.listen);
  if (!identified && !loopback) {
    if (!f.insecure) {
      return Die(absl::StrCat(
          "--listen=", f.listen,
          " is not a loopback address, and nothing identifies callers: "
          "pass --auth-tokens (bearer tokens, and client-certificate SANs "
          "with --tls-client-ca), or --insecure to let anyone who can reach "
          "it act as an operator of every tenant. TLS alone encrypts; it "
          "does not say who is calling."));
    }
    Log(LogLevel::kWarn,
        "--insecure: serving without authentication on a non-loopback "
        "address; anyone who can reach it can read and settle every "
        "tenant's records",
        {{"listen", f.listen}, {"tls", tls ? "on" : "off"}});
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFor({f.tls_cert, f.tls_key, f.tls_client_ca});
  if (!credentials.ok())
    return Die(std::string(credentials.status().message()));
  if (!f.tls_client_ca.empty() && !tls) {
    return Die("--tls-client-ca: needs --tls-cert and --tls-key");
  }
  // Client certificates alone identify nobody: principals come from the
  // --auth-tokens file (tokens and certificate SANs).
  if (!f.tls_client_ca.empty() && f.auth_tokens.empty()) {
    return Die(
        "--tls-client-ca: needs --auth-tokens to map certificate "
        "SANs to principals");
  }
  std::unique_ptr<Authenticator> auth;
  if (!f.auth_tokens.empty()) {
    absl::StatusOr<std::unique_ptr<Authenticator>> created =
        Authenticator::Create(f.auth_tokens);
    if (!created.ok()) return Die(std::string(created.status().message()));
    auth = *std::move(created);
  }
  if (f.tenant_rate < 0 || f.tenant_burst < 0 ||
      (f.tenant_rate > 0 && f.tenant_burst < 1)) {
    return Die(
        "--tenant-rate and --tenant-burst: a rate needs a burst of "
        "at least 1; neither may be negative");
  }
  TenantRateLimiter rate_limiter(f.tenant_rate, f.tenant_burst);
  if (f.max_processing_per_tenant < 0) {
    return Die("--max-processing-per-tenant: must not be negative");
  }
  if (f.max_concurrent_streams < 1) {
    return Die("--max-concurrent-streams: must be positive");
  }
  if (f.rpc_threads < 0 || f.rpc_threads > 256) {
    return Die("--rpc-threads: must be 0 (one per two cores) to 256");
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, int64_t>{"max-waiters", f.max_waiters},
        {"max-waiters-per-tenant", f.max_waiters_per_tenant},
        {"max-waiters-per-key", f.max_waiters_per_key},
        {"max-calls-in-flight", f.max_calls_in_flight},
        {"max-admin-calls-in-flight", f.max_admin_calls_in_flight},
        {"max-health-watches", f.max_health_watches}}) {
    if (value < 0 || value > 1000000) {
      return Die(absl::StrCat("--", flag, ": must be 0 to 1000000"));
    }
  }
  absl::StatusOr<std::optional<RedisCache>> redis = RedisCacheFromFlags(f);
  if (!redis.ok()) return Die(std::string(redis.status().message()));
  PolicySet policies;
  if (!f.config.empty()) {
    absl::StatusOr<PolicySet> loaded = LoadPolicies(f.config);
    if (!loaded.ok()) return Die(std::string(loaded.status().message()));
    policies = *std::move(loaded);
  }

  gateway::GatewayOptions http;
  gateway::GatewayConfig routes;
  if (!f.http_listen.empty()) {
    if (f.http_upstream.empty()) {
      return Die("--http-upstream: required with --http-listen");
    }
    for (const auto& [flag, value, out] :
         {std::tuple{"http-upstream-timeout", f.http_upstream_timeout,
                     &http.upstream_timeout},
          std::tuple{"http-idle-timeout", f.http_idle_timeout,
                     &http.idle_timeout}}) {
      absl::Status s = ParseFlagDuration(flag, value, out);
      if (!s.ok()) return Die(std::string(s.message()));
    }
    if (f.http_threads < 1 || f.http_threads > 64) {
      return Die("--http-threads: must be 1-64");
    }
    if (f.http_max_connections < 1 || f.http_max_connections > 1000000) {
      return Die("--http-max-connections: must be 1-1000000");
    }
    if (f.http_max_body > (size_t{64} << 20)) {
      return Die("--http-max-body: must be at most 67108864 (64 MiB)");
    }
    if (!IsRecordName(f.http_tenant)) {
      return Die("--http-tenant: must be 1-128 bytes of [A-Za-z0-9._:-]");
    }
    http.listen = f.http_listen;
    http.upstream = f.http_upstream;
    http.tenant = f.http_tenant;
    http.threads = f.http_threads;
    http.max_connections = f.http_max_connections;
    http.max_body = f.http_max_body;
    http.max_snapshot_bytes = f.max_snapshot_bytes;
    if (!f.config.empty()) {
      absl::StatusOr<gateway::GatewayConfig> loaded =
          gateway::LoadGatewayConfig(f.config);
      if (!loaded.ok()) return Die(std::string(loaded.status().message()));
      routes = *std::move(loaded);
    }
    absl::StatusOr<PolicySet> merged =
        gateway::WithRoutePolicies(policies, routes, http.upstream_timeout);
    if (!merged.ok()) return Die(std::string(merged.status().message()));
    policies = *std::move(merged);
  }

  std::set<std::string> operations;
  for (const auto& [name, policy] : policies.operations()) {
    operations.insert(name);
  }
  Metrics metrics(operations);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!f.metrics_listen.empty() && f.metrics_listen != "off") {
    absl::StatusOr<std::unique_ptr<prometheus::Exposer>> served =
        ServeMetrics(f.metrics_listen, metrics);
    if (!served.ok()) return Die(std::string(served.status().message()));
    exposer = *std::move(served);
  }

  std::unique_ptr<Store> store;
  if (f.store == "memory") {
    Log(LogLevel::kWarn,
        "--store=memory: records live in this process only. They are lost "
        "on exit and NOT shared with other instances. Never use this in "
        "production or with more than one instance.");
    store = NewMemoryStore();
  } else if (f.store == "postgres") {
    if (f.postgres.empty())
      return Die("--postgres: required (or IDEM_POSTGRES)");
    if (!pg.prepared && f.postgres_direct.empty()) {
      // Through transaction pooling LISTEN succeeds but hears nothing, and
      // waiting Begins would only learn of outcomes at their deadlines.
      Log(LogLevel::kWarn,
          "--pg-prepared=off without --postgres-direct: LISTEN and "
          "migrations use --postgres, which must then not be a "
          "transaction-pooling PgBouncer");
    }
    if (f.migrate) {
      int rc = RunMigrate(f.postgres_direct.empty() ? f.postgres
                                                    : f.postgres_direct);
      if (rc != 0) return rc;
    }
    store = NewPostgresStore(
        pg, PgBatchOptions{f.pg_max_batch, f.pg_batch_inflight});
  } else {
    return Die("--store: must be postgres or memory");
  }

  store = NewInstrumentedStore(std::move(store), f.store, &metrics);
  // The coordinator's records: the backing store's, behind the caches.
  std::unique_ptr<RecordStore> records = RecordsOf(store.get());
  if (*redis) {
    metrics.SetRedisUp(false);
    records = NewRedisCacheStore(
        std::move(records),
        NewRedisClient(std::move((*redis)->options),
                       [&metrics](bool up) { metrics.SetRedisUp(up); }),
        (*redis)->mac, &metrics);
  }
  if (f.store == "postgres") {
    LocalCacheOptions local;
    local.max_bytes = static_cast<size_t>(f.local_cache_mib) << 20;
    records = NewLocalCacheStore(std::move(records), local);
  }
  CallsOptions calls_options;
  calls_options.coordinator.max_processing_per_tenant =
      f.max_processing_per_tenant;
  calls_options.waiters = WaiterLimits{f.max_waiters_per_key,
                                       f.max_waiters_per_tenant, f.max_waiters};
  Calls calls(records.get(), store->Changes(), &policies, &metrics,
              calls_options);
  ServiceContext context;
  context.calls = &calls;
  context.admin_store = store.get();
  context.limits.max_snapshot_bytes = f.max_snapshot_bytes;
  context.metrics = &metrics;
  context.auth = auth.get();
  context.rate = rate_limiter.enabled() ? &rate_limiter : nullptr;
  IdempotencyService service(context);
  IdempotencyAdminService admin(context, f.max_admin_calls_in_flight);

  // Our own health service: gRPC's default one is a callback service, whose
  // threads would read the calls meant for the RPC threads (async_server.h).
  grpc::EnableDefaultHealthCheckService(false);
  HealthService health_service(f.max_health_watches, &metrics);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(f.listen, *credentials, &port);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             f.max_concurrent_streams);
  builder.RegisterService(&service);
  builder.RegisterService(&admin);
  builder.RegisterService(&health_service);
  AsyncServer rpcs(&builder,
                   f.rpc_threads > 0 ? f.rpc_threads : DefaultAsyncThreads(),
                   f.max_calls_in_flight, &metrics);
  service.ServeOn(&rpcs);
  admin.ServeOn(&rpcs);
  health_service.ServeOn(&rpcs);
  metrics.AddScrapedGauge(
      "idem_calls_in_flight",
      "Idempotency calls taken and not yet answered, parked ones included.",
      [in_flight = rpcs.in_flight()] {
        return static_cast<double>(in_flight->load());
      });
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::max<size_t>(4 << 20, f.max_snapshot_bytes * 2)));
  grpc::ResourceQuota quota("idempotency-sidecar");
  // Threads of the one synchronous service, reflection (grpcurl's
  // discovery): every other call is served by the RPC threads.
  quota.SetMaxThreads(16);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Die(absl::StrCat("cannot listen on ", f.listen));
  }
  rpcs.Start();
  HealthMonitor health(store.get(), &health_service, absl::Seconds(1));
  MaintenanceHooks hooks;
  hooks.expired = [&metrics](const Record& r) {
    metrics.LeaseExpired(r.key.operation, r.status == Status::kUnknown
                                              ? ExpiryPolicy::kUnknown
                                              : ExpiryPolicy::kRelease);
  };
  hooks.stats = [&metrics](const StoreStats& s) {
    metrics.SetRecordCounts(s.records, s.oldest_unknown_age);
  };
  // The caches drop what the purge removed.
  hooks.purged = [&records](const std::vector<RecordKey>& keys) {
    records->Forget(keys);
  };
  Maintenance background(store.get(), &policies, maintenance, hooks);
  Reconciler reconciler(store.get(), calls.coordinator(), &policies, &metrics,
                        reconcile);
  reconciler.Start();
  std::unique_ptr<gateway::Gateway> http_gateway;
  if (!f.http_listen.empty()) {
    absl::StatusOr<std::unique_ptr<gateway::Gateway>> started =
        gateway::Gateway::Start(http, routes, &calls, &metrics);
    if (!started.ok()) return Die(std::string(started.status().message()));
    http_gateway = *std::move(started);
    metrics.AddScrapedGauge("idem_http_connections",
                            "HTTP gateway client connections open now.",
                            [g = http_gateway.get()] {
                              return static_cast<double>(g->connections());
                            });
    Log(LogLevel::kInfo, "HTTP gateway serving",
        {{"http_listen", f.http_listen},
         {"http_upstream", f.http_upstream},
         {"tenant", f.http_tenant},
         {"routes", absl::StrCat(routes.routes.size())}});
  }
  Log(LogLevel::kInfo, "serving",
      {{"listen", f.listen},
       {"metrics_listen", exposer ? f.metrics_listen : "off"},
       {"store", f.store},
       {"redis", f.redis.empty() ? "off" : f.redis},
       {"tls", !tls ? "off"
               : f.tls_client_ca.empty()
                   ? "on"
                   : "mutual (client certificates required)"},
       {"auth", auth       ? (f.tls_client_ca.empty()
                                  ? "bearer tokens (" + f.auth_tokens + ")"
                                  : "bearer tokens and client certificates (" +
                                  f.auth_tokens + ")")
                : loopback ? "off (loopback only)"
                           : "off (--insecure: every caller is an "
                             "operator of every tenant)"},
       {"tenant_rate",
        f.tenant_rate > 0 ? absl::StrCat(f.tenant_rate, "/s") : "off"}});

  int sig = WaitForSignal();
  Log(LogLevel::kInfo, "shutting down",
      {{"signal", absl::StrCat(sig)},
       {"grace_period", absl::FormatDuration(grace)}});
  health.Stop();
  // Still serving while load balancers and probes notice NOT_SERVING.
  absl::SleepFor(drain);
  // Open health Watch streams end now rather than at the deadline, and so
  // do parked Begins (answered IN_PROGRESS, as at the end of their wait).
  health_service.Shutdown();
  calls.Shutdown();
  if (http_gateway != nullptr) http_gateway->Stop(grace);
  server->Shutdown(std::chrono::system_clock::now() +
                   absl::ToChronoNanoseconds(grace));
  server->Wait();
  rpcs.Stop();
  Log(LogLevel::kInfo, "stopped");
  return 0;
}

int Main(int argc, char** argv) {
  // Signals are taken by WaitForSignal, not by whichever thread gets them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // hiredis writes with write(2): a Redis that closed the connection must
  // fail that call, not kill the process.
  signal(SIGPIPE, SIG_IGN);

  Flags f;
  CLI::App app{
      "idempotency-sidecar: an idempotency gRPC service over PostgreSQL.\n"
      "Every flag has an IDEM_* environment twin (e.g. IDEM_POSTGRES)."};
  app.add_option("--listen", f.listen, "gRPC address (host:port)")
      ->envname("IDEM_LISTEN")
      ->capture_default_str();
  app.add_option("--postgres", f.postgres,
                 "PostgreSQL conninfo or URI (e.g. "
                 "postgresql://user@host/db?sslmode=require)")
      ->envname("IDEM_POSTGRES");
  app.add_option("--postgres-direct", f.postgres_direct,
                 "PostgreSQL conninfo of a session connection, for LISTEN and "
                 "the migrations' advisory lock, when --postgres names a "
                 "transaction-pooling PgBouncer (default: --postgres)")
      ->envname("IDEM_POSTGRES_DIRECT");
  app.add_option("--pg-prepared", f.pg_prepared,
                 "on: named prepared statements; off: unnamed statements and "
                 "no session settings, for PgBouncer's transaction pooling")
      ->envname("IDEM_PG_PREPARED")
      ->capture_default_str();
  app.add_option("--pg-pool-size", f.pg_pool_size,
                 "PostgreSQL connections in the pool")
      ->envname("IDEM_PG_POOL_SIZE")
      ->capture_default_str();
  app.add_option("--local-cache-mib", f.local_cache_mib,
                 "MiB of finished records kept in this process for replays "
                 "(each no longer than its retention, at most 1m; 0: off)")
      ->envname("IDEM_LOCAL_CACHE_MIB")
      ->capture_default_str();
  app.add_option("--pg-max-batch", f.pg_max_batch,
                 "most concurrent reads, inserts or updates folded into one "
                 "statement and one commit (1: no batching)")
      ->envname("IDEM_PG_MAX_BATCH")
      ->capture_default_str();
  app.add_option("--pg-batch-inflight", f.pg_batch_inflight,
                 "batches of each kind (reads, inserts, updates) in flight "
                 "at once, each on a store thread of its own and a pooled "
                 "connection; with --pg-max-batch 1, one thread per "
                 "connection for each kind")
      ->envname("IDEM_PG_BATCH_INFLIGHT")
      ->capture_default_str();
  app.add_option("--pg-connect-timeout", f.pg_connect_timeout,
                 "bound on opening a PostgreSQL connection (at least 2s)")
      ->envname("IDEM_PG_CONNECT_TIMEOUT")
      ->capture_default_str();
  app.add_option("--pg-statement-timeout", f.pg_statement_timeout,
                 "bound on one statement and on waiting for a pooled "
                 "connection; past it a call is UNAVAILABLE")
      ->envname("IDEM_PG_STATEMENT_TIMEOUT")
      ->capture_default_str();
  app.add_option("--metrics-listen", f.metrics_listen,
                 "Prometheus metrics address (host:port, or off)")
      ->envname("IDEM_METRICS_LISTEN")
      ->capture_default_str();
  app.add_option("--config", f.config,
                 "YAML file with per-operation policies (see docs/)")
      ->envname("IDEM_CONFIG");
  app.add_flag("--migrate", f.migrate,
               "apply pending migrations (on Citus, then distribute the "
               "tables by tenant), then serve")
      ->envname("IDEM_MIGRATE");
  app.add_option("--store", f.store,
                 "postgres, or memory (one instance, not durable: tests "
                 "and demos only)")
      ->envname("IDEM_STORE")
      ->capture_default_str();
  app.add_option("--tls-cert", f.tls_cert,
                 "PEM certificate chain of the gRPC port (re-read when it "
                 "changes)")
      ->envname("IDEM_TLS_CERT");
  app.add_option("--tls-key", f.tls_key, "PEM private key for --tls-cert")
      ->envname("IDEM_TLS_KEY");
  app.add_option("--tls-client-ca", f.tls_client_ca,
                 "PEM CA bundle: require and verify client certificates "
                 "(mutual TLS); needs --auth-tokens to map SANs")
      ->envname("IDEM_TLS_CLIENT_CA");
  app.add_option("--auth-tokens", f.auth_tokens,
                 "JSON file of principals (bearer tokens, certificate SANs, "
                 "roles, tenants); turns authentication on; re-read when it "
                 "changes; removing it revokes every principal")
      ->envname("IDEM_AUTH_TOKENS");
  app.add_option("--tenant-rate", f.tenant_rate,
                 "business calls per second allowed per tenant (0: no limit)")
      ->envname("IDEM_TENANT_RATE")
      ->capture_default_str();
  app.add_option("--tenant-burst", f.tenant_burst,
                 "calls a tenant may make at once above --tenant-rate")
      ->envname("IDEM_TENANT_BURST")
      ->capture_default_str();
  app.add_option("--max-processing-per-tenant", f.max_processing_per_tenant,
                 "open PROCESSING records a tenant may have (0: no cap)")
      ->envname("IDEM_MAX_PROCESSING_PER_TENANT")
      ->capture_default_str();
  app.add_option("--max-concurrent-streams", f.max_concurrent_streams,
                 "concurrent calls per client connection")
      ->envname("IDEM_MAX_CONCURRENT_STREAMS")
      ->capture_default_str();
  app.add_option("--rpc-threads", f.rpc_threads,
                 "threads that take the Idempotency service's calls and "
                 "answer replays from the caches (0: one per two cores, at "
                 "least one)")
      ->envname("IDEM_RPC_THREADS")
      ->capture_default_str();
  app.add_option("--max-waiters", f.max_waiters,
                 "Begin calls with `wait` parked in this instance at once "
                 "(past it: RESOURCE_EXHAUSTED)")
      ->envname("IDEM_MAX_WAITERS")
      ->capture_default_str();
  app.add_option("--max-waiters-per-tenant", f.max_waiters_per_tenant,
                 "parked Begin calls of one tenant")
      ->envname("IDEM_MAX_WAITERS_PER_TENANT")
      ->capture_default_str();
  app.add_option("--max-waiters-per-key", f.max_waiters_per_key,
                 "parked Begin calls on one record")
      ->envname("IDEM_MAX_WAITERS_PER_KEY")
      ->capture_default_str();
  app.add_option("--max-calls-in-flight", f.max_calls_in_flight,
                 "Idempotency calls taken and not yet answered, parked ones "
                 "included (past it: RESOURCE_EXHAUSTED; 0: no bound)")
      ->envname("IDEM_MAX_CALLS_IN_FLIGHT")
      ->capture_default_str();
  app.add_option("--max-admin-calls-in-flight", f.max_admin_calls_in_flight,
                 "IdempotencyAdmin calls taken and not yet answered, counted "
                 "apart from --max-calls-in-flight (past it: "
                 "RESOURCE_EXHAUSTED; 0: no bound)")
      ->envname("IDEM_MAX_ADMIN_CALLS_IN_FLIGHT")
      ->capture_default_str();
  app.add_option("--max-health-watches", f.max_health_watches,
                 "open grpc.health.v1.Health/Watch streams (past it Watch "
                 "is RESOURCE_EXHAUSTED, Check is not affected)")
      ->envname("IDEM_MAX_HEALTH_WATCHES")
      ->capture_default_str();
  app.add_flag("--insecure", f.insecure,
               "allow a non-loopback --listen without --auth-tokens (with or "
               "without TLS): every caller is an operator of every tenant")
      ->envname("IDEM_INSECURE");
  app.add_option("--log-level", f.log_level, "debug, info, warn or error")
      ->envname("IDEM_LOG_LEVEL")
      ->capture_default_str();
  app.add_option("--http-listen", f.http_listen,
                 "serve the HTTP gateway here (host:port): Idempotency-Key "
                 "in front of --http-upstream (docs/gateway.md); off by "
                 "default")
      ->envname("IDEM_HTTP_LISTEN");
  app.add_option("--http-upstream", f.http_upstream,
                 "the HTTP service behind the gateway (http://host:port)")
      ->envname("IDEM_HTTP_UPSTREAM");
  app.add_option("--http-tenant", f.http_tenant,
                 "tenant of the gateway's records")
      ->envname("IDEM_HTTP_TENANT")
      ->capture_default_str();
  app.add_option("--http-threads", f.http_threads,
                 "threads of the gateway's event loop")
      ->envname("IDEM_HTTP_THREADS")
      ->capture_default_str();
  app.add_option("--http-max-connections", f.http_max_connections,
                 "gateway client connections open at once; past it new ones "
                 "are closed")
      ->envname("IDEM_HTTP_MAX_CONNECTIONS")
      ->capture_default_str();
  app.add_option("--http-max-body", f.http_max_body,
                 "largest request body through the gateway, in bytes, unless "
                 "a route sets max_body (larger: 413)")
      ->envname("IDEM_HTTP_MAX_BODY")
      ->capture_default_str();
  app.add_option("--http-upstream-timeout", f.http_upstream_timeout,
                 "longest wait for the service's answer, unless a route "
                 "sets timeout")
      ->envname("IDEM_HTTP_UPSTREAM_TIMEOUT")
      ->capture_default_str();
  app.add_option("--http-idle-timeout", f.http_idle_timeout,
                 "a gateway connection idle, or a request not read whole, "
                 "this long is closed")
      ->envname("IDEM_HTTP_IDLE_TIMEOUT")
      ->capture_default_str();
  app.add_option("--max-snapshot-bytes", f.max_snapshot_bytes,
                 "largest result snapshot accepted (body + content type + "
                 "headers)")
      ->envname("IDEM_MAX_SNAPSHOT_BYTES")
      ->capture_default_str();
  app.add_option("--grace-period", f.grace_period,
                 "on SIGTERM, how long in-flight calls may take to finish")
      ->envname("IDEM_GRACE_PERIOD")
      ->capture_default_str();
  app.add_option("--drain-delay", f.drain_delay,
                 "on SIGTERM, how long to keep serving with health "
                 "NOT_SERVING before refusing new calls")
      ->envname("IDEM_DRAIN_DELAY")
      ->capture_default_str();
  app.add_option("--reaper-interval", f.reaper_interval,
                 "how often this instance moves PROCESSING records whose "
                 "lease ran out to their expiry policy")
      ->envname("IDEM_REAPER_INTERVAL")
      ->capture_default_str();
  app.add_option("--purge-interval", f.purge_interval,
                 "how often this instance deletes terminal records past "
                 "their retention")
      ->envname("IDEM_PURGE_INTERVAL")
      ->capture_default_str();
  app.add_option("--reconcile-interval", f.reconcile_interval,
                 "how often this instance probes UNKNOWN records of "
                 "operations whose policy names a probe")
      ->envname("IDEM_RECONCILE_INTERVAL")
      ->capture_default_str();
  app.add_option("--maintenance-batch", f.maintenance_batch,
                 "records per reaper or purge transaction")
      ->envname("IDEM_MAINTENANCE_BATCH")
      ->capture_default_str();
  app.add_option("--redis", f.redis,
                 "Redis cache of finished records (HOST:PORT or "
                 "unix:/path/to.sock; empty: off). Never authoritative: "
                 "lookups fall through to PostgreSQL when it misses or fails")
      ->envname("IDEM_REDIS");
  app.add_option("--redis-user", f.redis_user,
                 "Redis ACL user for AUTH (needs a password)")
      ->envname("IDEM_REDIS_USER");
  app.add_option("--redis-password-file", f.redis_password_file,
                 "file holding the Redis password (trailing newlines "
                 "ignored); or set IDEM_REDIS_PASSWORD. Never a flag value")
      ->envname("IDEM_REDIS_PASSWORD_FILE");
  app.add_option("--redis-mac-key-file", f.redis_mac_key_file,
                 "file holding the key (at least 32 bytes; trailing newlines "
                 "ignored) that signs and verifies cached records "
                 "(HMAC-SHA256), the same on every instance; or set "
                 "IDEM_REDIS_MAC_KEY. Required with --redis")
      ->envname("IDEM_REDIS_MAC_KEY_FILE");
  app.add_option("--redis-mac-previous-key-file", f.redis_mac_previous_key_file,
                 "while keys rotate: file holding the previous key, still "
                 "accepted for cached records but never used to sign; or set "
                 "IDEM_REDIS_MAC_PREVIOUS_KEY")
      ->envname("IDEM_REDIS_MAC_PREVIOUS_KEY_FILE");
  app.add_option("--redis-timeout", f.redis_timeout,
                 "bound on connecting to Redis and on each Redis command; "
                 "past it the call falls through to PostgreSQL")
      ->envname("IDEM_REDIS_TIMEOUT")
      ->capture_default_str();
  app.add_option("--redis-pool-size", f.redis_pool_size,
                 "Redis connections in the pool")
      ->envname("IDEM_REDIS_POOL_SIZE")
      ->capture_default_str();
  app.add_option("--redis-backoff-min", f.redis_backoff_min,
                 "after a Redis timeout or connection failure, calls skip "
                 "Redis until a probe answers; the first probe comes this "
                 "long after the failure")
      ->envname("IDEM_REDIS_BACKOFF_MIN")
      ->capture_default_str();
  app.add_option("--redis-backoff-max", f.redis_backoff_max,
                 "the wait between failed probes doubles up to this")
      ->envname("IDEM_REDIS_BACKOFF_MAX")
      ->capture_default_str();
  CLI::App* migrate =
      app.add_subcommand("migrate",
                         "apply pending migrations (on Citus, then distribute "
                         "the tables by tenant) and exit");
  std::string migrate_postgres;
  migrate->add_option("--postgres", migrate_postgres, "PostgreSQL conninfo")
      ->envname("IDEM_POSTGRES");
  std::string migrate_direct;
  migrate
      ->add_option("--postgres-direct", migrate_direct,
                   "PostgreSQL conninfo of a session connection (default: "
                   "--postgres)")
      ->envname("IDEM_POSTGRES_DIRECT");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (migrate->parsed()) {
    if (!migrate_direct.empty()) return RunMigrate(migrate_direct);
    if (!f.postgres_direct.empty()) return RunMigrate(f.postgres_direct);
    return RunMigrate(migrate_postgres.empty() ? f.postgres : migrate_postgres);
  }
  return Serve(f);
}

}  // namespace
}  // namespace idem

int main(int argc, char** argv) {
  // Debian's Abseil is built with the deadlock detector on: it keeps a
  // global lock-order graph that every absl::Mutex (gRPC's locks too)
  // updates, which costs more CPU than the locks themselves.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#ifdef IDEM_TCMALLOC
  // tcmalloc lets its per-thread caches hold 32 MiB in all; a quarter of
  // that is as fast on replays and lowers peak RSS: less freed memory sits
  // idle in the threads' caches.
  if (!MallocExtension::instance()->SetNumericProperty(
          "tcmalloc.max_total_thread_cache_bytes", 8 << 20)) {
    idem::Log(idem::LogLevel::kWarn,
              "tcmalloc refused the 8 MiB thread cache cap; using its default");
  }
#endif
  return idem::Main(argc, argv);
}
