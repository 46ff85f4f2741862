// One conformance suite for every Store: the memory store and the PostgreSQL
// store (on a throwaway cluster) must behave the same, directly and through
// the coordinator.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <pqxx/pqxx>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/core/calls.h"
#include "server/core/maintenance.h"
#include "server/core/sync_calls.h"
#include "server/postgres/migrate.h"
#include "server/postgres/pg_pool.h"
#include "server/postgres/postgres_store.h"
#include "server/store/memory_store.h"
#include "tests/testing/citus_cluster.h"
#include "tests/testing/pg_cluster.h"
#include "tests/testing/pgbouncer.h"

namespace idem {
namespace {

using ::idem::testing::CitusCluster;
using ::idem::testing::PgBouncer;
using ::idem::testing::PgCluster;

PgCluster* cluster = nullptr;
// With IDEM_TEST_PGBOUNCER=1: a transaction-pooling PgBouncer in front of
// the cluster, which the conformance suite's PostgreSQL stores go through.
PgBouncer* bouncer = nullptr;

class ClusterEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    PgCluster* pg = nullptr;
    // With IDEM_TEST_CITUS=1 the suite runs on a Citus coordinator and two
    // workers, where Citus is installed (else it is skipped, or fails under
    // CI=true).
    if (::idem::testing::UseCitus()) {
      IDEM_REQUIRE_CITUS();
      absl::StatusOr<std::unique_ptr<CitusCluster>> c = CitusCluster::Start();
      ASSERT_TRUE(c.ok()) << c.status();
      citus_ = *std::move(c);
      pg = &citus_->coordinator();
    } else {
      absl::StatusOr<std::unique_ptr<PgCluster>> c = PgCluster::Start();
      ASSERT_TRUE(c.ok()) << c.status();
      pg_ = *std::move(c);
      pg = pg_.get();
    }
    std::vector<std::string> distributed;
    absl::StatusOr<std::vector<std::string>> applied =
        Migrate(pg->ConnInfo(), &distributed);
    ASSERT_TRUE(applied.ok()) << applied.status();
    ASSERT_FALSE(applied->empty());
    // Distributed on Citus only, both tables at once.
    EXPECT_EQ(distributed.size(), citus_ != nullptr ? 2u : 0u);
    // A second run is a no-op.
    distributed.clear();
    applied = Migrate(pg->ConnInfo(), &distributed);
    ASSERT_TRUE(applied.ok()) << applied.status();
    ASSERT_TRUE(applied->empty());
    EXPECT_TRUE(distributed.empty());
    cluster = pg;
    if (::idem::testing::UsePgBouncer()) {
      absl::StatusOr<std::unique_ptr<PgBouncer>> b = PgBouncer::Start(*pg);
      ASSERT_TRUE(b.ok()) << b.status();
      bouncer_ = *std::move(b);
      bouncer = bouncer_.get();
    }
  }
  void TearDown() override {
    if (citus_ != nullptr) {
      // The suite's records landed on both workers.
      absl::StatusOr<std::string> nodes = citus_->coordinator().Psql(
          "SELECT count(DISTINCT s.nodeport) FROM citus_shards s"
          " WHERE s.table_name = 'idempotency_record'::regclass"
          " AND s.shardid IN (SELECT get_shard_id_for_distribution_column("
          "'idempotency_record', tenant_id) FROM idempotency_record)");
      EXPECT_TRUE(nodes.ok() && *nodes == "2")
          << nodes.status() << " " << nodes.value_or("");
    }
    bouncer = nullptr;
    bouncer_.reset();
    cluster = nullptr;
    pg_.reset();
    citus_.reset();
  }

 private:
  std::unique_ptr<PgCluster> pg_;
  std::unique_ptr<CitusCluster> citus_;
  std::unique_ptr<PgBouncer> bouncer_;
};

const auto* const kEnv =
    ::testing::AddGlobalTestEnvironment(new ClusterEnvironment());

// kPostgresBatch: the PostgreSQL store running every call through its batch
// statements (pg_batch.h), even alone.
enum class Kind { kMemory, kPostgres, kPostgresBatch };

// Counts Store::Read calls (the coordinator's reads before deciding).
class ReadCountingStore final : public StoreWrapper {
 public:
  ReadCountingStore(std::unique_ptr<Store> base, std::atomic<int>* reads)
      : StoreWrapper(std::move(base)), reads_(reads) {}

  void Read(const RecordKey& key, ReadFn done) override {
    ++*reads_;
    StoreWrapper::Read(key, std::move(done));
  }

 private:
  std::atomic<int>* const reads_;
};

class StoreTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    std::unique_ptr<Store> base;
    if (GetParam() == Kind::kMemory) {
      base = NewMemoryStore();
    } else {
      ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
      ASSERT_EQ(bouncer != nullptr, ::idem::testing::UsePgBouncer())
          << "PgBouncer did not start";
      PgOptions options;
      options.conninfo = cluster->ConnInfo();
      if (bouncer != nullptr) {
        options.conninfo = bouncer->ConnInfo();
        options.direct_conninfo = cluster->ConnInfo();
        options.prepared = false;
      }
      options.pool_size = 8;
      PgBatchOptions batch;
      batch.always = GetParam() == Kind::kPostgresBatch;
      base = NewPostgresStore(options, batch);
    }
    store_ = std::make_unique<ReadCountingStore>(std::move(base), &reads_);
    coordinator_ = std::make_unique<SyncCoordinator>(store_.get(), &policies_);
    // Tests share one database: each uses its own tenant.
    tenant_ = absl::StrCat(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
        counter_++);
    for (char& c : tenant_) {
      if (c == '/') c = '.';
    }
  }

  RecordKey NewKey(const std::string& key = "k") {
    return RecordKey{tenant_, "create-payment", key};
  }

  BeginCommand Cmd(const std::string& hash = "h1",
                   absl::Duration lease = absl::Seconds(30)) {
    BeginCommand cmd;
    cmd.request_hash = hash;
    cmd.lease = lease;
    return cmd;
  }

  // Begin the way the gRPC service runs it: the caches first, then the
  // coordinator's Begin without them.
  absl::StatusOr<BeginResult> BeginNonBlocking(const RecordKey& key,
                                               const BeginCommand& cmd) {
    std::optional<BeginResult> cached =
        std::move(coordinator_->BeginFromCacheMany({&key}, {&cmd})[0]);
    if (cached) return *std::move(cached);
    return coordinator_->Begin(key, cmd, /*cache_checked=*/true);
  }

  // Threads race whole lifecycles (Begin with `begin`, Complete) on shared
  // keys whose spelling an array literal must escape (keys are printable
  // ASCII without spaces), so that the PostgreSQL store folds reads,
  // inserts and updates of several records (and repeats of one) into
  // batches: one grant per key, every Complete acknowledged once, every
  // replay the snapshot.
  void RaceLifecycles(
      const std::function<absl::StatusOr<BeginResult>(const RecordKey&)>& begin,
      const std::function<absl::StatusOr<Record>(
          const RecordKey&, const CompleteCommand&)>& complete);

  // A Begin with `wait`, through calls() as the gRPC service runs it.
  class Waiting {
   public:
    Waiting(StoreTest* test, const RecordKey& key, const BeginCommand& cmd,
            absl::Duration wait) {
      Calls* calls = test->calls();
      calls->Begin(key, cmd, calls->NewWait(SteadyDeadline(wait)),
                   [this](absl::StatusOr<BeginResult> r) {
                     result_ = std::move(r);
                     done_.Notify();
                   });
    }
    bool answered() const { return done_.HasBeenNotified(); }
    absl::StatusOr<BeginResult> Await() {
      if (!done_.WaitForNotificationWithTimeout(absl::Seconds(30))) {
        return absl::DeadlineExceededError("no answer in 30 s");
      }
      return result_;
    }

   private:
    absl::StatusOr<BeginResult> result_ = absl::UnknownError("none");
    SteadyNotification done_;
  };

  // Every call's entry point over store_, made on first use.
  Calls* calls() {
    if (calls_ == nullptr) {
      calls_ = std::make_unique<Calls>(store_.get(), store_->Changes(),
                                       &policies_, nullptr);
    }
    return calls_.get();
  }

  void TearDown() override { calls_.reset(); }

  static inline int counter_ = 0;
  std::atomic<int> reads_{0};
  PolicySet policies_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<SyncCoordinator> coordinator_;
  std::unique_ptr<Calls> calls_;
  std::string tenant_;
};

