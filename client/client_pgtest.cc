// End to end: idem::Client against two real sidecar processes over one
// throwaway PostgreSQL. Execute runs fn once and replays byte for byte (G3),
// one owner among 16 concurrent callers (G1), heartbeats keep a long fn's
// lease, retryable and final failures, UNKNOWN (G2) and MISMATCH, and a
// Complete that outlives a sidecar restart (G4).
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"

namespace idem {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::idem::testing::BinarySnapshot;
using ::idem::testing::Ctx;
using ::idem::testing::SidecarEnv;
using Kind = ExecuteResult::Kind;

SidecarEnv* env = nullptr;

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(
    new ::idem::testing::SharedSidecarEnv(&env, 2));

constexpr char kOperation[] = "create-payment";

class ClientPgTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(env, nullptr) << "environment did not start";
    tenant_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // A client of sidecar `i` whose default tenant is the test's name.
  std::unique_ptr<Client> NewClient(int i, RetryOptions retry = {}) {
    ClientOptions options;
    options.target = env->sidecar(i).Address();
    options.tenant = tenant_;
    options.retry = retry;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // The record as sidecar `i` reads it.
  pb::Record Get(int i, const std::string& key) {
    pb::GetRequest req;
    *req.mutable_key() = testing::Key(tenant_, kOperation, key);
    pb::GetResponse resp;
    grpc::Status s = env->client(i).Get(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.record();
  }

  // A fn that counts its runs and succeeds with `result`.
  WriteFn Succeed(const pb::Snapshot& result,
                  absl::Duration takes = absl::ZeroDuration()) {
    return [this, result, takes](const Lease&) {
      ++runs_;
      absl::SleepFor(takes);
      return WriteResult::Success(result);
    };
  }

  std::string tenant_;
  std::atomic<int> runs_{0};
};

TEST_F(ClientPgTest, ExecuteRunsFnOnceThenReplaysByteIdentical) {
  std::unique_ptr<Client> c0 = NewClient(0);
  std::unique_ptr<Client> c1 = NewClient(1);
  const pb::Snapshot result = BinarySnapshot(201, "pay-1");
  const std::string hash = Fingerprint("amount=100;to=alice");

  absl::StatusOr<ExecuteResult> first =
      c0->Execute({kOperation, "k"}, hash, [&](const Lease& lease) {
        ++runs_;
        EXPECT_EQ(lease.fencing_token(), 1);
        EXPECT_EQ(lease.key().tenant(), tenant_);
        EXPECT_TRUE(lease.alive());
        return WriteResult::Success(result);
      });
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->kind, Kind::kSucceeded);
  EXPECT_FALSE(first->replayed);
  EXPECT_EQ(first->fencing_token, 1);
  EXPECT_TRUE(MessageDifferencer::Equals(first->snapshot, result));
  EXPECT_EQ(first->record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(runs_, 1);

  for (Client* c : {c0.get(), c1.get()}) {
    absl::StatusOr<ExecuteResult> again =
        c->Execute({kOperation, "k"}, hash, Succeed(BinarySnapshot(500, "x")));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->kind, Kind::kSucceeded);
    EXPECT_TRUE(again->replayed);
    EXPECT_FALSE(again->executed());
    EXPECT_TRUE(MessageDifferencer::Equals(again->snapshot, result))
        << again->snapshot.DebugString();
    EXPECT_EQ(again->snapshot.body(), result.body());
  }
  EXPECT_EQ(runs_, 1);
  EXPECT_EQ(Get(1, "k").status(), pb::STATUS_SUCCEEDED);
}

// Sixteen threads, eight on each sidecar, Execute one key at once.
class ConcurrentTest : public ClientPgTest {
 protected:
  std::vector<ExecuteResult> RunSixteen(const std::string& key,
                                        absl::Duration wait) {
    std::unique_ptr<Client> clients[2] = {NewClient(0), NewClient(1)};
    const pb::Snapshot result = BinarySnapshot(201, key);
    ExecuteOptions options;
    options.wait = wait;
    std::vector<ExecuteResult> results(16);
    absl::Notification go;
    std::vector<std::thread> threads;
    threads.reserve(16);
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&, t] {
        go.WaitForNotification();
        absl::StatusOr<ExecuteResult> r = clients[t % 2]->Execute(
            {kOperation, key}, "same-request",
            Succeed(result, absl::Milliseconds(1500)), options);
        EXPECT_TRUE(r.ok()) << r.status();
        if (r.ok()) results[t] = *std::move(r);
      });
    }
    go.Notify();
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(runs_, 1);
    int ran = 0;
    for (const ExecuteResult& r : results) {
      if (!r.executed()) continue;
      ++ran;
      EXPECT_EQ(r.kind, Kind::kSucceeded);
      EXPECT_EQ(r.fencing_token, 1);
      EXPECT_TRUE(MessageDifferencer::Equals(r.snapshot, result));
    }
    EXPECT_EQ(ran, 1);
    return results;
  }
};

