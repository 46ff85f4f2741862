// Faults with real processes: a sidecar killed mid-flight (G4), PostgreSQL
// stopped and crashed under a running sidecar.
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"

namespace idem::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using Serving = grpc::health::v1::HealthCheckResponse;

class FaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SidecarEnv>> e =
        SidecarEnv::Start(IDEM_SIDECAR_PATH, 2);
    ASSERT_TRUE(e.ok()) << e.status();
    env_ = *std::move(e);
  }

  grpc::Status Begin(int i, const std::string& key, pb::BeginResponse* resp,
                     absl::Duration deadline = absl::Seconds(10)) {
    pb::BeginRequest req;
    *req.mutable_key() = Key("t", "create-payment", key);
    req.set_request_hash("hash-1");
    return env_->client(i).Begin(Ctx(deadline).get(), req, resp);
  }

  grpc::Status Complete(int i, const std::string& key, int64_t token,
                        const pb::Snapshot& result) {
    pb::CompleteRequest req;
    *req.mutable_key() = Key("t", "create-payment", key);
    req.set_fencing_token(token);
    *req.mutable_result() = result;
    pb::CompleteResponse resp;
    return env_->client(i).Complete(Ctx().get(), req, &resp);
  }

  std::unique_ptr<SidecarEnv> env_;
};

TEST_F(FaultsTest, GrantSurvivesSidecarKillAndCompletesAfterRestart) {
  pb::BeginResponse grant;
  ASSERT_TRUE(Begin(0, "order-1", &grant).ok());
  ASSERT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
  ASSERT_TRUE(env_->sidecar(0).Kill().ok());
  // The other instance sees the grant at once.
  pb::BeginResponse other;
  ASSERT_TRUE(Begin(1, "order-1", &other).ok());
  EXPECT_EQ(other.outcome(), pb::OUTCOME_IN_PROGRESS);
  ASSERT_TRUE(env_->sidecar(0).StartAgain().ok()) << env_->sidecar(0).Log();
  const pb::Snapshot result = BinarySnapshot(201, "after-restart");
  grpc::Status s = Complete(0, "order-1", grant.fencing_token(), result);
  ASSERT_TRUE(s.ok()) << s.error_message();
  pb::BeginResponse replay;
  ASSERT_TRUE(Begin(1, "order-1", &replay).ok());
  EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
  EXPECT_TRUE(MessageDifferencer::Equals(replay.record().result(), result));
}

TEST_F(FaultsTest, PostgresDownIsUnavailableQuicklyThenRecoversWithoutRestart) {
  ASSERT_TRUE(
      WaitForHealth(env_->health(0), Serving::SERVING, absl::Seconds(10)));
  pb::BeginResponse grant;
  ASSERT_TRUE(Begin(0, "before", &grant).ok());
  ASSERT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);

  ASSERT_TRUE(env_->pg().Stop().ok());
  for (int i = 0; i < env_->size(); ++i) {
    const absl::Time start = absl::Now();
    pb::BeginResponse resp;
    grpc::Status s =
        Begin(i, absl::StrCat("during-", i), &resp, absl::Seconds(8));
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
        << s.error_message() << " outcome " << resp.outcome();
    EXPECT_LT(took, absl::Seconds(8));
    EXPECT_NE(resp.outcome(), pb::OUTCOME_ACQUIRED);
  }
  EXPECT_TRUE(
      WaitForHealth(env_->health(0), Serving::NOT_SERVING, absl::Seconds(5)));
  EXPECT_TRUE(
      WaitForHealth(env_->health(1), Serving::NOT_SERVING, absl::Seconds(5)));
  // Liveness stays SERVING: a PostgreSQL outage must not restart sidecars.
  EXPECT_EQ(HealthOf(env_->health(0), "liveness"), Serving::SERVING);

  ASSERT_TRUE(env_->pg().StartAgain().ok());
  EXPECT_TRUE(
      WaitForHealth(env_->health(0), Serving::SERVING, absl::Seconds(10)));
  EXPECT_TRUE(
      WaitForHealth(env_->health(1), Serving::SERVING, absl::Seconds(10)));
  for (int i = 0; i < env_->size(); ++i) {
    pb::BeginResponse resp;
    grpc::Status s = Begin(i, absl::StrCat("after-", i), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  }
  EXPECT_TRUE(
      Complete(1, "before", grant.fencing_token(), BinarySnapshot(200, "ok"))
          .ok());
  // Nothing was written while PostgreSQL was down.
  EXPECT_EQ(env_->Sql("SELECT count(*) FROM idempotency_record WHERE "
                      "idempotency_key LIKE 'during-%'"),
            "0");
}