Snapshot AllBytes(const std::string& tag) {
  Snapshot s;
  s.code = 201;
  for (int i = 0; i < 256; ++i) s.body.push_back(static_cast<char>(i));
  s.body += tag;
  s.content_type = "application/json; charset=utf-8";
  // Header names are HTTP tokens (sql/0005); values may hold UTF-8.
  s.headers = {{"location", "/p/" + tag}, {"x-unicode", "välue \"q\" ünï"}};
  return s;
}

TEST_P(StoreTest, ReadOfAbsentRecordHasClock) {
  absl::StatusOr<StoreRead> read = ReadNow(*store_, NewKey());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->record.has_value());
  EXPECT_LT(absl::AbsDuration(read->now - absl::Now()), absl::Seconds(5));
}

TEST_P(StoreTest, InsertOnlyWhenAbsent) {
  Decision d = DecideBegin(std::nullopt, NewKey(), Cmd(), absl::Now(),
                           policies_.defaults());
  ASSERT_TRUE(d.write.has_value());
  absl::StatusOr<std::optional<Record>> first = ApplyNow(*store_, *d.write);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->status, Status::kProcessing);
  EXPECT_EQ((*first)->fencing_token, 1);
  EXPECT_EQ((*first)->attempt, 1);
  EXPECT_EQ((*first)->request_hash, "h1");
  EXPECT_GT((*first)->lease_expires_at, (*first)->created_at);
  absl::StatusOr<std::optional<Record>> second = ApplyNow(*store_, *d.write);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->has_value());
}

TEST_P(StoreTest, GuardedWriteLosesToStaleGuard) {
  absl::StatusOr<BeginResult> begin = coordinator_->Begin(NewKey(), Cmd());
  ASSERT_TRUE(begin.ok()) << begin.status();
  Write w;
  w.guard = Guard{Status::kProcessing, /*fencing_token=*/7, false};
  w.next = *begin->record;
  w.next.status = Status::kSucceeded;
  w.next.result = AllBytes("x");
  w.retention = absl::Hours(1);
  absl::StatusOr<std::optional<Record>> r = ApplyNow(*store_, w);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
  w.guard = Guard{Status::kSucceeded, 1, false};
  r = ApplyNow(*store_, w);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
  absl::StatusOr<StoreRead> read = ReadNow(*store_, NewKey());
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->record->status, Status::kProcessing);
}

TEST_P(StoreTest, LeaseExpiredGuardUsesStoreClock) {
  Decision d =
      DecideBegin(std::nullopt, NewKey(), Cmd("h1", absl::Milliseconds(300)),
                  absl::Now(), policies_.defaults());
  absl::StatusOr<std::optional<Record>> rec = ApplyNow(*store_, *d.write);
  ASSERT_TRUE(rec.ok() && rec->has_value());
  Write expire;
  expire.guard = Guard{Status::kProcessing, 1, /*lease_expired=*/true};
  expire.next = **rec;
  expire.next.status = Status::kUnknown;
  absl::StatusOr<std::optional<Record>> early = ApplyNow(*store_, expire);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(early->has_value()) << "lease still live";
  absl::SleepFor(absl::Milliseconds(400));
  absl::StatusOr<std::optional<Record>> late = ApplyNow(*store_, expire);
  ASSERT_TRUE(late.ok()) << late.status();
  ASSERT_TRUE(late->has_value());
  EXPECT_EQ((*late)->status, Status::kUnknown);
}

TEST_P(StoreTest, SnapshotRoundTripsByteForByte) {
  absl::StatusOr<BeginResult> begin = coordinator_->Begin(NewKey(), Cmd());
  ASSERT_TRUE(begin.ok()) << begin.status();
  ASSERT_EQ(begin->outcome, Outcome::kAcquired);
  const Snapshot want = AllBytes("exact");
  absl::StatusOr<Record> done =
      coordinator_->Complete(NewKey(), CompleteCommand{1, want});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status, Status::kSucceeded);
  ASSERT_TRUE(done->result.has_value());
  EXPECT_EQ(*done->result, want);
  absl::StatusOr<BeginResult> replay = coordinator_->Begin(NewKey(), Cmd());
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
  ASSERT_TRUE(replay->record->result.has_value());
  EXPECT_EQ(*replay->record->result, want);
  ASSERT_TRUE(replay->record->expires_at.has_value());
  EXPECT_NEAR(absl::ToDoubleHours(*replay->record->expires_at -
                                  replay->record->updated_at),
              24.0, 0.01);
}

TEST_P(StoreTest, EmptySnapshotIsStoredNotDropped) {
  ASSERT_TRUE(coordinator_->Begin(NewKey(), Cmd()).ok());
  absl::StatusOr<Record> failed =
      coordinator_->Fail(NewKey(), FailCommand{1, Snapshot{}, false});
  ASSERT_TRUE(failed.ok()) << failed.status();
  ASSERT_TRUE(failed->result.has_value());
  EXPECT_EQ(*failed->result, Snapshot{});
  absl::StatusOr<BeginResult> replay = coordinator_->Begin(NewKey(), Cmd());
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->outcome, Outcome::kFailed);
}

TEST_P(StoreTest, RetryableFailReacquiresWithNextToken) {
  ASSERT_TRUE(coordinator_->Begin(NewKey(), Cmd()).ok());
  ASSERT_TRUE(
      coordinator_->Fail(NewKey(), FailCommand{1, AllBytes("e"), true}).ok());
  absl::StatusOr<BeginResult> again = coordinator_->Begin(NewKey(), Cmd());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, Outcome::kAcquired);
  EXPECT_EQ(again->record->fencing_token, 2);
  EXPECT_EQ(again->record->attempt, 2);
  EXPECT_FALSE(again->record->result.has_value());
  EXPECT_FALSE(again->record->expires_at.has_value());
  // The first holder is fenced off.
  absl::StatusOr<Record> stale =
      coordinator_->Complete(NewKey(), CompleteCommand{1, AllBytes("late")});
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(StoreTest, ExpiryIsAuditedOnceAndNeverGrantsAgain) {
  ASSERT_TRUE(
      coordinator_->Begin(NewKey(), Cmd("h1", absl::Milliseconds(200))).ok());
  absl::SleepFor(absl::Milliseconds(300));
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<BeginResult> r = coordinator_->Begin(NewKey(), Cmd());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, Outcome::kUnknown);
    EXPECT_EQ(r->record->status, Status::kUnknown);
  }
  absl::StatusOr<std::vector<AuditEntry>> history =
      HistoryNow(*store_, HistoryQuery{NewKey()});
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), 1u);
  EXPECT_EQ((*history)[0].from, Status::kProcessing);
  EXPECT_EQ((*history)[0].to, Status::kUnknown);
  EXPECT_EQ((*history)[0].actor, kActorLazyExpiry);
  EXPECT_EQ((*history)[0].fencing_token, 1);
}

TEST_P(StoreTest, LateReportSettlesUnknownAndIsAudited) {
  ASSERT_TRUE(
      coordinator_->Begin(NewKey(), Cmd("h1", absl::Milliseconds(200))).ok());
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(coordinator_->Get(NewKey()).ok());
  absl::StatusOr<Record> late =
      coordinator_->Complete(NewKey(), CompleteCommand{1, AllBytes("late")});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->status, Status::kSucceeded);
  absl::StatusOr<std::vector<AuditEntry>> history =
      HistoryNow(*store_, HistoryQuery{NewKey()});
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), 2u);
  EXPECT_EQ((*history)[1].actor, kActorLateReport);
  EXPECT_EQ((*history)[1].from, Status::kUnknown);
  EXPECT_EQ((*history)[1].to, Status::kSucceeded);
  EXPECT_LE((*history)[0].at, (*history)[1].at);
}

