#include "server/main/sidecar_flags.h"

#include <CLI/CLI.hpp>
#include <cstdlib>

#include "server/main/flag_groups.h"

namespace idem {
namespace {

// The gRPC port, PostgreSQL, security and limits.
void AddServingFlags(CLI::App* app, SidecarConfig* c) {
  AddOption(app, "listen", &c->listen,
            "gRPC address (host:port); it must be free: two instances never "
            "share a port");
  AddPostgresFlags(app, &c->postgres);
  AddOption(app, "pg-prepared", &c->pg_prepared,
            "on: named prepared statements; off: unnamed statements and "
            "no session settings, for PgBouncer's transaction pooling");
  AddOption(app, "pg-pool-size", &c->pg_pool_size,
            "PostgreSQL connections in the pool");
  AddOption(app, "pg-lone-lane", &c->pg_lone_lane,
            "on: a call with nothing else in flight goes to PostgreSQL "
            "from the thread that took it, on one more connection, and is "
            "answered from the thread that reads the result; off: every "
            "call through the batch threads");
  AddOption(app, "local-cache-mib", &c->local_cache_mib,
            "MiB of finished records kept in this process for replays "
            "(each no longer than its retention, at most 1m; 0: off)");
  AddOption(app, "pg-max-batch", &c->pg_max_batch,
            "most concurrent reads, inserts or updates folded into one "
            "statement and one commit (1: no batching)");
  AddOption(app, "pg-batch-inflight", &c->pg_batch_inflight,
            "batches of each kind (reads, inserts, updates) in flight "
            "at once, each on a store thread of its own and a pooled "
            "connection; with --pg-max-batch 1, one thread per "
            "connection for each kind");
  AddOption(app, "pg-connect-timeout", &c->pg_connect_timeout,
            "bound on opening a PostgreSQL connection (at least 2s)");
  AddOption(app, "pg-statement-timeout", &c->pg_statement_timeout,
            "bound on one statement and on waiting for a pooled "
            "connection; past it a call is UNAVAILABLE");
  AddOption(app, "metrics-listen", &c->metrics_listen,
            "Prometheus metrics address (host:port, or off)");
  AddOption(app, "config", &c->config,
            "YAML file with per-operation policies (see docs/)");
  AddFlag(app, "migrate", &c->migrate,
          "apply pending migrations (on Citus, then distribute the tables "
          "by tenant), then serve");
  AddOption(app, "store", &c->store,
            "postgres, or memory (one instance, not durable: tests "
            "and demos only)");
  AddTlsKeyPairFlags(app,
                     "PEM certificate chain of the gRPC port (re-read when "
                     "it changes)",
                     &c->tls);
  AddOption(app, "tls-client-ca", &c->tls_client_ca,
            "PEM CA bundle: require and verify client certificates "
            "(mutual TLS); needs --auth-tokens to map SANs");
  AddOption(app, "auth-tokens", &c->auth_tokens,
            "JSON file of principals (bearer tokens, certificate SANs, "
            "roles, tenants); turns authentication on; re-read when it "
            "changes; removing it revokes every principal");
  AddOption(app, "tenant-rate", &c->tenant_rate,
            "business calls per second allowed per tenant (0: no limit)");
  AddOption(app, "tenant-burst", &c->tenant_burst,
            "calls a tenant may make at once above --tenant-rate");
  AddOption(app, "max-processing-per-tenant", &c->max_processing_per_tenant,
            "open PROCESSING records a tenant may have (0: no cap)");
  AddOption(app, "max-concurrent-streams", &c->max_concurrent_streams,
            "concurrent calls per client connection");
  AddOption(app, "rpc-threads", &c->rpc_threads,
            "threads that take the Idempotency service's calls and "
            "answer replays from the caches (0: one per two cores, at "
            "least one)");
  AddOption(app, "max-waiters", &c->max_waiters,
            "Begin calls with `wait` parked in this instance at once "
            "(past it: RESOURCE_EXHAUSTED)");
  AddOption(app, "max-waiters-per-tenant", &c->max_waiters_per_tenant,
            "parked Begin calls of one tenant");
  AddOption(app, "max-waiters-per-key", &c->max_waiters_per_key,
            "parked Begin calls on one record");
  AddOption(app, "max-calls-in-flight", &c->max_calls_in_flight,
            "Idempotency calls taken and not yet answered, parked ones "
            "included (past it: RESOURCE_EXHAUSTED; 0: no bound)");
  AddOption(app, "max-admin-calls-in-flight", &c->max_admin_calls_in_flight,
            "IdempotencyAdmin calls taken and not yet answered, counted "
            "apart from --max-calls-in-flight (past it: "
            "RESOURCE_EXHAUSTED; 0: no bound)");
  AddOption(app, "max-health-watches", &c->max_health_watches,
            "open grpc.health.v1.Health/Watch streams (past it Watch "
            "is RESOURCE_EXHAUSTED, Check is not affected)");
  AddFlag(app, "insecure", &c->insecure,
          "allow a non-loopback --listen without --auth-tokens (with or "
          "without TLS): every caller is an operator of every tenant");
  AddOption(app, "log-level", &c->log_level, "debug, info, warn or error");
}

// The HTTP gateway, the background loops and the Redis cache.
void AddGatewayAndCacheFlags(CLI::App* app, SidecarConfig* c) {
  AddOption(app, "console-listen", &c->console_listen,
            "serve the operator console here (host:port): a page and JSON "
            "API over List, Get, History and Resolve for operator tokens "
            "(docs/console.md); without --auth-tokens loopback only; off "
            "by default");
  AddOption(app, "http-listen", &c->http_listen,
            "serve the HTTP gateway here (host:port): Idempotency-Key "
            "in front of --http-upstream (docs/gateway.md); off by "
            "default");
  AddOption(app, "http-upstream", &c->http_upstream,
            "the HTTP service behind the gateway (http://host:port)");
  AddOption(app, "http-tenant", &c->http_tenant,
            "tenant of the gateway's records");
  AddOption(app, "http-threads", &c->http_threads,
            "threads of the gateway's event loop");
  AddOption(app, "http-max-connections", &c->http_max_connections,
            "gateway client connections open at once; past it new ones "
            "are closed");
  AddOption(app, "http-max-body", &c->http_max_body,
            "largest request body through the gateway, in bytes, unless "
            "a route sets max_body (larger: 413)");
  AddOption(app, "http-upstream-timeout", &c->http_upstream_timeout,
            "longest wait for the service's answer, unless a route "
            "sets timeout");
  AddOption(app, "http-idle-timeout", &c->http_idle_timeout,
            "a gateway connection idle, or a request not read whole, "
            "this long is closed");
  AddOption(app, "http-upstream-keepalive", &c->http_upstream_keepalive,
            "idle keep-alive connections to the service kept for the next "
            "request (0: a new connection for every request)");
  AddOption(app, "http-upstream-keepalive-timeout",
            &c->http_upstream_keepalive_timeout,
            "an idle connection to the service older than this is closed; "
            "keep it below the service's own keep-alive timeout");
  AddOption(app, "max-snapshot-bytes", &c->max_snapshot_bytes,
            "largest result snapshot accepted (body + content type + "
            "headers)");
  AddOption(app, "grace-period", &c->grace_period,
            "on SIGTERM, how long in-flight calls may take to finish");
  AddOption(app, "drain-delay", &c->drain_delay,
            "on SIGTERM, how long to keep serving with health "
            "NOT_SERVING before refusing new calls");
  AddOption(app, "reaper-interval", &c->reaper_interval,
            "how often this instance moves PROCESSING records whose "
            "lease ran out to their expiry policy");
  AddOption(app, "purge-interval", &c->purge_interval,
            "how often this instance deletes terminal records past "
            "their retention");
  AddOption(app, "reconcile-interval", &c->reconcile_interval,
            "how often this instance probes UNKNOWN records of "
            "operations whose policy names a probe");
  AddOption(app, "maintenance-batch", &c->maintenance_batch,
            "records per reaper or purge transaction");
  AddOption(app, "redis", &c->redis,
            "Redis cache of finished records (HOST:PORT or "
            "unix:/path/to.sock; empty: off). Never authoritative: "
            "lookups fall through to PostgreSQL when it misses or fails");
  AddOption(app, "redis-user", &c->redis_user,
            "Redis ACL user for AUTH (needs a password)");
  AddOption(app, "redis-password-file", &c->redis_password_file,
            "file holding the Redis password (trailing newlines "
            "ignored); or set IDEM_REDIS_PASSWORD. Never a flag value");
  AddOption(app, "redis-mac-key-file", &c->redis_mac_key_file,
            "file holding the key (at least 32 bytes; trailing newlines "
            "ignored) that signs and verifies cached records "
            "(HMAC-SHA256), the same on every instance; or set "
            "IDEM_REDIS_MAC_KEY. Required with --redis");
  AddOption(app, "redis-mac-previous-key-file", &c->redis_mac_previous_key_file,
            "while keys rotate: file holding the previous key, still "
            "accepted for cached records but never used to sign; or set "
            "IDEM_REDIS_MAC_PREVIOUS_KEY");
  AddOption(app, "redis-timeout", &c->redis_timeout,
            "bound on connecting to Redis and on each Redis command; "
            "past it the call falls through to PostgreSQL");
  AddOption(app, "redis-pool-size", &c->redis_pool_size,
            "Redis connections in the pool");
  AddOption(app, "redis-backoff-min", &c->redis_backoff_min,
            "after a Redis timeout or connection failure, calls skip "
            "Redis until a probe answers; the first probe comes this "
            "long after the failure");
  AddOption(app, "redis-backoff-max", &c->redis_backoff_max,
            "the wait between failed probes doubles up to this");
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
      app.add_subcommand("migrate",
                         "apply pending migrations (on Citus, then distribute "
                         "the tables by tenant) and exit");
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
