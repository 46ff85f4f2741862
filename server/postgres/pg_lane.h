// The lone-call lane: one PostgreSQL connection (libpq, non-blocking) that a
// call with nothing else in flight takes without a thread hop. The caller's
// thread sends the statement and returns; the lane's thread, parked on the
// connection's socket (epoll), reads the result and runs the call's
// completion, so the answer leaves from the thread that saw the result.
// While the lane is busy or reconnecting, TrySend declines and the caller
// takes the batch threads (group_commit.h), which fold concurrent calls.
// Bounds as the pool's (pg_pool.h): connect and statement timeouts, and a
// deadline of statement timeout plus the watchdog margin after which the
// connection is closed and the call fails UNAVAILABLE.
#ifndef IDEM_SERVER_POSTGRES_PG_LANE_H_
#define IDEM_SERVER_POSTGRES_PG_LANE_H_

#include <libpq-fe.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/steady_wait.h"
#include "server/postgres/pg_pool.h"
#include "server/postgres/pg_record.h"

namespace idem {

// A statement's result as libpq gave it (text fields), freed with it.
class PgResult {
 public:
  explicit PgResult(PGresult* r) : r_(r, &PQclear) {}
  int Rows() const { return PQntuples(r_.get()); }

  // Row `i` of the result; valid while the result lives.
  class Row final : public PgRow {
   public:
    Row(const PGresult* r, int i) : r_(r), i_(i) {}
    bool IsNull(int c) const override { return PQgetisnull(r_, i_, c) != 0; }
    const char* Text(int c) const override { return PQgetvalue(r_, i_, c); }

   private:
    const PGresult* r_;
    int i_;
  };
  Row At(int i) const { return Row(r_.get(), i); }

 private:
  std::unique_ptr<PGresult, void (*)(PGresult*)> r_;
};

// Thread-safe.
class PgLane {
 public:
  using Done = std::function<void(absl::StatusOr<PgResult>)>;

  // `statements`: (name, SQL) of what TrySend may run, prepared on the
  // lane's connection unless options.prepared is false.
  PgLane(const PgOptions& options,
         std::vector<std::pair<std::string, std::string>> statements);
  ~PgLane();
  PgLane(const PgLane&) = delete;
  PgLane& operator=(const PgLane&) = delete;

  // Sends statement `name` with `params` (text, none null) and returns true,
  // or returns false at once and sends nothing when the lane is busy, not
  // connected, or cannot queue the statement. After true, the completion
  // `make_done` made (called only then) runs exactly once: on the lane's
  // thread with the result, or with UNAVAILABLE (the connection failed or
  // the deadline passed: the statement may or may not have committed) or
  // another status from the statement's SQLSTATE (StatusFromSqlState).
  // Never blocks.
  bool TrySend(const char* context, const std::string& name,
               const std::vector<std::string>& params,
               absl::FunctionRef<Done()> make_done);

  // Statements sent through the lane so far.
  uint64_t Sent() const { return sent_.load(std::memory_order_relaxed); }

 private:
  enum class State { kDown, kIdle, kBusy };

  void Loop();
  // Opens the connection (blocking, on the lane's thread, bounded by the
  // connect timeout). Returns whether it is ready.
  bool Connect();
  // Acts on the socket's events: sends the rest of a statement, reads a
  // result and completes its call when whole, fails the call past its
  // deadline or whose connection failed, drops a connection the server
  // ended while idle.
  void Service(bool readable, bool writable);
  // Closes the connection (the loop opens a new one) and returns the
  // completion of the call in flight, if any, for the caller to run with
  // its failure once out of the lock.
  Done Drop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the socket's epoll events.
  void Watch(uint32_t events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a completion taken out of the lock.
  static void Finish(const Done& done, absl::StatusOr<PgResult> result);

  const PgOptions options_;
  const std::string conninfo_;
  const std::vector<std::pair<std::string, std::string>> statements_;
  const int epoll_fd_;
  const int wake_fd_;  // eventfd: the destructor wakes the loop with it

  absl::Mutex mu_;
  PGconn* conn_ ABSL_GUARDED_BY(mu_) = nullptr;
  State state_ ABSL_GUARDED_BY(mu_) = State::kDown;
  // The call in flight (kBusy): its completion, context, deadline, its
  // result so far, and whether the socket still has to take the statement.
  Done done_ ABSL_GUARDED_BY(mu_);
  std::string context_ ABSL_GUARDED_BY(mu_);
  SteadyTime deadline_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PgResult> result_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<uint64_t> sent_{0};
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_PG_LANE_H_
