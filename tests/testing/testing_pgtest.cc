// Proves that the test helpers start, stop, restart, pause and resume real
// PostgreSQL and Redis servers and child processes. A server that cannot be
// started fails the test: nothing here is skipped, but for the Citus
// cluster where Citus is not installed (and never under CI=true).

#include <signal.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/citus_cluster.h"
#include "tests/testing/files.h"
#include "tests/testing/pg_cluster.h"
#include "tests/testing/ports.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/sidecar_process.h"

namespace idem::testing {
namespace {

// Unwraps `expr` (a StatusOr) into `lhs`, failing the test loudly if not OK.
#define IDEM_ASSERT_OK_AND_ASSIGN(lhs, expr)                  \
  auto lhs##_or = (expr);                                     \
  ASSERT_TRUE(lhs##_or.ok()) << lhs##_or.status().ToString(); \
  auto lhs = *std::move(lhs##_or)  // NOLINT(bugprone-macro-parentheses)

#define IDEM_ASSERT_OK(expr)                       \
  do {                                             \
    absl::Status idem_s = (expr);                  \
    ASSERT_TRUE(idem_s.ok()) << idem_s.ToString(); \
  } while (0)

TEST(FreePortTest, ReturnsAPortNobodyListensOn) {
  int port = FreePort();
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
  EXPECT_FALSE(PortAcceptsConnections(port));
}

TEST(RunCommandTest, ReturnsStdout) {
  IDEM_ASSERT_OK_AND_ASSIGN(out,
                            RunCommand({"sh", "-c", "echo hi; echo err >&2"}));
  EXPECT_EQ(out, "hi\n");
}

TEST(RunCommandTest, PassesEnvironmentAndDirectory) {
  RunOptions options;
  options.env = {"IDEM_TESTING_X=42"};
  options.cwd = "/";
  IDEM_ASSERT_OK_AND_ASSIGN(
      out, RunCommand({"sh", "-c", "echo $IDEM_TESTING_X $(pwd)"}, options));
  EXPECT_EQ(out, "42 /\n");
}

TEST(RunCommandTest, NonZeroExitIsAnErrorWithStderr) {
  absl::StatusOr<std::string> out =
      RunCommand({"sh", "-c", "echo broken >&2; exit 3"});
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "code 3"))
      << out.status();
  EXPECT_TRUE(absl::StrContains(out.status().message(), "broken"))
      << out.status();
}

TEST(RunCommandTest, MissingBinaryIsAnError) {
  EXPECT_FALSE(RunCommand({"/nonexistent/idem-no-such-binary"}).ok());
}

TEST(RunCommandTest, TimesOut) {
  RunOptions options;
  options.timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> out = RunCommand({"sleep", "30"}, options);
  EXPECT_TRUE(absl::IsDeadlineExceeded(out.status())) << out.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(ProcessTest, ExitCodeAndLog) {
  IDEM_ASSERT_OK_AND_ASSIGN(dir, MakeTempDir("idem-testing-"));
  const std::string log = dir + "/log";
  IDEM_ASSERT_OK_AND_ASSIGN(
      process,
      Process::Spawn({"sh", "-c", "echo out; echo err >&2; exit 7"}, {}, log));
  IDEM_ASSERT_OK_AND_ASSIGN(code, process->Wait(absl::Seconds(30)));
  EXPECT_EQ(code, 7);
  EXPECT_FALSE(process->Running());
  EXPECT_EQ(process->Log(), "out\nerr\n");
  RemoveTempDir(dir);
}

TEST(ProcessTest, KillRunningChildAndItsGroup) {
  IDEM_ASSERT_OK_AND_ASSIGN(dir, MakeTempDir("idem-testing-"));
  IDEM_ASSERT_OK_AND_ASSIGN(
      process, Process::Spawn({"sh", "-c", "sleep 60 & echo $! >pid; wait"}, {},
                              dir + "/log", dir));
  EXPECT_TRUE(process->Running());
  absl::StatusOr<int> early = process->Wait(absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(early.status()));
  // Wait for the grandchild to write its pid.
  std::string pid_text;
  for (int i = 0; i < 500 && pid_text.empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    pid_text = ReadFile(dir + "/pid");
  }
  const pid_t grandchild = std::stoi(pid_text);
  IDEM_ASSERT_OK_AND_ASSIGN(code, process->Kill(SIGKILL));
  EXPECT_EQ(code, 128 + SIGKILL);
  EXPECT_FALSE(process->Running());
  // The grandchild got SIGKILL too; init reaps it soon.
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    std::string stat =
        ReadFile("/proc/" + std::to_string(grandchild) + "/stat");
    gone = stat.empty() || absl::StrContains(stat, ") Z");
    if (!gone) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone);
  EXPECT_FALSE(process->Signal(SIGTERM).ok());
  RemoveTempDir(dir);
}

TEST(ProcessTest, SpawnFailsForMissingBinary) {
  EXPECT_FALSE(
      Process::Spawn({"/nonexistent/idem-no-such-binary"}, {}, "/dev/null")
          .ok());
}

TEST(SidecarProcessTest, StartsWaitsTerminatesAndRestarts) {
  IDEM_ASSERT_OK_AND_ASSIGN(
      sidecar,
      SidecarProcess::Start(IDEM_FAKE_SIDECAR_PATH, {"--start-delay-ms=300"}, 0,
                            {"FAKE_SIDECAR_ECHO=hello"}));
  EXPECT_TRUE(PortAcceptsConnections(sidecar->port()));
  EXPECT_NE(sidecar->port(), sidecar->metrics_port());
  EXPECT_EQ(sidecar->Address(), "127.0.0.1:" + std::to_string(sidecar->port()));
  EXPECT_TRUE(absl::StrContains(sidecar->Log(), "FAKE_SIDECAR_ECHO=hello"))
      << sidecar->Log();

  IDEM_ASSERT_OK_AND_ASSIGN(code, sidecar->Terminate());
  EXPECT_EQ(code, 0) << sidecar->Log();
  EXPECT_FALSE(PortAcceptsConnections(sidecar->port()));

  const int port = sidecar->port();
  IDEM_ASSERT_OK(sidecar->StartAgain());
  EXPECT_EQ(sidecar->port(), port);
  EXPECT_TRUE(PortAcceptsConnections(port));
  IDEM_ASSERT_OK(sidecar->Kill());
  EXPECT_FALSE(sidecar->Running());
  EXPECT_FALSE(PortAcceptsConnections(port));
}

TEST(SidecarProcessTest, UsesTheGivenPort) {
  const int port = FreePort();
  IDEM_ASSERT_OK_AND_ASSIGN(
      sidecar, SidecarProcess::Start(IDEM_FAKE_SIDECAR_PATH, {}, port));
  EXPECT_EQ(sidecar->port(), port);
  EXPECT_TRUE(PortAcceptsConnections(port));
}

TEST(SidecarProcessTest, ExitDuringStartupReturnsItsLog) {
  absl::StatusOr<std::unique_ptr<SidecarProcess>> sidecar =
      SidecarProcess::Start(IDEM_FAKE_SIDECAR_PATH, {"--exit-at-start=4"});
  ASSERT_FALSE(sidecar.ok());
  EXPECT_TRUE(absl::StrContains(sidecar.status().message(),
                                "exiting at start as asked"))
      << sidecar.status();
  EXPECT_TRUE(absl::StrContains(sidecar.status().message(), "code 4"))
      << sidecar.status();
}

TEST(SidecarProcessTest, RejectsListenInArgs) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      SidecarProcess::Start(IDEM_FAKE_SIDECAR_PATH, {"--listen=127.0.0.1:1"})
          .status()));
}

