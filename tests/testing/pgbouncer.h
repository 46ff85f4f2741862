#ifndef IDEM_TESTS_TESTING_PGBOUNCER_H_
#define IDEM_TESTS_TESTING_PGBOUNCER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tests/testing/pg_cluster.h"
#include "tests/testing/process.h"

namespace idem::testing {

// Whether the environment asks for the PostgreSQL store's tests to run
// through PgBouncer (IDEM_TEST_PGBOUNCER=1; CTest's *_bouncer entries).
bool UsePgBouncer();

// A throwaway PgBouncer (Debian's /usr/sbin/pgbouncer, else PATH) in
// transaction pooling mode in front of a PgCluster: 127.0.0.1 on a free
// port, trust authentication for the postgres user, every database of the
// cluster. When the caller is root it runs as the `postgres` user (it
// refuses root). Not thread-safe.
class PgBouncer {
 public:
  // Creates /tmp/idem-pgbouncer-XXXXXX with the configuration, starts
  // PgBouncer with at most `server_connections` server connections per
  // database and user, and waits (up to 10 s) until it accepts
  // connections. The error carries its log when start-up fails.
  static absl::StatusOr<std::unique_ptr<PgBouncer>> Start(
      const PgCluster& pg, int server_connections = 20);

  PgBouncer(const PgBouncer&) = delete;
  PgBouncer& operator=(const PgBouncer&) = delete;
  // Kills PgBouncer and removes the directory.
  ~PgBouncer();

  // Returns a libpq conninfo through the bouncer, as PgCluster::ConnInfo.
  std::string ConnInfo(const std::string& dbname = "postgres") const;

  int port() const { return port_; }

  // Returns PgBouncer's log.
  std::string Log() const;

 private:
  PgBouncer(std::string dir, int port) : dir_(std::move(dir)), port_(port) {}

  const std::string dir_;
  const int port_;
  std::unique_ptr<Process> process_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_PGBOUNCER_H_
