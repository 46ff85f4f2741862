#include "server/main/sidecar_flags.h"

#include <CLI/CLI.hpp>
#include <cstdlib>

#include "server/main/flag_groups.h"

namespace idem {
namespace {

// The gRPC port, PostgreSQL, security and limits.
void AddServingFlags(CLI::App* app, SidecarConfig* c) {
  app->add_option("--listen", c->listen, "gRPC address (host:port)")
      ->envname("IDEM_LISTEN")
      ->capture_default_str();
  AddPostgresFlags(app, &c->postgres);
  app->add_option("--pg-prepared", c->pg_prepared,
                  "on: named prepared statements; off: unnamed statements and "
                  "no session settings, for PgBouncer's transaction pooling")
      ->envname("IDEM_PG_PREPARED")
      ->capture_default_str();
  app->add_option("--pg-pool-size", c->pg_pool_size,
                  "PostgreSQL connections in the pool")
      ->envname("IDEM_PG_POOL_SIZE")
      ->capture_default_str();
  app->add_option("--local-cache-mib", c->local_cache_mib,
                  "MiB of finished records kept in this process for replays "
                  "(each no longer than its retention, at most 1m; 0: off)")
      ->envname("IDEM_LOCAL_CACHE_MIB")
      ->capture_default_str();
  app->add_option("--pg-max-batch", c->pg_max_batch,
                  "most concurrent reads, inserts or updates folded into one "
                  "statement and one commit (1: no batching)")
      ->envname("IDEM_PG_MAX_BATCH")
      ->capture_default_str();
  app->add_option("--pg-batch-inflight", c->pg_batch_inflight,
                  "batches of each kind (reads, inserts, updates) in flight "
                  "at once, each on a store thread of its own and a pooled "
                  "connection; with --pg-max-batch 1, one thread per "
                  "connection for each kind")
      ->envname("IDEM_PG_BATCH_INFLIGHT")
      ->capture_default_str();
  app->add_option("--pg-connect-timeout", c->pg_connect_timeout,
                  "bound on opening a PostgreSQL connection (at least 2s)")
      ->envname("IDEM_PG_CONNECT_TIMEOUT")
      ->capture_default_str();
  app->add_option("--pg-statement-timeout", c->pg_statement_timeout,
                  "bound on one statement and on waiting for a pooled "
                  "connection; past it a call is UNAVAILABLE")
      ->envname("IDEM_PG_STATEMENT_TIMEOUT")
      ->capture_default_str();
  app->add_option("--metrics-listen", c->metrics_listen,
                  "Prometheus metrics address (host:port, or off)")
      ->envname("IDEM_METRICS_LISTEN")
      ->capture_default_str();
  app->add_option("--config", c->config,
                  "YAML file with per-operation policies (see docs/)")
      ->envname("IDEM_CONFIG");
  app->add_flag("--migrate", c->migrate, "apply pending migrations, then serve")
      ->envname("IDEM_MIGRATE");
  app->add_option("--store", c->store,
                  "postgres, or memory (one instance, not durable: tests "
                  "and demos only)")
      ->envname("IDEM_STORE")
      ->capture_default_str();
  AddTlsKeyPairFlags(app,
                     "PEM certificate chain of the gRPC port (re-read when "
                     "it changes)",
                     &c->tls);
  app->add_option("--tls-client-ca", c->tls_client_ca,
                  "PEM CA bundle: require and verify client certificates "
                  "(mutual TLS); needs --auth-tokens to map SANs")
      ->envname("IDEM_TLS_CLIENT_CA");
  app->add_option("--auth-tokens", c->auth_tokens,
                  "JSON file of principals (bearer tokens, certificate SANs, "
                  "roles, tenants); turns authentication on; re-read when it "
                  "changes; removing it revokes every principal")
      ->envname("IDEM_AUTH_TOKENS");
  app->add_option("--tenant-rate", c->tenant_rate,
                  "business calls per second allowed per tenant (0: no limit)")
      ->envname("IDEM_TENANT_RATE")
      ->capture_default_str();
  app->add_option("--tenant-burst", c->tenant_burst,
                  "calls a tenant may make at once above --tenant-rate")
      ->envname("IDEM_TENANT_BURST")
      ->capture_default_str();
  app->add_option("--max-processing-per-tenant", c->max_processing_per_tenant,
                  "open PROCESSING records a tenant may have (0: no cap)")
      ->envname("IDEM_MAX_PROCESSING_PER_TENANT")
      ->capture_default_str();
  app->add_option("--max-concurrent-streams", c->max_concurrent_streams,
                  "concurrent calls per client connection")
      ->envname("IDEM_MAX_CONCURRENT_STREAMS")
      ->capture_default_str();
  app->add_option("--rpc-threads", c->rpc_threads,
                  "threads that take the Idempotency service's calls and "
                  "answer replays from the caches (0: one per two cores, at "
                  "least one)")
      ->envname("IDEM_RPC_THREADS")
      ->capture_default_str();
  app->add_option("--max-waiters", c->max_waiters,
                  "Begin calls with `wait` parked in this instance at once "
                  "(past it: RESOURCE_EXHAUSTED)")
      ->envname("IDEM_MAX_WAITERS")
      ->capture_default_str();
  app->add_option("--max-waiters-per-tenant", c->max_waiters_per_tenant,
                  "parked Begin calls of one tenant")
      ->envname("IDEM_MAX_WAITERS_PER_TENANT")
      ->capture_default_str();
  app->add_option("--max-waiters-per-key", c->max_waiters_per_key,
                  "parked Begin calls on one record")
      ->envname("IDEM_MAX_WAITERS_PER_KEY")
      ->capture_default_str();
  app->add_option("--max-calls-in-flight", c->max_calls_in_flight,
                  "Idempotency calls taken and not yet answered, parked ones "
                  "included (past it: RESOURCE_EXHAUSTED; 0: no bound)")
      ->envname("IDEM_MAX_CALLS_IN_FLIGHT")
      ->capture_default_str();
  app->add_option("--max-admin-calls-in-flight", c->max_admin_calls_in_flight,
                  "IdempotencyAdmin calls taken and not yet answered, counted "
                  "apart from --max-calls-in-flight (past it: "
                  "RESOURCE_EXHAUSTED; 0: no bound)")
      ->envname("IDEM_MAX_ADMIN_CALLS_IN_FLIGHT")
      ->capture_default_str();
  app->add_option("--max-health-watches", c->max_health_watches,
                  "open grpc.health.v1.Health/Watch streams (past it Watch "
                  "is RESOURCE_EXHAUSTED, Check is not affected)")
      ->envname("IDEM_MAX_HEALTH_WATCHES")
      ->capture_default_str();
  app->add_flag("--insecure", c->insecure,
                "allow a non-loopback --listen without --auth-tokens (with or "
                "without TLS): every caller is an operator of every tenant")
      ->envname("IDEM_INSECURE");
  app->add_option("--log-level", c->log_level, "debug, info, warn or error")
      ->envname("IDEM_LOG_LEVEL")
      ->capture_default_str();
}

// The HTTP gateway, the background loops and the Redis cache.
void AddGatewayAndCacheFlags(CLI::App* app, SidecarConfig* c) {
  app->add_option("--http-listen", c->http_listen,
                  "serve the HTTP gateway here (host:port): Idempotency-Key "
                  "in front of --http-upstream (docs/gateway.md); off by "
                  "default")
      ->envname("IDEM_HTTP_LISTEN");
  app->add_option("--http-upstream", c->http_upstream,
                  "the HTTP service behind the gateway (http://host:port)")
      ->envname("IDEM_HTTP_UPSTREAM");
  app->add_option("--http-tenant", c->http_tenant,
                  "tenant of the gateway's records")
      ->envname("IDEM_HTTP_TENANT")
      ->capture_default_str();
  app->add_option("--http-threads", c->http_threads,
                  "threads of the gateway's event loop")
      ->envname("IDEM_HTTP_THREADS")
      ->capture_default_str();
  app->add_option("--http-max-connections", c->http_max_connections,
                  "gateway client connections open at once; past it new ones "
                  "are closed")
      ->envname("IDEM_HTTP_MAX_CONNECTIONS")
      ->capture_default_str();
  app->add_option("--http-max-body", c->http_max_body,
                  "largest request body through the gateway, in bytes, unless "
                  "a route sets max_body (larger: 413)")
      ->envname("IDEM_HTTP_MAX_BODY")
      ->capture_default_str();
  app->add_option("--http-upstream-timeout", c->http_upstream_timeout,
                  "longest wait for the service's answer, unless a route "
                  "sets timeout")
      ->envname("IDEM_HTTP_UPSTREAM_TIMEOUT")
      ->capture_default_str();
  app->add_option("--http-idle-timeout", c->http_idle_timeout,
                  "a gateway connection idle, or a request not read whole, "
                  "this long is closed")
      ->envname("IDEM_HTTP_IDLE_TIMEOUT")
      ->capture_default_str();
  app->add_option("--max-snapshot-bytes", c->max_snapshot_bytes,
                  "largest result snapshot accepted (body + content type + "
                  "headers)")
      ->envname("IDEM_MAX_SNAPSHOT_BYTES")
      ->capture_default_str();
  app->add_option("--grace-period", c->grace_period,
                  "on SIGTERM, how long in-flight calls may take to finish")
      ->envname("IDEM_GRACE_PERIOD")
      ->capture_default_str();
  app->add_option("--drain-delay", c->drain_delay,
                  "on SIGTERM, how long to keep serving with health "
                  "NOT_SERVING before refusing new calls")
      ->envname("IDEM_DRAIN_DELAY")
      ->capture_default_str();
  app->add_option("--reaper-interval", c->reaper_interval,
                  "how often this instance moves PROCESSING records whose "
                  "lease ran out to their expiry policy")
      ->envname("IDEM_REAPER_INTERVAL")
      ->capture_default_str();
  app->add_option("--purge-interval", c->purge_interval,
                  "how often this instance deletes terminal records past "
                  "their retention")
      ->envname("IDEM_PURGE_INTERVAL")
      ->capture_default_str();
  app->add_option("--reconcile-interval", c->reconcile_interval,
                  "how often this instance probes UNKNOWN records of "
                  "operations whose policy names a probe")
      ->envname("IDEM_RECONCILE_INTERVAL")
      ->capture_default_str();
  app->add_option("--maintenance-batch", c->maintenance_batch,
                  "records per reaper or purge transaction")
      ->envname("IDEM_MAINTENANCE_BATCH")
      ->capture_default_str();
  app->add_option("--redis", c->redis,
                  "Redis cache of finished records (HOST:PORT or "
                  "unix:/path/to.sock; empty: off). Never authoritative: "
                  "lookups fall through to PostgreSQL when it misses or fails")
      ->envname("IDEM_REDIS");
  app->add_option("--redis-user", c->redis_user,
                  "Redis ACL user for AUTH (needs a password)")
      ->envname("IDEM_REDIS_USER");
  app->add_option("--redis-password-file", c->redis_password_file,
                  "file holding the Redis password (trailing newlines "
                  "ignored); or set IDEM_REDIS_PASSWORD. Never a flag value")
      ->envname("IDEM_REDIS_PASSWORD_FILE");
  app->add_option("--redis-mac-key-file", c->redis_mac_key_file,
                  "file holding the key (at least 32 bytes; trailing newlines "
                  "ignored) that signs and verifies cached records "
                  "(HMAC-SHA256), the same on every instance; or set "
                  "IDEM_REDIS_MAC_KEY. Required with --redis")
      ->envname("IDEM_REDIS_MAC_KEY_FILE");
  app->add_option("--redis-mac-previous-key-file",
                  c->redis_mac_previous_key_file,
                  "while keys rotate: file holding the previous key, still "
                  "accepted for cached records but never used to sign; or set "
                  "IDEM_REDIS_MAC_PREVIOUS_KEY")
      ->envname("IDEM_REDIS_MAC_PREVIOUS_KEY_FILE");
  app->add_option("--redis-timeout", c->redis_timeout,
                  "bound on connecting to Redis and on each Redis command; "
                  "past it the call falls through to PostgreSQL")
      ->envname("IDEM_REDIS_TIMEOUT")
      ->capture_default_str();
  app->add_option("--redis-pool-size", c->redis_pool_size,
                  "Redis connections in the pool")
      ->envname("IDEM_REDIS_POOL_SIZE")
      ->capture_default_str();
  app->add_option("--redis-backoff-min", c->redis_backoff_min,
                  "after a Redis timeout or connection failure, calls skip "
                  "Redis until a probe answers; the first probe comes this "
                  "long after the failure")
      ->envname("IDEM_REDIS_BACKOFF_MIN")
      ->capture_default_str();
  app->add_option("--redis-backoff-max", c->redis_backoff_max,
                  "the wait between failed probes doubles up to this")
      ->envname("IDEM_REDIS_BACKOFF_MAX")
      ->capture_default_str();
}

// The value of environment variable `name`, or "".
std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

}  // namespace

std::optional<int> ParseCommandLine(int argc, char** argv, CommandLine* out) {
  SidecarConfig& c = out->config;
  CLI::App app{
      "idempotency-sidecar: an idempotency gRPC service over PostgreSQL.\n"
      "Every flag has an IDEM_* environment twin (e.g. IDEM_POSTGRES)."};
  AddServingFlags(&app, &c);
  AddGatewayAndCacheFlags(&app, &c);
  CLI::App* migrate =
      app.add_subcommand("migrate", "apply pending migrations and exit");
  PostgresFlags migrate_postgres;
  AddPostgresFlags(migrate, &migrate_postgres);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  c.redis_password_env = Env("IDEM_REDIS_PASSWORD");
  c.redis_mac_key_env = Env("IDEM_REDIS_MAC_KEY");
  c.redis_mac_previous_key_env = Env("IDEM_REDIS_MAC_PREVIOUS_KEY");
  out->migrate_only = migrate->parsed();
  if (out->migrate_only) {
    out->migrate_conninfo =
        !migrate_postgres.direct.empty()     ? migrate_postgres.direct
        : !c.postgres.direct.empty()         ? c.postgres.direct
        : !migrate_postgres.conninfo.empty() ? migrate_postgres.conninfo
                                             : c.postgres.conninfo;
  }
  return std::nullopt;
}

}  // namespace idem