// G4: acknowledged grants and completions survive a PostgreSQL crash.
TEST_F(FaultsTest, AcknowledgedWritesSurvivePostgresCrash) {
  constexpr int kKeys = 50;
  std::vector<int64_t> tokens(kKeys);
  for (int k = 0; k < kKeys; ++k) {
    pb::BeginResponse grant;
    ASSERT_TRUE(Begin(k % 2, absl::StrCat("k", k), &grant).ok());
    ASSERT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
    tokens[k] = grant.fencing_token();
    if (k % 2 == 0) {
      ASSERT_TRUE(Complete(k % 2, absl::StrCat("k", k), tokens[k],
                           BinarySnapshot(200, absl::StrCat("r", k)))
                      .ok());
    }
  }
  ASSERT_TRUE(env_->pg().StopImmediate().ok());
  ASSERT_TRUE(env_->pg().StartAgain().ok());
  ASSERT_TRUE(
      WaitForHealth(env_->health(0), Serving::SERVING, absl::Seconds(10)));
  for (int k = 0; k < kKeys; ++k) {
    pb::BeginResponse resp;
    grpc::Status s;
    // The first call after the crash may meet a stale pooled connection.
    for (int attempt = 0; attempt < 3; ++attempt) {
      s = Begin(1, absl::StrCat("k", k), &resp);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    }
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (k % 2 == 0) {
      EXPECT_EQ(resp.outcome(), pb::OUTCOME_COMPLETED) << k;
      EXPECT_EQ(resp.record().result().headers().at("x-tag"),
                absl::StrCat("r", k));
    } else {
      EXPECT_EQ(resp.outcome(), pb::OUTCOME_IN_PROGRESS) << k;
      EXPECT_EQ(resp.record().fencing_token(), tokens[k]);
    }
  }
}

// A paused (SIGSTOP) PostgreSQL answers nothing, not even statement_timeout:
// the pool's watchdog still bounds every call.
TEST(PausedPostgresTest, CallsFailWithinTheirBoundThenRecover) {
  absl::StatusOr<std::unique_ptr<SidecarEnv>> e =
      SidecarEnv::Start(IDEM_SIDECAR_PATH, 1, {"--pg-statement-timeout=1s"});
  ASSERT_TRUE(e.ok()) << e.status();
  SidecarEnv& env = **e;
  pb::BeginRequest req;
  *req.mutable_key() = Key("t", "create-payment", "paused");
  req.set_request_hash("h");
  ASSERT_TRUE(env.pg().Pause().ok());
  const absl::Time start = absl::Now();
  pb::BeginResponse resp;
  grpc::Status s =
      env.client(0).Begin(Ctx(absl::Seconds(20)).get(), req, &resp);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(env.pg().Resume().ok());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("PostgreSQL did not answer within"),
            std::string::npos)
      << s.error_message();
  EXPECT_LT(took, absl::Seconds(5));
  // Nothing was acknowledged, so a retry may find the row committed or not;
  // either way it is answered, and the grant is never given twice.
  std::set<pb::Outcome> seen;
  int acquired = 0;
  for (int i = 0; i < 3; ++i) {
    grpc::Status r;
    for (int attempt = 0; attempt < 5; ++attempt) {
      r = env.client(0).Begin(Ctx().get(), req, &resp);
      if (r.ok()) break;
      absl::SleepFor(absl::Milliseconds(300));
    }
    ASSERT_TRUE(r.ok()) << r.error_message();
    seen.insert(resp.outcome());
    if (resp.outcome() == pb::OUTCOME_ACQUIRED) ++acquired;
  }
  EXPECT_LE(acquired, 1);
  EXPECT_TRUE(
      WaitForHealth(env.health(0), Serving::SERVING, absl::Seconds(10)));
}

// SIGTERM: health turns NOT_SERVING at once, the call in flight finishes,
// then the process exits 0 and new calls are refused. The call may need a new
// connection (a health ping can hold the idle one when PostgreSQL pauses), so
// the connect bound is above the pause.
TEST(ShutdownTest, DrainsInFlightCallsAndExitsZero) {
  absl::StatusOr<std::unique_ptr<SidecarEnv>> e = SidecarEnv::Start(
      IDEM_SIDECAR_PATH, 1,
      {"--drain-delay=2s", "--grace-period=10s", "--pg-statement-timeout=4s",
       "--pg-connect-timeout=4s"});
  ASSERT_TRUE(e.ok()) << e.status();
  SidecarEnv& env = **e;
  ASSERT_TRUE(
      WaitForHealth(env.health(0), Serving::SERVING, absl::Seconds(10)));
  ASSERT_TRUE(env.pg().Pause().ok());
  grpc::Status in_flight;
  pb::BeginResponse in_flight_resp;
  std::thread call([&] {
    pb::BeginRequest req;
    *req.mutable_key() = Key("t", "create-payment", "in-flight");
    req.set_request_hash("h");
    in_flight =
        env.client(0).Begin(Ctx(absl::Seconds(20)).get(), req, &in_flight_resp);
  });
  absl::SleepFor(absl::Milliseconds(300));
  absl::StatusOr<int> exit_code;
  std::thread term([&] { exit_code = env.sidecar(0).Terminate(); });
  EXPECT_TRUE(
      WaitForHealth(env.health(0), Serving::NOT_SERVING, absl::Seconds(1)));
  EXPECT_EQ(HealthOf(env.health(0), "liveness"), Serving::NOT_SERVING);
  ASSERT_TRUE(env.pg().Resume().ok());
  call.join();
  term.join();
  EXPECT_TRUE(in_flight.ok()) << in_flight.error_message();
  EXPECT_EQ(in_flight_resp.outcome(), pb::OUTCOME_ACQUIRED);
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0) << env.sidecar(0).Log();
  pb::BeginRequest req;
  *req.mutable_key() = Key("t", "create-payment", "after");
  req.set_request_hash("h");
  pb::BeginResponse resp;
  EXPECT_EQ(
      env.client(0).Begin(Ctx(absl::Seconds(2)).get(), req, &resp).error_code(),
      grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace idem::testing