TEST_P(StoreTest, HeartbeatExtendsLease) {
  absl::StatusOr<BeginResult> begin =
      coordinator_->Begin(NewKey(), Cmd("h1", absl::Seconds(2)));
  ASSERT_TRUE(begin.ok());
  absl::StatusOr<Record> beat =
      coordinator_->Heartbeat(NewKey(), HeartbeatCommand{1, absl::Minutes(10)});
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_GT(beat->lease_expires_at,
            begin->record->lease_expires_at + absl::Minutes(9));
  EXPECT_EQ(
      coordinator_->Heartbeat(NewKey(), HeartbeatCommand{2, absl::Seconds(5)})
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
}

// The holder's calls to the instance that granted the record decide on the
// record it holds (held_records.h): no read before the write. Without held
// records, each of them reads first.
TEST_P(StoreTest, HolderCallsToTheGrantingInstanceSkipTheRead) {
  for (size_t held : {size_t{16384}, size_t{0}}) {
    CoordinatorOptions options;
    options.held_records = held;
    SyncCoordinator c(store_.get(), &policies_, nullptr, options);
    const RecordKey done_key = NewKey(absl::StrCat("done-", held));
    const RecordKey failed_key = NewKey(absl::StrCat("failed-", held));
    const int before = reads_;
    for (const RecordKey& key : {done_key, failed_key}) {
      absl::StatusOr<BeginResult> begin = c.Begin(key, Cmd());
      ASSERT_TRUE(begin.ok()) << begin.status();
      ASSERT_EQ(begin->outcome, Outcome::kAcquired);
      ASSERT_TRUE(c.Heartbeat(key, HeartbeatCommand{1, absl::Minutes(1)}).ok());
    }
    absl::StatusOr<Record> completed =
        c.Complete(done_key, CompleteCommand{1, AllBytes("held")});
    ASSERT_TRUE(completed.ok()) << completed.status();
    EXPECT_EQ(completed->status, Status::kSucceeded);
    EXPECT_EQ(completed->result, AllBytes("held"));
    absl::StatusOr<Record> failed =
        c.Fail(failed_key, FailCommand{1, AllBytes("no"), /*retryable=*/true});
    ASSERT_TRUE(failed.ok()) << failed.status();
    EXPECT_EQ(failed->status, Status::kFailed);
    EXPECT_TRUE(failed->retryable);
    EXPECT_EQ(reads_ - before, held > 0 ? 0 : 4) << "held records: " << held;
    // A repeated Complete is answered from the stored record.
    absl::StatusOr<Record> again =
        c.Complete(done_key, CompleteCommand{1, AllBytes("held")});
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->updated_at, completed->updated_at);
  }
}

// A lease another instance extended after the grant survives the Complete
// this instance decides on its held record (a guarded write keeps the
// stored lease).
TEST_P(StoreTest, CompleteOnAHeldRecordKeepsALeaseExtendedElsewhere) {
  SyncCoordinator other(store_.get(), &policies_);
  ASSERT_TRUE(coordinator_->Begin(NewKey(), Cmd("h1", absl::Seconds(5))).ok());
  absl::StatusOr<Record> beat =
      other.Heartbeat(NewKey(), HeartbeatCommand{1, absl::Minutes(10)});
  ASSERT_TRUE(beat.ok()) << beat.status();
  const int before = reads_;
  absl::StatusOr<Record> done =
      coordinator_->Complete(NewKey(), CompleteCommand{1, AllBytes("x")});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(reads_, before);
  EXPECT_EQ(done->lease_expires_at, beat->lease_expires_at);
}

// A record held by an instance whose lease ran out and that another
// instance granted again: the old holder's Complete fails its guard, reads,
// and is refused as stale; the new holder's record is untouched by it.
TEST_P(StoreTest, HeldRecordTakenOverElsewhereRefusesTheOldHolder) {
  Policy release;
  release.on_lease_expiry = ExpiryPolicy::kRelease;
  const PolicySet policies(release, {});
  SyncCoordinator first(store_.get(), &policies);
  SyncCoordinator second(store_.get(), &policies);
  ASSERT_TRUE(first.Begin(NewKey(), Cmd("h1", absl::Milliseconds(200))).ok());
  absl::SleepFor(absl::Milliseconds(300));
  absl::StatusOr<BeginResult> r = second.Begin(NewKey(), Cmd());
  ASSERT_TRUE(r.ok()) << r.status();
  if (r->outcome == Outcome::kFailed) r = second.Begin(NewKey(), Cmd());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outcome, Outcome::kAcquired);
  ASSERT_EQ(r->record->fencing_token, 2);
  const int before = reads_;
  absl::StatusOr<Record> stale =
      first.Complete(NewKey(), CompleteCommand{1, AllBytes("old")});
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition)
      << stale.status();
  EXPECT_EQ(reads_, before + 1);
  absl::StatusOr<Record> done =
      second.Complete(NewKey(), CompleteCommand{2, AllBytes("new")});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->result, AllBytes("new"));
  EXPECT_EQ(done->fencing_token, 2);
}

TEST_P(StoreTest, ResolveIsAuditedWithActorAndReason) {
  ASSERT_TRUE(
      coordinator_->Begin(NewKey(), Cmd("h1", absl::Milliseconds(100))).ok());
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_EQ(coordinator_->Get(NewKey())->status, Status::kUnknown);
  ResolveCommand cmd;
  cmd.to = Status::kSucceeded;
  cmd.result = AllBytes("resolved");
  cmd.reason = "ledger shows the payment";
  cmd.actor = "alice";
  absl::StatusOr<Record> r = coordinator_->Resolve(NewKey(), cmd);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, Status::kSucceeded);
  EXPECT_EQ(r->resolved_by, "alice");
  EXPECT_EQ(r->resolve_reason, "ledger shows the payment");
  absl::StatusOr<BeginResult> replay = coordinator_->Begin(NewKey(), Cmd());
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
  EXPECT_EQ(*replay->record->result, *cmd.result);
  absl::StatusOr<std::vector<AuditEntry>> history =
      HistoryNow(*store_, HistoryQuery{NewKey()});
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), 2u);
  EXPECT_EQ((*history)[1].actor, "alice");
  EXPECT_EQ((*history)[1].reason, "ledger shows the payment");
}

// History pages by audit id: `limit` entries after `after_id`, oldest
// first, and only the record's own.
TEST_P(StoreTest, HistoryPagesOldestFirst) {
  absl::StatusOr<BeginResult> begin = coordinator_->Begin(NewKey(), Cmd());
  ASSERT_TRUE(begin.ok()) << begin.status();
  for (int i = 0; i < 5; ++i) {
    Write w;
    w.guard = Guard{Status::kProcessing, begin->record->fencing_token, false};
    w.next = *begin->record;
    w.audit = AuditEntry{absl::Now(), Status::kProcessing,  Status::kProcessing,
                         "test",      absl::StrCat("r", i), 1};
    absl::StatusOr<std::optional<Record>> r = ApplyNow(*store_, w);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value());
  }
  std::vector<std::string> reasons;
  HistoryQuery q{NewKey(), 0, 2};
  for (int page = 0; page < 4; ++page) {
    absl::StatusOr<std::vector<AuditEntry>> got = HistoryNow(*store_, q);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_LE(got->size(), 2u);
    if (got->empty()) break;
    for (const AuditEntry& e : *got) {
      EXPECT_GT(e.id, q.after_id);
      q.after_id = e.id;
      reasons.push_back(e.reason);
    }
  }
  EXPECT_EQ(reasons, (std::vector<std::string>{"r0", "r1", "r2", "r3", "r4"}));
  absl::StatusOr<std::vector<AuditEntry>> other =
      HistoryNow(*store_, HistoryQuery{NewKey("someone-else")});
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->empty());
}

