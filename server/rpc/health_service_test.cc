// HealthService over loopback gRPC: Check and Watch follow SetServingStatus;
// Watch sends only changes; Shutdown() ends open Watch calls, and a client
// that cancels its Watch frees the server, so grpc::Server::Shutdown returns
// at once instead of waiting for its deadline.
#include "server/rpc/health_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace idem {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ServingStatus = HealthCheckResponse::ServingStatus;

constexpr absl::Duration kWait = absl::Seconds(5);

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoNanoseconds(d);
}

// A Watch call read on its own thread, so that the test can wait for the
// next message with a timeout (ClientReader::Read has none).
class Watcher {
 public:
  Watcher(Health::Stub* stub, const std::string& name) {
    // A stream that never ends fails the test here rather than hanging it.
    context_.set_deadline(DeadlineIn(absl::Seconds(30)));
    HealthCheckRequest request;
    request.set_service(name);
    reader_ = stub->Watch(&context_, request);
    thread_ = std::thread([this] {
      HealthCheckResponse response;
      while (reader_->Read(&response)) {
        SteadyMutexLock lock(&mu_);
        received_.push_back(response.status());
        cv_.SignalAll();
      }
      grpc::Status status = reader_->Finish();
      SteadyMutexLock lock(&mu_);
      status_ = status;
      cv_.SignalAll();
    });
  }
  ~Watcher() {
    context_.TryCancel();
    thread_.join();
  }
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // The next status received, or nullopt if none comes within `timeout`.
  std::optional<ServingStatus> Next(absl::Duration timeout = kWait) {
    SteadyMutexLock lock(&mu_);
    if (!cv_.WaitFor(&lock, timeout,
                     [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       return !received_.empty();
                     })) {
      return std::nullopt;
    }
    ServingStatus status = received_.front();
    received_.pop_front();
    return status;
  }

