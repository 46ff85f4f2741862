// Operators: the reaper across instances, Resolve, List, History, purging
// and late reports, against two real sidecars on one PostgreSQL.
#include <atomic>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"
#include "tests/testing/process.h"

namespace idem::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;

SidecarEnv* env = nullptr;

constexpr char kConfig[] = R"yaml(
operations:
  short-lived: {retention: 1s, tombstone_retention: 0s}
  tombstoned: {retention: 1s, tombstone_retention: 2s}
  send-email: {on_lease_expiry: release}
)yaml";

const auto* const kEnv =
    ::testing::AddGlobalTestEnvironment(new SharedSidecarEnv(
        &env, 2, {"--reaper-interval=200ms", "--purge-interval=200ms"},
        kConfig));

class OperatorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(env, nullptr) << "environment did not start";
    tenant_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  pb::RecordKey K(const std::string& key,
                  const std::string& op = "create-payment") {
    return Key(tenant_, op, key);
  }

  grpc::Status Begin(int i, const pb::RecordKey& key, pb::BeginResponse* resp,
                     int lease_seconds = 0, const std::string& hash = "h") {
    pb::BeginRequest req;
    *req.mutable_key() = key;
    req.set_request_hash(hash);
    if (lease_seconds > 0) req.mutable_lease()->set_seconds(lease_seconds);
    return env->client(i).Begin(Ctx().get(), req, resp);
  }

  pb::Outcome BeginOutcome(int i, const pb::RecordKey& key) {
    pb::BeginResponse resp;
    grpc::Status s = Begin(i, key, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.outcome();
  }

  grpc::Status Finish(const pb::RecordKey& key, int64_t token, bool ok,
                      bool retryable = false) {
    if (ok) {
      pb::CompleteRequest req;
      *req.mutable_key() = key;
      req.set_fencing_token(token);
      *req.mutable_result() = BinarySnapshot(200, "done");
      pb::CompleteResponse resp;
      return env->client(0).Complete(Ctx().get(), req, &resp);
    }
    pb::FailRequest req;
    *req.mutable_key() = key;
    req.set_fencing_token(token);
    *req.mutable_error() = BinarySnapshot(500, "err");
    req.set_retryable(retryable);
    pb::FailResponse resp;
    return env->client(0).Fail(Ctx().get(), req, &resp);
  }

  // Makes `key` UNKNOWN: a 1s lease nobody completes, then a Get.
  void MakeUnknown(const pb::RecordKey& key) {
    pb::BeginResponse resp;
    ASSERT_TRUE(Begin(0, key, &resp, 1).ok());
    ASSERT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
    WaitForStatus(key, pb::STATUS_UNKNOWN);
  }

  void WaitForStatus(const pb::RecordKey& key, pb::Status want) {
    pb::Record r;
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (absl::Now() < end) {
      if (Get(key, &r).ok() && r.status() == want) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL() << "record never reached " << pb::Status_Name(want) << ": "
           << r.DebugString();
  }

  grpc::Status Get(const pb::RecordKey& key, pb::Record* out) {
    pb::GetRequest req;
    *req.mutable_key() = key;
    pb::GetResponse resp;
    grpc::Status s = env->client(1).Get(Ctx().get(), req, &resp);
    *out = resp.record();
    return s;
  }

  grpc::Status Resolve(const pb::RecordKey& key, pb::Status to, bool retryable,
                       pb::ResolveResponse* resp = nullptr,
                       int64_t expected_token = 0, bool force = false,
                       const std::string& reason = "checked the ledger") {
    pb::ResolveRequest req;
    *req.mutable_key() = key;
    req.set_to(to);
    if (to == pb::STATUS_SUCCEEDED) {
      *req.mutable_result() = BinarySnapshot(201, "resolved");
    }
    req.set_retryable(retryable);
    req.set_reason(reason);
    req.set_actor("alice");
    req.set_expected_fencing_token(expected_token);
    req.set_force(force);
    pb::ResolveResponse local;
    return env->admin(1).Resolve(Ctx().get(), req, resp ? resp : &local);
  }

  std::vector<pb::AuditEntry> History(const pb::RecordKey& key) {
    pb::HistoryRequest req;
    *req.mutable_key() = key;
    pb::HistoryResponse resp;
    grpc::Status s = env->admin(0).History(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {resp.entries().begin(), resp.entries().end()};
  }

  std::string Count(const std::string& where) {
    return env->Sql(absl::StrCat(
        "SELECT count(*) FROM idempotency_record WHERE tenant_id = '", tenant_,
        "' AND ", where));
  }

  std::string tenant_;
};

// Two reapers, 1,000 abandoned leases: each becomes UNKNOWN exactly once.
TEST_F(OperatorsTest, ReapersExpireEveryAbandonedLeaseExactlyOnce) {
  constexpr int kRecords = 1000;
  std::vector<std::thread> threads;
  threads.reserve(8);
  std::atomic<int> acquired{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int k = t; k < kRecords; k += 8) {
        pb::BeginResponse resp;
        if (Begin(t % 2, K(absl::StrCat("abandoned-", k)), &resp, 1).ok() &&
            resp.outcome() == pb::OUTCOME_ACQUIRED) {
          ++acquired;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(acquired.load(), kRecords);
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (absl::Now() < end && Count("status = 'UNKNOWN'") != "1000") {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(Count("status = 'UNKNOWN'"), "1000");
  EXPECT_EQ(env->Sql(absl::StrCat(
                "SELECT count(*), count(DISTINCT idempotency_key) FROM "
                "idempotency_audit WHERE tenant_id = '",
                tenant_, "' AND actor = 'reaper' AND to_status = 'UNKNOWN'")),
            "1000|1000");
  EXPECT_EQ(env->Sql(absl::StrCat(
                "SELECT count(*) FROM idempotency_audit WHERE tenant_id = '",
                tenant_, "'")),
            "1000");
}

TEST_F(OperatorsTest, ResolveMatrix) {
  struct Row {
    std::string name;
    std::function<void(const pb::RecordKey&)> setup;
    pb::Status to;
    bool retryable;
    bool force;
    grpc::StatusCode want;
  };
  auto unknown = [this](const pb::RecordKey& k) { MakeUnknown(k); };
  auto processing = [this](const pb::RecordKey& k) {
    EXPECT_EQ(BeginOutcome(0, k), pb::OUTCOME_ACQUIRED);
  };
  auto succeeded = [this](const pb::RecordKey& k) {
    EXPECT_EQ(BeginOutcome(0, k), pb::OUTCOME_ACQUIRED);
    EXPECT_TRUE(Finish(k, 1, true).ok());
  };
  auto failed_final = [this](const pb::RecordKey& k) {
    EXPECT_EQ(BeginOutcome(0, k), pb::OUTCOME_ACQUIRED);
    EXPECT_TRUE(Finish(k, 1, false, false).ok());
  };
  auto failed_retryable = [this](const pb::RecordKey& k) {
    EXPECT_EQ(BeginOutcome(0, k), pb::OUTCOME_ACQUIRED);
    EXPECT_TRUE(Finish(k, 1, false, true).ok());
  };
  auto absent = [](const pb::RecordKey&) {};
  using C = grpc::StatusCode;
  const std::vector<Row> rows = {
      {"absent-s", absent, pb::STATUS_SUCCEEDED, false, false, C::NOT_FOUND},
      {"absent-f", absent, pb::STATUS_FAILED, true, false, C::NOT_FOUND},
      {"unknown-s", unknown, pb::STATUS_SUCCEEDED, false, false, C::OK},
      {"unknown-fr", unknown, pb::STATUS_FAILED, true, false, C::OK},
      {"unknown-ff", unknown, pb::STATUS_FAILED, false, false, C::OK},
      {"processing-s", processing, pb::STATUS_SUCCEEDED, false, false,
       C::FAILED_PRECONDITION},
      {"processing-f", processing, pb::STATUS_FAILED, true, false,
       C::FAILED_PRECONDITION},
      {"processing-s-force", processing, pb::STATUS_SUCCEEDED, false, true,
       C::OK},
      {"processing-ff-force", processing, pb::STATUS_FAILED, false, true,
       C::OK},
      {"succeeded-s", succeeded, pb::STATUS_SUCCEEDED, false, true,
       C::FAILED_PRECONDITION},
      {"succeeded-f", succeeded, pb::STATUS_FAILED, true, false,
       C::FAILED_PRECONDITION},
      {"failed-final-s", failed_final, pb::STATUS_SUCCEEDED, false, false,
       C::FAILED_PRECONDITION},
      {"failed-final-f", failed_final, pb::STATUS_FAILED, false, true,
       C::FAILED_PRECONDITION},
      {"failed-retryable-s", failed_retryable, pb::STATUS_SUCCEEDED, false,
       false, C::FAILED_PRECONDITION},
      {"failed-retryable-f", failed_retryable, pb::STATUS_FAILED, true, false,
       C::FAILED_PRECONDITION},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const pb::RecordKey key = K(row.name);
    row.setup(key);
    pb::Record before;
    Get(key, &before);
    pb::ResolveResponse resp;
    grpc::Status s = Resolve(key, row.to, row.retryable, &resp, 0, row.force);
    EXPECT_EQ(s.error_code(), row.want) << s.error_message();
    pb::Record after;
    Get(key, &after);
    if (!s.ok()) {
      EXPECT_TRUE(MessageDifferencer::Equals(before, after));
      continue;
    }
    EXPECT_EQ(after.status(), row.to);
    EXPECT_EQ(after.retryable(), row.retryable);
    EXPECT_EQ(after.resolved_by(), "alice");
    EXPECT_EQ(after.resolve_reason(), "checked the ledger");
    EXPECT_TRUE(after.has_expires_at());
    // Repeating the same Resolve is OK and changes nothing.
    pb::ResolveResponse again;
    EXPECT_TRUE(Resolve(key, row.to, row.retryable, &again, 0, row.force).ok());
    EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), again.record()));
    // Another resolution of a settled record is refused.
    EXPECT_EQ(Resolve(key, row.to, row.retryable, nullptr, 0, row.force,
                      "another reason")
                  .error_code(),
              C::FAILED_PRECONDITION);
    // What Begin does next follows from the resolution.
    pb::Outcome next = BeginOutcome(1, key);
    if (row.to == pb::STATUS_SUCCEEDED) {
      EXPECT_EQ(next, pb::OUTCOME_COMPLETED);
    } else if (row.retryable) {
      EXPECT_EQ(next, pb::OUTCOME_ACQUIRED);
    } else {
      EXPECT_EQ(next, pb::OUTCOME_FAILED);
    }
    std::vector<pb::AuditEntry> history = History(key);
    ASSERT_FALSE(history.empty());
    EXPECT_EQ(history.back().actor(), "alice");
    EXPECT_EQ(history.back().to(), row.to);
  }
}

TEST_F(OperatorsTest, ResolveGuards) {
  const pb::RecordKey key = K("guarded");
  MakeUnknown(key);
  pb::ResolveRequest no_reason;
  *no_reason.mutable_key() = key;
  no_reason.set_to(pb::STATUS_FAILED);
  pb::ResolveResponse resp;
  grpc::Status s = env->admin(0).Resolve(Ctx().get(), no_reason, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("reason:", 0), 0u) << s.error_message();
  pb::ResolveRequest no_result = no_reason;
  no_result.set_reason("r");
  no_result.set_to(pb::STATUS_SUCCEEDED);
  s = env->admin(0).Resolve(Ctx().get(), no_result, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("result:", 0), 0u) << s.error_message();
  no_result.set_to(pb::STATUS_UNKNOWN);
  s = env->admin(0).Resolve(Ctx().get(), no_result, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("to:", 0), 0u) << s.error_message();
  // PostgreSQL text holds no NUL: a reason or actor with one is refused,
  // not stored cut short (which made the identical retry a mismatch).
  pb::ResolveRequest nul = no_result;
  nul.set_to(pb::STATUS_FAILED);
  nul.set_reason(std::string("before\0after", 12));
  s = env->admin(0).Resolve(Ctx().get(), nul, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "reason: must not contain NUL");
  nul.set_reason("r");
  nul.set_actor(std::string("al\0ice", 6));
  s = env->admin(0).Resolve(Ctx().get(), nul, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "actor: must not contain NUL");
  EXPECT_EQ(Resolve(key, pb::STATUS_SUCCEEDED, false, nullptr, 2).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  pb::Record r;
  ASSERT_TRUE(Get(key, &r).ok());
  EXPECT_EQ(r.status(), pb::STATUS_UNKNOWN);
  EXPECT_TRUE(Resolve(key, pb::STATUS_SUCCEEDED, false, nullptr, 1).ok());
}

// Begin is never ACQUIRED on an UNKNOWN record unless it was resolved FAILED
// retryable, and then exactly one Begin is. Each thread keeps calling until
// it has made 5 Begins that started after Resolve returned, so Begins run
// before, during and after the resolve however slow the machine is.
TEST_F(OperatorsTest, ConcurrentResolveAndBeginOnUnknown) {
  for (bool retryable : {false, true}) {
    for (int round = 0; round < 3; ++round) {
      const pb::RecordKey key = K(absl::StrCat("race-", retryable, "-", round));
      MakeUnknown(key);
      std::atomic<int> acquired{0};
      std::atomic<int> errors{0};
      std::atomic<bool> resolved{false};
      std::atomic<bool> resolve_returned{false};
      std::vector<std::thread> threads;
      threads.reserve(8);
      for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&, t] {
          for (int after = 0; after < 5;) {
            if (resolve_returned.load()) ++after;
            pb::BeginResponse resp;
            grpc::Status s = Begin(t % 2, key, &resp);
            if (!s.ok()) {
              ++errors;
              continue;
            }
            if (resp.outcome() == pb::OUTCOME_ACQUIRED) {
              ++acquired;
              EXPECT_TRUE(resolved.load()) << "granted before the resolve";
            }
          }
        });
      }
      absl::SleepFor(absl::Milliseconds(20));
      resolved = true;
      grpc::Status s = Resolve(key, pb::STATUS_FAILED, retryable);
      resolve_returned = true;
      for (auto& t : threads) t.join();
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(errors.load(), 0);
      EXPECT_EQ(acquired.load(), retryable ? 1 : 0) << "round " << round;
    }
  }
}

