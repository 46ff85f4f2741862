// The lone-call lane (server/postgres/pg_lane.h) on a real PostgreSQL: what
// it answers, that it declines rather than queues or blocks, and what its
// callers hear when the connection or the server fails.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/postgres/pg_lane.h"
#include "tests/testing/pg_cluster.h"

namespace idem {
namespace {

using ::idem::testing::PgCluster;

PgCluster* cluster = nullptr;

class Env : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<PgCluster>> pg = PgCluster::Start();
    ASSERT_TRUE(pg.ok()) << pg.status();
    owned_ = *std::move(pg);
    cluster = owned_.get();
    // The lane prepares every statement: their tables must exist.
    pqxx::connection c(cluster->ConnInfo());
    pqxx::nontransaction tx(c);
    tx.exec("CREATE TABLE lane_unique (v int PRIMARY KEY)");
  }
  void TearDown() override {
    cluster = nullptr;
    owned_.reset();
  }

 private:
  std::unique_ptr<PgCluster> owned_;
};

const ::testing::Environment* const env =
    ::testing::AddGlobalTestEnvironment(new Env);

std::vector<std::pair<std::string, std::string>> Statements() {
  return {{"echo", "SELECT $1::text, pg_backend_pid()"},
          {"sleep", "SELECT pg_sleep($1::float8)::text"},
          {"divide", "SELECT (1 / $1::int)::text"},
          {"insert", "INSERT INTO lane_unique VALUES ($1::int) RETURNING 'x'"}};
}

PgOptions Options(bool prepared = true) {
  PgOptions options;
  options.conninfo = cluster->ConnInfo();
  options.prepared = prepared;
  options.statement_timeout = absl::Seconds(5);
  return options;
}

// What one call through the lane gave: the first field of its first row,
// the thread it completed on, and its status.
struct Answer {
  absl::StatusOr<std::string> value;
  std::thread::id thread;
};

// A call sent through the lane; Wait() gives its answer.
class Call {
 public:
  // Whether the lane took it.
  bool Send(PgLane& lane, const std::string& name,
            const std::vector<std::string>& params) {
    return lane.TrySend("test", name, params, [this] {
      return [this](absl::StatusOr<PgResult> r) {
        Answer a;
        a.thread = std::this_thread::get_id();
        if (!r.ok()) {
          a.value = r.status();
        } else if (r->Rows() == 0) {
          a.value = std::string("<no rows>");
        } else {
          a.value = std::string(r->At(0).Text(0));
        }
        std::lock_guard<std::mutex> lock(mu_);
        answer_ = std::move(a);
        ++completions_;
        done_.notify_all();
      };
    });
  }

  // The answer, once the completion has run (it is not written after).
  const Answer& Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_.wait_for(lock, std::chrono::seconds(30),
                        [this] { return answer_.has_value(); })) {
      ADD_FAILURE() << "the call never completed";
      answer_ = Answer{absl::DeadlineExceededError("never completed"), {}};
    }
    return *answer_;
  }

  int completions() {
    std::lock_guard<std::mutex> lock(mu_);
    return completions_;
  }

 private:
  // A std::mutex, not absl::Notification: TSan sees the libstdc++ locks,
  // not the fast path of Debian's uninstrumented Abseil.
  std::mutex mu_;
  std::condition_variable done_;
  std::optional<Answer> answer_;
  int completions_ = 0;
};

// The lane is ready once a call goes through (it connects on its thread).
bool WaitReady(PgLane& lane) {
  for (int i = 0; i < 200; ++i) {
    Call c;
    if (c.Send(lane, "echo", {"ready"})) {
      return c.Wait().value.ok();
    }
    absl::SleepFor(absl::Milliseconds(25));
  }
  return false;
}

// Runs `sql` on a connection of its own.
void Exec(const std::string& sql) {
  pqxx::connection c(cluster->ConnInfo());
  pqxx::nontransaction tx(c);
  tx.exec(sql);
}

TEST(PgLaneTest, AnswersOnItsOwnThreadWithPreparedOrUnnamedStatements) {
  for (bool prepared : {true, false}) {
    PgLane lane(Options(prepared), Statements());
    ASSERT_TRUE(WaitReady(lane)) << "prepared=" << prepared;
    const uint64_t before = lane.Sent();
    Call c;
    ASSERT_TRUE(c.Send(lane, "echo", {"hello 'quoted' \\ text"}));
    const Answer& a = c.Wait();
    ASSERT_TRUE(a.value.ok()) << a.value.status();
    EXPECT_EQ(*a.value, "hello 'quoted' \\ text");
    EXPECT_NE(a.thread, std::this_thread::get_id());
    EXPECT_EQ(lane.Sent(), before + 1);
  }
}

// One call at a time: a second is declined at once, its completion never
// made, and the lane takes calls again once the first has its answer.
TEST(PgLaneTest, DeclinesWhileACallIsInFlight) {
  PgLane lane(Options(), Statements());
  ASSERT_TRUE(WaitReady(lane));
  Call slow;
  ASSERT_TRUE(slow.Send(lane, "sleep", {"0.3"}));
  const absl::Time start = absl::Now();
  bool made = false;
  EXPECT_FALSE(lane.TrySend("test", "echo", {"x"}, [&] {
    made = true;
    return PgLane::Done([](absl::StatusOr<PgResult>) {});
  }));
  EXPECT_FALSE(made);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100)) << "it waited";
  EXPECT_TRUE(slow.Wait().value.ok()) << slow.Wait().value.status();
  Call next;
  ASSERT_TRUE(next.Send(lane, "echo", {"after"}));
  EXPECT_EQ(next.Wait().value.value_or(""), "after");
  EXPECT_EQ(slow.completions(), 1);
}

