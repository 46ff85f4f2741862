#include "server/postgres/pg_lane.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/thread_name.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"

namespace idem {
namespace {

// How often the lane's thread looks at the deadline of the call in flight.
constexpr int kTickMs = 100;

std::string ConnError(const PGconn* c) {
  return std::string(absl::StripTrailingAsciiWhitespace(PQerrorMessage(c)));
}

// Whether `r` ran (a result or a command's completion).
bool Ran(const PGresult* r) {
  const ExecStatusType s = PQresultStatus(r);
  return s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK;
}

}  // namespace

PgLane::PgLane(const PgOptions& options,
               std::vector<std::pair<std::string, std::string>> statements)
    : options_(options),
      conninfo_(TunedConnInfo(options.conninfo, options.connect_timeout)),
      statements_(std::move(statements)),
      epoll_fd_(epoll_create1(EPOLL_CLOEXEC)),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      thread_([this] {
        // The destructor's write wakes the loop out of epoll_wait.
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = wake_fd_;
        epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
        Loop();
      }) {}

PgLane::~PgLane() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

bool PgLane::TrySend(const char* context, const std::string& name,
                     const std::vector<std::string>& params,
                     absl::FunctionRef<Done()> make_done) {
  // A lane whose thread holds the lock is about to be free or is failing:
  // the caller does not wait for it.
  if (!mu_.TryLock()) return false;
  if (state_ != State::kIdle || stopping_) {
    mu_.Unlock();
    return false;
  }
  // Anything to read on an idle connection is the server ending it (a
  // restart, a terminated backend) before the lane's thread has seen it.
  pollfd readable{PQsocket(conn_), POLLIN, 0};
  if (poll(&readable, 1, 0) != 0) {
    mu_.Unlock();
    return false;
  }
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const std::string& p : params) values.push_back(p.c_str());
  const int n = static_cast<int>(values.size());
  int queued = 0;
  if (options_.prepared) {
    queued = PQsendQueryPrepared(conn_, name.c_str(), n, values.data(), nullptr,
                                 nullptr, 0);
  } else {
    auto it = std::find_if(statements_.begin(), statements_.end(),
                           [&](const auto& s) { return s.first == name; });
    queued = it != statements_.end() &&
             PQsendQueryParams(conn_, it->second.c_str(), n, nullptr,
                               values.data(), nullptr, nullptr, 0);
  }
  if (!queued) {
    // Nothing went out: the batch threads run the call. A broken
    // connection is reopened by the lane's thread.
    if (PQstatus(conn_) != CONNECTION_OK) Drop();
    mu_.Unlock();
    return false;
  }
  sent_.fetch_add(1, std::memory_order_relaxed);
  const int flushed = PQflush(conn_);
  if (flushed < 0) {
    // Part of the statement may have gone out: its caller hears
    // UNAVAILABLE, as after any connection failure during a statement.
    const std::string error = ConnError(conn_);
    Drop();
    mu_.Unlock();
    Finish(make_done(), absl::UnavailableError(absl::StrCat(
                            context, ": PostgreSQL unreachable: ", error)));
    return true;
  }
  state_ = State::kBusy;
  done_ = make_done();
  context_ = context;
  deadline_ =
      SteadyDeadline(options_.statement_timeout + options_.watchdog_margin);
  if (flushed == 1) {
    // The socket is full: the lane's thread sends the rest.
    flushing_ = true;
    Watch(EPOLLIN | EPOLLOUT);
  }
  mu_.Unlock();
  return true;
}

void PgLane::Watch(uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = PQsocket(conn_);
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, ev.data.fd, &ev);
}

PgLane::Done PgLane::Drop() {
  if (conn_ != nullptr) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, PQsocket(conn_), nullptr);
    PQfinish(conn_);
    conn_ = nullptr;
  }
  state_ = State::kDown;
  flushing_ = false;
  result_.reset();
  error_ = absl::OkStatus();
  Done done = std::move(done_);
  done_ = nullptr;
  return done;
}

void PgLane::Finish(const Done& done, absl::StatusOr<PgResult> result) {
  if (done) done(std::move(result));
}