TEST_F(OperatorsTest, LateReportSettlesUnknownAndIsAudited) {
  const pb::RecordKey key = K("late");
  MakeUnknown(key);
  ASSERT_TRUE(Finish(key, 1, true).ok());
  pb::Record r;
  ASSERT_TRUE(Get(key, &r).ok());
  EXPECT_EQ(r.status(), pb::STATUS_SUCCEEDED);
  std::vector<pb::AuditEntry> history = History(key);
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].to(), pb::STATUS_UNKNOWN);
  EXPECT_EQ(history[1].actor(), "late-report");
  EXPECT_EQ(history[1].from(), pb::STATUS_UNKNOWN);
  EXPECT_EQ(history[1].to(), pb::STATUS_SUCCEEDED);
  // A second late report with other content is refused.
  EXPECT_EQ(Finish(key, 1, false).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(OperatorsTest, ReaperAppliesReleasePolicy) {
  const pb::RecordKey key = K("released", "send-email");
  pb::BeginResponse resp;
  ASSERT_TRUE(Begin(0, key, &resp, 1).ok());
  ASSERT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  // Wait for the reaper (no Begin or Get in between).
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && Count("status = 'FAILED'") != "1") {
    absl::SleepFor(absl::Milliseconds(100));
  }
  pb::Record r;
  ASSERT_TRUE(Get(key, &r).ok());
  EXPECT_EQ(r.status(), pb::STATUS_FAILED);
  EXPECT_TRUE(r.retryable());
  EXPECT_EQ(r.result().body(), "LEASE_EXPIRED");
  std::vector<pb::AuditEntry> history = History(key);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].actor(), "reaper");
  ASSERT_TRUE(Begin(1, key, &resp).ok());
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(resp.fencing_token(), 2);
}

