// The PostgreSQL pool's watchdog runs on the steady clock: a forward step
// of the wall clock during a call leaves the call alone. CTest runs this
// binary with libfaketime preloaded, reading its offset from the file named
// by FAKETIME_TIMESTAMP_FILE at every clock read, so the test steps the
// wall clock by writing that file. The monotonic clock stays real
// (FAKETIME_DONT_FAKE_MONOTONIC=1).
#include <cstdlib>
#include <memory>
#include <pqxx/pqxx>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/postgres/pg_pool.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/pg_cluster.h"

namespace idem {
namespace {

using ::idem::testing::PgCluster;
using ::idem::testing::SetWallClockOffset;
using ::idem::testing::WallClockStepsWork;

// A call that runs while the wall clock steps 2 h forward, far past its
// statement timeout plus the watchdog's margin, still answers: on the wall
// clock the watchdog shut its socket down and the call failed.
TEST(PoolClockTest, AForwardWallClockStepLeavesACallAlone) {
  ASSERT_TRUE(WallClockStepsWork())
      << "run through ctest: it preloads libfaketime and sets "
         "FAKETIME_TIMESTAMP_FILE";
  // The server keeps the real clock: pg_sleep follows the wall clock.
  unsetenv("LD_PRELOAD");
  absl::StatusOr<std::unique_ptr<PgCluster>> pg = PgCluster::Start();
  ASSERT_TRUE(pg.ok()) << pg.status();

  PgOptions options;
  options.conninfo = (*pg)->ConnInfo();
  options.pool_size = 1;
  options.statement_timeout = absl::Seconds(10);
  options.watchdog_margin = absl::Seconds(1);
  PgPool pool(options);
  ASSERT_TRUE(pool.Run("warm up", [](pqxx::connection&) {}).ok());

  const SteadyTime start = SteadyClock::now();
  absl::Status status = pool.Run("sleep", [](pqxx::connection& c) {
    SetWallClockOffset("+2h");
    pqxx::nontransaction tx(c);
    tx.exec("SELECT pg_sleep(3)");
  });
  SetWallClockOffset("+0");
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_GE(SteadySince(start), absl::Seconds(3));
}

}  // namespace
}  // namespace idem