bool PgLane::Connect() {
  // Without its descriptors (the process is out of them) the lane stays
  // closed and every call goes to the batch threads.
  if (epoll_fd_ < 0 || wake_fd_ < 0) return false;
  PGconn* c = PQconnectdb(conninfo_.c_str());
  const auto fail = [&](const std::string& what) {
    Log(LogLevel::kDebug, "lone-call lane: " + what, {{"error", ConnError(c)}});
    PQfinish(c);
    return false;
  };
  if (PQstatus(c) != CONNECTION_OK) return fail("cannot connect");
  if (options_.prepared) {
    PGresult* set = PQexec(c, SessionSettingsSql(options_).c_str());
    const bool ok = Ran(set);
    PQclear(set);
    if (!ok) return fail("cannot apply the session settings");
    for (const auto& [name, sql] : statements_) {
      PGresult* prepared = PQprepare(c, name.c_str(), sql.c_str(), 0, nullptr);
      const bool done = Ran(prepared);
      PQclear(prepared);
      if (!done) return fail("cannot prepare " + name);
    }
  }
  if (PQsetnonblocking(c, 1) != 0) return fail("cannot go non-blocking");
  // Notices (a FATAL of a terminated backend) are not written to stderr:
  // the call they concern hears its error.
  PQsetNoticeProcessor(
      c, [](void*, const char*) {}, nullptr);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = PQsocket(c);
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
    return fail("epoll_ctl");
  }
  absl::MutexLock lock(&mu_);
  conn_ = c;
  state_ = State::kIdle;
  return true;
}

void PgLane::Loop() {
  NameThisThread(thread_names::kPgLane);
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    bool down = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      down = state_ == State::kDown;
    }
    if (down) {
      if (Connect()) {
        backoff = absl::Milliseconds(100);
        continue;
      }
      // Until the database is back the batch threads serve every call.
      pollfd p{wake_fd_, POLLIN, 0};
      poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(backoff)));
      backoff = std::min(backoff * 2, absl::Seconds(5));
      continue;
    }
    epoll_event events[2];
    const int n = epoll_wait(epoll_fd_, events, 2, kTickMs);
    bool readable = false;
    bool writable = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) continue;
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) readable = true;
      if (events[i].events & EPOLLOUT) writable = true;
    }
    Service(readable, writable);
  }
  Done done;
  {
    absl::MutexLock lock(&mu_);
    done = Drop();
  }
  Finish(done,
         absl::UnavailableError("PostgreSQL: the sidecar is shutting down"));
}

void PgLane::Service(bool readable, bool writable) {
  Done done;
  std::optional<absl::StatusOr<PgResult>> out;
  {
    absl::MutexLock lock(&mu_);
    if (conn_ == nullptr) return;
    const auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      done = Drop();
      if (done) out = std::move(s);
    };
    if (state_ == State::kBusy && SteadyClock::now() > deadline_) {
      fail(absl::UnavailableError(
          absl::StrCat(context_, ": PostgreSQL did not answer within ",
                       absl::FormatDuration(options_.statement_timeout +
                                            options_.watchdog_margin),
                       " (--pg-statement-timeout plus ",
                       absl::FormatDuration(options_.watchdog_margin),
                       "); the connection was closed")));
    } else if (flushing_ && writable && PQflush(conn_) != 1) {
      // All sent (or the socket failed, which the read below sees).
      flushing_ = false;
      Watch(EPOLLIN);
    }
    if (conn_ != nullptr && state_ == State::kIdle && readable) {
      // Input on an idle connection is the server ending the session (a
      // restart, a terminated backend) or a change of its settings: the
      // connection is reopened before a call uses it.
      fail(absl::OkStatus());
    } else if (conn_ != nullptr && readable &&
               (!PQconsumeInput(conn_) || PQstatus(conn_) != CONNECTION_OK)) {
      fail(absl::UnavailableError(absl::StrCat(
          context_, ": PostgreSQL unreachable: ", ConnError(conn_))));
    }
    while (conn_ != nullptr && state_ == State::kBusy && !PQisBusy(conn_)) {
      PGresult* r = PQgetResult(conn_);
      if (r == nullptr) {
        done = std::move(done_);
        if (!error_.ok()) {
          out = error_;
        } else if (result_ != nullptr) {
          out = std::move(*result_);
        } else {
          out = absl::InternalError(
              absl::StrCat(context_, ": the statement returned nothing"));
        }
        done_ = nullptr;
        result_.reset();
        error_ = absl::OkStatus();
        state_ = State::kIdle;
        break;
      }
      if (Ran(r) && result_ == nullptr) {
        result_ = std::make_unique<PgResult>(r);
      } else if (!Ran(r) && error_.ok()) {
        const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        const std::string message(
            absl::StripTrailingAsciiWhitespace(PQresultErrorMessage(r)));
        error_ = state == nullptr
                     ? absl::UnavailableError(absl::StrCat(
                           context_, ": PostgreSQL unreachable: ", message))
                     : StatusFromSqlState(context_, message, state);
        PQclear(r);
      } else {
        PQclear(r);
      }
    }
  }
  if (out) Finish(done, *std::move(out));
}

}  // namespace idem