TEST_F(OperatorsTest, PurgeRemovesExactlyTheExpiredTerminalRecords) {
  auto done = [&](const std::string& k, const std::string& op, bool ok) {
    EXPECT_EQ(BeginOutcome(0, K(k, op)), pb::OUTCOME_ACQUIRED);
    EXPECT_TRUE(Finish(K(k, op), 1, ok).ok());
  };
  done("s-short", "short-lived", true);
  done("f-short", "short-lived", false);
  done("s-long", "create-payment", true);
  EXPECT_EQ(BeginOutcome(0, K("p-short", "short-lived")), pb::OUTCOME_ACQUIRED);
  MakeUnknown(K("u-short", "short-lived"));
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && Count("true") != "3") {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(env->Sql(absl::StrCat(
                "SELECT string_agg(idempotency_key, ',' ORDER BY "
                "idempotency_key) FROM idempotency_record WHERE tenant_id = '",
                tenant_, "'")),
            "p-short,s-long,u-short");
  // A purged key without a tombstone is new again.
  EXPECT_EQ(BeginOutcome(1, K("s-short", "short-lived")), pb::OUTCOME_ACQUIRED);
}

// After the retention a tombstone answers EXPIRED, never ACQUIRED, until
// its own retention ends; retryable failures leave none.
TEST_F(OperatorsTest, TombstonesAnswerExpiredUntilTheyGo) {
  const std::string op = "tombstoned";
  EXPECT_EQ(BeginOutcome(0, K("ok", op)), pb::OUTCOME_ACQUIRED);
  ASSERT_TRUE(Finish(K("ok", op), 1, true).ok());
  EXPECT_EQ(BeginOutcome(0, K("final", op)), pb::OUTCOME_ACQUIRED);
  ASSERT_TRUE(Finish(K("final", op), 1, false, false).ok());
  EXPECT_EQ(BeginOutcome(0, K("again", op)), pb::OUTCOME_ACQUIRED);
  ASSERT_TRUE(Finish(K("again", op), 1, false, true).ok());
  // "again" expires a moment after the others, so a maintenance pass may
  // tombstone those before it can purge this one: wait for both.
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && (Count("tombstone") != "2" ||
                               Count("operation = 'tombstoned'") != "2")) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(Count("tombstone"), "2");
  EXPECT_EQ(Count("operation = 'tombstoned'"), "2");
  EXPECT_EQ(Count("result_body IS NOT NULL AND operation = 'tombstoned'"), "0");
  for (const char* key : {"ok", "final"}) {
    for (int i = 0; i < 3; ++i) {
      pb::BeginResponse resp;
      ASSERT_TRUE(Begin(i % 2, K(key, op), &resp).ok());
      EXPECT_EQ(resp.outcome(), pb::OUTCOME_EXPIRED) << key;
      EXPECT_FALSE(resp.record().has_result());
      EXPECT_EQ(resp.fencing_token(), 0);
    }
    pb::BeginResponse other;
    ASSERT_TRUE(Begin(0, K(key, op), &other, 0, "other-hash").ok());
    EXPECT_EQ(other.outcome(), pb::OUTCOME_MISMATCH);
    pb::Record r;
    EXPECT_EQ(Get(K(key, op), &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // The retryable failure left no tombstone: it may run again.
  EXPECT_EQ(BeginOutcome(1, K("again", op)), pb::OUTCOME_ACQUIRED);
  // Once the tombstones' own retention ends, the keys are new.
  const absl::Time gone = absl::Now() + absl::Seconds(10);
  while (absl::Now() < gone && Count("tombstone") != "0") {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(Count("tombstone"), "0");
  EXPECT_EQ(BeginOutcome(0, K("ok", op)), pb::OUTCOME_ACQUIRED);
}

TEST_F(OperatorsTest, ListFiltersAndPagesStably) {
  for (int k = 0; k < 25; ++k) {
    EXPECT_EQ(BeginOutcome(k % 2, K(absl::StrCat("rec-", k))),
              pb::OUTCOME_ACQUIRED);
  }
  for (int k = 0; k < 5; ++k) {
    EXPECT_TRUE(Finish(K(absl::StrCat("rec-", k)), 1, true).ok());
  }
  auto list = [&](pb::ListRequest req) {
    std::vector<std::string> keys;
    int pages = 0;
    while (true) {
      pb::ListResponse resp;
      grpc::Status s = env->admin(pages % 2).List(Ctx().get(), req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      ++pages;
      for (const pb::Record& r : resp.records()) keys.push_back(r.key().key());
      if (resp.next_page_token().empty()) break;
      req.set_page_token(resp.next_page_token());
    }
    return std::make_pair(keys, pages);
  };
  pb::ListRequest all;
  all.set_tenant(tenant_);
  all.set_page_size(10);
  auto [keys, pages] = list(all);
  EXPECT_EQ(keys.size(), 25u);
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), 25u);
  EXPECT_GE(pages, 3);
  pb::ListRequest processing = all;
  processing.set_status(pb::STATUS_PROCESSING);
  EXPECT_EQ(list(processing).first.size(), 20u);
  pb::ListRequest succeeded = all;
  succeeded.set_status(pb::STATUS_SUCCEEDED);
  EXPECT_EQ(list(succeeded).first.size(), 5u);
  pb::ListRequest old = all;
  old.mutable_older_than()->set_seconds(3600);
  EXPECT_EQ(list(old).first.size(), 0u);
  pb::ListRequest other_op = all;
  other_op.set_operation("refund");
  EXPECT_EQ(list(other_op).first.size(), 0u);

  // A token only continues the listing it came from.
  pb::ListResponse first;
  ASSERT_TRUE(env->admin(0).List(Ctx().get(), all, &first).ok());
  ASSERT_FALSE(first.next_page_token().empty());
  pb::ListRequest mixed = processing;
  mixed.set_page_token(first.next_page_token());
  pb::ListResponse resp;
  grpc::Status s = env->admin(0).List(Ctx().get(), mixed, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("page_token:", 0), 0u);
  mixed.set_page_token("garbage!");
  EXPECT_EQ(env->admin(0).List(Ctx().get(), mixed, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A bad config file stops start-up with a message naming the field.
TEST(ConfigTest, BadConfigStopsStartup) {
  const std::string path = ::testing::TempDir() + "/idem-bad.yaml";
  const std::pair<std::string, std::string> cases[] = {
      {"operations:\n  refund: {leese: 5s}\n", "operations.refund.leese"},
      // These once threw out of the parser (std::terminate) or started and
      // then failed every write.
      {"operations:\n  [a, b]: {lease: 5s}\n", "config operations: a key"},
      {"defaults: {retention: inf}\n", "config defaults.retention"},
  };
  for (const auto& [yaml, field] : cases) {
    std::ofstream(path, std::ios::trunc) << yaml;
    absl::StatusOr<std::string> out =
        RunCommand({IDEM_SIDECAR_PATH, "--store=memory", "--config=" + path,
                    "--listen=127.0.0.1:0", "--metrics-listen=off"});
    ASSERT_FALSE(out.ok()) << yaml;
    EXPECT_NE(std::string(out.status().message()).find(field),
              std::string::npos)
        << yaml << ": " << out.status();
  }
}

// Bad flag values stop start-up with a message naming the flag.
TEST(ConfigTest, BadFlagsStopStartup) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--pg-pool-size=0", "--pg-pool-size"},
      {"--pg-prepared=maybe", "--pg-prepared"},
      {"--reaper-interval=soon", "--reaper-interval"},
      {"--grace-period=-1s", "--grace-period"},
      // Beyond 24h: "inf" once overflowed the shutdown deadline.
      {"--grace-period=inf", "--grace-period"},
      {"--pg-statement-timeout=9999999h", "--pg-statement-timeout"},
      {"--reconcile-interval=25h", "--reconcile-interval"},
      {"--store=disk", "--store"},
      {"--log-level=loud", "--log-level"},
      {"--tenant-rate=-1", "--tenant-rate"},
      {"--rpc-threads=-1", "--rpc-threads"},
      {"--rpc-threads=257", "--rpc-threads"},
      {"--tls-cert=/nonexistent.pem", "--tls-cert"},
      {"--auth-tokens=/nonexistent.json", "auth tokens"},
  };
  for (const auto& [flag, name] : cases) {
    absl::StatusOr<std::string> out =
        RunCommand({IDEM_SIDECAR_PATH, "--store=memory", "--metrics-listen=off",
                    "--listen=127.0.0.1:0", flag});
    ASSERT_FALSE(out.ok()) << flag;
    EXPECT_NE(std::string(out.status().message()).find(name), std::string::npos)
        << flag << ": " << out.status();
  }
}

}  // namespace
}  // namespace idem::testing
