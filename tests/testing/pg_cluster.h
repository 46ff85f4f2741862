#ifndef IDEM_TESTS_TESTING_PG_CLUSTER_H_
#define IDEM_TESTS_TESTING_PG_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace idem::testing {

// A throwaway PostgreSQL cluster in a temporary directory, listening on
// 127.0.0.1 on a free port, with fsync on (durability tests use it). When
// the caller is root, the server runs as the `postgres` user. The binaries
// are taken from $IDEM_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin,
// else PATH. Not thread-safe.
class PgCluster {
 public:
  // Creates /tmp/idem-pg-XXXXXX, runs initdb (user postgres, trust auth,
  // UTF8), starts the server and waits (up to 30 s) until it accepts
  // connections. The error carries the server log when start-up fails.
  // `settings` are more postgresql.conf lines (e.g. to preload Citus).
  static absl::StatusOr<std::unique_ptr<PgCluster>> Start(
      const std::vector<std::string>& settings = {});

  // Returns the directory holding the server's binaries that Start() uses
  // ("" when they are taken from PATH).
  static std::string BinDir();

  // Starts a streaming-replication standby of the running `primary`
  // (pg_basebackup -R, WAL streamed) in a temporary directory of its own on
  // another free port, and waits until it accepts (read-only) connections.
  // The primary's pg_hba.conf of initdb lets replication in from 127.0.0.1.
  static absl::StatusOr<std::unique_ptr<PgCluster>> StartStandby(
      const PgCluster& primary);

  PgCluster(const PgCluster&) = delete;
  PgCluster& operator=(const PgCluster&) = delete;
  // Stops the server (immediate mode) and removes the directory.
  ~PgCluster();

  // Returns a libpq conninfo for the superuser, e.g. "host=127.0.0.1
  // port=N user=postgres dbname=postgres".
  std::string ConnInfo(const std::string& dbname = "postgres") const;

  // Returns the TCP port the server listens on (the same across restarts).
  int port() const { return port_; }

  // Returns the temporary directory (data in dir()/data, log in dir()/log).
  const std::string& dir() const { return dir_; }

  // Returns the server log.
  std::string Log() const;

  // Stops the server with `pg_ctl stop -m fast` and waits until it is down.
  absl::Status Stop();

  // Stops the server with `pg_ctl stop -m immediate` (a crash: recovery
  // runs at the next start) and waits until it is down.
  absl::Status StopImmediate();

  // Starts the stopped server again on the same port and data directory and
  // waits until it accepts connections.
  absl::Status StartAgain();

  // Sends SIGKILL to the postmaster and all its children at once, as when
  // the machine dies, and waits until the postmaster is gone. Nothing is
  // flushed or cleaned up; StartAgain() would run crash recovery.
  absl::Status Kill();

  // Promotes a standby to a primary (`pg_ctl promote -w`) and waits until
  // it accepts writes.
  absl::Status Promote();

  // Sends SIGSTOP to the postmaster and all its children: connections hang
  // (the kernel still accepts TCP connections) until Resume().
  absl::Status Pause();

  // Sends SIGCONT to the processes stopped by Pause().
  absl::Status Resume();

  // Returns true iff the server answers a query within `timeout`.
  bool Ready(absl::Duration timeout = absl::Seconds(5)) const;

  // Runs `sql` with `psql -X -At -v ON_ERROR_STOP=1` on database `dbname`
  // and returns its stdout (trailing newline removed); an error carrying
  // psql's stderr if psql exits non-zero or runs longer than `timeout`.
  absl::StatusOr<std::string> Psql(
      const std::string& sql, absl::Duration timeout = absl::Seconds(60),
      const std::string& dbname = "postgres") const;

  // Returns the pid of the running postmaster, from postmaster.pid.
  absl::StatusOr<pid_t> PostmasterPid() const;

 private:
  PgCluster(std::string bindir, std::string dir, int port);

  // Returns argv that runs `bin` from the PostgreSQL bindir as the server's
  // owner (through runuser when the caller is root).
  std::vector<std::string> AsOwner(const std::string& bin) const;
  absl::Status InitDb(const std::vector<std::string>& settings);
  absl::Status BaseBackup(const PgCluster& primary);
  absl::Status ChownDir();
  absl::Status PgCtlStart();
  absl::Status PgCtlStop(const std::string& mode);
  absl::Status WaitReady(absl::Duration timeout);
  absl::Status SignalAll(int sig);

  const std::string bindir_;
  const std::string dir_;
  const std::string data_dir_;
  const std::string log_path_;
  const int port_;
  bool running_ = false;
  // The processes stopped by Pause(), postmaster first; empty when running.
  std::vector<pid_t> paused_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_PG_CLUSTER_H_
