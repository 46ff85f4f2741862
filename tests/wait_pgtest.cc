// Begin with `wait`: callers wait while another attempt holds the lease and
// are woken by PostgreSQL LISTEN/NOTIFY (through every sidecar's one
// listening connection) when the record settles. At scale: waiters_pgtest.
#include <thread>

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

// Fail settles a record too: waiters hear of it.
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
  EXPECT_LT(answered - failed, absl::Milliseconds(500));
}

}  // namespace
}  // namespace idem::testing