// Errors keep the pool's mapping of SQLSTATEs, and the connection serves
// the next call.
TEST(PgLaneTest, StatementErrorsMapAsThePoolsDo) {
  PgLane lane(Options(), Statements());
  ASSERT_TRUE(WaitReady(lane));
  Call zero;
  ASSERT_TRUE(zero.Send(lane, "divide", {"0"}));
  EXPECT_EQ(zero.Wait().value.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(zero.Wait().value.status().message(), "22012"))
      << zero.Wait().value.status();
  Call first;
  ASSERT_TRUE(first.Send(lane, "insert", {"7"}));
  EXPECT_TRUE(first.Wait().value.ok());
  Call again;
  ASSERT_TRUE(again.Send(lane, "insert", {"7"}));
  EXPECT_EQ(again.Wait().value.status().code(), absl::StatusCode::kAborted)
      << again.Wait().value.status();
  Call bad_param;
  ASSERT_TRUE(bad_param.Send(lane, "divide", {"not a number"}));
  EXPECT_EQ(bad_param.Wait().value.status().code(),
            absl::StatusCode::kInternal);
  Call next;
  ASSERT_TRUE(next.Send(lane, "echo", {"still here"}));
  EXPECT_EQ(next.Wait().value.value_or(""), "still here");
}

// A backend terminated during a statement: its caller hears UNAVAILABLE
// (the statement may have run), and the lane reconnects for later calls.
TEST(PgLaneTest, AConnectionLostMidCallIsUnavailableThenReopened) {
  PgLane lane(Options(), Statements());
  ASSERT_TRUE(WaitReady(lane));
  Call pid;
  ASSERT_TRUE(pid.Send(lane, "echo", {"x"}));
  ASSERT_TRUE(pid.Wait().value.ok());
  Call slow;
  ASSERT_TRUE(slow.Send(lane, "sleep", {"5"}));
  absl::SleepFor(absl::Milliseconds(100));
  Exec(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query "
      "LIKE 'SELECT pg_sleep%' AND pid <> pg_backend_pid()");
  const Answer& a = slow.Wait();
  EXPECT_EQ(a.value.status().code(), absl::StatusCode::kUnavailable)
      << a.value.status();
  EXPECT_TRUE(WaitReady(lane)) << "the lane did not reconnect";
}

// A backend that ended while the lane was idle is replaced before a call
// uses it: no call fails for it.
TEST(PgLaneTest, AConnectionEndedWhileIdleCostsNoCall) {
  PgLane lane(Options(), Statements());
  ASSERT_TRUE(WaitReady(lane));
  pqxx::connection admin(cluster->ConnInfo());
  pqxx::nontransaction tx(admin);
  tx.exec(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
      "application_name = 'idempotency-sidecar'");
  // Once the backend has gone (pg_terminate_backend only signals it): a
  // connection can end under a call at any moment, and that call fails.
  for (int i = 0; i < 200; ++i) {
    if (tx.exec("SELECT count(*) FROM pg_stat_activity WHERE "
                "application_name = 'idempotency-sidecar'")[0][0]
            .as<int>() == 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  // Until it has reopened the lane declines; after, calls succeed.
  for (int i = 0; i < 20; ++i) {
    Call c;
    if (c.Send(lane, "echo", {"after"})) {
      EXPECT_TRUE(c.Wait().value.ok()) << c.Wait().value.status();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(WaitReady(lane));
}

// With no session settings (--pg-prepared=off) the server never times the
// statement out: the lane's own deadline, statement timeout plus margin,
// fails the call and closes the connection.
TEST(PgLaneTest, AStatementPastItsDeadlineIsUnavailable) {
  PgOptions options = Options(/*prepared=*/false);
  options.statement_timeout = absl::Milliseconds(300);
  options.watchdog_margin = absl::Milliseconds(200);
  PgLane lane(options, Statements());
  ASSERT_TRUE(WaitReady(lane));
  Call slow;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(slow.Send(lane, "sleep", {"10"}));
  const Answer& a = slow.Wait();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(a.value.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(a.value.status().message(), "did not answer"))
      << a.value.status();
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_TRUE(WaitReady(lane));
}

// The server's statement_timeout (--pg-prepared=on sets it) ends a slow
// statement first: UNAVAILABLE (SQLSTATE 57014), as the pool maps it.
TEST(PgLaneTest, TheServersStatementTimeoutIsUnavailable) {
  PgOptions options = Options();
  options.statement_timeout = absl::Milliseconds(300);
  PgLane lane(options, Statements());
  ASSERT_TRUE(WaitReady(lane));
  Call slow;
  ASSERT_TRUE(slow.Send(lane, "sleep", {"10"}));
  const Answer& a = slow.Wait();
  EXPECT_EQ(a.value.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(a.value.status().message(), "57014"))
      << a.value.status();
}

// A server that is not there: the lane declines every call (the batch
// threads serve them) and never blocks the caller.
TEST(PgLaneTest, NoServerMeansEveryCallIsDeclined) {
  PgOptions options;
  options.conninfo = "host=127.0.0.1 port=1 dbname=none user=none";
  PgLane lane(options, Statements());
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10; ++i) {
    Call c;
    EXPECT_FALSE(c.Send(lane, "echo", {"x"}));
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Destroyed with a call in flight, the lane completes it: UNAVAILABLE.
TEST(PgLaneTest, ACallInFlightAtShutdownIsAnswered) {
  Call slow;
  {
    PgLane lane(Options(), Statements());
    ASSERT_TRUE(WaitReady(lane));
    ASSERT_TRUE(slow.Send(lane, "sleep", {"10"}));
  }
  EXPECT_EQ(slow.Wait().value.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(slow.completions(), 1);
}

}  // namespace
}  // namespace idem