TEST(PgClusterTest, StartPsqlStopStartAgainPauseResume) {
  IDEM_ASSERT_OK_AND_ASSIGN(pg, PgCluster::Start());
  EXPECT_GT(pg->port(), 0);
  EXPECT_EQ(pg->ConnInfo(),
            "host=127.0.0.1 port=" + std::to_string(pg->port()) +
                " user=postgres dbname=postgres");
  IDEM_ASSERT_OK_AND_ASSIGN(one, pg->Psql("SELECT 1"));
  EXPECT_EQ(one, "1");
  IDEM_ASSERT_OK_AND_ASSIGN(
      settings, pg->Psql("SELECT current_setting('fsync') || ',' || "
                         "current_setting('max_connections')"));
  EXPECT_EQ(settings, "on,200");
  IDEM_ASSERT_OK(
      pg->Psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)").status());
  EXPECT_FALSE(pg->Psql("SELECT * FROM no_such_table").ok());

  // Fast stop: the server is gone, the data survives the restart.
  IDEM_ASSERT_OK(pg->Stop());
  EXPECT_FALSE(PortAcceptsConnections(pg->port()));
  EXPECT_FALSE(pg->Psql("SELECT 1", absl::Seconds(5)).ok());
  IDEM_ASSERT_OK(pg->StartAgain());
  IDEM_ASSERT_OK_AND_ASSIGN(count, pg->Psql("SELECT count(*) FROM t"));
  EXPECT_EQ(count, "1");

  // Immediate stop is a crash: committed rows survive recovery.
  IDEM_ASSERT_OK(pg->Psql("INSERT INTO t VALUES (2)").status());
  IDEM_ASSERT_OK(pg->StopImmediate());
  EXPECT_FALSE(PortAcceptsConnections(pg->port()));
  IDEM_ASSERT_OK(pg->StartAgain());
  IDEM_ASSERT_OK_AND_ASSIGN(sum, pg->Psql("SELECT sum(v) FROM t"));
  EXPECT_EQ(sum, "3");

  // Paused: connections are accepted by the kernel but never answered.
  IDEM_ASSERT_OK(pg->Pause());
  EXPECT_TRUE(PortAcceptsConnections(pg->port()));
  absl::StatusOr<std::string> hung = pg->Psql("SELECT 1", absl::Seconds(2));
  EXPECT_FALSE(hung.ok());
  IDEM_ASSERT_OK(pg->Resume());
  IDEM_ASSERT_OK_AND_ASSIGN(after, pg->Psql("SELECT 1"));
  EXPECT_EQ(after, "1");
  EXPECT_TRUE(pg->Ready());
}