TEST_P(StoreTest, ConcurrentBeginsGrantExactlyOnce) {
  constexpr int kThreads = 16;
  constexpr int kKeys = 20;
  std::vector<std::atomic<int>> grants(kKeys);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < kKeys; ++k) {
        absl::StatusOr<BeginResult> r =
            coordinator_->Begin(NewKey(absl::StrCat("key-", k)), Cmd());
        if (!r.ok()) {  // NOLINT(bugprone-branch-clone)
          ++errors;
        } else if (r->outcome == Outcome::kAcquired) {
          ++grants[k];
        } else if (r->outcome != Outcome::kInProgress) {
          ++errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  for (int k = 0; k < kKeys; ++k) EXPECT_EQ(grants[k].load(), 1) << "key " << k;
}

void StoreTest::RaceLifecycles(
    const std::function<absl::StatusOr<BeginResult>(const RecordKey&)>& begin,
    const std::function<absl::StatusOr<Record>(
        const RecordKey&, const CompleteCommand&)>& complete) {
  constexpr int kThreads = 24;
  constexpr int kRounds = 40;
  const std::vector<std::string> spellings = {
      "plain",   "quote\"d", "back\\slash",
      "com,ma",  "{brace}",  "NULL",
      "(paren)", "a=b&c",    "x';DROP-TABLE-idempotency_record;--"};
  std::vector<std::string> keys;
  keys.reserve(18);
  for (int i = 0; i < 18; ++i) {
    keys.push_back(absl::StrCat(spellings[i % spellings.size()], "-", i));
  }
  std::vector<std::atomic<int>> grants(keys.size());
  std::vector<std::atomic<int>> completes(keys.size());
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const size_t k = (t * 7 + round) % keys.size();
        const RecordKey key = NewKey(keys[k]);
        absl::StatusOr<BeginResult> r = begin(key);
        if (!r.ok()) {
          ++errors;
          continue;
        }
        if (r->outcome == Outcome::kAcquired) {
          ++grants[k];
          absl::StatusOr<Record> done = complete(
              key,
              CompleteCommand{r->record->fencing_token, AllBytes(keys[k])});
          if (done.ok() && done->result == AllBytes(keys[k])) {
            ++completes[k];
          } else {
            ++errors;
          }
        } else if (r->outcome == Outcome::kCompleted) {
          if (r->record->result != AllBytes(keys[k])) ++errors;
        } else if (r->outcome != Outcome::kInProgress) {
          ++errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  for (size_t k = 0; k < keys.size(); ++k) {
    EXPECT_EQ(grants[k].load(), 1) << keys[k];
    EXPECT_EQ(completes[k].load(), 1) << keys[k];
    absl::StatusOr<StoreRead> read = ReadNow(*store_, NewKey(keys[k]));
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_TRUE(read->record.has_value()) << keys[k];
    EXPECT_EQ(read->record->key.key, keys[k]);
    EXPECT_EQ(read->record->status, Status::kSucceeded) << keys[k];
    EXPECT_EQ(read->record->result, AllBytes(keys[k])) << keys[k];
  }
}

TEST_P(StoreTest, ConcurrentLifecyclesInBatchesKeepEveryAnswer) {
  RaceLifecycles(
      [this](const RecordKey& key) { return coordinator_->Begin(key, Cmd()); },
      [this](const RecordKey& key, const CompleteCommand& cmd) {
        return coordinator_->Complete(key, cmd);
      });
}

// The same with Begin as the gRPC service runs it (the caches first).
TEST_P(StoreTest, ConcurrentNonBlockingLifecyclesKeepEveryAnswer) {
  RaceLifecycles(
      [this](const RecordKey& key) { return BeginNonBlocking(key, Cmd()); },
      [this](const RecordKey& key, const CompleteCommand& cmd) {
        return coordinator_->Complete(key, cmd);
      });
}

// While most Begins find their record (a retry storm), the PostgreSQL store
// reads before it inserts (BeginMix, pg_batch.h); every answer stays the
// same: replays, new keys granted once, races between instances.
TEST_P(StoreTest, BeginsDuringAReplayStormKeepEveryAnswer) {
  for (int i = 0; i < 8; ++i) {
    const RecordKey key = NewKey(absl::StrCat("done-", i));
    ASSERT_TRUE(coordinator_->Begin(key, Cmd()).ok());
    ASSERT_TRUE(
        coordinator_->Complete(key, CompleteCommand{1, AllBytes("r")}).ok());
  }
  ::testing::internal::CaptureStderr();
  for (int round = 0; round < 40; ++round) {
    absl::StatusOr<BeginResult> r =
        BeginNonBlocking(NewKey(absl::StrCat("done-", round % 8)), Cmd());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, Outcome::kCompleted);
    EXPECT_EQ(r->record->result, AllBytes("r"));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  if (GetParam() != Kind::kMemory) {
    EXPECT_NE(log.find("Begin reads first"), std::string::npos) << log;
  }
  absl::StatusOr<BeginResult> fresh = BeginNonBlocking(NewKey("new"), Cmd());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->outcome, Outcome::kAcquired);
  absl::StatusOr<BeginResult> other = BeginNonBlocking(NewKey("new"), Cmd());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->outcome, Outcome::kInProgress);
  absl::StatusOr<BeginResult> mismatch =
      BeginNonBlocking(NewKey("done-0"), Cmd("other-hash"));
  ASSERT_TRUE(mismatch.ok()) << mismatch.status();
  EXPECT_EQ(mismatch->outcome, Outcome::kMismatch);
  RaceLifecycles(
      [this](const RecordKey& key) { return BeginNonBlocking(key, Cmd()); },
      [this](const RecordKey& key, const CompleteCommand& cmd) {
        return coordinator_->Complete(key, cmd);
      });
}

// A holder's Complete to the instance that granted the record decides on
// the record it holds, without a read; when the record changed since
// (another instance expired and granted it again), the write's guard fails,
// and the next round reads and refuses the stale token.
TEST_P(StoreTest, CompleteOfAHeldRecordSkipsTheRead) {
  ASSERT_TRUE(coordinator_->Begin(NewKey("a"), Cmd()).ok());
  const int reads = reads_;
  absl::StatusOr<Record> done =
      coordinator_->Complete(NewKey("a"), CompleteCommand{1, AllBytes("a")});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status, Status::kSucceeded);
  EXPECT_EQ(done->result, AllBytes("a"));
  EXPECT_EQ(reads_, reads);

  Policy release;
  release.on_lease_expiry = ExpiryPolicy::kRelease;
  const PolicySet policies(release, {});
  coordinator_ = std::make_unique<SyncCoordinator>(store_.get(), &policies);
  SyncCoordinator other(store_.get(), &policies);
  ASSERT_TRUE(
      coordinator_->Begin(NewKey("b"), Cmd("h1", absl::Milliseconds(200)))
          .ok());
  absl::SleepFor(absl::Milliseconds(300));
  absl::StatusOr<BeginResult> r = other.Begin(NewKey("b"), Cmd());
  if (r.ok() && r->outcome == Outcome::kFailed)
    r = other.Begin(NewKey("b"), Cmd());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outcome, Outcome::kAcquired);
  const int reads_before = reads_;
  absl::StatusOr<Record> stale =
      coordinator_->Complete(NewKey("b"), CompleteCommand{1, AllBytes("old")});
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition)
      << stale.status();
  EXPECT_GT(reads_, reads_before);
  absl::StatusOr<StoreRead> read = ReadNow(*store_, NewKey("b"));
  ASSERT_TRUE(read.ok() && read->record) << read.status();
  EXPECT_EQ(read->record->status, Status::kProcessing);
  EXPECT_EQ(read->record->fencing_token, 2);
}

TEST_P(StoreTest, BeginSettlesNewKeysAndReplaysWithoutARead) {
  const RecordKey key = NewKey();
  absl::StatusOr<BeginResult> grant = BeginNonBlocking(key, Cmd("h1"));
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->outcome, Outcome::kAcquired);
  absl::StatusOr<BeginResult> busy = BeginNonBlocking(key, Cmd("h1"));
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(busy->outcome, Outcome::kInProgress);
  EXPECT_GT(busy->retry_after, absl::ZeroDuration());
  ASSERT_TRUE(coordinator_
                  ->Complete(key, CompleteCommand{grant->record->fencing_token,
                                                  AllBytes("paid")})
                  .ok());
  absl::StatusOr<BeginResult> replay = BeginNonBlocking(key, Cmd("h1"));
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
  EXPECT_EQ(replay->record->result, AllBytes("paid"));
  absl::StatusOr<BeginResult> other = BeginNonBlocking(key, Cmd("h2"));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->outcome, Outcome::kMismatch);
  // Each was settled by Begin's first statement (insert-or-read).
  EXPECT_EQ(reads_.load(), 0);
}

TEST_P(StoreTest, AParkedBeginWakesWhenTheLeaseRunsOut) {
  const RecordKey key = NewKey();
  absl::StatusOr<BeginResult> grant =
      BeginNonBlocking(key, Cmd("h1", absl::Milliseconds(300)));
  ASSERT_TRUE(grant.ok()) << grant.status();
  ASSERT_EQ(grant->outcome, Outcome::kAcquired);
  // IN_PROGRESS with a wait: the Begin parks until the lease runs out, then
  // the record is UNKNOWN (the default policy), never granted again.
  Waiting waiting(this, key, Cmd("h1"), absl::Seconds(5));
  absl::StatusOr<BeginResult> waited = waiting.Await();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->outcome, Outcome::kUnknown);
  absl::StatusOr<BeginResult> again = BeginNonBlocking(key, Cmd("h1"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, Outcome::kUnknown);
}

