// Pure tests of the client library: SHA-256 against FIPS 180-2, the result
// types, option checks, and Execute against an in-process fake sidecar whose
// answers each test scripts (retries, heartbeats, lost leases, metadata).
#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/sha256.h"
#include "gtest/gtest.h"
#include "idempotency/v1/idempotency.grpc.pb.h"

namespace idem {
namespace {

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(bytes);
}

// FIPS 180-2, appendix B.
TEST(Sha256Test, Fips180_2OneBlock) {
  EXPECT_EQ(Hex(Sha256Digest("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, Fips180_2TwoBlocks) {
  EXPECT_EQ(Hex(Sha256Digest(
                "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, Fips180_2MillionAs) {
  EXPECT_EQ(Hex(Sha256Digest(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, EmptyMessage) {
  EXPECT_EQ(Hex(Sha256Digest("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256Test, IncrementalEqualsOneShotAtEveryBlockBoundary) {
  std::string message;
  for (int i = 0; i < 300; ++i) message.push_back(static_cast<char>(i * 7));
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 300}) {
    const std::string m = message.substr(0, len);
    for (size_t split : {size_t{0}, size_t{1}, len / 2, len}) {
      if (split > len) continue;
      Sha256 h;
      h.Update(absl::string_view(m).substr(0, split));
      h.Update(absl::string_view(m).substr(split));
      EXPECT_EQ(h.Finish(), Sha256Digest(m)) << len << " " << split;
    }
  }
}

TEST(Sha256Test, FinishResets) {
  Sha256 h;
  h.Update("something else");
  h.Finish();
  h.Update("abc");
  EXPECT_EQ(h.Finish(), Sha256Digest("abc"));
}

TEST(FingerprintTest, IsSha256OfTheCanonicalBytes) {
  EXPECT_EQ(Fingerprint("abc"), Sha256Digest("abc"));
  EXPECT_EQ(Fingerprint("abc").size(), 32u);
}

TEST(FingerprintTest, FieldsAreFramed) {
  EXPECT_NE(FingerprintFields({"ab", "c"}), FingerprintFields({"a", "bc"}));
  EXPECT_NE(FingerprintFields({"abc"}), FingerprintFields({"abc", ""}));
  EXPECT_EQ(FingerprintFields({"POST", "/payments", "{}"}),
            FingerprintFields({"POST", "/payments", "{}"}));
  EXPECT_EQ(FingerprintFields({"abc"}),
            Sha256Digest(std::string("\0\0\0\0\0\0\0\3abc", 11)));
}

TEST(WriteResultTest, FactoriesSayWhatToReport) {
  const pb::Snapshot s = MakeSnapshot(201, "body", "text/plain");
  EXPECT_EQ(s.code(), 201);
  EXPECT_EQ(s.body(), "body");
  EXPECT_EQ(s.content_type(), "text/plain");

  WriteResult ok = WriteResult::Success(s);
  EXPECT_EQ(ok.kind(), WriteResult::Kind::kSuccess);
  EXPECT_EQ(ok.snapshot().body(), "body");
  EXPECT_EQ(WriteResult::RetryableFailure(s).kind(),
            WriteResult::Kind::kRetryableFailure);
  EXPECT_EQ(WriteResult::FinalFailure(s).kind(),
            WriteResult::Kind::kFinalFailure);
  EXPECT_EQ(WriteResult::FinalFailure(s).snapshot().code(), 201);
  EXPECT_EQ(WriteResult::Unknown().kind(), WriteResult::Kind::kUnknown);
  EXPECT_EQ(WriteResult::Unknown().snapshot().body(), "");
}

TEST(ExecuteResultTest, KindNamesAndExecuted) {
  using Kind = ExecuteResult::Kind;
  EXPECT_STREQ(ExecuteResult::KindName(Kind::kSucceeded), "SUCCEEDED");
  EXPECT_STREQ(ExecuteResult::KindName(Kind::kFailed), "FAILED");
  EXPECT_STREQ(ExecuteResult::KindName(Kind::kInProgress), "IN_PROGRESS");
  EXPECT_STREQ(ExecuteResult::KindName(Kind::kUnknown), "UNKNOWN");
  EXPECT_STREQ(ExecuteResult::KindName(Kind::kMismatch), "MISMATCH");
  EXPECT_STREQ(ExecuteResult::KindName(Kind::kLeaseLost), "LEASE_LOST");
  EXPECT_STREQ(ExecuteResult::KindName(Kind::kUnreported), "UNREPORTED");
  ExecuteResult r;
  EXPECT_FALSE(r.executed());
  r.fencing_token = 3;
  EXPECT_TRUE(r.executed());
}

TEST(ClientOptionsTest, BadOptionsAreInvalidArguments) {
  auto code_of = [](const ClientOptions& o) {
    return Client::Create(o).status().code();
  };
  ClientOptions o;
  EXPECT_EQ(code_of(o), absl::StatusCode::kOk);
  o.target = "";
  EXPECT_EQ(code_of(o), absl::StatusCode::kInvalidArgument);
  o = ClientOptions();
  o.deadline = absl::ZeroDuration();
  EXPECT_EQ(code_of(o), absl::StatusCode::kInvalidArgument);
  o = ClientOptions();
  o.retry.max_attempts = 0;
  EXPECT_EQ(code_of(o), absl::StatusCode::kInvalidArgument);
  o = ClientOptions();
  o.retry.max_backoff = absl::Milliseconds(1);
  EXPECT_EQ(code_of(o), absl::StatusCode::kInvalidArgument);
  o = ClientOptions();
  o.retry.multiplier = 0.5;
  EXPECT_EQ(code_of(o), absl::StatusCode::kInvalidArgument);
  o = ClientOptions();
  o.bearer_token = "two words";
  EXPECT_EQ(code_of(o), absl::StatusCode::kInvalidArgument);
  o = ClientOptions();
  o.tls.root_ca_path = "/etc/ca.pem";  // but TLS not enabled
  EXPECT_EQ(code_of(o), absl::StatusCode::kInvalidArgument);
  o.tls.enabled = true;
  o.tls.cert_chain_path = "/etc/client.pem";  // without the key
  EXPECT_EQ(code_of(o), absl::StatusCode::kInvalidArgument);
  o.tls.cert_chain_path = "";
  o.tls.root_ca_path = "/nonexistent/ca.pem";
  absl::Status s = Client::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tls.root_ca_path"), absl::string_view::npos) << s;
  o.tls.root_ca_path = "";
  EXPECT_EQ(code_of(o), absl::StatusCode::kOk);  // TLS with system roots
}

// A sidecar whose answers the test scripts. Handlers run on gRPC threads.
class FakeSidecar final : public pb::Idempotency::Service {
 public:
  using BeginFn =
      std::function<grpc::Status(const pb::BeginRequest&, pb::BeginResponse*)>;
  using HeartbeatFn = std::function<grpc::Status(const pb::HeartbeatRequest&,
                                                 pb::HeartbeatResponse*)>;
  using CompleteFn = std::function<grpc::Status(const pb::CompleteRequest&,
                                                pb::CompleteResponse*)>;
  using FailFn =
      std::function<grpc::Status(const pb::FailRequest&, pb::FailResponse*)>;

  // Set before the first call.
  BeginFn begin;
  HeartbeatFn heartbeat = [](const pb::HeartbeatRequest&,
                             pb::HeartbeatResponse*) {
    return grpc::Status::OK;
  };
  CompleteFn complete;
  FailFn fail;

  grpc::Status Begin(grpc::ServerContext* ctx, const pb::BeginRequest* req,
                     pb::BeginResponse* resp) override {
    Observe(ctx);
    {
      absl::MutexLock lock(&mu_);
      begins_.push_back(*req);
    }
    return begin(*req, resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx,
                         const pb::HeartbeatRequest* req,
                         pb::HeartbeatResponse* resp) override {
    Observe(ctx);
    {
      absl::MutexLock lock(&mu_);
      heartbeats_.push_back(*req);
    }
    return heartbeat(*req, resp);
  }
  grpc::Status Complete(grpc::ServerContext* ctx,
                        const pb::CompleteRequest* req,
                        pb::CompleteResponse* resp) override {
    Observe(ctx);
    {
      absl::MutexLock lock(&mu_);
      completes_.push_back(*req);
    }
    return complete(*req, resp);
  }
  grpc::Status Fail(grpc::ServerContext* ctx, const pb::FailRequest* req,
                    pb::FailResponse* resp) override {
    Observe(ctx);
    {
      absl::MutexLock lock(&mu_);
      fails_.push_back(*req);
    }
    return fail(*req, resp);
  }
  grpc::Status Get(grpc::ServerContext* ctx, const pb::GetRequest*,
                   pb::GetResponse*) override {
    Observe(ctx);
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such record");
  }

  std::vector<pb::BeginRequest> begins() {
    absl::MutexLock lock(&mu_);
    return begins_;
  }
  std::vector<pb::HeartbeatRequest> heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<pb::CompleteRequest> completes() {
    absl::MutexLock lock(&mu_);
    return completes_;
  }
  std::vector<pb::FailRequest> fails() {
    absl::MutexLock lock(&mu_);
    return fails_;
  }
  // The authorization metadata of every call ("" when absent).
  std::vector<std::string> authorizations() {
    absl::MutexLock lock(&mu_);
    return authorizations_;
  }
  // How far in the future each call's deadline was when it arrived.
  std::vector<absl::Duration> deadlines() {
    absl::MutexLock lock(&mu_);
    return deadlines_;
  }

 private:
  void Observe(grpc::ServerContext* ctx) {
    std::string auth;
    auto it = ctx->client_metadata().find("authorization");
    if (it != ctx->client_metadata().end()) {
      auth.assign(it->second.data(), it->second.size());
    }
    const absl::Duration left = absl::FromChrono(ctx->deadline()) - absl::Now();
    absl::MutexLock lock(&mu_);
    authorizations_.push_back(auth);
    deadlines_.push_back(left);
  }

  absl::Mutex mu_;
  std::vector<pb::BeginRequest> begins_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::CompleteRequest> completes_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::FailRequest> fails_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> deadlines_ ABSL_GUARDED_BY(mu_);
};

grpc::Status Unavailable() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "sidecar restarting");
}

grpc::Status StaleToken() {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      "fencing token 1 is stale; the record has token 2");
}

// Answers ACQUIRED with token 1.
grpc::Status Acquired(const pb::BeginRequest& req, pb::BeginResponse* resp) {
  resp->set_outcome(pb::OUTCOME_ACQUIRED);
  resp->set_fencing_token(1);
  *resp->mutable_record()->mutable_key() = req.key();
  resp->mutable_record()->set_status(pb::STATUS_PROCESSING);
  resp->mutable_record()->set_fencing_token(1);
  return grpc::Status::OK;
}

grpc::Status Stored(const pb::CompleteRequest& req,
                    pb::CompleteResponse* resp) {
  resp->mutable_record()->set_status(pb::STATUS_SUCCEEDED);
  *resp->mutable_record()->mutable_result() = req.result();
  return grpc::Status::OK;
}

class FakeSidecarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    options_.tenant = "shop";
    options_.bearer_token = "s3cret";
    options_.deadline = absl::Seconds(3);
    options_.retry.max_attempts = 4;
    options_.retry.initial_backoff = absl::Milliseconds(5);
    options_.retry.max_backoff = absl::Milliseconds(20);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Client> NewClient() {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::CreateWithChannel(
        server_->InProcessChannel(grpc::ChannelArguments()), options_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  FakeSidecar fake_;
  std::unique_ptr<grpc::Server> server_;
  ClientOptions options_;
  std::atomic<int> runs_{0};
};

TEST_F(FakeSidecarTest, ReplayCarriesTokenDeadlineAndDefaultTenant) {
  fake_.begin = [](const pb::BeginRequest& req, pb::BeginResponse* resp) {
    resp->set_outcome(pb::OUTCOME_COMPLETED);
    *resp->mutable_record()->mutable_key() = req.key();
    resp->mutable_record()->set_status(pb::STATUS_SUCCEEDED);
    *resp->mutable_record()->mutable_result() = MakeSnapshot(201, "stored");
    return grpc::Status::OK;
  };
  std::unique_ptr<Client> client = NewClient();
  absl::StatusOr<ExecuteResult> r = client->Execute(
      {"create-payment", "k1"}, Fingerprint("req"), [&](const Lease&) {
        ++runs_;
        return WriteResult::Success(MakeSnapshot(201, "new"));
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kSucceeded);
  EXPECT_TRUE(r->replayed);
  EXPECT_FALSE(r->executed());
  EXPECT_EQ(r->snapshot.body(), "stored");
  EXPECT_EQ(runs_, 0);

  std::vector<pb::BeginRequest> begins = fake_.begins();
  ASSERT_EQ(begins.size(), 1u);
  EXPECT_EQ(begins[0].key().tenant(), "shop");
  EXPECT_EQ(begins[0].key().operation(), "create-payment");
  EXPECT_EQ(begins[0].key().key(), "k1");
  EXPECT_EQ(begins[0].request_hash(), Fingerprint("req"));
  EXPECT_FALSE(begins[0].attempt_id().empty());
  EXPECT_FALSE(begins[0].has_lease());
  EXPECT_EQ(fake_.authorizations(), std::vector<std::string>{"Bearer s3cret"});
  ASSERT_EQ(fake_.deadlines().size(), 1u);
  EXPECT_GT(fake_.deadlines()[0], absl::Seconds(2));
  // gRPC rounds the timeout it sends up a little.
  EXPECT_LE(fake_.deadlines()[0], absl::Seconds(3) + absl::Milliseconds(100));

  // An explicit tenant wins over the default.
  r = client->Execute({"create-payment", "k1", "other"}, "h",
                      [&](const Lease&) { return WriteResult::Unknown(); });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(fake_.begins().back().key().tenant(), "other");
}

TEST_F(FakeSidecarTest, BeginRetriedWithTheSameAttemptIdAndCompleteRetried) {
  std::atomic<int> begin_calls{0};
  fake_.begin = [&](const pb::BeginRequest& req, pb::BeginResponse* resp) {
    if (++begin_calls <= 2) return Unavailable();
    return Acquired(req, resp);
  };
  std::atomic<int> complete_calls{0};
  fake_.complete = [&](const pb::CompleteRequest& req,
                       pb::CompleteResponse* resp) {
    if (++complete_calls == 1) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow");
    }
    if (complete_calls == 2) return Unavailable();
    return Stored(req, resp);
  };
  std::unique_ptr<Client> client = NewClient();
  ExecuteOptions eo;
  eo.lease = absl::Seconds(30);
  absl::StatusOr<ExecuteResult> r = client->Execute(
      {"create-payment", "k2"}, "hash",
      [&](const Lease& lease) {
        ++runs_;
        EXPECT_EQ(lease.fencing_token(), 1);
        EXPECT_EQ(lease.key().tenant(), "shop");
        EXPECT_EQ(lease.key().key(), "k2");
        EXPECT_TRUE(lease.alive());
        EXPECT_TRUE(lease.status().ok());
        return WriteResult::Success(MakeSnapshot(201, "paid"));
      },
      eo);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kSucceeded);
  EXPECT_FALSE(r->replayed);
  EXPECT_EQ(r->fencing_token, 1);
  EXPECT_EQ(r->snapshot.body(), "paid");
  EXPECT_EQ(r->record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(runs_, 1);

  std::vector<pb::BeginRequest> begins = fake_.begins();
  ASSERT_EQ(begins.size(), 3u);
  EXPECT_EQ(begins[0].attempt_id(), begins[1].attempt_id());
  EXPECT_EQ(begins[0].attempt_id(), begins[2].attempt_id());
  EXPECT_EQ(begins[0].lease().seconds(), 30);
  std::vector<pb::CompleteRequest> completes = fake_.completes();
  ASSERT_EQ(completes.size(), 3u);
  for (const pb::CompleteRequest& c : completes) {
    EXPECT_EQ(c.fencing_token(), 1);
    EXPECT_EQ(c.key().tenant(), "shop");
    EXPECT_EQ(c.result().body(), "paid");
  }
  for (const std::string& auth : fake_.authorizations()) {
    EXPECT_EQ(auth, "Bearer s3cret");
  }

  // A new Execute is a new attempt.
  ASSERT_TRUE(client
                  ->Execute({"create-payment", "k2"}, "hash",
                            [](auto&) { return WriteResult::Unknown(); })
                  .ok());
  EXPECT_NE(fake_.begins().back().attempt_id(), begins[0].attempt_id());
}

TEST_F(FakeSidecarTest, BeginGivesUpAfterMaxAttemptsAndFnNeverRuns) {
  fake_.begin = [](const pb::BeginRequest&, pb::BeginResponse*) {
    return Unavailable();
  };
  absl::StatusOr<ExecuteResult> r =
      NewClient()->Execute({"op", "k"}, "h", [&](const Lease&) {
        ++runs_;
        return WriteResult::Unknown();
      });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fake_.begins().size(), 4u);
  EXPECT_EQ(runs_, 0);
}

TEST_F(FakeSidecarTest, InvalidArgumentIsNotRetried) {
  fake_.begin = [](const pb::BeginRequest&, pb::BeginResponse*) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "key.tenant: empty");
  };
  absl::StatusOr<ExecuteResult> r = NewClient()->Execute(
      {"op", "k"}, "h", [&](const Lease&) { return WriteResult::Unknown(); });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "key.tenant: empty");
  EXPECT_EQ(fake_.begins().size(), 1u);
}

TEST_F(FakeSidecarTest, HeartbeatsEveryThirdOfTheLease) {
  fake_.begin = Acquired;
  fake_.complete = Stored;
  ExecuteOptions eo;
  eo.lease = absl::Milliseconds(600);
  bool alive_at_end = false;
  absl::StatusOr<ExecuteResult> r = NewClient()->Execute(
      {"op", "k"}, "h",
      [&](const Lease& lease) {
        absl::SleepFor(absl::Milliseconds(1300));
        alive_at_end = lease.alive();
        return WriteResult::Success(MakeSnapshot(200, "done"));
      },
      eo);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kSucceeded);
  EXPECT_TRUE(alive_at_end);
  std::vector<pb::HeartbeatRequest> beats = fake_.heartbeats();
  // About one every 200 ms for 1.3 s.
  EXPECT_GE(beats.size(), 4u);
  EXPECT_LE(beats.size(), 8u);
  for (const pb::HeartbeatRequest& b : beats) {
    EXPECT_EQ(b.fencing_token(), 1);
    EXPECT_EQ(b.key().tenant(), "shop");
    EXPECT_EQ(absl::Seconds(b.extend().seconds()) +
                  absl::Nanoseconds(b.extend().nanos()),
              absl::Milliseconds(600));
  }
  // The heartbeat stopped with fn.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(fake_.heartbeats().size(), beats.size());
}

TEST_F(FakeSidecarTest, RefusedHeartbeatLosesTheLeaseAndCompleteIsLeaseLost) {
  fake_.begin = Acquired;
  fake_.heartbeat = [](const pb::HeartbeatRequest&, pb::HeartbeatResponse*) {
    return StaleToken();
  };
  fake_.complete = [](const pb::CompleteRequest&, pb::CompleteResponse*) {
    return StaleToken();
  };
  ExecuteOptions eo;
  eo.lease = absl::Milliseconds(150);
  absl::Status lease_status;
  absl::StatusOr<ExecuteResult> r = NewClient()->Execute(
      {"op", "k"}, "h",
      [&](const Lease& lease) {
        const absl::Time end = absl::Now() + absl::Seconds(5);
        while (lease.alive() && absl::Now() < end) {
          absl::SleepFor(absl::Milliseconds(5));
        }
        lease_status = lease.status();
        return WriteResult::Success(MakeSnapshot(200, "mine"));
      },
      eo);
  EXPECT_EQ(lease_status.code(), absl::StatusCode::kFailedPrecondition)
      << lease_status;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kLeaseLost);
  EXPECT_TRUE(r->executed());
  EXPECT_FALSE(r->replayed);
  EXPECT_EQ(r->snapshot.body(), "mine");
  EXPECT_EQ(r->report_status.code(), absl::StatusCode::kFailedPrecondition);
  // Not retried: the refusal is an answer.
  EXPECT_EQ(fake_.completes().size(), 1u);
  // Heartbeats stop after the refusal.
  EXPECT_EQ(fake_.heartbeats().size(), 1u);
}

TEST_F(FakeSidecarTest, UnreachableHeartbeatsLetTheLeaseRunOut) {
  fake_.begin = Acquired;
  fake_.heartbeat = [](const pb::HeartbeatRequest&, pb::HeartbeatResponse*) {
    return Unavailable();
  };
  fake_.fail = [](const pb::FailRequest& req, pb::FailResponse* resp) {
    resp->mutable_record()->set_status(pb::STATUS_FAILED);
    resp->mutable_record()->set_retryable(req.retryable());
    *resp->mutable_record()->mutable_result() = req.error();
    return grpc::Status::OK;
  };
  ExecuteOptions eo;
  eo.lease = absl::Milliseconds(200);
  absl::Status lease_status;
  absl::StatusOr<ExecuteResult> r = NewClient()->Execute(
      {"op", "k"}, "h",
      [&](const Lease& lease) {
        absl::SleepFor(absl::Milliseconds(400));
        lease_status = lease.status();
        return WriteResult::RetryableFailure(MakeSnapshot(503, "busy"));
      },
      eo);
  EXPECT_EQ(lease_status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(r.ok()) << r.status();
  // The sidecar still took the report (the record had not moved on).
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kFailed);
  EXPECT_TRUE(r->retryable);
  EXPECT_FALSE(r->replayed);
  EXPECT_EQ(r->snapshot.body(), "busy");
  ASSERT_EQ(fake_.fails().size(), 1u);
  EXPECT_TRUE(fake_.fails()[0].retryable());
  EXPECT_GE(fake_.heartbeats().size(), 2u);  // kept trying
}

TEST_F(FakeSidecarTest, FinalFailureIsReportedNotRetryable) {
  fake_.begin = Acquired;
  fake_.fail = [](const pb::FailRequest& req, pb::FailResponse* resp) {
    resp->mutable_record()->set_status(pb::STATUS_FAILED);
    resp->mutable_record()->set_retryable(req.retryable());
    *resp->mutable_record()->mutable_result() = req.error();
    return grpc::Status::OK;
  };
  absl::StatusOr<ExecuteResult> r =
      NewClient()->Execute({"op", "k"}, "h", [](const Lease&) {
        return WriteResult::FinalFailure(MakeSnapshot(402, "declined"));
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kFailed);
  EXPECT_FALSE(r->retryable);
  EXPECT_EQ(r->snapshot.code(), 402);
  ASSERT_EQ(fake_.fails().size(), 1u);
  EXPECT_FALSE(fake_.fails()[0].retryable());
  EXPECT_EQ(fake_.fails()[0].error().body(), "declined");
}

TEST_F(FakeSidecarTest, CompleteUnreachableIsUnreported) {
  fake_.begin = Acquired;
  fake_.complete = [](const pb::CompleteRequest&, pb::CompleteResponse*) {
    return Unavailable();
  };
  absl::StatusOr<ExecuteResult> r =
      NewClient()->Execute({"op", "k"}, "h", [](const Lease&) {
        return WriteResult::Success(MakeSnapshot(201, "paid"));
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kUnreported);
  EXPECT_EQ(r->report_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r->fencing_token, 1);
  EXPECT_EQ(r->snapshot.body(), "paid");
  EXPECT_EQ(fake_.completes().size(), 4u);
}

TEST_F(FakeSidecarTest, UnknownWriteReportsNothing) {
  fake_.begin = Acquired;
  absl::StatusOr<ExecuteResult> r = NewClient()->Execute(
      {"op", "k"}, "h", [](const Lease&) { return WriteResult::Unknown(); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kUnreported);
  EXPECT_EQ(r->report_status.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(fake_.completes().empty());
  EXPECT_TRUE(fake_.fails().empty());
}

TEST_F(FakeSidecarTest, InProgressWithoutWaitAnswersAtOnce) {
  fake_.begin = [](const pb::BeginRequest&, pb::BeginResponse* resp) {
    resp->set_outcome(pb::OUTCOME_IN_PROGRESS);
    resp->mutable_retry_after()->set_nanos(250000000);
    return grpc::Status::OK;
  };
  absl::StatusOr<ExecuteResult> r =
      NewClient()->Execute({"op", "k"}, "h", [&](const Lease&) {
        ++runs_;
        return WriteResult::Unknown();
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kInProgress);
  EXPECT_EQ(r->retry_after, absl::Milliseconds(250));
  EXPECT_EQ(fake_.begins().size(), 1u);
  EXPECT_EQ(runs_, 0);
}

TEST_F(FakeSidecarTest, InProgressWaitPollsUntilTheReplay) {
  std::atomic<int> calls{0};
  fake_.begin = [&](const pb::BeginRequest&, pb::BeginResponse* resp) {
    if (++calls <= 3) {
      resp->set_outcome(pb::OUTCOME_IN_PROGRESS);
      resp->mutable_retry_after()->set_nanos(50000000);
    } else {
      resp->set_outcome(pb::OUTCOME_COMPLETED);
      resp->mutable_record()->set_status(pb::STATUS_SUCCEEDED);
      *resp->mutable_record()->mutable_result() = MakeSnapshot(201, "theirs");
    }
    return grpc::Status::OK;
  };
  ExecuteOptions eo;
  eo.wait = absl::Seconds(5);
  absl::StatusOr<ExecuteResult> r = NewClient()->Execute(
      {"op", "k"}, "h",
      [&](const Lease&) {
        ++runs_;
        return WriteResult::Unknown();
      },
      eo);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kSucceeded);
  EXPECT_TRUE(r->replayed);
  EXPECT_EQ(r->snapshot.body(), "theirs");
  EXPECT_EQ(fake_.begins().size(), 4u);
  EXPECT_EQ(runs_, 0);
}

TEST_F(FakeSidecarTest, InProgressWaitIsBounded) {
  fake_.begin = [](const pb::BeginRequest&, pb::BeginResponse* resp) {
    resp->set_outcome(pb::OUTCOME_IN_PROGRESS);
    resp->mutable_retry_after()->set_seconds(1);
    return grpc::Status::OK;
  };
  ExecuteOptions eo;
  eo.wait = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<ExecuteResult> r = NewClient()->Execute(
      {"op", "k"}, "h", [](const Lease&) { return WriteResult::Unknown(); },
      eo);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ExecuteResult::Kind::kInProgress);
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_GE(fake_.begins().size(), 3u);
}

TEST_F(FakeSidecarTest, UnknownAndMismatchAreDistinctAndNeverRunFn) {
  std::atomic<int> calls{0};
  fake_.begin = [&](const pb::BeginRequest&, pb::BeginResponse* resp) {
    resp->set_outcome(++calls == 1 ? pb::OUTCOME_UNKNOWN
                                   : pb::OUTCOME_MISMATCH);
    return grpc::Status::OK;
  };
  std::unique_ptr<Client> client = NewClient();
  auto fn = [&](const Lease&) {
    ++runs_;
    return WriteResult::Unknown();
  };
  absl::StatusOr<ExecuteResult> unknown = client->Execute({"op", "k"}, "h", fn);
  absl::StatusOr<ExecuteResult> mismatch =
      client->Execute({"op", "k"}, "h", fn);
  ASSERT_TRUE(unknown.ok() && mismatch.ok());
  EXPECT_EQ(unknown->kind, ExecuteResult::Kind::kUnknown);
  EXPECT_EQ(mismatch->kind, ExecuteResult::Kind::kMismatch);
  EXPECT_EQ(runs_, 0);
}

TEST_F(FakeSidecarTest, LowLevelCallsMapCodesAndFillTheTenant) {
  std::unique_ptr<Client> client = NewClient();
  pb::GetRequest get;
  get.mutable_key()->set_operation("op");
  get.mutable_key()->set_key("k");
  absl::StatusOr<pb::GetResponse> got = client->Get(get);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got.status().message(), "no such record");

  fake_.begin = Acquired;
  pb::BeginRequest begin;
  begin.mutable_key()->set_operation("op");
  begin.mutable_key()->set_key("k");
  absl::StatusOr<pb::BeginResponse> begun = client->Begin(begin);
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_EQ(begun->outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(fake_.begins().back().key().tenant(), "shop");
  EXPECT_TRUE(fake_.begins().back().attempt_id().empty());

  // Exactly one call, even when it is UNAVAILABLE.
  fake_.begin = [](const pb::BeginRequest&, pb::BeginResponse*) {
    return Unavailable();
  };
  EXPECT_EQ(client->Begin(begin).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(fake_.begins().size(), 2u);
}

}  // namespace
}  // namespace idem
