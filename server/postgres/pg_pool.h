// A fixed-size pool of PostgreSQL connections (libpqxx), opened lazily (a
// few at a time) and reopened after a failure, with bounded connect and
// statement timeouts so a dead database costs a quick UNAVAILABLE, never a
// hang. A watchdog (a job on the shared timer thread, periodic.h) shuts
// down the socket of any call that outlives
// its bound by a margin, so even a paused (SIGSTOP) server or a black-holed
// network cannot hang a caller: statement_timeout alone needs a server that
// answers.
#ifndef IDEM_SERVER_POSTGRES_PG_POOL_H_
#define IDEM_SERVER_POSTGRES_PG_POOL_H_

#include <functional>
#include <map>
#include <memory>
#include <pqxx/connection>
#include <pqxx/transaction_base>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "server/base/periodic.h"

namespace idem {

struct PgOptions {
  // libpq conninfo ("host=... dbname=...") or URI ("postgresql://...").
  std::string conninfo;
  // The session connection for LISTEN (PgListener); empty: conninfo. Behind
  // a transaction-pooling PgBouncer, conninfo names the bouncer and this
  // PostgreSQL itself (LISTEN needs one server session throughout).
  std::string direct_conninfo;
  // Named prepared statements. false: every statement is sent unnamed
  // (parsed on each call) and the pool sets no session state, so that each
  // transaction may run on another server connection (PgBouncer's
  // transaction pooling, which before 1.21 does not carry prepared
  // statements over).
  bool prepared = true;
  int pool_size = 8;
  absl::Duration connect_timeout = absl::Seconds(2);
  absl::Duration statement_timeout = absl::Seconds(5);
  // How long a caller waits for a free connection before UNAVAILABLE.
  absl::Duration acquire_timeout = absl::Seconds(5);
  // How many connections may be opening at once. PostgreSQL forks a backend
  // per connection: a burst of calls on a cold pool (start-up, a restart)
  // that opened one each at once could take longer than connect_timeout
  // for the last of them. Callers past this wait for a connection another
  // call releases, or for their turn to open one.
  int max_connecting = 4;
  // A call running longer than statement_timeout plus this has its socket
  // shut down by the watchdog (the server did not answer at all).
  absl::Duration watchdog_margin = absl::Seconds(1);
};

// Returns `conninfo` with connect_timeout, keepalives and application_name
// added unless it sets them itself.
std::string TunedConnInfo(const std::string& conninfo,
                          absl::Duration connect_timeout);

// The SET statements of a session with prepared statements: the statement,
// lock and idle-in-transaction timeouts of `options`.
std::string SessionSettingsSql(const PgOptions& options);

// Runs the current exception (call inside a catch block) through the mapping
// of libpqxx errors to statuses: connection problems, timeouts and server
// shutdowns -> UNAVAILABLE; serialization and unique conflicts -> ABORTED;
// anything else -> INTERNAL. `context` prefixes the message.
absl::Status StatusFromCurrentException(const std::string& context);

// The status of a statement that failed with SQLSTATE `state` and error
// `message`, as StatusFromCurrentException maps a libpqxx sql_error.
absl::Status StatusFromSqlState(const std::string& context,
                                const std::string& message,
                                const std::string& state);

// Thread-safe.
class PgPool {
 public:
  explicit PgPool(PgOptions options);
  ~PgPool();
  PgPool(const PgPool&) = delete;
  PgPool& operator=(const PgPool&) = delete;

  // Runs `fn` on a pooled connection. Exceptions thrown by `fn` become
  // statuses (see StatusFromCurrentException); after an UNAVAILABLE one the
  // connection is dropped and reopened on next use.
  absl::Status Run(const std::string& context,
                   const std::function<void(pqxx::connection&)>& fn);

  // Registers a named statement: prepared on every connection, now and
  // future, unless options.prepared is false. Call before the first Run.
  void Prepare(std::string name, std::string sql);

  // Runs `fn` on every connection the pool opens, once, before the call that
  // opened it: it should leave the connection as it found it (roll back).
  // A failure of `fn` is logged and the call goes on, unless the connection
  // broke. Call before the first Run.
  void OnConnect(std::function<void(pqxx::connection&)> fn);

  // Connections handed out to calls now (0 to pool_size).
  int InUse();

  // Runs the statement registered as `name` in `tx` with `args`: the
  // prepared statement, or its text as an unnamed statement.
  template <typename... Args>
  pqxx::result Exec(pqxx::transaction_base& tx, const std::string& name,
                    Args&&... args) const {
    if (options_.prepared) {
      return tx.exec_prepared(name, std::forward<Args>(args)...);
    }
    return tx.exec_params(Sql(name), std::forward<Args>(args)...);
  }

 private:
  // The text of the statement registered as `name`.
  const std::string& Sql(const std::string& name) const;
  // Opens a connection with the session settings and statements applied
  // (neither with options_.prepared false).
  std::unique_ptr<pqxx::connection> Connect();
  // Shuts down the sockets of calls past their deadline: one pass over
  // in_flight_, a shutdown(2) for each (never waits on the network).
  void Watchdog();

  const PgOptions options_;
  const std::string conninfo_;
  std::map<std::string, std::string> statements_;
  std::function<void(pqxx::connection&)> on_connect_;
  // A steady mutex: waiting for a free slot must not move with the wall
  // clock.
  SteadyMutex mu_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_ ABSL_GUARDED_BY(mu_);
  int free_slots_ ABSL_GUARDED_BY(mu_);
  // Connections being opened (at most options_.max_connecting).
  int connecting_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled when a slot or a turn to connect comes free.
  SteadyCondVar slot_freed_;

  // Calls in flight: socket -> deadline, on the steady clock (a wall-clock
  // step must not fail every call in flight). A socket the watchdog shut
  // down is moved to killed_ so that its owner drops the connection.
  absl::Mutex watch_mu_;
  std::map<int, SteadyTime> in_flight_ ABSL_GUARDED_BY(watch_mu_);
  std::map<int, bool> killed_ ABSL_GUARDED_BY(watch_mu_);
  // Last: stops before the members Watchdog uses go.
  PeriodicJob watchdog_;
};

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_PG_POOL_H_