TEST_P(StoreTest, ParkedBeginsWakeWhenTheRecordCompletes) {
  const RecordKey key = NewKey();
  absl::StatusOr<BeginResult> grant = BeginNonBlocking(key, Cmd("h1"));
  ASSERT_TRUE(grant.ok()) << grant.status();
  ASSERT_EQ(grant->outcome, Outcome::kAcquired);
  std::vector<std::unique_ptr<Waiting>> waiting;
  waiting.reserve(50);
  for (int i = 0; i < 50; ++i) {
    waiting.push_back(
        std::make_unique<Waiting>(this, key, Cmd("h1"), absl::Seconds(30)));
  }
  // Give the Begins time to park; none is answered while the lease runs.
  absl::SleepFor(absl::Milliseconds(200));
  for (auto& w : waiting) EXPECT_FALSE(w->answered());
  const SteadyTime completed = SteadyClock::now();
  ASSERT_TRUE(coordinator_
                  ->Complete(key, CompleteCommand{grant->record->fencing_token,
                                                  AllBytes("paid")})
                  .ok());
  // PostgreSQL: the change comes back through LISTEN/NOTIFY.
  for (auto& w : waiting) {
    absl::StatusOr<BeginResult> r = w->Await();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, Outcome::kCompleted);
    EXPECT_EQ(r->record->result, AllBytes("paid"));
  }
  EXPECT_LT(SteadySince(completed), absl::Seconds(5));
  EXPECT_EQ(calls()->parked(), 0);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest,
                         ::testing::Values(Kind::kMemory, Kind::kPostgres,
                                           Kind::kPostgresBatch),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           switch (info.param) {
                             case Kind::kMemory:
                               return "Memory";
                             case Kind::kPostgres:
                               return "Postgres";
                             case Kind::kPostgresBatch:
                               return "PostgresBatch";
                           }
                           return "";
                         });

// The payloads of NOTIFYs on the record channel that start with `prefix`,
// as a separate session (another instance's listener) receives them.
class NotifyLog final : public pqxx::notification_receiver {
 public:
  NotifyLog(pqxx::connection& c, std::string prefix)
      : pqxx::notification_receiver(c, "idempotency_record"),
        prefix_(std::move(prefix)) {}
  void operator()(const std::string& payload, int) override {
    if (absl::StartsWith(payload, prefix_)) payloads.push_back(payload);
  }
  std::vector<std::string> payloads;

 private:
  const std::string prefix_;
};

// Only a record that a waiting Begin marked (ReadForWaiter) notifies when it
// settles, whoever settles it: Complete, Fail, the reaper, Resolve. The
// others commit without NOTIFY (which takes a database-wide lock at commit),
// and marking notifies nothing. Notifications arrive in commit order, so
// the marked records' arriving proves the unmarked ones' absence.
TEST(NotifyTest, OnlyRecordsAWaiterMarkedNotifyWhenTheySettle) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  pqxx::connection listen(cluster->ConnInfo());
  // Other tests' records (the reaper may settle them) are left out.
  NotifyLog log(listen, "notify\n");
  PgOptions options;
  options.conninfo = cluster->ConnInfo();
  options.pool_size = 4;
  std::unique_ptr<Store> store = NewPostgresStore(options);
  PolicySet policies;
  SyncCoordinator coordinator(store.get(), &policies);
  const auto key = [](const std::string& k) {
    return RecordKey{"notify", "create-payment", k};
  };
  const auto grant = [&](const std::string& k, absl::Duration lease) {
    BeginCommand cmd;
    cmd.request_hash = "h1";
    cmd.lease = lease;
    absl::StatusOr<BeginResult> r = coordinator.Begin(key(k), cmd);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r.ok() ? r->outcome : Outcome::kInProgress, Outcome::kAcquired);
    return r.ok() ? r->record->fencing_token : 0;
  };
  const auto mark = [&](const std::string& k) {
    absl::StatusOr<StoreRead> read =
        Await<absl::StatusOr<StoreRead>>([&](Store::ReadFn done) {
          store->ReadForWaiter(key(k), std::move(done));
        });
    EXPECT_TRUE(read.ok()) << read.status();
    return read.ok() ? read->record : std::nullopt;
  };
  // Each settle, once unmarked ("u-") and once marked ("m-").
  const auto settle_all = [&](const std::string& prefix, bool marked) {
    const int64_t c = grant(prefix + "complete", absl::Seconds(30));
    const int64_t f = grant(prefix + "fail", absl::Seconds(30));
    const int64_t e = grant(prefix + "expire", absl::Milliseconds(200));
    if (marked) {
      for (const char* k : {"complete", "fail", "expire"}) {
        std::optional<Record> r = mark(prefix + k);
        ASSERT_TRUE(r.has_value()) << k;
        EXPECT_EQ(r->status, Status::kProcessing) << k;
      }
    }
    ASSERT_TRUE(coordinator
                    .Complete(key(prefix + "complete"),
                              CompleteCommand{c, AllBytes("paid")})
                    .ok());
    ASSERT_TRUE(coordinator
                    .Fail(key(prefix + "fail"),
                          FailCommand{f, AllBytes("declined"), false})
                    .ok());
    absl::SleepFor(absl::Milliseconds(300));
    absl::StatusOr<int> reaped = ReapOnce(store.get(), policies, 100, {});
    ASSERT_TRUE(reaped.ok()) << reaped.status();
    ResolveCommand resolve;
    resolve.result = AllBytes("checked");
    resolve.reason = "checked with the bank";
    resolve.actor = "test";
    resolve.expected_fencing_token = e;
    absl::StatusOr<Record> resolved =
        coordinator.Resolve(key(prefix + "expire"), resolve);
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    EXPECT_EQ(resolved->status, Status::kSucceeded);
  };
  settle_all("u-", false);
  settle_all("m-", true);
  // A record marked after it settled reads settled; an absent one absent.
  std::optional<Record> settled = mark("m-complete");
  ASSERT_TRUE(settled.has_value());
  EXPECT_EQ(settled->status, Status::kSucceeded);
  EXPECT_FALSE(mark("absent").has_value());

  const std::string p = "notify\ncreate-payment\n";
  const std::vector<std::string> want = {p + "m-complete", p + "m-fail",
                                         p + "m-expire", p + "m-expire"};
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (log.payloads.size() < want.size() && absl::Now() < until) {
    listen.await_notification(0, 100000);
  }
  // Anything sent by mistake after the last one would arrive with it.
  listen.await_notification(0, 300000);
  EXPECT_EQ(log.payloads, want);
}

// A call with nothing else in flight goes to PostgreSQL on the lone-call
// lane (pg_lane.h): Begin's insert, Complete's update and a replay's read
// each take it once the first call has learnt the table's layout through
// the pool, with the answers the batch threads give. With the lane off
// (--pg-lone-lane=off) no call takes it.
TEST(LaneTest, LoneCallsTakeTheLaneWithTheSameAnswers) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "lane on" : "lane off");
    PgOptions options;
    options.conninfo = cluster->ConnInfo();
    options.pool_size = 2;
    PgBatchOptions batch;
    batch.lone_lane = on;
    PgStoreProbes probes;
    std::unique_ptr<Store> store = NewPostgresStore(options, batch, &probes);
    PolicySet policies;
    SyncCoordinator coordinator(store.get(), &policies);
    BeginCommand cmd;
    cmd.request_hash = "h1";
    cmd.lease = absl::Seconds(30);
    const auto lifecycle = [&](const std::string& k) {
      const RecordKey key{"lane", on ? "on" : "off", k};
      absl::StatusOr<BeginResult> first = coordinator.Begin(key, cmd);
      ASSERT_TRUE(first.ok()) << first.status();
      ASSERT_EQ(first->outcome, Outcome::kAcquired);
      ASSERT_TRUE(
          coordinator
              .Complete(key, CompleteCommand{first->record->fencing_token,
                                             AllBytes("paid")})
              .ok());
      absl::StatusOr<BeginResult> replay = coordinator.Begin(key, cmd);
      ASSERT_TRUE(replay.ok()) << replay.status();
      EXPECT_EQ(replay->outcome, Outcome::kCompleted);
      EXPECT_EQ(replay->record->result, AllBytes("paid"));
      absl::StatusOr<StoreRead> read = ReadNow(*store, key);
      ASSERT_TRUE(read.ok()) << read.status();
      ASSERT_TRUE(read->record.has_value());
      EXPECT_EQ(read->record->status, Status::kSucceeded);
    };
    // The lane connects on its own thread: until then calls are batched.
    for (int i = 0; i < 50 && probes.lane_calls() == 0; ++i) {
      lifecycle(absl::StrCat("warm-", i));
      absl::SleepFor(absl::Milliseconds(20));
    }
    const uint64_t before = probes.lane_calls();
    lifecycle("k");
    EXPECT_EQ(probes.lane_calls() - before, on ? 4u : 0u);
    if (!on) {
      EXPECT_EQ(probes.lane_calls(), 0u);
    }
  }
}

