#include "server/postgres/pg_pool.h"

#include <poll.h>
#include <sys/socket.h>

#include <pqxx/pqxx>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/base/log.h"

namespace idem {
namespace {

bool IsUri(const std::string& conninfo) {
  return absl::StartsWith(conninfo, "postgresql://") ||
         absl::StartsWith(conninfo, "postgres://");
}

// Whether the SQLSTATE says the server or the connection is unavailable.
bool UnavailableState(const std::string& state) {
  return absl::StartsWith(state, "08") ||  // connection exception
         absl::StartsWith(state, "53") ||  // insufficient resources
         absl::StartsWith(state, "57") ||  // operator intervention, timeouts
         state == "25P03";                 // idle in transaction timeout
}

// Whether the server ended an idle connection (restarted, or terminated its
// backend): an idle connection has nothing to read, so anything readable
// (EOF, the FATAL message of a terminated backend) or a hang-up means the
// next statement on it would fail. One poll(2), no round trip.
bool EndedWhileIdle(const pqxx::connection& conn) {
  pollfd p{conn.sock(), POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

}  // namespace

std::string TunedConnInfo(const std::string& conninfo,
                          absl::Duration connect_timeout) {
  const std::pair<std::string, std::string> defaults[] = {
      {"connect_timeout", absl::StrCat(std::max<int64_t>(
                              2, absl::ToInt64Seconds(connect_timeout)))},
      {"keepalives", "1"},
      {"keepalives_idle", "5"},
      {"keepalives_interval", "2"},
      {"keepalives_count", "3"},
      {"tcp_user_timeout", "10000"},
      {"application_name", "idempotency-sidecar"},
  };
  std::string out = conninfo;
  bool uri = IsUri(conninfo);
  bool has_query = uri && absl::StrContains(conninfo, "?");
  for (const auto& [name, value] : defaults) {
    if (absl::StrContains(conninfo, name + "=")) continue;
    if (uri) {
      absl::StrAppend(&out, has_query ? "&" : "?", name, "=", value);
      has_query = true;
    } else {
      absl::StrAppend(&out, out.empty() ? "" : " ", name, "=", value);
    }
  }
  return out;
}

std::string SessionSettingsSql(const PgOptions& options) {
  const int64_t ms = absl::ToInt64Milliseconds(options.statement_timeout);
  return absl::StrCat("SET statement_timeout = ", ms,
                      "; SET idle_in_transaction_session_timeout = ", ms * 2,
                      "; SET lock_timeout = ", ms);
}

absl::Status StatusFromSqlState(const std::string& context,
                                const std::string& message,
                                const std::string& state) {
  std::string text =
      absl::StrCat(context, ": ", message, " (SQLSTATE ", state, ")");
  if (UnavailableState(state)) return absl::UnavailableError(text);
  if (state == "40001" || state == "40P01" || state == "23505") {
    return absl::AbortedError(text);
  }
  return absl::InternalError(text);
}

absl::Status StatusFromCurrentException(const std::string& context) {
  try {
    throw;
  } catch (const pqxx::broken_connection& e) {
    return absl::UnavailableError(
        absl::StrCat(context, ": PostgreSQL unreachable: ", e.what()));
  } catch (const pqxx::in_doubt_error& e) {
    return absl::UnavailableError(
        absl::StrCat(context, ": commit outcome unknown: ", e.what()));
  } catch (const pqxx::sql_error& e) {
    return StatusFromSqlState(context, e.what(), e.sqlstate());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  }
}

PgPool::PgPool(PgOptions options)
    : options_(std::move(options)),
      conninfo_(TunedConnInfo(options_.conninfo, options_.connect_timeout)),
      free_slots_(options_.pool_size),
      watchdog_(absl::Milliseconds(100), [this] { Watchdog(); }) {}

PgPool::~PgPool() = default;

void PgPool::Watchdog() {
  absl::MutexLock lock(&watch_mu_);
  const SteadyTime now = SteadyClock::now();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second < now) {
      // The owner still holds the connection, so the fd is still open.
      shutdown(it->first, SHUT_RDWR);
      killed_[it->first] = true;
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  }
}

void PgPool::Prepare(std::string name, std::string sql) {
  statements_[std::move(name)] = std::move(sql);
}

void PgPool::OnConnect(std::function<void(pqxx::connection&)> fn) {
  on_connect_ = std::move(fn);
}

const std::string& PgPool::Sql(const std::string& name) const {
  auto it = statements_.find(name);
  if (it == statements_.end()) {
    throw std::logic_error(absl::StrCat("no statement named ", name));
  }
  return it->second;
}

std::unique_ptr<pqxx::connection> PgPool::Connect() {
  auto c = std::make_unique<pqxx::connection>(conninfo_);
  // A session SET would stay on whichever server connection a pooler ran it
  // on; the timeouts then come from the role's settings (ALTER ROLE ... SET)
  // and the watchdog.
  if (!options_.prepared) return c;
  pqxx::nontransaction tx(*c);
  tx.exec(SessionSettingsSql(options_));
  tx.commit();
  for (const auto& [name, sql] : statements_) c->prepare(name, sql);
  return c;
}

int PgPool::InUse() {
  SteadyMutexLock lock(&mu_);
  return options_.pool_size - free_slots_;
}

absl::Status PgPool::Run(const std::string& context,
                         const std::function<void(pqxx::connection&)>& fn) {
  std::unique_ptr<pqxx::connection> conn;
  // Idle connections the server ended, closed outside the lock.
  std::vector<std::unique_ptr<pqxx::connection>> ended;
  bool connect = false;
  {
    SteadyMutexLock lock(&mu_);
    const SteadyTime deadline = SteadyDeadline(options_.acquire_timeout);
    auto available = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return free_slots_ > 0 &&
             (!idle_.empty() || connecting_ < options_.max_connecting);
    };
    while (conn == nullptr && !connect) {
      if (!slot_freed_.WaitUntil(&lock, deadline, available)) {
        return absl::UnavailableError(
            absl::StrCat(context, ": no PostgreSQL connection free within ",
                         absl::FormatDuration(options_.acquire_timeout)));
      }
      // A connection the server ended while it sat idle is replaced, not
      // used: after a PostgreSQL restart each would fail one more call.
      while (!idle_.empty() &&
             (!idle_.back()->is_open() || EndedWhileIdle(*idle_.back()))) {
        ended.push_back(std::move(idle_.back()));
        idle_.pop_back();
      }
      if (!idle_.empty()) {
        conn = std::move(idle_.back());
        idle_.pop_back();
      } else if (connecting_ < options_.max_connecting) {
        ++connecting_;
        connect = true;
      }
    }
    --free_slots_;
  }
  ended.clear();
  absl::Status status;
  int fd = -1;
  try {
    if (connect) {
      // The turn to connect ends with Connect(), however it ends.
      struct Turn {
        PgPool* pool;
        ~Turn() {
          SteadyMutexLock lock(&pool->mu_);
          --pool->connecting_;
          pool->slot_freed_.Signal();
        }
      } turn{this};
      conn = Connect();
    }
    fd = conn->sock();
    {
      absl::MutexLock lock(&watch_mu_);
      in_flight_[fd] =
          SteadyDeadline(options_.statement_timeout + options_.watchdog_margin);
    }
    if (connect && on_connect_) {
      try {
        on_connect_(*conn);
      } catch (const pqxx::broken_connection&) {
        throw;
      } catch (...) {
        Log(LogLevel::kWarn,
            StatusFromCurrentException("connection warm-up").ToString());
      }
    }
    fn(*conn);
  } catch (...) {
    status = StatusFromCurrentException(context);
  }
  bool killed = false;
  if (fd >= 0) {
    absl::MutexLock lock(&watch_mu_);
    in_flight_.erase(fd);
    killed = killed_.erase(fd) > 0;
  }
  // A killed connection is dropped; an answer that arrived as the watchdog
  // fired still stands. The error libpq gives for the closed socket ("not
  // connected") would hide why: a hung server, or a commit waiting for a
  // synchronous standby that is gone.
  if (killed && !status.ok()) {
    status = absl::UnavailableError(
        absl::StrCat(context, ": PostgreSQL did not answer within ",
                     absl::FormatDuration(options_.statement_timeout +
                                          options_.watchdog_margin),
                     " (--pg-statement-timeout plus ",
                     absl::FormatDuration(options_.watchdog_margin),
                     "); the connection was closed"));
  }
  SteadyMutexLock lock(&mu_);
  ++free_slots_;
  slot_freed_.Signal();
  if (conn != nullptr && !killed &&
      status.code() != absl::StatusCode::kUnavailable && conn->is_open()) {
    idle_.push_back(std::move(conn));
  }
  return status;
}

}  // namespace idem
