// End to end: three real sidecar processes over one throwaway PostgreSQL,
// called over gRPC. Covers the lifecycle, replay on every instance, fencing,
// validation (G6), one owner under contention (G1) and lease expiry (G2).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"

namespace idem::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;

SidecarEnv* env = nullptr;

constexpr char kConfig[] = R"yaml(
defaults: {lease: 30s, min_lease: 1s, max_lease: 1h, retention: 24h}
operations:
  send-email: {lease: 5m, on_lease_expiry: release}
)yaml";

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(
    new SharedSidecarEnv(&env, 3, {}, kConfig));

class SidecarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(env, nullptr) << "environment did not start";
    tenant_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  pb::RecordKey K(const std::string& key = "k",
                  const std::string& op = "create-payment") {
    return Key(tenant_, op, key);
  }

  pb::BeginResponse Begin(int i, const pb::RecordKey& key,
                          const std::string& hash = "hash-1",
                          const std::string& attempt_id = "",
                          grpc::Status* status = nullptr) {
    pb::BeginRequest req;
    *req.mutable_key() = key;
    req.set_request_hash(hash);
    req.set_attempt_id(attempt_id);
    pb::BeginResponse resp;
    grpc::Status s = env->client(i).Begin(Ctx().get(), req, &resp);
    if (status != nullptr) {
      *status = s;
    } else {
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    return resp;
  }

  grpc::Status Complete(int i, const pb::RecordKey& key, int64_t token,
                        const pb::Snapshot& result,
                        pb::CompleteResponse* resp = nullptr) {
    pb::CompleteRequest req;
    *req.mutable_key() = key;
    req.set_fencing_token(token);
    *req.mutable_result() = result;
    pb::CompleteResponse local;
    return env->client(i).Complete(Ctx().get(), req, resp ? resp : &local);
  }

  grpc::Status Fail(int i, const pb::RecordKey& key, int64_t token,
                    const pb::Snapshot& error, bool retryable) {
    pb::FailRequest req;
    *req.mutable_key() = key;
    req.set_fencing_token(token);
    *req.mutable_error() = error;
    req.set_retryable(retryable);
    pb::FailResponse resp;
    return env->client(i).Fail(Ctx().get(), req, &resp);
  }

  grpc::Status Get(int i, const pb::RecordKey& key, pb::Record* out) {
    pb::GetRequest req;
    *req.mutable_key() = key;
    pb::GetResponse resp;
    grpc::Status s = env->client(i).Get(Ctx().get(), req, &resp);
    *out = resp.record();
    return s;
  }

  int64_t Rows() {
    std::string n = env->Sql(absl::StrCat(
        "SELECT count(*) FROM idempotency_record WHERE tenant_id = '", tenant_,
        "'"));
    return std::stoll(n);
  }

  std::string tenant_;
};

TEST_F(SidecarTest, CompleteThenEveryInstanceReplaysByteIdentical) {
  pb::BeginResponse first = Begin(0, K());
  ASSERT_EQ(first.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(first.fencing_token(), 1);
  EXPECT_EQ(first.record().status(), pb::STATUS_PROCESSING);
  const pb::Snapshot result = BinarySnapshot(201, "p-1");
  pb::CompleteResponse done;
  ASSERT_TRUE(Complete(1, K(), 1, result, &done).ok());
  EXPECT_EQ(done.record().status(), pb::STATUS_SUCCEEDED);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < env->size(); ++i) {
      pb::BeginResponse replay = Begin(i, K());
      EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED) << "sidecar " << i;
      EXPECT_EQ(replay.fencing_token(), 0);
      EXPECT_TRUE(MessageDifferencer::Equals(replay.record().result(), result))
          << replay.record().result().DebugString();
      EXPECT_EQ(replay.record().result().body(), result.body());
    }
  }
}

