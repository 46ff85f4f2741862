// Every thread the sidecar starts, by the name it carries (thread_name.h;
// `top -H`, perf and /proc/<pid>/task/*/comm show it). Threads not listed
// are the libraries': gRPC's (its event engine, resolver and timer threads)
// and the metrics endpoint's (prometheus-cpp's civetweb workers).
#ifndef IDEM_SERVER_BASE_THREAD_NAMES_H_
#define IDEM_SERVER_BASE_THREAD_NAMES_H_

namespace idem::thread_names {

// Take the Idempotency service's calls and answer them; --rpc-threads
// (default one per two cores). async_server.h.
inline constexpr char kRpc[] = "idem-rpc";
// The record calls of the PostgreSQL store, each kind batched on threads of
// its own: --pg-batch-inflight each (default 1), or --pg-pool-size each with
// batching off (--pg-max-batch 1). postgres_store.cc.
// Reads (Get, a Begin's rounds after a lost race, parked Begins' reads).
inline constexpr char kPgRead[] = "idem-pg-read";
// Begin's first statement (insert-or-read).
inline constexpr char kPgInsert[] = "idem-pg-insert";
// Writes after a read: holders' guarded updates, expiries, resolutions.
inline constexpr char kPgUpdate[] = "idem-pg-update";
// The lone-call lane's connection: reads its results and answers their
// calls; one. pg_lane.h.
inline constexpr char kPgLane[] = "idem-pg-lane";
// Counts of a tenant's open records (--max-processing-per-tenant); one.
inline constexpr char kPgCount[] = "idem-pg-count";
// The admin service's queries (List, History); two. postgres_store.cc.
inline constexpr char kPgAdmin[] = "idem-pg-admin";
// The one LISTEN connection of the change feed. pg_listener.h.
inline constexpr char kPgListen[] = "idem-pg-listen";
// Deadlines and lease expiry of parked Begins. begin_waiters.h.
inline constexpr char kWaitTimer[] = "idem-wait-timer";
// Redis fills of finished records, batched (two). redis_store.cc.
inline constexpr char kRedisSet[] = "idem-redis-set";
// Reconnects Redis and trips its breaker. redis_client.cc.
inline constexpr char kRedisMonitor[] = "idem-redis-mon";
// The store ping behind health. health.h.
inline constexpr char kHealth[] = "idem-health";
// The lease reaper, the purge and the record counts. maintenance.h.
inline constexpr char kMaintenance[] = "idem-maint";
// Probes of UNKNOWN records. reconciler.h.
inline constexpr char kReconciler[] = "idem-reconcile";
// The HTTP gateway's event loop: --http-threads (default 1). gateway.h.
inline constexpr char kHttp[] = "idem-http";
// The operator console's event loop. console.h.
inline constexpr char kConsole[] = "idem-console";
// The short periodic jobs, one at a time (periodic.h): the statement
// watchdog of each PostgreSQL pool (pg_pool.h), the console's vitals sampler
// (vitals.h) and the --auth-tokens watch (auth.h).
inline constexpr char kTimer[] = "idem-timer";

}  // namespace idem::thread_names

#endif  // IDEM_SERVER_BASE_THREAD_NAMES_H_
