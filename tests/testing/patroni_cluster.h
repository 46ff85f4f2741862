#ifndef IDEM_TESTS_TESTING_PATRONI_CLUSTER_H_
#define IDEM_TESTS_TESTING_PATRONI_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/process.h"

namespace idem::testing {

// A throwaway high-availability PostgreSQL cluster as a user would run it:
// one etcd (Debian's etcd-server) as Patroni's configuration store and
// `nodes` Patroni agents (Debian's patroni), each managing a PostgreSQL
// data directory of its own, all on 127.0.0.1 on free ports. Patroni
// bootstraps the first leader (initdb: user postgres, trust from
// 127.0.0.1, UTF8) and clones the others from it with pg_basebackup. When
// the caller is root, Patroni and PostgreSQL run as the `postgres` user.
// Not thread-safe.
class PatroniCluster {
 public:
  struct Options {
    int nodes = 3;
    // Patroni's leader lock: the leader renews it every `loop_wait_s`; when
    // nobody renews it for `ttl_s`, the healthiest eligible replica takes it
    // and promotes itself. Patroni asks ttl >= loop_wait + 2 * retry_timeout.
    int ttl_s = 10;
    int loop_wait_s = 2;
    int retry_timeout_s = 4;
    // Patroni's synchronous_mode: one replica is a synchronous standby (every
    // commit waits for it) and only that replica may be promoted.
    bool synchronous_mode = true;
  };

  // Creates /tmp/idem-patroni-XXXXXX, starts etcd and the Patroni agents
  // and waits (up to `timeout`) until WaitHealthy() holds. FAILED_PRECONDITION
  // when etcd or patroni is not installed; other errors carry the logs.
  static absl::StatusOr<std::unique_ptr<PatroniCluster>> Start(
      const Options& options, absl::Duration timeout = absl::Seconds(180));

  PatroniCluster(const PatroniCluster&) = delete;
  PatroniCluster& operator=(const PatroniCluster&) = delete;
  // Kills every agent, stops every PostgreSQL (immediate mode), kills etcd
  // and removes the directory.
  ~PatroniCluster();

  int size() const { return static_cast<int>(nodes_.size()); }
  const Options& options() const { return options_; }
  // PostgreSQL's and Patroni's REST API's port of node i.
  int pg_port(int i) const { return nodes_[i].pg_port; }
  int rest_port(int i) const { return nodes_[i].rest_port; }
  // False once KillNode(i) ran.
  bool alive(int i) const { return nodes_[i].patroni != nullptr; }

  // A libpq conninfo naming every node, with target_session_attrs=read-write
  // (libpq connects to whichever is the primary), as the superuser.
  std::string ConnInfo(const std::string& dbname = "postgres") const;

  // The node that holds Patroni's leader lock (its REST API answers 200 to
  // GET /leader); NOT_FOUND when no live node does.
  absl::StatusOr<int> Leader() const;
  // The node Patroni made the synchronous standby (200 to GET /sync);
  // NOT_FOUND when no live node is.
  absl::StatusOr<int> SyncStandby() const;

  // Waits until there is a leader that accepts writes and, with
  // synchronous_mode, a synchronous standby that the leader's
  // pg_stat_replication shows as `sync`.
  absl::Status WaitHealthy(absl::Duration timeout);

  // Kills node i as when its machine dies: SIGKILL to its Patroni agent and,
  // at the same moment, to its postmaster and every backend. The node is
  // never started again.
  absl::Status KillNode(int i);

  // Runs `sql` with psql on node i, as PgCluster::Psql.
  absl::StatusOr<std::string> Psql(
      int i, const std::string& sql,
      absl::Duration timeout = absl::Seconds(60)) const;

  // Node i's Patroni log (PostgreSQL's log is in it), etcd's log.
  std::string NodeLog(int i) const;
  std::string EtcdLog() const;

 private:
  struct Node {
    std::string name;
    std::string dir;
    std::string data_dir;
    std::string config_path;
    int pg_port = 0;
    int rest_port = 0;
    std::unique_ptr<Process> patroni;
  };

  PatroniCluster(Options options, std::string dir)
      : options_(options), dir_(std::move(dir)) {}

  absl::Status StartEtcd();
  absl::Status WriteConfig(const Node& node) const;
  // The HTTP status code node i's REST API answers to GET `path`, or 0.
  int RestStatus(int i, const std::string& path) const;
  // Runs a PostgreSQL binary (pg_ctl, ...) as the data directories' owner.
  std::vector<std::string> AsOwner(const std::string& bin) const;
  // All logs, for errors.
  std::string Logs() const;

  const Options options_;
  const std::string dir_;
  std::string bindir_;
  int etcd_port_ = 0;
  std::unique_ptr<Process> etcd_;
  std::vector<Node> nodes_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_PATRONI_CLUSTER_H_