TEST_F(ConcurrentTest, SixteenCallersOneRunOthersInProgress) {
  int in_progress = 0;
  for (const ExecuteResult& r : RunSixteen("k", absl::ZeroDuration())) {
    if (r.executed()) continue;
    // Without a wait the others are turned away (or, were one very late,
    // replayed).
    EXPECT_TRUE(r.kind == Kind::kInProgress ||
                (r.kind == Kind::kSucceeded && r.replayed))
        << ExecuteResult::KindName(r.kind);
    if (r.kind == Kind::kInProgress) {
      ++in_progress;
      EXPECT_GT(r.retry_after, absl::ZeroDuration());
    }
  }
  EXPECT_GE(in_progress, 1);
}

TEST_F(ConcurrentTest, SixteenCallersOneRunOthersWaitForTheReplay) {
  const pb::Snapshot result = BinarySnapshot(201, "k");
  for (const ExecuteResult& r : RunSixteen("k", absl::Seconds(20))) {
    if (r.executed()) continue;
    EXPECT_EQ(r.kind, Kind::kSucceeded) << ExecuteResult::KindName(r.kind);
    EXPECT_TRUE(r.replayed);
    EXPECT_TRUE(MessageDifferencer::Equals(r.snapshot, result));
  }
}

TEST_F(ClientPgTest, HeartbeatsKeepALeaseLongerThanItsLength) {
  std::unique_ptr<Client> c0 = NewClient(0);
  ExecuteOptions options;
  options.lease = absl::Seconds(1);
  bool alive_at_end = false;
  absl::StatusOr<ExecuteResult> r = c0->Execute(
      {kOperation, "k"}, "h",
      [&](const Lease& lease) {
        ++runs_;
        absl::SleepFor(absl::Seconds(2));
        // Twice the lease later, another attempt is still turned away: the
        // lease was extended, not expired (which would make it UNKNOWN).
        pb::BeginRequest req;
        *req.mutable_key() = lease.key();
        req.set_request_hash("h");
        pb::BeginResponse resp;
        grpc::Status s = env->client(1).Begin(Ctx().get(), req, &resp);
        EXPECT_TRUE(s.ok()) << s.error_message();
        EXPECT_EQ(resp.outcome(), pb::OUTCOME_IN_PROGRESS)
            << pb::Outcome_Name(resp.outcome());
        absl::SleepFor(absl::Seconds(1));
        alive_at_end = lease.alive();
        EXPECT_TRUE(lease.status().ok()) << lease.status();
        return WriteResult::Success(BinarySnapshot(201, "long"));
      },
      options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, Kind::kSucceeded) << r->report_status;
  EXPECT_FALSE(r->replayed);
  EXPECT_TRUE(alive_at_end);
  EXPECT_EQ(runs_, 1);
  pb::Record record = Get(1, "k");
  EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(record.fencing_token(), 1);
}

TEST_F(ClientPgTest, RetryableFailureRunsFnAgainWithToken2) {
  std::unique_ptr<Client> c0 = NewClient(0);
  std::unique_ptr<Client> c1 = NewClient(1);
  const pb::Snapshot busy = BinarySnapshot(503, "busy");
  absl::StatusOr<ExecuteResult> failed =
      c0->Execute({kOperation, "k"}, "h", [&](const Lease& lease) {
        ++runs_;
        EXPECT_EQ(lease.fencing_token(), 1);
        return WriteResult::RetryableFailure(busy);
      });
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->kind, Kind::kFailed);
  EXPECT_TRUE(failed->retryable);
  EXPECT_FALSE(failed->replayed);
  EXPECT_EQ(failed->fencing_token, 1);
  EXPECT_TRUE(MessageDifferencer::Equals(failed->snapshot, busy));

  const pb::Snapshot paid = BinarySnapshot(201, "paid");
  int64_t token = 0;
  absl::StatusOr<ExecuteResult> again =
      c1->Execute({kOperation, "k"}, "h", [&](const Lease& lease) {
        ++runs_;
        token = lease.fencing_token();
        return WriteResult::Success(paid);
      });
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->kind, Kind::kSucceeded);
  EXPECT_FALSE(again->replayed);
  EXPECT_EQ(token, 2);
  EXPECT_EQ(again->fencing_token, 2);
  EXPECT_EQ(again->record.attempt(), 2);
  EXPECT_TRUE(MessageDifferencer::Equals(again->snapshot, paid));
  EXPECT_EQ(runs_, 2);
}

TEST_F(ClientPgTest, FinalFailureIsReplayed) {
  std::unique_ptr<Client> c0 = NewClient(0);
  std::unique_ptr<Client> c1 = NewClient(1);
  const pb::Snapshot declined = BinarySnapshot(402, "declined");
  absl::StatusOr<ExecuteResult> failed =
      c0->Execute({kOperation, "k"}, "h", [&](const Lease&) {
        ++runs_;
        return WriteResult::FinalFailure(declined);
      });
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->kind, Kind::kFailed);
  EXPECT_FALSE(failed->retryable);
  EXPECT_FALSE(failed->replayed);

  for (Client* c : {c0.get(), c1.get()}) {
    absl::StatusOr<ExecuteResult> replay =
        c->Execute({kOperation, "k"}, "h", Succeed(BinarySnapshot(201, "x")));
    ASSERT_TRUE(replay.ok()) << replay.status();
    EXPECT_EQ(replay->kind, Kind::kFailed);
    EXPECT_TRUE(replay->replayed);
    EXPECT_FALSE(replay->retryable);
    EXPECT_FALSE(replay->executed());
    EXPECT_TRUE(MessageDifferencer::Equals(replay->snapshot, declined))
        << replay->snapshot.DebugString();
  }
  EXPECT_EQ(runs_, 1);
}

