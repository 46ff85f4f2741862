// Begin with `wait`: callers wait while another attempt holds the lease and
// are woken by PostgreSQL LISTEN/NOTIFY (through every sidecar's one
// listening connection) when the record settles. At scale: waiters_pgtest.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"

namespace idem::testing {
namespace {

class WaitTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<SidecarEnv>> e =
        SidecarEnv::Start(IDEM_SIDECAR_PATH, 2, {"--log-level=warn"});
    ASSERT_TRUE(e.ok()) << e.status();
    env_ = e->release();
  }
  static void TearDownTestSuite() {
    delete env_;
    env_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(env_, nullptr); }

  static pb::BeginRequest Req(const std::string& key, absl::Duration wait,
                              int lease_seconds = 30) {
    pb::BeginRequest req;
    *req.mutable_key() = Key("wait", "create-payment", key);
    req.set_request_hash("hash-1");
    req.mutable_lease()->set_seconds(lease_seconds);
    if (wait > absl::ZeroDuration()) {
      req.mutable_wait()->set_seconds(absl::ToInt64Seconds(wait));
      req.mutable_wait()->set_nanos(
          static_cast<int32_t>(absl::ToInt64Nanoseconds(wait) % 1000000000));
    }
    return req;
  }

  static SidecarEnv* env_;
};

SidecarEnv* WaitTest::env_ = nullptr;

TEST_F(WaitTest, AWaiterThatTimesOutGetsInProgress) {
  pb::BeginResponse holder;
  ASSERT_TRUE(
      env_->client(0)
          .Begin(Ctx().get(), Req("slow", absl::ZeroDuration()), &holder)
          .ok());
  const absl::Time start = absl::Now();
  pb::BeginResponse resp;
  ASSERT_TRUE(
      env_->client(1)
          .Begin(Ctx().get(), Req("slow", absl::Milliseconds(400)), &resp)
          .ok());
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_IN_PROGRESS);
  EXPECT_GE(took, absl::Milliseconds(390));
  EXPECT_LT(took, absl::Seconds(2));
}

TEST_F(WaitTest, TheCallDeadlineBoundsTheWait) {
  pb::BeginResponse holder;
  ASSERT_TRUE(
      env_->client(0)
          .Begin(Ctx().get(), Req("bounded", absl::ZeroDuration()), &holder)
          .ok());
  pb::BeginResponse resp;
  grpc::Status s =
      env_->client(1).Begin(Ctx(absl::Milliseconds(600)).get(),
                            Req("bounded", absl::Seconds(30)), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_IN_PROGRESS);
}

// A lease that runs out while others wait: they get UNKNOWN (the default
// policy) as soon as it does, never a grant.
TEST_F(WaitTest, WaitersSeeTheLeaseRunOut) {
  pb::BeginResponse holder;
  ASSERT_TRUE(env_->client(0)
                  .Begin(Ctx().get(), Req("abandoned", absl::ZeroDuration(), 1),
                         &holder)
                  .ok());
  const absl::Time start = absl::Now();
  pb::BeginResponse resp;
  ASSERT_TRUE(
      env_->client(1)
          .Begin(Ctx().get(), Req("abandoned", absl::Seconds(10)), &resp)
          .ok());
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_UNKNOWN);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// Fail settles a record too: waiters hear of it. A missed wake-up leaves
// the waiter IN_PROGRESS when its 10 s wait ends; the 3 s bound is loose for
// the reason given at EveryWaiterRacingTheSettleIsWoken (load under ASan).
TEST_F(WaitTest, WaitersWakeOnFail) {
  pb::BeginResponse holder;
  ASSERT_TRUE(
      env_->client(0)
          .Begin(Ctx().get(), Req("failing", absl::ZeroDuration()), &holder)
          .ok());
  pb::BeginResponse waited;
  absl::Time answered;
  std::thread waiter([&] {
    ASSERT_TRUE(
        env_->client(1)
            .Begin(Ctx().get(), Req("failing", absl::Seconds(10)), &waited)
            .ok());
    answered = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(500));
  pb::FailRequest fail;
  *fail.mutable_key() = Req("failing", absl::ZeroDuration()).key();
  fail.set_fencing_token(holder.fencing_token());
  *fail.mutable_error() = BinarySnapshot(502, "upstream");
  fail.set_retryable(false);
  pb::FailResponse fail_resp;
  ASSERT_TRUE(env_->client(0).Fail(Ctx().get(), fail, &fail_resp).ok());
  const absl::Time failed = absl::Now();
  waiter.join();
  EXPECT_EQ(waited.outcome(), pb::OUTCOME_FAILED);
  EXPECT_LT(answered - failed, absl::Seconds(3));
}

// A waiter marks the record before it parks, and only marked records
// notify when they settle: a settle racing the mark must still wake it.
// Rounds of a waiter on one instance and Complete on the other, started
// together with the Complete delayed by 0-3.5 ms (the span in which a
// waiter reads, parks and marks), four rounds at a time: every waiter is
// answered COMPLETED (a missed wake-up would leave it IN_PROGRESS when its
// 5 s wait ends; the lease is 10 minutes), and before that wait could have
// ended. The bound is loose on purpose: under ASan on a loaded CI machine,
// with PgBouncer in the path, one wake-up took 1.03 s, and with CPU hogs
// here all four waiters of a round stall together by up to 300 ms.
TEST_F(WaitTest, EveryWaiterRacingTheSettleIsWoken) {
  constexpr int kWorkers = 4;
  constexpr int kRounds = 100;  // per worker
  std::atomic<int> woken{0};
  std::vector<std::thread> workers;
  workers.reserve(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      for (int round = 0; round < kRounds; ++round) {
        const std::string key = absl::StrCat("race-", w, "-", round);
        pb::BeginResponse holder;
        grpc::Status s = env_->client(0).Begin(
            Ctx().get(), Req(key, absl::ZeroDuration(), 600), &holder);
        ASSERT_TRUE(s.ok()) << s.error_message();
        ASSERT_EQ(holder.outcome(), pb::OUTCOME_ACQUIRED);
        pb::BeginResponse waited;
        grpc::Status waited_status;
        absl::Time answered;
        std::thread waiter([&] {
          waited_status = env_->client(1).Begin(
              Ctx().get(), Req(key, absl::Seconds(5)), &waited);
          answered = absl::Now();
        });
        absl::SleepFor(absl::Microseconds(500 * (round % 8)));
        pb::CompleteRequest complete;
        *complete.mutable_key() = Req(key, absl::ZeroDuration()).key();
        complete.set_fencing_token(holder.fencing_token());
        *complete.mutable_result() = BinarySnapshot(200, "paid");
        pb::CompleteResponse complete_resp;
        s = env_->client(0).Complete(Ctx().get(), complete, &complete_resp);
        const absl::Time completed = absl::Now();
        waiter.join();
        ASSERT_TRUE(s.ok()) << s.error_message();
        ASSERT_TRUE(waited_status.ok()) << waited_status.error_message();
        EXPECT_EQ(waited.outcome(), pb::OUTCOME_COMPLETED) << key;
        EXPECT_LT(answered - completed, absl::Seconds(3)) << key;
        if (waited.outcome() == pb::OUTCOME_COMPLETED) ++woken;
      }
    });
  }
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(woken.load(), kWorkers * kRounds);
}

}  // namespace
}  // namespace idem::testing
