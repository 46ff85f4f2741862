// The PostgreSQL store's batches on Citus (decision 29): concurrent calls of
// several tenants fold into one statement per shard, tenants that share a
// shard included, every statement is a router query on one shard, and every
// call gets its own answer.
#include <atomic>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/core/sync_calls.h"
#include "server/postgres/migrate.h"
#include "server/postgres/postgres_store.h"
#include "tests/testing/citus_cluster.h"

namespace idem {
namespace {

using ::idem::testing::CitusCluster;

// Transactions committed on the workers' database so far.
int64_t WorkerCommits(CitusCluster& citus) {
  int64_t total = 0;
  for (int i = 0; i < citus.workers(); ++i) {
    absl::StatusOr<std::string> out = citus.worker(i).Psql(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'");
    EXPECT_TRUE(out.ok()) << out.status();
    int64_t n = 0;
    EXPECT_TRUE(absl::SimpleAtoi(out.value_or(""), &n)) << out.value_or("");
    total += n;
  }
  return total;
}

// Runs `threads` threads of `keys_per_thread` new keys each (Begin,
// Complete, then a replay; every answer checked) through one store, the
// key's tenant `tenant_of(thread, i)`; returns the transactions the workers
// committed meanwhile.
int64_t RunCalls(CitusCluster& citus, int threads, int keys_per_thread,
                 const std::function<std::string(int, int)>& tenant_of) {
  int64_t commits_before = 0;
  {
    PgOptions options;
    options.conninfo = citus.ConnInfo();
    options.pool_size = 8;
    std::unique_ptr<Store> store = NewPostgresStore(options);
    PolicySet policies;
    SyncCoordinator coordinator(store.get(), &policies);
    // The pool's connections are open, warmed up, before counting.
    EXPECT_TRUE(store->Ping().ok());
    commits_before = WorkerCommits(citus);
    std::atomic<int> wrong{0};
    std::vector<std::thread> running;
    running.reserve(threads);
    for (int t = 0; t < threads; ++t) {
      running.emplace_back([&, t] {
        for (int i = 0; i < keys_per_thread; ++i) {
          const RecordKey key{tenant_of(t, i), "pay",
                              absl::StrCat("k-", t, "-", i)};
          BeginCommand begin;
          begin.request_hash = absl::StrCat("h-", t, "-", i);
          absl::StatusOr<BeginResult> granted = coordinator.Begin(key, begin);
          if (!granted.ok() || granted->outcome != Outcome::kAcquired) {
            ADD_FAILURE() << key.tenant << "/" << key.key << " "
                          << granted.status();
            ++wrong;
            continue;
          }
          const std::string body = absl::StrCat("paid ", key.key);
          absl::StatusOr<Record> done = coordinator.Complete(
              key, CompleteCommand{granted->record->fencing_token,
                                   Snapshot{200, body, "text/plain", {}}});
          if (!done.ok() || done->status != Status::kSucceeded) {
            ADD_FAILURE() << key.key << " " << done.status();
            ++wrong;
            continue;
          }
          // A retry replays this key's own result.
          absl::StatusOr<BeginResult> replay = coordinator.Begin(key, begin);
          if (!replay.ok() || replay->outcome != Outcome::kCompleted ||
              !replay->record->result || replay->record->result->body != body) {
            ADD_FAILURE() << key.key << " replay " << replay.status();
            ++wrong;
          }
        }
      });
    }
    for (std::thread& th : running) th.join();
    EXPECT_EQ(wrong.load(), 0);
  }
  // The pool's connections are closed: their backends and the workers'
  // have reported their statistics.
  absl::SleepFor(absl::Seconds(2));
  return WorkerCommits(citus) - commits_before;
}

TEST(BatchCitusTest, ConcurrentCallsFoldIntoOneRouterStatementPerShard) {
  IDEM_REQUIRE_CITUS();
  absl::StatusOr<std::unique_ptr<CitusCluster>> started = CitusCluster::Start();
  ASSERT_TRUE(started.ok()) << started.status();
  CitusCluster& citus = **started;
  std::vector<std::string> distributed;
  absl::StatusOr<std::vector<std::string>> applied =
      Migrate(citus.ConnInfo(), &distributed);
  ASSERT_TRUE(applied.ok()) << applied.status();
  ASSERT_EQ(distributed.size(), 2u);
  // A statement on more than one shard fails loudly instead of running.
  ASSERT_TRUE(citus.coordinator()
                  .Psql("ALTER DATABASE postgres SET"
                        " citus.multi_task_query_log_level = 'error'")
                  .ok());
  const size_t log_start = citus.coordinator().Log().size();

  // Tenants on several shards, and on both workers, several calls of each
  // in a batch.
  const std::vector<std::string> tenants = {"t1", "t2", "t3", "t4", "t5"};
  constexpr int kThreads = 32;
  constexpr int kKeysPerThread = 12;
  constexpr int kCalls = kThreads * kKeysPerThread * 3;
  const int64_t commits =
      RunCalls(citus, kThreads, kKeysPerThread,
               [&](int t, int i) { return tenants[(t + i) % tenants.size()]; });
  std::cout << kCalls << " calls, " << commits << " commits on the workers\n";
  // Calls run alone commit at least once each (a replay's Begin twice:
  // the insert, then the read), 1,550 times here; folded, a batch's calls
  // of one shard commit once.
  EXPECT_LT(commits, kCalls);

  // One call in flight per tenant, 64 tenants over the cluster's 32 shards:
  // grouped by tenant no call would fold; tenants that share a shard fold.
  constexpr int kTenants = 64;
  constexpr int kTenantKeys = 8;
  constexpr int kTenantCalls = kTenants * kTenantKeys * 3;
  const int64_t shared_commits =
      RunCalls(citus, kTenants, kTenantKeys,
               [](int t, int) { return absl::StrCat("tenant-", t); });
  std::cout << kTenantCalls << " calls of " << kTenants << " tenants, "
            << shared_commits << " commits on the workers\n";
  EXPECT_LT(shared_commits, kTenantCalls);

  const std::string log = citus.coordinator().Log().substr(log_start);
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    EXPECT_EQ(line.find("ERROR"), absl::string_view::npos) << line;
  }
  // The records landed on both workers (a query of every shard).
  ASSERT_TRUE(citus.coordinator()
                  .Psql("ALTER DATABASE postgres RESET"
                        " citus.multi_task_query_log_level")
                  .ok());
  absl::StatusOr<std::string> nodes = citus.coordinator().Psql(
      "SELECT count(DISTINCT s.nodeport) FROM citus_shards s"
      " WHERE s.table_name = 'idempotency_record'::regclass"
      " AND s.shardid IN (SELECT get_shard_id_for_distribution_column("
      "'idempotency_record', tenant_id) FROM idempotency_record)");
  EXPECT_TRUE(nodes.ok() && *nodes == "2")
      << nodes.status() << " " << nodes.value_or("");
}

}  // namespace
}  // namespace idem