// A settle written through this store reaches its own change feed with the
// record as written (its parked Begins need no read); a write that leaves
// the record PROCESSING does not.
TEST(NotifyTest, ASettleWrittenHereIsPublishedWithItsRecord) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  PgOptions options;
  options.conninfo = cluster->ConnInfo();
  options.pool_size = 2;
  std::unique_ptr<Store> store = NewPostgresStore(options);
  PolicySet policies;
  SyncCoordinator coordinator(store.get(), &policies);
  std::mutex mu;
  std::vector<Record> published;
  store->Changes()->SetListener(
      [&](const RecordKey* key, const Record* settled) {
        if (settled == nullptr || key->tenant != "published") return;
        EXPECT_EQ(*key, settled->key);
        std::lock_guard<std::mutex> lock(mu);
        published.push_back(*settled);
      });
  const auto grant = [&](const std::string& k) {
    BeginCommand cmd;
    cmd.request_hash = "h1";
    cmd.lease = absl::Seconds(30);
    absl::StatusOr<BeginResult> r =
        coordinator.Begin(RecordKey{"published", "create-payment", k}, cmd);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->record->fencing_token : 0;
  };
  const RecordKey paid{"published", "create-payment", "paid"};
  const RecordKey declined{"published", "create-payment", "declined"};
  const int64_t c = grant(paid.key);
  const int64_t f = grant(declined.key);
  HeartbeatCommand beat;
  beat.fencing_token = c;
  beat.extend = absl::Seconds(60);
  ASSERT_TRUE(coordinator.Heartbeat(paid, beat).ok());
  ASSERT_TRUE(
      coordinator.Complete(paid, CompleteCommand{c, AllBytes("paid")}).ok());
  ASSERT_TRUE(
      coordinator.Fail(declined, FailCommand{f, AllBytes("declined"), false})
          .ok());
  // Published after the writer's answer: wait for it.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (published.size() >= 2) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::SleepFor(absl::Milliseconds(100));  // and nothing more
  store->Changes()->SetListener({});
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(published.size(), 2u);
  EXPECT_EQ(published[0].key, paid);
  EXPECT_EQ(published[0].status, Status::kSucceeded);
  ASSERT_TRUE(published[0].result.has_value());
  EXPECT_EQ(published[0].result->body, AllBytes("paid").body);
  EXPECT_LT(absl::AbsDuration(published[0].updated_at - absl::Now()),
            absl::Seconds(5));
  EXPECT_EQ(published[1].key, declined);
  EXPECT_EQ(published[1].status, Status::kFailed);
}

// A waiter's read writes only to mark a PROCESSING record the first time:
// reading it again, or reading it once settled (every wake-up after a
// NOTIFY), leaves the row as it was (no write, no WAL flush).
TEST(NotifyTest, MarkingWritesOnlyTheFirstTime) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  PgOptions options;
  options.conninfo = cluster->ConnInfo();
  options.pool_size = 2;
  std::unique_ptr<Store> store = NewPostgresStore(options);
  PolicySet policies;
  SyncCoordinator coordinator(store.get(), &policies);
  const RecordKey key{"notify", "create-payment", "marked-once"};
  BeginCommand cmd;
  cmd.request_hash = "h1";
  cmd.lease = absl::Seconds(30);
  absl::StatusOr<BeginResult> grant = coordinator.Begin(key, cmd);
  ASSERT_TRUE(grant.ok()) << grant.status();
  const auto mark = [&] {
    absl::StatusOr<StoreRead> read =
        Await<absl::StatusOr<StoreRead>>([&](Store::ReadFn done) {
          store->ReadForWaiter(key, std::move(done));
        });
    EXPECT_TRUE(read.ok()) << read.status();
    return read.ok() && read->record ? read->record->status : Status::kUnknown;
  };
  // The row's version (ctid, xmin) and mark.
  const auto version = [&] {
    absl::StatusOr<std::string> v = cluster->Psql(
        "SELECT ctid::text || ' ' || xmin::text || ' ' || waited::text "
        "FROM idempotency_record WHERE idempotency_key = 'marked-once'");
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : "";
  };
  const std::string before = version();
  EXPECT_TRUE(absl::EndsWith(before, " false")) << before;
  EXPECT_EQ(mark(), Status::kProcessing);
  const std::string marked = version();
  EXPECT_NE(marked, before);
  EXPECT_TRUE(absl::EndsWith(marked, " true")) << marked;
  EXPECT_EQ(mark(), Status::kProcessing);
  EXPECT_EQ(version(), marked);
  ASSERT_TRUE(coordinator
                  .Complete(key, CompleteCommand{grant->record->fencing_token,
                                                 AllBytes("paid")})
                  .ok());
  const std::string settled = version();
  EXPECT_EQ(mark(), Status::kSucceeded);
  EXPECT_EQ(version(), settled);
}

// Each connection the store's pool opens first runs the hot path (create,
// read, mark waited, settle) on a record of its own and rolls it back: the
// statistics count its writes, yet no row and no NOTIFY is left, and the
// call that opened the connection gets its answer.
TEST(NotifyTest, ConnectionWarmUpLeavesNoTrace) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  const auto counts = [&] {
    absl::StatusOr<std::string> v = cluster->Psql(
        "SELECT n_tup_ins || ' ' || n_tup_upd FROM pg_stat_user_tables "
        "WHERE relname = 'idempotency_record'");
    EXPECT_TRUE(v.ok()) << v.status();
    std::vector<std::string> f = absl::StrSplit(v.ok() ? *v : "0 0", ' ');
    return std::make_pair(std::stoll(f.at(0)), std::stoll(f.at(1)));
  };
  pqxx::connection listen(cluster->ConnInfo());
  NotifyLog log(listen, "");
  const std::pair<int64_t, int64_t> before = counts();
  PgOptions options;
  options.conninfo = cluster->ConnInfo();
  options.pool_size = 1;
  std::unique_ptr<Store> store = NewPostgresStore(options);
  const absl::StatusOr<StoreRead> read =
      ReadNow(*store, RecordKey{"warm-up", "op", "absent"});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->record.has_value());
  // A backend's statistics reach the shared counters when it exits at the
  // latest: the insert, the mark and the settle.
  store.reset();
  std::pair<int64_t, int64_t> after = counts();
  const absl::Time until = absl::Now() + absl::Seconds(15);
  while ((after.first < before.first + 1 || after.second < before.second + 2) &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(200));
    after = counts();
  }
  EXPECT_GE(after.first, before.first + 1);
  EXPECT_GE(after.second, before.second + 2);
  absl::StatusOr<std::string> left = cluster->Psql(
      "SELECT count(*) FROM idempotency_record WHERE tenant_id = "
      "'idem.warm-up'");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(*left, "0");
  // Notifications arrive in commit order: the marker, sent after, proves
  // that none came from the warm-up.
  ASSERT_TRUE(cluster->Psql("NOTIFY idempotency_record, 'marker'").ok());
  while (log.payloads.empty() && absl::Now() < until + absl::Seconds(5)) {
    listen.await_notification(0, 100000);
  }
  EXPECT_EQ(log.payloads, std::vector<std::string>{"marker"});
}