TEST_F(ClientPgTest, MismatchIsRejectedWithoutTheResult) {
  std::unique_ptr<Client> c0 = NewClient(0);
  absl::StatusOr<ExecuteResult> first =
      c0->Execute({kOperation, "k"}, Fingerprint("amount=100"),
                  Succeed(BinarySnapshot(201, "a")));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->kind, Kind::kSucceeded);
  absl::StatusOr<ExecuteResult> other =
      NewClient(1)->Execute({kOperation, "k"}, Fingerprint("amount=9999"),
                            Succeed(BinarySnapshot(201, "b")));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->kind, Kind::kMismatch);
  EXPECT_FALSE(other->executed());
  EXPECT_FALSE(other->record.has_result());
  EXPECT_EQ(other->snapshot.body(), "");
  EXPECT_EQ(runs_, 1);
}

TEST_F(ClientPgTest, UnknownIsNeverExecuted) {
  // An attempt takes a 1 s lease and vanishes without reporting.
  pb::BeginRequest req;
  *req.mutable_key() = testing::Key(tenant_, kOperation, "k");
  req.set_request_hash("h");
  req.mutable_lease()->set_seconds(1);
  pb::BeginResponse resp;
  ASSERT_TRUE(env->client(0).Begin(Ctx().get(), req, &resp).ok());
  ASSERT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  absl::SleepFor(absl::Milliseconds(1500));

  for (int i : {0, 1, 0}) {
    ExecuteOptions options;
    options.wait = absl::Seconds(2);  // waiting does not help
    absl::StatusOr<ExecuteResult> r = NewClient(i)->Execute(
        {kOperation, "k"}, "h", Succeed(BinarySnapshot(201, "x")), options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->kind, Kind::kUnknown) << ExecuteResult::KindName(r->kind);
    EXPECT_FALSE(r->executed());
    EXPECT_EQ(r->record.status(), pb::STATUS_UNKNOWN);
  }
  EXPECT_EQ(runs_, 0);
}

TEST_F(ClientPgTest, InvalidKeyIsAnErrorAndFnDoesNotRun) {
  absl::StatusOr<ExecuteResult> r = NewClient(0)->Execute(
      {"bad operation!", "k"}, "h", Succeed(BinarySnapshot(201, "x")));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << r.status();
  EXPECT_NE(r.status().message().find("operation"), absl::string_view::npos)
      << r.status();
  EXPECT_EQ(runs_, 0);
}

TEST_F(ClientPgTest, CompleteIsRetriedAcrossASidecarRestart) {
  RetryOptions retry;
  retry.max_attempts = 60;
  retry.initial_backoff = absl::Milliseconds(100);
  retry.max_backoff = absl::Milliseconds(500);
  std::unique_ptr<Client> c1 = NewClient(1, retry);
  const pb::Snapshot result = BinarySnapshot(201, "across-restart");
  std::thread restarter;
  absl::Status restarted;
  absl::Time killed_at;
  absl::StatusOr<ExecuteResult> r =
      c1->Execute({kOperation, "k"}, "h", [&](const Lease&) {
        ++runs_;
        // The sidecar this client talks to dies while fn writes, and comes
        // back a second later.
        EXPECT_TRUE(env->sidecar(1).Kill().ok());
        killed_at = absl::Now();
        restarter = std::thread([&] {
          absl::SleepFor(absl::Seconds(1));
          restarted = env->sidecar(1).StartAgain();
        });
        return WriteResult::Success(result);
      });
  const absl::Duration took = absl::Now() - killed_at;
  restarter.join();
  ASSERT_TRUE(restarted.ok()) << restarted;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, Kind::kSucceeded) << r->report_status;
  EXPECT_FALSE(r->replayed);
  EXPECT_TRUE(MessageDifferencer::Equals(r->snapshot, result));
  EXPECT_GE(took, absl::Seconds(1));  // it did wait for the restart
  EXPECT_EQ(runs_, 1);

  pb::Record record = Get(0, "k");
  EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_TRUE(MessageDifferencer::Equals(record.result(), result));
  // And the restarted sidecar replays it.
  absl::StatusOr<ExecuteResult> replay =
      c1->Execute({kOperation, "k"}, "h", Succeed(BinarySnapshot(500, "x")));
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->kind, Kind::kSucceeded);
  EXPECT_TRUE(replay->replayed);
  EXPECT_EQ(runs_, 1);
}

}  // namespace
}  // namespace idem
