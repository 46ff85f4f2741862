// The system under test for one scenario: a PostgreSQL cluster, a Redis
// server, N idempotency-sidecar processes and a fault proxy on each of their
// links (clients -> sidecar i, sidecar i -> PostgreSQL, sidecar i -> Redis),
// plus the business tables the workers write their effects to. With
// IDEM_TEST_PGBOUNCER=1 the sidecars' pools reach PostgreSQL through a
// transaction-pooling PgBouncer (sidecar i -> proxy -> PgBouncer), with
// --pg-prepared=off; their LISTEN connections go to PostgreSQL directly.
// With ClusterOptions::patroni, PostgreSQL is three nodes under Patroni
// instead, which the sidecars reach directly (no PostgreSQL proxies). With
// ClusterOptions::citus (or IDEM_TEST_CITUS=1 for the scenarios without a
// standby or Patroni), PostgreSQL is a Citus coordinator with two workers,
// the tables distributed by --migrate; the sidecars reach the coordinator
// through their proxies, and the PostgreSQL faults hit the coordinator.
#ifndef IDEM_TESTS_FAULTS_CLUSTER_H_
#define IDEM_TESTS_FAULTS_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/faults/fault_proxy.h"
#include "tests/faults/history.h"
#include "tests/testing/citus_cluster.h"
#include "tests/testing/patroni_cluster.h"
#include "tests/testing/pg_cluster.h"
#include "tests/testing/pgbouncer.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/sidecar_process.h"

namespace idem::faults {

inline constexpr int64_t kRetentionMs = 24 * 3600 * 1000;

struct ClusterOptions {
  std::string sidecar_path;
  int sidecars = 3;
  // Per sidecar: a faketime offset such as "+1h" (empty: the real clock).
  std::vector<std::string> clock_offsets;
  // Appended to every sidecar's arguments (e.g. to try a broken setup such
  // as --store=memory and watch the checker fail).
  std::vector<std::string> extra_args;
  // Where the sidecars' logs are copied when the scenario fails.
  std::string artifacts_dir;
  // A synchronous streaming standby of PostgreSQL: every commit waits until
  // the standby has it. Sidecars and clients then name both servers in one
  // conninfo (target_session_attrs=read-write) and find the primary
  // themselves, before and after a failover.
  bool standby = false;
  // Three PostgreSQL nodes under Patroni and etcd (synchronous_mode) instead
  // of one server: sidecars and clients name the three in one conninfo
  // (target_session_attrs=read-write). No PgBouncer, no PostgreSQL proxies.
  bool patroni = false;
  // A Citus coordinator and two workers (testing::CitusCluster) instead of
  // one server. No PgBouncer.
  bool citus = false;
};

class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(
      const ClusterOptions& options);
  ~Cluster();

  int size() const { return static_cast<int>(sidecars_.size()); }
  // The first primary (after a failover: the dead one); not with patroni
  // or citus.
  testing::PgCluster& pg() { return *pg_; }
  // The server the sidecars write to first: the primary, or the Citus
  // coordinator; not with patroni.
  testing::PgCluster& Primary() const {
    return citus_ != nullptr ? citus_->coordinator() : *pg_;
  }
  // The standby (ClusterOptions::standby); after FailOver(), the primary.
  testing::PgCluster& standby() { return *standby_; }
  // ClusterOptions::patroni's nodes.
  testing::PatroniCluster& patroni() { return *patroni_; }
  // ClusterOptions::citus's nodes.
  testing::CitusCluster& citus() { return *citus_; }
  testing::RedisServer& redis() { return *redis_; }
  testing::SidecarProcess& sidecar(int i) { return *sidecars_[i]; }
  FaultProxy& client_proxy(int i) { return *client_proxies_[i]; }
  FaultProxy& pg_proxy(int i) { return *pg_proxies_[i]; }
  FaultProxy& redis_proxy(int i) { return *redis_proxies_[i]; }

  // The addresses clients dial (through the client proxies).
  std::vector<std::string> ClientAddresses() const;
  // A libpq conninfo straight to PostgreSQL (not proxied); with a standby
  // or Patroni, to whichever server is the primary; on Citus, the
  // coordinator.
  std::string DirectConnInfo() const;
  // Runs `sql` with psql on the (first) primary; under Patroni, the leader;
  // on Citus, the coordinator.
  absl::StatusOr<std::string> Psql(const std::string& sql) const;

  // Kills the primary with SIGKILL (postmaster and backends, as when its
  // machine dies) and, after `detection` (a failure detector's delay),
  // promotes the standby. The old primary is never started again (two
  // primaries would split the history).
  absl::Status FailOver(absl::Duration detection);

  // Restarts sidecar i (after it was killed) with the same ports.
  absl::Status RestartSidecar(int i);
  // Kills sidecar i and starts it again under faketime with `offset`
  // ("+1h", "-30m"; empty: the real clock).
  absl::Status RestartSidecarWithClock(int i, const std::string& offset);
  const std::string& clock_offset(int i) const { return offsets_[i]; }

  // Heals every fault: proxies pass, PostgreSQL and Redis running and not
  // paused, every sidecar running; then waits until each answers health
  // SERVING. Errors name what did not come back.
  absl::Status HealAll(absl::Duration timeout = absl::Seconds(60));

  // Reads records, audit rows and effects from PostgreSQL and every idem:*
  // entry from Redis.
  absl::StatusOr<FinalState> Scan();

  // Writes each sidecar's log to `dir`/sidecar-<i>.log and PostgreSQL's.
  void SaveLogs(const std::string& dir);

  // Bookkeeping of PostgreSQL (Primary()) and Redis state for HealAll.
  bool pg_paused = false;
  bool pg_stopped = false;
  bool redis_paused = false;
  bool redis_killed = false;
  bool failed_over = false;

 private:
  Cluster() = default;
  absl::StatusOr<std::unique_ptr<testing::SidecarProcess>> SpawnSidecar(
      int i, int port);
  // Starts the standby and makes it synchronous.
  absl::Status StartStandby();

  ClusterOptions options_;
  std::string dir_;
  std::string config_path_;
  std::string mac_key_path_;  // --redis-mac-key-file
  std::unique_ptr<testing::PgCluster> pg_;
  std::unique_ptr<testing::PgCluster> standby_;
  std::unique_ptr<testing::PatroniCluster> patroni_;
  std::unique_ptr<testing::CitusCluster> citus_;
  std::unique_ptr<testing::PgBouncer> bouncer_;  // IDEM_TEST_PGBOUNCER=1
  std::unique_ptr<testing::RedisServer> redis_;
  std::vector<std::unique_ptr<FaultProxy>> pg_proxies_;
  std::vector<std::unique_ptr<FaultProxy>> redis_proxies_;
  std::vector<std::unique_ptr<FaultProxy>> client_proxies_;
  std::vector<std::unique_ptr<testing::SidecarProcess>> sidecars_;
  std::vector<int> ports_;
  std::vector<std::string> offsets_;
};

// Returns true iff the sidecar at `address` answers health SERVING within
// `timeout`.
bool WaitServing(const std::string& address, absl::Duration timeout);

}  // namespace idem::faults

#endif  // IDEM_TESTS_FAULTS_CLUSTER_H_