// The schema refuses what the API refuses, one byte past each bound, and
// takes the largest value the API accepts: a bug in validation cannot store
// an over-long reason or actor, or headers that are not an object.
TEST(SchemaTest, ChecksHoldTheApiBounds) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  const auto record = [](const std::string& key, const std::string& set) {
    return absl::StrCat(
        "INSERT INTO idempotency_record (tenant_id, operation, "
        "idempotency_key, status, request_hash, fencing_token, attempt, "
        "lease_expires_at) VALUES ('t', 'schema', '",
        key,
        "', 'UNKNOWN', '\\x01', 1, 1, now()); UPDATE idempotency_record SET ",
        set, " WHERE idempotency_key = '", key, "'");
  };
  const auto audit = [](const std::string& actor, const std::string& reason) {
    return absl::StrCat(
        "INSERT INTO idempotency_audit (tenant_id, operation, "
        "idempotency_key, from_status, to_status, actor, reason, "
        "fencing_token) VALUES ('t', 'schema', 'k', 'UNKNOWN', 'SUCCEEDED', '",
        actor, "', '", reason, "', 1)");
  };
  const auto repeat = [](size_t n) { return std::string(n, 'r'); };
  struct Case {
    std::string sql;
    std::string refused_by;  // empty: accepted
  };
  const std::vector<Case> cases = {
      {record("k1", "resolve_reason = '" + repeat(1024) + "'"), ""},
      {record("k2", "resolve_reason = '" + repeat(1025) + "'"),
       "idempotency_record_resolve_reason_check"},
      {record("k3", "resolved_by = '" + repeat(128) + "'"), ""},
      {record("k4", "resolved_by = '" + repeat(129) + "'"),
       "idempotency_record_resolved_by_check"},
      {record("k5", "result_headers = '{\"a\": \"b\"}'"), ""},
      {record("k6", "result_headers = '[1]'"),
       "idempotency_record_headers_check"},
      {audit(repeat(128), repeat(1024)), ""},
      {audit(repeat(129), "r"), "idempotency_audit_actor_check"},
      {audit("", "r"), "idempotency_audit_actor_check"},
      {audit("a", repeat(1025)), "idempotency_audit_reason_check"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> ran = cluster->Psql(c.sql);
    if (c.refused_by.empty()) {
      EXPECT_TRUE(ran.ok()) << c.sql.substr(0, 200) << ": " << ran.status();
    } else {
      EXPECT_FALSE(ran.ok()) << c.sql.substr(0, 200);
      EXPECT_NE(ran.status().message().find(c.refused_by), std::string::npos)
          << ran.status();
    }
  }
  ASSERT_TRUE(cluster
                  ->Psql("DELETE FROM idempotency_record WHERE operation = "
                         "'schema'; DELETE FROM idempotency_audit WHERE "
                         "operation = 'schema'")
                  .ok());
}

// The CHECKs of sql/0005 refuse the snapshots CheckSnapshot refuses
// (server/wire/snapshot_validation_test.cc) and take the largest it accepts.
TEST(SchemaTest, SnapshotChecksHoldTheApiBounds) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  pqxx::connection c(cluster->ConnInfo());
  // Each case in its own transaction, rolled back: true when accepted, else
  // the name of the constraint that refused it.
  const auto store = [&c](const std::string& content_type,
                          const std::string& headers) -> std::string {
    pqxx::work tx(c);
    try {
      tx.exec_params(
          "INSERT INTO idempotency_record (tenant_id, operation, "
          "idempotency_key, status, request_hash, fencing_token, attempt, "
          "lease_expires_at, result_code, result_content_type, "
          "result_headers) VALUES ('t', 'schema', 'k', 'UNKNOWN', '\\x01', 1, "
          "1, now(), 200, $1, $2::jsonb)",
          content_type, headers);
      return "";
    } catch (const pqxx::check_violation& e) {
      return e.what();
    }
  };
  const auto headers = [](size_t n, const std::string& value) {
    std::string json = "{";
    for (size_t i = 0; i < n; ++i) {
      absl::StrAppend(&json, i == 0 ? "" : ",", "\"h", i, "\":\"", value, "\"");
    }
    return json + "}";
  };
  const std::string name_256(256, 'n');
  const std::string value_8192(8192, 'v');
  const struct {
    std::string content_type;
    std::string headers;
    std::string refused_by;  // empty: accepted
  } cases[] = {
      {std::string(255, 'c'), "{}", ""},
      {"caf\xc3\xa9/plain", "{}", ""},
      {std::string(256, 'c'), "{}", "idempotency_record_content_type_check"},
      {"text/plain\r\nX-Injected: 1", "{}",
       "idempotency_record_content_type_check"},
      {"a\nb", "{}", "idempotency_record_content_type_check"},
      {"", headers(64, "v"), ""},
      {"", headers(65, "v"), "idempotency_record_headers_valid_check"},
      {"", "{\"" + name_256 + "\":\"v\"}", ""},
      {"", "{\"!#$%&'*+-.^_`|~09AZaz\":\"v\"}", ""},
      {"", "{\"" + name_256 + "n\":\"v\"}",
       "idempotency_record_headers_valid_check"},
      {"", "{\"\":\"v\"}", "idempotency_record_headers_valid_check"},
      {"", "{\"a b\":\"v\"}", "idempotency_record_headers_valid_check"},
      {"", "{\":status\":\"v\"}", "idempotency_record_headers_valid_check"},
      {"", "{\"caf\xc3\xa9\":\"v\"}", "idempotency_record_headers_valid_check"},
      {"", "{\"x\":\"" + value_8192 + "\"}", ""},
      {"", "{\"x\":\"caf\xc3\xa9\\t \\\"q\\\"\"}", ""},
      {"", "{\"x\":\"" + value_8192 + "v\"}",
       "idempotency_record_headers_valid_check"},
      {"", "{\"x\":\"a\\r\\nb: c\"}", "idempotency_record_headers_valid_check"},
      {"", "{\"x\":\"a\\nb\"}", "idempotency_record_headers_valid_check"},
      {"", "{\"x\":1}", "idempotency_record_headers_valid_check"},
  };
  for (const auto& c : cases) {
    const std::string refused = store(c.content_type, c.headers);
    const std::string what =
        c.content_type.substr(0, 40) + " " + c.headers.substr(0, 80);
    if (c.refused_by.empty()) {
      EXPECT_EQ(refused, "") << what;
    } else {
      EXPECT_NE(refused.find(c.refused_by), std::string::npos)
          << what << ": " << refused;
    }
  }
}

// sql/0005 repairs the rows an older version stored that its CHECKs would
// refuse, instead of failing the migration: replayed anew, in a rolled-back
// transaction, over such rows.
TEST(SchemaTest, SnapshotBoundsMigrationRepairsOlderRows) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  const Migration* bounds = nullptr;
  for (const Migration& m : Migrations()) {
    if (m.version == 5) bounds = &m;
  }
  ASSERT_NE(bounds, nullptr);
  pqxx::connection c(cluster->ConnInfo());
  pqxx::work tx(c);
  tx.exec(
      "ALTER TABLE idempotency_record"
      " DROP CONSTRAINT idempotency_record_content_type_check,"
      " DROP CONSTRAINT idempotency_record_headers_valid_check;"
      " DROP FUNCTION idempotency_result_headers_valid(jsonb);"
      " DROP FUNCTION idempotency_result_header_valid(text, jsonb)");
  std::string many = "{";
  for (int i = 0; i < 70; ++i) {
    absl::StrAppend(&many, i == 0 ? "" : ",", "\"h", absl::StrFormat("%02d", i),
                    "\":\"v\"");
  }
  many += "}";
  const auto insert = [&tx](const std::string& key,
                            const std::string& content_type,
                            const std::string& headers) {
    tx.exec_params(
        "INSERT INTO idempotency_record (tenant_id, operation, "
        "idempotency_key, status, request_hash, fencing_token, attempt, "
        "lease_expires_at, result_code, result_content_type, result_headers) "
        "VALUES ('t', 'repair', $1, 'UNKNOWN', '\\x01', 1, 1, now(), 200, $2, "
        "$3::jsonb)",
        key, content_type, headers);
  };
  insert("good", "text/plain", "{\"location\":\"/a\",\"x-b\":\"b\"}");
  insert("long", std::string(300, 'c'), "{}");
  insert("crlf", "text/plain\r\nX-Injected: 1",
         "{\"ok\":\"1\",\"bad name\":\"2\",\"x\":\"a\\r\\nb\",\"n\":3}");
  insert("many", "text/plain", many);
  tx.exec(bounds->sql);
  const auto row = [&tx](const std::string& key) {
    pqxx::row r = tx.exec_params1(
        "SELECT result_content_type, result_headers::text,"
        " (SELECT count(*) FROM jsonb_each(result_headers)),"
        " result_headers ? 'h63', result_headers ? 'h64'"
        " FROM idempotency_record WHERE operation = 'repair'"
        " AND idempotency_key = $1",
        key);
    return std::make_tuple(r[0].as<std::string>(), r[1].as<std::string>(),
                           r[2].as<int>(), r[3].as<bool>(), r[4].as<bool>());
  };
  EXPECT_EQ(std::get<0>(row("good")), "text/plain");
  EXPECT_EQ(std::get<1>(row("good")), "{\"x-b\": \"b\", \"location\": \"/a\"}");
  EXPECT_EQ(std::get<0>(row("long")), "");
  EXPECT_EQ(std::get<0>(row("crlf")), "");
  EXPECT_EQ(std::get<1>(row("crlf")), "{\"ok\": \"1\"}");
  const auto many_row = row("many");
  EXPECT_EQ(std::get<0>(many_row), "text/plain");
  EXPECT_EQ(std::get<2>(many_row), 64);
  EXPECT_TRUE(std::get<3>(many_row));
  EXPECT_FALSE(std::get<4>(many_row));
  // The constraints are back, and hold.
  EXPECT_THROW(insert("again", "a\nb", "{}"), pqxx::check_violation);
}