TEST(PgClusterTest, DestructorStopsAPausedServerAndRemovesItsDirectory) {
  std::string dir;
  int port = 0;
  {
    IDEM_ASSERT_OK_AND_ASSIGN(pg, PgCluster::Start());
    dir = pg->dir();
    port = pg->port();
    IDEM_ASSERT_OK(pg->Pause());
  }
  EXPECT_FALSE(PortAcceptsConnections(port));
  EXPECT_TRUE(ReadFile(dir + "/data/PG_VERSION").empty());
}

TEST(PgClusterTest, TwoClustersRunSideBySide) {
  IDEM_ASSERT_OK_AND_ASSIGN(a, PgCluster::Start());
  IDEM_ASSERT_OK_AND_ASSIGN(b, PgCluster::Start());
  EXPECT_NE(a->port(), b->port());
  IDEM_ASSERT_OK(a->Psql("CREATE TABLE only_in_a (v int)").status());
  EXPECT_FALSE(b->Psql("SELECT * FROM only_in_a").ok());
}

TEST(RedisServerTest, StartCliKillStartAgainPauseResume) {
  IDEM_ASSERT_OK_AND_ASSIGN(redis, RedisServer::Start());
  EXPECT_EQ(redis->Address(), "127.0.0.1:" + std::to_string(redis->port()));
  IDEM_ASSERT_OK_AND_ASSIGN(pong, redis->Cli("PING"));
  EXPECT_EQ(pong, "PONG");
  IDEM_ASSERT_OK_AND_ASSIGN(set, redis->Cli("SET", "k", "v"));
  EXPECT_EQ(set, "OK");
  IDEM_ASSERT_OK_AND_ASSIGN(get, redis->Cli({"GET", "k"}));
  EXPECT_EQ(get, "v");
  IDEM_ASSERT_OK_AND_ASSIGN(save, redis->Cli("CONFIG", "GET", "save"));
  EXPECT_EQ(save, "save");

  IDEM_ASSERT_OK(redis->Kill());
  EXPECT_FALSE(PortAcceptsConnections(redis->port()));
  EXPECT_FALSE(redis->Ping().ok());

  // Restarted on the same port, empty: Redis loses everything.
  IDEM_ASSERT_OK(redis->StartAgain());
  IDEM_ASSERT_OK_AND_ASSIGN(pong2, redis->Cli("PING"));
  EXPECT_EQ(pong2, "PONG");
  IDEM_ASSERT_OK_AND_ASSIGN(lost, redis->Cli("EXISTS", "k"));
  EXPECT_EQ(lost, "0");

  IDEM_ASSERT_OK(redis->Pause());
  EXPECT_TRUE(PortAcceptsConnections(redis->port()));
  EXPECT_FALSE(redis->Ping(absl::Milliseconds(300)).ok());
  IDEM_ASSERT_OK(redis->Resume());
  IDEM_ASSERT_OK(redis->Ping());
}

