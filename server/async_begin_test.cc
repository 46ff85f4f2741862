// AsyncBeginServer over real gRPC on loopback: calls arrive in batches and
// each gets its own answer; shutting down waits for calls answered later
// from another thread.
#include "server/async_begin.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace idem {
namespace {

// A server with AsyncBeginServer and `handle`, on a free loopback port.
class Harness {
 public:
  explicit Harness(AsyncBeginServer::HandleFn handle) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    begins_ = std::make_unique<AsyncBeginServer>(&service_, &builder, 2,
                                                 std::move(handle));
    server_ = builder.BuildAndStart();
    begins_->Start();
    stub_ = pb::Idempotency::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }
  ~Harness() { Stop(); }

  // Server::Shutdown, then AsyncBeginServer::Stop, as the sidecar does.
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    server_->Wait();
    begins_->Stop();
    server_.reset();
  }

  grpc::Status Begin(const std::string& key, pb::BeginResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    pb::BeginRequest req;
    req.mutable_key()->set_key(key);
    return stub_->Begin(&ctx, req, resp);
  }

 private:
  IdempotencyBase service_;
  int port_ = 0;
  std::unique_ptr<AsyncBeginServer> begins_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Idempotency::Stub> stub_;
};

TEST(AsyncBeginServerTest, AnswersEveryCallWithItsOwnResponse) {
  absl::Mutex mu;
  size_t largest_batch = 0;
  Harness h([&](const std::vector<AsyncBegin*>& calls) {
    {
      absl::MutexLock lock(&mu);
      largest_batch = std::max(largest_batch, calls.size());
    }
    for (AsyncBegin* call : calls) {
      if (call->request().key().key() == "bad") {
        call->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
        continue;
      }
      call->response()->mutable_record()->mutable_key()->set_key(
          call->request().key().key());
      call->Finish(grpc::Status::OK);
    }
  });
  std::vector<std::thread> clients;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 50; ++i) {
        const std::string key = absl::StrCat("k", c, "-", i);
        pb::BeginResponse resp;
        grpc::Status s = h.Begin(key, &resp);
        if (!s.ok() || resp.record().key().key() != key) ++wrong;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
  pb::BeginResponse resp;
  grpc::Status bad = h.Begin("bad", &resp);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  absl::MutexLock lock(&mu);
  EXPECT_GE(largest_batch, 1u);
}

// A call the handler hands elsewhere still gets its answer when the server
// shuts down meanwhile: the shutdown (Server::Shutdown, then Stop) returns
// only after it was finished.
TEST(AsyncBeginServerTest, ShutdownWaitsForCallsFinishedLater) {
  absl::Notification taken;
  std::atomic<AsyncBegin*> held{nullptr};
  Harness h([&](const std::vector<AsyncBegin*>& calls) {
    for (AsyncBegin* call : calls) held = call;
    taken.Notify();
  });
  pb::BeginResponse resp;
  grpc::Status status;
  std::thread client([&] { status = h.Begin("later", &resp); });
  ASSERT_TRUE(taken.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::atomic<bool> finished{false};
  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(300));
    held.load()->response()->mutable_record()->mutable_key()->set_key("later");
    finished = true;
    held.load()->Finish(grpc::Status::OK);
  });
  h.Stop();
  EXPECT_TRUE(finished.load());
  finisher.join();
  client.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(resp.record().key().key(), "later");
}

}  // namespace
}  // namespace idem