TEST_F(SidecarTest, RetryableFailLetsTheNextBeginInWithToken2) {
  ASSERT_EQ(Begin(0, K()).outcome(), pb::OUTCOME_ACQUIRED);
  ASSERT_TRUE(Fail(0, K(), 1, BinarySnapshot(503, "busy"), true).ok());
  pb::BeginResponse again = Begin(2, K());
  EXPECT_EQ(again.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(again.fencing_token(), 2);
  EXPECT_EQ(again.record().attempt(), 2);
  EXPECT_EQ(Begin(1, K()).outcome(), pb::OUTCOME_IN_PROGRESS);
  // Token 1 is fenced off; token 2 completes.
  EXPECT_EQ(Complete(0, K(), 1, BinarySnapshot(200, "old")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(Complete(1, K(), 2, BinarySnapshot(200, "new")).ok());
  EXPECT_EQ(Begin(0, K()).record().result().headers().at("x-tag"), "new");
}

TEST_F(SidecarTest, FinalFailIsReplayed) {
  ASSERT_EQ(Begin(0, K()).outcome(), pb::OUTCOME_ACQUIRED);
  const pb::Snapshot error = BinarySnapshot(422, "declined");
  ASSERT_TRUE(Fail(1, K(), 1, error, false).ok());
  for (int i = 0; i < env->size(); ++i) {
    pb::BeginResponse r = Begin(i, K());
    EXPECT_EQ(r.outcome(), pb::OUTCOME_FAILED);
    EXPECT_FALSE(r.record().retryable());
    EXPECT_TRUE(MessageDifferencer::Equals(r.record().result(), error));
  }
}

TEST_F(SidecarTest, MismatchDoesNotLeakTheResult) {
  ASSERT_EQ(Begin(0, K()).outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(Begin(1, K(), "other-hash").outcome(), pb::OUTCOME_MISMATCH);
  ASSERT_TRUE(Complete(0, K(), 1, BinarySnapshot(201, "secret")).ok());
  pb::BeginResponse r = Begin(2, K(), "other-hash");
  EXPECT_EQ(r.outcome(), pb::OUTCOME_MISMATCH);
  EXPECT_FALSE(r.record().has_result());
  EXPECT_EQ(r.fencing_token(), 0);
  EXPECT_EQ(r.record().status(), pb::STATUS_SUCCEEDED);
}

TEST_F(SidecarTest, StaleTokenChangesNothing) {
  ASSERT_EQ(Begin(0, K()).outcome(), pb::OUTCOME_ACQUIRED);
  pb::Record before;
  ASSERT_TRUE(Get(0, K(), &before).ok());
  EXPECT_EQ(Complete(1, K(), 2, BinarySnapshot(200, "x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Fail(1, K(), 5, BinarySnapshot(500, "x"), false).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  pb::Record after;
  ASSERT_TRUE(Get(2, K(), &after).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(before, after))
      << before.DebugString() << " vs " << after.DebugString();
}

TEST_F(SidecarTest, RepeatedIdenticalCompleteIsOk) {
  ASSERT_EQ(Begin(0, K()).outcome(), pb::OUTCOME_ACQUIRED);
  const pb::Snapshot result = BinarySnapshot(201, "same");
  pb::CompleteResponse a, b;
  ASSERT_TRUE(Complete(0, K(), 1, result, &a).ok());
  ASSERT_TRUE(Complete(1, K(), 1, result, &b).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(a.record(), b.record()));
  EXPECT_EQ(Complete(2, K(), 1, BinarySnapshot(201, "different")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(SidecarTest, HeartbeatExtendsTheLease) {
  pb::BeginResponse b = Begin(0, K());
  ASSERT_EQ(b.outcome(), pb::OUTCOME_ACQUIRED);
  pb::HeartbeatRequest req;
  *req.mutable_key() = K();
  req.set_fencing_token(1);
  req.mutable_extend()->set_seconds(600);
  pb::HeartbeatResponse resp;
  ASSERT_TRUE(env->client(1).Heartbeat(Ctx().get(), req, &resp).ok());
  EXPECT_GT(resp.lease_expires_at().seconds(),
            b.record().lease_expires_at().seconds() + 500);
  pb::Record r;
  ASSERT_TRUE(Get(2, K(), &r).ok());
  EXPECT_EQ(r.lease_expires_at().seconds(), resp.lease_expires_at().seconds());
  req.set_fencing_token(2);
  EXPECT_EQ(env->client(0).Heartbeat(Ctx().get(), req, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(SidecarTest, SameAttemptIdRegainsItsGrant) {
  pb::BeginResponse a = Begin(0, K(), "hash-1", "attempt-A");
  ASSERT_EQ(a.outcome(), pb::OUTCOME_ACQUIRED);
  pb::BeginResponse again = Begin(1, K(), "hash-1", "attempt-A");
  EXPECT_EQ(again.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(again.fencing_token(), a.fencing_token());
  pb::BeginResponse other = Begin(2, K(), "hash-1", "attempt-B");
  EXPECT_EQ(other.outcome(), pb::OUTCOME_IN_PROGRESS);
  EXPECT_GT(other.retry_after().seconds() * 1000 +
                other.retry_after().nanos() / 1000000,
            0);
  EXPECT_EQ(Begin(2, K()).outcome(), pb::OUTCOME_IN_PROGRESS);
}

TEST_F(SidecarTest, LeaseRunsOutToUnknownAndIsNeverGrantedAgain) {
  pb::BeginRequest req;
  *req.mutable_key() = K();
  req.set_request_hash("hash-1");
  req.mutable_lease()->set_seconds(1);
  pb::BeginResponse resp;
  ASSERT_TRUE(env->client(0).Begin(Ctx().get(), req, &resp).ok());
  ASSERT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  absl::SleepFor(absl::Milliseconds(1300));
  for (int i = 0; i < 6; ++i) {
    pb::BeginResponse r =
        Begin(i % env->size(), K(), "hash-1", i % 2 ? "" : "attempt-X");
    EXPECT_EQ(r.outcome(), pb::OUTCOME_UNKNOWN);
    EXPECT_EQ(r.record().status(), pb::STATUS_UNKNOWN);
  }
  pb::Record r;
  ASSERT_TRUE(Get(1, K(), &r).ok());
  EXPECT_EQ(r.status(), pb::STATUS_UNKNOWN);
  pb::HistoryRequest hreq;
  *hreq.mutable_key() = K();
  pb::HistoryResponse hresp;
  ASSERT_TRUE(env->admin(2).History(Ctx().get(), hreq, &hresp).ok());
  ASSERT_EQ(hresp.entries_size(), 1);
  EXPECT_EQ(hresp.entries(0).from(), pb::STATUS_PROCESSING);
  EXPECT_EQ(hresp.entries(0).to(), pb::STATUS_UNKNOWN);
}

TEST_F(SidecarTest, ReleasePolicyReacquiresWithTheNextToken) {
  const pb::RecordKey key = K("k", "send-email");
  pb::BeginRequest req;
  *req.mutable_key() = key;
  req.set_request_hash("hash-1");
  req.mutable_lease()->set_seconds(1);
  pb::BeginResponse resp;
  ASSERT_TRUE(env->client(0).Begin(Ctx().get(), req, &resp).ok());
  ASSERT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  absl::SleepFor(absl::Milliseconds(1300));
  pb::BeginResponse again = Begin(1, key);
  EXPECT_EQ(again.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(again.fencing_token(), 2);
  EXPECT_EQ(Complete(0, key, 1, BinarySnapshot(200, "late")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// G6: every malformed field is INVALID_ARGUMENT naming it; nothing is written.
TEST_F(SidecarTest, MalformedCallsNameTheFieldAndWriteNothing) {
  struct Case {
    std::string field;
    std::function<void(pb::BeginRequest*)> mutate;
  };
  const std::vector<Case> begin_cases = {
      {"key", [](pb::BeginRequest* r) { r->clear_key(); }},
      {"key.tenant",
       [](pb::BeginRequest* r) { r->mutable_key()->set_tenant(""); }},
      {"key.tenant",
       [](pb::BeginRequest* r) { r->mutable_key()->set_tenant("a b"); }},
      {"key.tenant",
       [](pb::BeginRequest* r) {
         r->mutable_key()->set_tenant(std::string(129, 't'));
       }},
      {"key.operation",
       [](pb::BeginRequest* r) { r->mutable_key()->set_operation(""); }},
      {"key.operation",
       [](pb::BeginRequest* r) {
         r->mutable_key()->set_operation("pay/ment");
       }},
      {"key.key", [](pb::BeginRequest* r) { r->mutable_key()->set_key(""); }},
      {"key.key",
       [](pb::BeginRequest* r) { r->mutable_key()->set_key("has space"); }},
      {"key.key",
       [](pb::BeginRequest* r) {
         r->mutable_key()->set_key(std::string(256, 'k'));
       }},
      {"request_hash", [](pb::BeginRequest* r) { r->set_request_hash(""); }},
      {"request_hash",
       [](pb::BeginRequest* r) { r->set_request_hash(std::string(65, 'h')); }},
      {"lease",
       [](pb::BeginRequest* r) { r->mutable_lease()->set_nanos(1000); }},
      {"lease",
       [](pb::BeginRequest* r) { r->mutable_lease()->set_seconds(7200); }},
      {"lease",
       [](pb::BeginRequest* r) { r->mutable_lease()->set_seconds(-5); }},
      {"lease.nanos",
       [](pb::BeginRequest* r) {
         r->mutable_lease()->set_seconds(5);
         r->mutable_lease()->set_nanos(2000000000);
       }},
      {"attempt_id",
       [](pb::BeginRequest* r) { r->set_attempt_id(std::string(129, 'a')); }},
      {"wait", [](pb::BeginRequest* r) { r->mutable_wait()->set_seconds(-1); }},
  };
  for (const Case& c : begin_cases) {
    pb::BeginRequest req;
    *req.mutable_key() = K("bad-begin");
    req.set_request_hash("hash-1");
    c.mutate(&req);
    pb::BeginResponse resp;
    grpc::Status s = env->client(0).Begin(Ctx().get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_EQ(s.error_message().rfind(c.field + ":", 0), 0u)
        << c.field << " vs " << s.error_message();
  }
  EXPECT_EQ(Rows(), 0);

  // Complete and Fail on a real record: bad input leaves it PROCESSING.
  ASSERT_EQ(Begin(0, K()).outcome(), pb::OUTCOME_ACQUIRED);
  pb::Snapshot huge;
  huge.set_body(std::string(256 * 1024 + 1, 'x'));
  pb::Snapshot nul_header;
  (*nul_header.mutable_headers())["x"] = std::string("a\0b", 3);
  // Content type and headers are replayed as HTTP header fields.
  pb::Snapshot long_type = BinarySnapshot(200, "x");
  long_type.set_content_type(std::string(256, 'c'));
  pb::Snapshot split_type = BinarySnapshot(200, "x");
  split_type.set_content_type("text/plain\r\nSet-Cookie: a=b");
  pb::Snapshot spaced_name = BinarySnapshot(200, "x");
  (*spaced_name.mutable_headers())["x tag"] = "v";
  pb::Snapshot split_value = BinarySnapshot(200, "x");
  (*split_value.mutable_headers())["x-tag"] = "v\r\nSet-Cookie: a=b";
  pb::Snapshot long_value = BinarySnapshot(200, "x");
  (*long_value.mutable_headers())["x-tag"] = std::string(8193, 'v');
  pb::Snapshot many_headers = BinarySnapshot(200, "x");
  for (int i = 0; i < 65; ++i) {
    (*many_headers.mutable_headers())[absl::StrCat("x-", i)] = "v";
  }
  struct Finish {
    std::string field;
    grpc::Status status;
  };
  pb::CompleteRequest no_result;
  *no_result.mutable_key() = K();
  no_result.set_fencing_token(1);
  pb::CompleteResponse cresp;
  pb::FailResponse fresp;
  pb::HeartbeatResponse hresp;
  pb::HeartbeatRequest bad_extend;
  *bad_extend.mutable_key() = K();
  bad_extend.set_fencing_token(1);
  bad_extend.mutable_extend()->set_seconds(100000);
  pb::FailRequest huge_error;
  *huge_error.mutable_key() = K();
  huge_error.set_fencing_token(1);
  *huge_error.mutable_error() = huge;
  pb::GetRequest bad_get;
  *bad_get.mutable_key() = K("bad key");
  pb::GetResponse gresp;
  const std::vector<Finish> cases = {
      {"result", env->client(0).Complete(Ctx().get(), no_result, &cresp)},
      {"result", Complete(1, K(), 1, huge)},
      {"result.headers", Complete(2, K(), 1, nul_header)},
      {"result.content_type", Complete(0, K(), 1, long_type)},
      {"result.content_type", Complete(1, K(), 1, split_type)},
      {"result.headers", Complete(2, K(), 1, spaced_name)},
      {"result.headers", Complete(0, K(), 1, split_value)},
      {"result.headers", Complete(1, K(), 1, long_value)},
      {"result.headers", Complete(2, K(), 1, many_headers)},
      {"error.headers", Fail(0, K(), 1, split_value, true)},
      {"error.content_type", Fail(1, K(), 1, split_type, false)},
      {"fencing_token", Complete(0, K(), 0, BinarySnapshot(200, "x"))},
      {"fencing_token", Fail(0, K(), -1, BinarySnapshot(200, "x"), false)},
      {"error", env->client(1).Fail(Ctx().get(), huge_error, &fresp)},
      {"extend", env->client(2).Heartbeat(Ctx().get(), bad_extend, &hresp)},
      {"key.key", env->client(0).Get(Ctx().get(), bad_get, &gresp)},
  };
  for (const Finish& c : cases) {
    EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field;
    EXPECT_EQ(c.status.error_message().rfind(c.field + ":", 0), 0u)
        << c.field << " vs " << c.status.error_message();
  }
  pb::Record r;
  ASSERT_TRUE(Get(0, K(), &r).ok());
  EXPECT_EQ(r.status(), pb::STATUS_PROCESSING);
  EXPECT_FALSE(r.has_result());
  EXPECT_EQ(Rows(), 1);
  EXPECT_EQ(
      env->Sql("SELECT count(*) FROM idempotency_audit WHERE tenant_id = '" +
               tenant_ + "'"),
      "0");
}

// --pg-prepared=off is for a transaction-pooling PgBouncer, where LISTEN
// needs --postgres-direct: without it the sidecar says so at start-up.
TEST_F(SidecarTest, PreparedOffWithoutDirectConnectionWarns) {
  absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH,
      {"--pg-prepared=off", "--postgres=" + env->pg().ConnInfo()});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE((*s)->Log().find("without --postgres-direct"), std::string::npos)
      << (*s)->Log();
  absl::StatusOr<std::unique_ptr<SidecarProcess>> direct =
      SidecarProcess::Start(
          IDEM_SIDECAR_PATH,
          {"--pg-prepared=off", "--postgres=" + env->pg().ConnInfo(),
           "--postgres-direct=" + env->pg().ConnInfo()});
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ((*direct)->Log().find("without --postgres-direct"),
            std::string::npos)
      << (*direct)->Log();
}

// A second sidecar started on the address of a running one fails to start
// and says why; the first goes on serving every call (no SO_REUSEPORT
// sharing of the port).
TEST_F(SidecarTest, SecondInstanceOnATakenPortRefusesToStart) {
  absl::StatusOr<std::unique_ptr<SidecarProcess>> second =
      SidecarProcess::Start(IDEM_SIDECAR_PATH, env->PostgresFlags(),
                            env->sidecar(0).port());
  std::string log;
  if (second.ok()) {
    // The port accepted at once (the first instance): wait for the exit.
    for (int i = 0; i < 200 && (*second)->Running(); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_FALSE((*second)->Running()) << "second instance still runs";
    log = (*second)->Log();
  } else {
    log = std::string(second.status().message());
  }
  EXPECT_NE(log.find("cannot listen on 127.0.0.1:" +
                     std::to_string(env->sidecar(0).port())),
            std::string::npos)
      << log;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Begin(0, K("k" + std::to_string(i))).outcome(),
              pb::OUTCOME_ACQUIRED);
  }
}

TEST_F(SidecarTest, NotFoundForUnknownRecords) {
  pb::Record r;
  EXPECT_EQ(Get(0, K("never"), &r).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Complete(1, K("never"), 1, BinarySnapshot(200, "x")).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// G1: 64 concurrent Begins on each of 100 keys through three sidecars.
TEST_F(SidecarTest, OneOwnerPerKeyAcrossInstances) {
  constexpr int kCallers = 64;
  constexpr int kKeys = 100;
  std::vector<std::atomic<int>> acquired(kKeys);
  std::atomic<int> in_progress{0};
  std::atomic<int> other{0};
  std::vector<std::thread> threads;
  threads.reserve(kCallers);
  for (int t = 0; t < kCallers; ++t) {
    threads.emplace_back([&, t] {
      auto channel = grpc::CreateChannel(env->sidecar(t % 3).Address(),
                                         grpc::InsecureChannelCredentials());
      auto stub = pb::Idempotency::NewStub(channel);
      for (int k = 0; k < kKeys; ++k) {
        pb::BeginRequest req;
        *req.mutable_key() = K(absl::StrCat("key-", k));
        req.set_request_hash("hash-1");
        pb::BeginResponse resp;
        grpc::Status s = stub->Begin(Ctx(absl::Seconds(30)).get(), req, &resp);
        if (!s.ok()) {  // NOLINT(bugprone-branch-clone)
          ++other;
        } else if (resp.outcome() == pb::OUTCOME_ACQUIRED) {
          ++acquired[k];
        } else if (resp.outcome() == pb::OUTCOME_IN_PROGRESS) {
          ++in_progress;
        } else {
          ++other;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(in_progress.load(), kCallers * kKeys - kKeys);
  for (int k = 0; k < kKeys; ++k) EXPECT_EQ(acquired[k].load(), 1) << k;
  EXPECT_EQ(env->Sql("SELECT count(*) FROM idempotency_record WHERE tenant_id "
                     "= '" +
                     tenant_ + "' AND fencing_token = 1"),
            "100");
}

TEST_F(SidecarTest, HealthIsServedPerService) {
  for (int i = 0; i < env->size(); ++i) {
    EXPECT_EQ(HealthOf(env->health(i)),
              grpc::health::v1::HealthCheckResponse::SERVING);
    EXPECT_EQ(HealthOf(env->health(i), "idempotency.v1.Idempotency"),
              grpc::health::v1::HealthCheckResponse::SERVING);
  }
}

// Counters count exactly: a private operation on one instance.
// Connections to the metrics endpoint that send nothing hold its threads
// only briefly: with CivetWeb's defaults two of them blocked every scrape
// for 30 s.
TEST_F(SidecarTest, SilentMetricsConnectionsDoNotBlockScrapes) {
  const int port = env->sidecar(0).metrics_port();
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    silent.push_back(fd);
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> scraped = HttpGet(port, "/metrics");
  const absl::Duration took = absl::Now() - start;
  for (int fd : silent) close(fd);
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  EXPECT_NE(scraped->find("idem_"), std::string::npos);
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_F(SidecarTest, MetricsCountExactly) {
  const std::string op = "metrics-op";
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(Begin(0, K(absl::StrCat("m", k), op)).outcome(),
              pb::OUTCOME_ACQUIRED);
  }
  ASSERT_TRUE(Complete(0, K("m0", op), 1, BinarySnapshot(200, "m")).ok());
  EXPECT_EQ(Begin(0, K("m0", op)).outcome(), pb::OUTCOME_COMPLETED);
  EXPECT_EQ(Begin(0, K("m0", op), "other").outcome(), pb::OUTCOME_MISMATCH);
  EXPECT_EQ(Begin(0, K("m1", op)).outcome(), pb::OUTCOME_IN_PROGRESS);
  const int port = env->sidecar(0).metrics_port();
  absl::StatusOr<std::string> before = HttpGet(port, "/metrics");
  ASSERT_TRUE(before.ok()) << before.status();
  const double fenced_before =
      MetricValue(*before, "idem_fencing_rejected_total");
  EXPECT_EQ(Complete(0, K("m1", op), 9, BinarySnapshot(200, "x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  absl::StatusOr<std::string> text = HttpGet(port, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  auto begin = [&](const std::string& outcome) {
    return MetricValue(*text,
                       "idem_begin_total{operation=\"metrics-op\","
                       "outcome=\"" +
                           outcome + "\"}");
  };
  EXPECT_EQ(begin("ACQUIRED"), 3);
  EXPECT_EQ(begin("COMPLETED"), 1);
  EXPECT_EQ(begin("MISMATCH"), 1);
  EXPECT_EQ(begin("IN_PROGRESS"), 1);
  EXPECT_EQ(MetricValue(*text, "idem_fencing_rejected_total"),
            fenced_before + 1);
  EXPECT_GE(MetricValue(*text, "idem_replay_total{source=\"postgres\"}"), 1);
  EXPECT_GE(
      MetricValue(*text, "idem_rpc_duration_seconds_count{method=\"Begin\"}"),
      6);
  EXPECT_GE(MetricValue(*text,
                        "idem_store_duration_seconds_count{op=\"insert\","
                        "store=\"postgres\"}"),
            3);
  EXPECT_GT(MetricValue(*text, "process_resident_memory_bytes"), 0);
  EXPECT_GE(MetricValue(*text, "idem_records{status=\"UNKNOWN\"}"), 0);
}

}  // namespace
}  // namespace idem::testing