// A standby streams what the primary commits; once the primary is killed
// and the standby promoted, it takes writes and has everything committed.
TEST(PgClusterTest, StandbyFollowsThenTakesOverWhenPromoted) {
  absl::StatusOr<std::unique_ptr<PgCluster>> primary = PgCluster::Start();
  ASSERT_TRUE(primary.ok()) << primary.status();
  ASSERT_TRUE((*primary)->Psql("CREATE TABLE t (v int)").ok());
  absl::StatusOr<std::unique_ptr<PgCluster>> standby =
      PgCluster::StartStandby(**primary);
  ASSERT_TRUE(standby.ok()) << standby.status();
  ASSERT_NE((*standby)->port(), (*primary)->port());
  EXPECT_EQ(*(*standby)->Psql("SELECT pg_is_in_recovery()"), "t");
  ASSERT_TRUE((*primary)->Psql("INSERT INTO t VALUES (1)").ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (*(*standby)->Psql("SELECT count(*) FROM t") != "1" &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE((*standby)->Psql("INSERT INTO t VALUES (2)").ok());

  ASSERT_TRUE((*primary)->Kill().ok());
  EXPECT_FALSE((*primary)->Ready(absl::Seconds(2)));
  ASSERT_TRUE((*standby)->Promote().ok());
  ASSERT_TRUE((*standby)->Psql("INSERT INTO t VALUES (2)").ok());
  EXPECT_EQ(*(*standby)->Psql("SELECT string_agg(v::text, ',' ORDER BY v) "
                              "FROM t"),
            "1,2");
}

TEST(CitusClusterTest, DistributesRowsOverBothWorkersAndAddsAWorker) {
  IDEM_REQUIRE_CITUS();
  IDEM_ASSERT_OK_AND_ASSIGN(citus, CitusCluster::Start());
  ASSERT_EQ(citus->workers(), 2);
  EXPECT_EQ(*citus->coordinator().Psql(
                "SELECT extversion LIKE '13.%' FROM pg_extension"
                " WHERE extname = 'citus'"),
            "t");
  IDEM_ASSERT_OK(citus->coordinator()
                     .Psql("CREATE TABLE t (tenant text PRIMARY KEY, n int);"
                           "SELECT create_distributed_table('t', 'tenant');"
                           "INSERT INTO t SELECT 'tenant-' || i, i"
                           " FROM generate_series(1, 64) i")
                     .status());
  // The coordinator holds no shard: the rows are on the two workers.
  const std::string nodes_of_rows =
      "SELECT count(DISTINCT s.nodeport) FROM citus_shards s"
      " WHERE s.table_name = 't'::regclass AND s.shardid IN"
      " (SELECT get_shard_id_for_distribution_column('t', tenant) FROM t)"
      " AND s.nodeport <> " +
      std::to_string(citus->coordinator().port());
  EXPECT_EQ(*citus->coordinator().Psql(nodes_of_rows), "2");
  for (int i = 0; i < citus->workers(); ++i) {
    EXPECT_EQ(*citus->worker(i).Psql("SELECT count(*) > 0 FROM pg_class"
                                     " WHERE relname LIKE 't\\_%'"),
              "t");
  }

  // A third worker takes a shard with rows once it is moved there; the rows
  // stay readable.
  IDEM_ASSERT_OK_AND_ASSIGN(added, citus->AddWorker());
  EXPECT_EQ(added, 2);
  const std::string shard =
      "get_shard_id_for_distribution_column('t', 'tenant-1')";
  IDEM_ASSERT_OK_AND_ASSIGN(
      from, citus->coordinator().Psql(
                "SELECT nodeport FROM citus_shards WHERE shardid = " + shard));
  IDEM_ASSERT_OK(citus->coordinator()
                     .Psql("SELECT citus_move_shard_placement(" + shard +
                               ", '127.0.0.1', " + from + ", '127.0.0.1', " +
                               std::to_string(citus->worker(2).port()) +
                               ", 'block_writes')",
                           absl::Seconds(60))
                     .status());
  EXPECT_EQ(*citus->coordinator().Psql(nodes_of_rows), "3");
  EXPECT_EQ(*citus->coordinator().Psql("SELECT sum(n) FROM t"), "2080");
}

}  // namespace
}  // namespace idem::testing