// After PostgreSQL ended the pool's idle connections (a restart, or
// pg_terminate_backend), none of them fails a call: each is replaced when
// taken, not found broken by the statement run on it.
TEST(PgPoolTest, ConnectionsEndedWhileIdleFailNoCall) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  PgOptions options;
  options.conninfo = cluster->ConnInfo();
  options.pool_size = 4;
  PgPool pool(options);
  const auto run = [&pool](const std::string& sql) {
    return pool.Run("test", [&sql](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      tx.exec(sql);
    });
  };
  // Four connections open at once, then idle in the pool.
  std::vector<std::thread> threads;
  threads.reserve(options.pool_size);
  for (int i = 0; i < options.pool_size; ++i) {
    threads.emplace_back(
        [&run] { EXPECT_TRUE(run("SELECT pg_sleep(0.2)").ok()); });
  }
  for (std::thread& t : threads) t.join();
  pqxx::connection admin(cluster->ConnInfo());
  pqxx::nontransaction tx(admin);
  const pqxx::result ended = tx.exec(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
      "backend_type = 'client backend' AND pid <> pg_backend_pid() AND "
      "query = 'SELECT pg_sleep(0.2)'");
  ASSERT_EQ(ended.size(), 4u);
  absl::SleepFor(absl::Milliseconds(100));  // the backends exit
  for (int i = 0; i < 2 * options.pool_size; ++i) {
    const absl::Status s = run("SELECT 1");
    EXPECT_TRUE(s.ok()) << "call " << i << ": " << s;
  }
}

// This process's TCP sockets connected to `port` (on 127.0.0.1), from
// /proc: the connections a pool holds or is opening.
int SocketsTo(int port) {
  std::set<std::string> inodes;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target =
        std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && absl::StartsWith(target, "socket:[")) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::ifstream tcp("/proc/self/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  const std::string remote = absl::StrFormat("0100007F:%04X", port);
  int n = 0;
  while (std::getline(tcp, line)) {
    std::vector<std::string> f =
        absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (f.size() > 9 && f[2] == remote && inodes.count(f[9]) > 0) ++n;
  }
  return n;
}

// A burst of calls on a cold pool opens max_connecting connections at a
// time, not one per call: with PostgreSQL paused (each connect hangs), the
// pool holds at most that many sockets to it; the other calls wait for a
// connection and give up after acquire_timeout. Once PostgreSQL answers,
// the pool serves every call.
TEST(PgPoolTest, ColdPoolOpensAFewConnectionsAtATime) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  PgOptions options;
  options.conninfo = cluster->ConnInfo();
  options.pool_size = 8;
  options.max_connecting = 2;
  options.acquire_timeout = absl::Milliseconds(600);
  options.connect_timeout = absl::Seconds(5);
  PgPool pool(options);
  const auto run = [&pool] {
    return pool.Run("test", [](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      tx.exec("SELECT 1");
    });
  };
  ASSERT_EQ(SocketsTo(cluster->port()), 0);
  ASSERT_TRUE(cluster->Pause().ok());
  std::vector<absl::Status> results(options.pool_size);
  std::vector<std::thread> threads;
  threads.reserve(options.pool_size);
  for (int i = 0; i < options.pool_size; ++i) {
    threads.emplace_back([&run, &results, i] { results[i] = run(); });
  }
  absl::SleepFor(absl::Milliseconds(300));
  const int opening = SocketsTo(cluster->port());
  absl::SleepFor(absl::Milliseconds(500));  // past acquire_timeout
  ASSERT_TRUE(cluster->Resume().ok());
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(opening, options.max_connecting);
  int waited_out = 0;
  for (const absl::Status& s : results) {
    if (s.ok()) continue;
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "no PostgreSQL connection"))
        << s;
    ++waited_out;
  }
  // The two that connected finish once PostgreSQL runs again.
  EXPECT_EQ(waited_out, options.pool_size - options.max_connecting);
  threads.clear();
  std::atomic<int> failed{0};
  for (int i = 0; i < 4 * options.pool_size; ++i) {
    threads.emplace_back([&run, &failed] {
      const absl::Status s = run();
      if (!s.ok()) {
        ++failed;
        ADD_FAILURE() << s;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_LE(SocketsTo(cluster->port()), options.pool_size);
}

// Named prepared statements do not survive PgBouncer's transaction
// pooling: a statement prepared on one server connection is missing on the
// next, or already there for another client. Two stores over a bouncer with
// one server connection: with --pg-prepared=on the second store's first
// read fails, with off both read.
TEST(PgBouncerTest, PreparedStatementsNeedOffBehindTransactionPooling) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  absl::StatusOr<std::unique_ptr<PgBouncer>> b = PgBouncer::Start(*cluster, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  const auto read_twice = [&](bool prepared) {
    PgOptions options;
    options.conninfo = (*b)->ConnInfo();
    options.direct_conninfo = cluster->ConnInfo();
    options.prepared = prepared;
    options.pool_size = 1;
    // Without the lone-call lane, whose own session would prepare on the
    // bouncer's one server connection too: the point here is the pool's.
    PgBatchOptions batch;
    batch.lone_lane = false;
    std::unique_ptr<Store> first = NewPostgresStore(options, batch);
    std::unique_ptr<Store> second = NewPostgresStore(options, batch);
    const RecordKey key{"bouncer", "op", prepared ? "on" : "off"};
    const absl::StatusOr<StoreRead> a = ReadNow(*first, key);
    EXPECT_TRUE(a.ok()) << a.status();
    return ReadNow(*second, key).status();
  };
  const absl::Status on = read_twice(true);
  EXPECT_FALSE(on.ok());
  EXPECT_TRUE(absl::StrContains(on.message(), "prepared statement")) << on;
  const absl::Status off = read_twice(false);
  EXPECT_TRUE(off.ok()) << off;
}

// With --pg-prepared=off, many concurrent calls of several stores (as of
// several sidecars) share a bouncer's two server connections: every Begin
// and Complete succeeds.
TEST(PgBouncerTest, ManyConcurrentCallsOverFewServerConnections) {
  ASSERT_NE(cluster, nullptr) << "PostgreSQL did not start";
  absl::StatusOr<std::unique_ptr<PgBouncer>> b = PgBouncer::Start(*cluster, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  PgOptions options;
  options.conninfo = (*b)->ConnInfo();
  options.direct_conninfo = cluster->ConnInfo();
  options.prepared = false;
  options.pool_size = 8;
  PolicySet policies;
  constexpr int kStores = 3;
  constexpr int kThreads = 24;
  constexpr int kCalls = 20;
  std::vector<std::unique_ptr<Store>> stores;
  std::vector<std::unique_ptr<SyncCoordinator>> coordinators;
  for (int i = 0; i < kStores; ++i) {
    stores.push_back(NewPostgresStore(options));
    coordinators.push_back(
        std::make_unique<SyncCoordinator>(stores.back().get(), &policies));
  }
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      SyncCoordinator& c = *coordinators[t % kStores];
      for (int i = 0; i < kCalls; ++i) {
        const RecordKey key{"bouncer-many", "op", absl::StrCat(t, "-", i)};
        BeginCommand cmd;
        cmd.request_hash = "h";
        cmd.lease = absl::Seconds(30);
        absl::StatusOr<BeginResult> begun = c.Begin(key, cmd);
        if (!begun.ok() || begun->outcome != Outcome::kAcquired) {
          ++failed;
          ADD_FAILURE() << key.key << ": " << begun.status();
          continue;
        }
        absl::StatusOr<Record> completed = c.Complete(
            key,
            CompleteCommand{begun->record->fencing_token, AllBytes(key.key)});
        if (!completed.ok()) {
          ++failed;
          ADD_FAILURE() << key.key << ": " << completed.status();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(cluster
                ->Psql("SELECT count(*) FROM idempotency_record WHERE "
                       "tenant_id = 'bouncer-many' AND status = "
                       "'SUCCEEDED'")
                .value_or(""),
            absl::StrCat(kThreads * kCalls));
}

}  // namespace
}  // namespace idem