  // How the stream ended, or nullopt if it has not within `timeout`.
  std::optional<grpc::Status> End(absl::Duration timeout = kWait) {
    SteadyMutexLock lock(&mu_);
    cv_.WaitFor(&lock, timeout, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return status_.has_value();
    });
    return status_;
  }

  // Statuses received and not yet taken by Next().
  size_t Pending() {
    SteadyMutexLock lock(&mu_);
    return received_.size();
  }

  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader_;
  std::thread thread_;
  SteadyMutex mu_;
  SteadyCondVar cv_;
  std::deque<ServingStatus> received_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
};

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    stub_ = Health::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }

  // The Watch calls of a test have all been cancelled by now: none may hold
  // the server's shutdown.
  void TearDown() override {
    if (server_ == nullptr) return;
    EXPECT_LT(ShutdownServer(absl::Seconds(2)), absl::Seconds(2))
        << "a Watch outlived its cancelled call";
  }

  // Check(`name`): the status, or the call's error as "code: message".
  std::string Check(const std::string& name) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(kWait));
    HealthCheckRequest request;
    request.set_service(name);
    HealthCheckResponse response;
    grpc::Status status = stub_->Check(&context, request, &response);
    if (!status.ok()) {
      return std::to_string(status.error_code()) + ": " +
             status.error_message();
    }
    return HealthCheckResponse::ServingStatus_Name(response.status());
  }

  // Runs grpc::Server::Shutdown with a deadline 5 s away and returns how
  // long it took. If it has not returned after `limit` (a Watch holding its
  // thread), ends every Watch with service_.Shutdown(), so that a Watch
  // deaf to cancellation fails the test instead of hanging it.
  absl::Duration ShutdownServer(absl::Duration limit) {
    const SteadyTime start = SteadyClock::now();
    SteadyNotification done;
    std::thread shutdown([&] {
      server_->Shutdown(DeadlineIn(absl::Seconds(5)));
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(limit)) service_.Shutdown();
    shutdown.join();
    return SteadySince(start);
  }

  HealthService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(HealthServiceTest, OverallServiceServingAtStart) {
  EXPECT_EQ(Check(""), "SERVING");
}

TEST_F(HealthServiceTest, UnknownNameIsNotFound) {
  EXPECT_EQ(Check("no.such.Service"),
            std::to_string(grpc::StatusCode::NOT_FOUND) +
                ": unknown service no.such.Service");
}

TEST_F(HealthServiceTest, CheckFollowsSetServingStatus) {
  service_.SetServingStatus("a", false);
  EXPECT_EQ(Check("a"), "NOT_SERVING");
  EXPECT_EQ(Check(""), "SERVING");
  service_.SetServingStatus("a", true);
  EXPECT_EQ(Check("a"), "SERVING");
  service_.SetServingStatus("", false);
  EXPECT_EQ(Check(""), "NOT_SERVING");
  EXPECT_EQ(Check("a"), "SERVING");
}

TEST_F(HealthServiceTest, SetServingStatusForAllNames) {
  service_.SetServingStatus("a", true);
  service_.SetServingStatus("b", false);
  service_.SetServingStatus(false);
  EXPECT_EQ(Check(""), "NOT_SERVING");
  EXPECT_EQ(Check("a"), "NOT_SERVING");
  EXPECT_EQ(Check("b"), "NOT_SERVING");
  service_.SetServingStatus(true);
  EXPECT_EQ(Check(""), "SERVING");
  EXPECT_EQ(Check("a"), "SERVING");
  EXPECT_EQ(Check("b"), "SERVING");
  // Only names already set: it registers none.
  EXPECT_EQ(Check("c").substr(0, 2),
            std::to_string(grpc::StatusCode::NOT_FOUND) + ":");
}

TEST_F(HealthServiceTest, WatchSendsCurrentStatusThenEachChange) {
  service_.SetServingStatus("a", true);
  Watcher watch(stub_.get(), "a");
  EXPECT_EQ(watch.Next(), HealthCheckResponse::SERVING);
  // Each change is awaited before the next, so none can be coalesced.
  service_.SetServingStatus("a", false);
  EXPECT_EQ(watch.Next(), HealthCheckResponse::NOT_SERVING);
  // The same value again: nothing sent, so the next message is the change
  // after it (a duplicate would come first).
  service_.SetServingStatus("a", false);
  service_.SetServingStatus(false);
  service_.SetServingStatus("a", true);
  EXPECT_EQ(watch.Next(), HealthCheckResponse::SERVING);
  // Other names' changes are not sent either.
  service_.SetServingStatus("b", false);
  service_.SetServingStatus("", false);
  EXPECT_EQ(watch.Next(absl::Milliseconds(300)), std::nullopt);
  EXPECT_EQ(watch.End(absl::ZeroDuration()), std::nullopt);
}

TEST_F(HealthServiceTest, WatchUnknownNameUntilSet) {
  Watcher watch(stub_.get(), "later");
  EXPECT_EQ(watch.Next(), HealthCheckResponse::SERVICE_UNKNOWN);
  service_.SetServingStatus("later", true);
  EXPECT_EQ(watch.Next(), HealthCheckResponse::SERVING);
}

TEST_F(HealthServiceTest, ShutdownEndsWatchesAndFreezesStatuses) {
  service_.SetServingStatus("a", true);
  Watcher watch(stub_.get(), "a");
  ASSERT_EQ(watch.Next(), HealthCheckResponse::SERVING);

  service_.Shutdown();
  EXPECT_EQ(Check(""), "NOT_SERVING");
  EXPECT_EQ(Check("a"), "NOT_SERVING");
  service_.SetServingStatus(true);
  service_.SetServingStatus("a", true);
  service_.SetServingStatus("new", true);
  EXPECT_EQ(Check(""), "NOT_SERVING");
  EXPECT_EQ(Check("a"), "NOT_SERVING");
  EXPECT_EQ(Check("new").substr(0, 2),
            std::to_string(grpc::StatusCode::NOT_FOUND) + ":");

  EXPECT_EQ(watch.Next(), HealthCheckResponse::NOT_SERVING);
  std::optional<grpc::Status> end = watch.End();
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->ok()) << end->error_code() << ": " << end->error_message();
  EXPECT_EQ(watch.Pending(), 0u);
}

TEST_F(HealthServiceTest, ServerShutdownDoesNotWaitForWatchAfterShutdown) {
  Watcher watch(stub_.get(), "");
  ASSERT_EQ(watch.Next(), HealthCheckResponse::SERVING);
  service_.Shutdown();
  EXPECT_LT(ShutdownServer(absl::Seconds(2)), absl::Seconds(1));
  EXPECT_EQ(watch.Next(), HealthCheckResponse::NOT_SERVING);
  std::optional<grpc::Status> end = watch.End();
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->ok()) << end->error_code() << ": " << end->error_message();
}

TEST_F(HealthServiceTest, WatchAfterShutdownEndsAtOnce) {
  service_.SetServingStatus("a", true);
  service_.Shutdown();
  Watcher known(stub_.get(), "a");
  Watcher unknown(stub_.get(), "b");
  EXPECT_EQ(known.Next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(unknown.Next(), HealthCheckResponse::SERVICE_UNKNOWN);
  for (Watcher* watch : {&known, &unknown}) {
    std::optional<grpc::Status> end = watch->End();
    ASSERT_TRUE(end.has_value());
    EXPECT_TRUE(end->ok()) << end->error_code() << ": " << end->error_message();
    EXPECT_EQ(watch->Pending(), 0u);
  }
}

TEST_F(HealthServiceTest, CancelledWatchFreesServer) {
  Watcher watch(stub_.get(), "");
  ASSERT_EQ(watch.Next(), HealthCheckResponse::SERVING);
  watch.Cancel();
  std::optional<grpc::Status> end = watch.End();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::CANCELLED);
  // The server's Watch notices within its poll interval (100 ms) and returns.
  EXPECT_LT(ShutdownServer(absl::Seconds(2)), absl::Seconds(1));
}

}  // namespace
}  // namespace idem
