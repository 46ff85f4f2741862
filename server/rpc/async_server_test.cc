// AsyncServer over real gRPC on loopback: calls of two methods arrive in
// batches, each to its own handler, and each gets its own answer, also when
// another thread finishes it; shutting down waits for calls answered later
// from another thread. FinishMailbox: answers posted from other threads are
// sent by the queue's thread, one wake-up for all posted meanwhile; while
// that thread waits, one answer per wait is sent by its finisher. A caller
// that hangs up reaches OnCancel; calls past the in-flight bound are
// refused. Streams (AsyncStream): written in order from their source on
// their own thread, ended by Finish, by a caller that hangs up, or by the
// server's shutdown deadline; bounded like calls unless the method is not.
#include "server/rpc/async_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "idempotency/v1/idempotency.grpc.pb.h"

namespace idem {
namespace {

namespace pb = ::idempotency::v1;

using BeginRpc = AsyncCall<pb::BeginRequest, pb::BeginResponse>;
using GetRpc = AsyncCall<pb::GetRequest, pb::GetResponse>;

// Get answers NOT_FOUND naming the key, on the thread that took it.
void AnswerGets(const std::vector<GetRpc*>& calls) {
  for (GetRpc* call : calls) {
    call->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                              "get " + call->request().key().key()));
  }
}

// A server with AsyncServer serving Begin with `handle` and Get with
// AnswerGets, on a free loopback port.
class Harness {
 public:
  // `max_in_flight` and `begin` as AsyncServer and AsyncServer::Add take
  // them.
  explicit Harness(
      AsyncServer::HandleFn<pb::BeginRequest, pb::BeginResponse> handle,
      int64_t max_in_flight = 0, AsyncMethodOptions begin = {}) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    rpcs_ = std::make_unique<AsyncServer>(&builder, 2, max_in_flight);
    rpcs_->Add<pb::BeginRequest, pb::BeginResponse>(
        [this](auto* ctx, auto* req, auto* writer, auto* cq, void* tag) {
          service_.RequestBegin(ctx, req, writer, cq, cq, tag);
        },
        std::move(handle), begin);
    // Get through the other form, with one call requested ahead.
    rpcs_->Add(&service_, &pb::Idempotency::AsyncService::RequestGet,
               AnswerGets, {/*ahead=*/1});
    server_ = builder.BuildAndStart();
    rpcs_->Start();
    stub_ = pb::Idempotency::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }
  ~Harness() { Stop(); }

  // Server::Shutdown, then AsyncServer::Stop, as the sidecar does.
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    server_->Wait();
    rpcs_->Stop();
    server_.reset();
  }

  grpc::Status Begin(
      const std::string& key, pb::BeginResponse* resp,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    pb::BeginRequest req;
    req.mutable_key()->set_key(key);
    return stub_->Begin(&ctx, req, resp);
  }

  AsyncServer& rpcs() { return *rpcs_; }

  grpc::Status Get(const std::string& key) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    pb::GetRequest req;
    req.mutable_key()->set_key(key);
    pb::GetResponse resp;
    return stub_->Get(&ctx, req, &resp);
  }

 private:
  pb::Idempotency::AsyncService service_;
  int port_ = 0;
  std::unique_ptr<AsyncServer> rpcs_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Idempotency::Stub> stub_;
};

// Answers a call with its own key, or INVALID_ARGUMENT for key "bad".
void Answer(BeginRpc* call) {
  if (call->request().key().key() == "bad") {
    call->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
    return;
  }
  call->response()->mutable_record()->mutable_key()->set_key(
      call->request().key().key());
  call->Finish(grpc::Status::OK);
}

// A caller that hangs up (here: its deadline passes) reaches the call's
// OnCancel hook on a method served with notify_when_done, and the call,
// finished from there, is freed.
TEST(AsyncServerTest, ACallerThatHangsUpReachesOnCancel) {
  absl::Notification cancelled;
  Harness h(
      [&](const std::vector<BeginRpc*>& calls) {
        for (BeginRpc* call : calls) {
          call->OnCancel([call, &cancelled] {
            call->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
            cancelled.Notify();
          });
        }
      },
      0, {/*ahead=*/4, /*notify_when_done=*/true});
  pb::BeginResponse resp;
  grpc::Status s = h.Begin("held", &resp, std::chrono::milliseconds(200));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (h.rpcs().in_flight()->load() > 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(h.rpcs().in_flight()->load(), 0);
}

// Past max_in_flight calls taken and not answered, a new call is refused
// at once; once one is answered, calls are served again.
TEST(AsyncServerTest, CallsPastTheInFlightBoundAreRefused) {
  std::mutex mu;
  std::vector<BeginRpc*> held;
  Harness h(
      [&](const std::vector<BeginRpc*>& calls) {
        std::lock_guard<std::mutex> lock(mu);
        for (BeginRpc* call : calls) {
          if (call->request().key().key() == "hold") {
            held.push_back(call);
          } else {
            Answer(call);
          }
        }
      },
      /*max_in_flight=*/1);
  std::thread holder([&] {
    pb::BeginResponse resp;
    EXPECT_TRUE(h.Begin("hold", &resp).ok());
  });
  while (h.rpcs().in_flight()->load() < 1) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  pb::BeginResponse resp;
  grpc::Status refused = h.Begin("next", &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("--max-calls-in-flight"),
            std::string::npos);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(held.size(), 1u);
    Answer(held[0]);
  }
  holder.join();
  EXPECT_TRUE(h.Begin("next", &resp).ok());
}

// Every other call is answered by a thread of its own, as the store's
// threads answer calls that waited on PostgreSQL.
TEST(AsyncServerTest, AnswersEveryCallWithItsOwnResponse) {
  absl::Mutex mu;
  size_t largest_batch = 0;
  std::mutex later_mu;
  std::condition_variable later_cv;
  std::deque<BeginRpc*> later;  // guarded by later_mu
  bool done = false;            // guarded by later_mu
  std::thread finisher([&] {
    std::unique_lock<std::mutex> lock(later_mu);
    while (true) {
      later_cv.wait(lock, [&] { return !later.empty() || done; });
      if (later.empty()) return;
      BeginRpc* call = later.front();
      later.pop_front();
      Answer(call);
    }
  });
  Harness h([&](const std::vector<BeginRpc*>& calls) {
    {
      absl::MutexLock lock(&mu);
      largest_batch = std::max(largest_batch, calls.size());
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      if (i % 2 == 0) {
        Answer(calls[i]);
        continue;
      }
      std::lock_guard<std::mutex> lock(later_mu);
      later.push_back(calls[i]);
      later_cv.notify_one();
    }
  });
  std::vector<std::thread> clients;
  clients.reserve(16);
  std::atomic<int> wrong{0};
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 50; ++i) {
        const std::string key = absl::StrCat("k", c, "-", i);
        pb::BeginResponse resp;
        grpc::Status s = h.Begin(key, &resp);
        if (!s.ok() || resp.record().key().key() != key) ++wrong;
        // The other method, through the same queues, to its own handler.
        s = h.Get(key);
        if (s.error_code() != grpc::StatusCode::NOT_FOUND ||
            s.error_message() != "get " + key) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
  pb::BeginResponse resp;
  grpc::Status bad = h.Begin("bad", &resp);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  {
    absl::MutexLock lock(&mu);
    EXPECT_GE(largest_batch, 1u);
  }
  {
    std::lock_guard<std::mutex> lock(later_mu);
    done = true;
    later_cv.notify_one();
  }
  finisher.join();
}

// A call the handler hands elsewhere still gets its answer when the server
// shuts down meanwhile: the shutdown (Server::Shutdown, then Stop) returns
// only after it was finished.
TEST(AsyncServerTest, ShutdownWaitsForCallsFinishedLater) {
  absl::Notification taken;
  std::atomic<BeginRpc*> held{nullptr};
  Harness h([&](const std::vector<BeginRpc*>& calls) {
    for (BeginRpc* call : calls) held = call;
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

// Records where and how often it was finished.
class Posted final : public PostedFinish {
 public:
  void FinishHere() override {
    thread = std::this_thread::get_id();
    on_current = mailbox != nullptr && mailbox->IsCurrent();
    ++finished;
    if (block != nullptr) block->WaitForNotification();
  }
  const FinishMailbox* mailbox = nullptr;
  std::thread::id thread;
  bool on_current = false;  // the mailbox knew this thread as its poller
  std::atomic<int> finished{0};
  absl::Notification* block = nullptr;
};

// Whether `call` was finished within 10 s.
bool FinishedSoon(const Posted& call) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (call.finished.load() == 0) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Posts from several threads are finished once each, on the thread that
// polls the queue. The first post sets the alarm; while its call is being
// finished (blocked here), 99 more are posted: they wake the queue's
// thread once, together.
TEST(FinishMailboxTest, FinishesOnTheQueueThreadOnceEachWithOneWakeUpPerBurst) {
  grpc::ServerBuilder builder;
  std::unique_ptr<grpc::ServerCompletionQueue> cq =
      builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto mailbox = std::make_unique<FinishMailbox>(cq.get());
  std::atomic<int> wake_ups{0};
  std::thread::id poller_id;
  std::thread poller([&] {
    poller_id = std::this_thread::get_id();
    FinishMailbox::SetCurrent(mailbox.get());
    void* tag;
    bool ok;
    while (cq->Next(&tag, &ok)) {
      ++wake_ups;
      static_cast<AsyncTag*>(tag)->Proceed(ok);
    }
  });
  absl::Notification release;
  std::vector<Posted> calls(100);
  for (Posted& call : calls) call.mailbox = mailbox.get();
  calls[0].block = &release;
  mailbox->Post(&calls[0]);
  const bool first_finished = FinishedSoon(calls[0]);
  std::vector<std::thread> posters;
  posters.reserve(3);
  for (int t = 0; t < 3; ++t) {
    posters.emplace_back([&, t] {
      for (size_t i = 1 + t; i < calls.size(); i += 3) {
        mailbox->Post(&calls[i]);
      }
    });
  }
  for (std::thread& t : posters) t.join();
  release.Notify();
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_TRUE(FinishedSoon(calls[i])) << "call " << i;
  }
  server->Shutdown();
  cq->Shutdown();
  poller.join();
  for (Posted& call : calls) {
    EXPECT_EQ(call.finished.load(), 1);
    EXPECT_EQ(call.thread, poller_id);
    EXPECT_TRUE(call.on_current);
  }
  EXPECT_FALSE(mailbox->IsCurrent());
  EXPECT_TRUE(first_finished);
  EXPECT_EQ(wake_ups.load(), 2);
}

// While the queue's thread waits for events, the first call finished
// elsewhere is sent by its finisher: of many finishers racing, exactly one
// gets the turn; the others, and every finisher while the thread works,
// post to the mailbox.
TEST(FinishMailboxTest, OneAnswerPerWaitIsSentByItsFinisher) {
  FinishMailbox mailbox(nullptr);    // posts nothing: no queue needed
  EXPECT_FALSE(mailbox.TakeTurn());  // its thread has not started waiting
  for (int wait = 0; wait < 50; ++wait) {
    mailbox.SetWaiting(true);
    std::atomic<int> turns{0};
    std::vector<std::thread> finishers;
    finishers.reserve(4);
    for (int t = 0; t < 4; ++t) {
      finishers.emplace_back([&] {
        for (int i = 0; i < 100; ++i) {
          if (mailbox.TakeTurn()) ++turns;
        }
      });
    }
    for (std::thread& t : finishers) t.join();
    EXPECT_EQ(turns.load(), 1) << "wait " << wait;
    mailbox.SetWaiting(false);
    EXPECT_FALSE(mailbox.TakeTurn());
  }
}

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using WatchStream = AsyncStream<HealthCheckRequest, HealthCheckResponse>;
using CheckRpc = AsyncCall<HealthCheckRequest, HealthCheckResponse>;

// A server with AsyncServer serving Health's Watch, a stream, with `handle`
// (counted against `max_in_flight`), and Check, not counted, answering
// SERVING.
class StreamHarness {
 public:
  explicit StreamHarness(
      AsyncServer::StreamHandleFn<HealthCheckRequest, HealthCheckResponse>
          handle,
      int64_t max_in_flight = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    rpcs_ = std::make_unique<AsyncServer>(&builder, 2, max_in_flight);
    rpcs_->AddStream(&service_, &Health::AsyncService::RequestWatch,
                     std::move(handle));
    AsyncMethodOptions check;
    check.bounded = false;
    rpcs_->Add(
        &service_, &Health::AsyncService::RequestCheck,
        [](const std::vector<CheckRpc*>& calls) {
          for (CheckRpc* call : calls) {
            call->response()->set_status(HealthCheckResponse::SERVING);
            call->Finish(grpc::Status::OK);
          }
        },
        check);
    server_ = builder.BuildAndStart();
    rpcs_->Start();
    stub_ = Health::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }
  ~StreamHarness() { Stop(std::chrono::seconds(5)); }

  // Server::Shutdown with `deadline`, then AsyncServer::Stop.
  void Stop(std::chrono::milliseconds deadline) {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() + deadline);
    server_->Wait();
    rpcs_->Stop();
    server_.reset();
  }

  AsyncServer& rpcs() { return *rpcs_; }

  // A Watch call with a deadline 10 s away.
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> Watch(
      grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(10));
    return stub_->Watch(ctx, HealthCheckRequest());
  }

  grpc::Status Check() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    HealthCheckResponse resp;
    return stub_->Check(&ctx, HealthCheckRequest(), &resp);
  }

 private:
  Health::AsyncService service_;
  int port_ = 0;
  std::unique_ptr<AsyncServer> rpcs_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

// Whether `in_flight` is back to 0 within 10 s.
bool DrainsSoon(const AsyncServer& rpcs) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (rpcs.in_flight()->load() > 0) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Waits for the handler to have stored a stream.
WatchStream* Taken(const std::atomic<WatchStream*>& stream) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (stream.load() == nullptr && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return stream.load();
}

// Sends one SERVING, then holds the stream open until its caller cancels.
void ServeOnceFinishOnCancel(WatchStream* s) {
  s->SetSource([sent = false](HealthCheckResponse* next) mutable {
    if (sent) return false;
    sent = true;
    next->set_status(HealthCheckResponse::SERVING);
    return true;
  });
  s->OnCancel([s] { s->Finish(grpc::Status::CANCELLED); });
  s->Wake();
}

// A stream woken from another thread writes what its source gives, in
// order, one message per ask, on the stream's own thread; Finish sends what
// the source still has, then ends the stream, which is freed.
TEST(AsyncStreamTest, WritesWhatItsSourceGivesThenFinishes) {
  std::mutex mu;
  std::deque<HealthCheckResponse::ServingStatus> queue;  // guarded by mu
  std::atomic<bool> on_test_thread{false};
  const std::thread::id test_thread = std::this_thread::get_id();
  std::atomic<WatchStream*> stream{nullptr};
  StreamHarness h([&](WatchStream* s) {
    s->SetSource([&](HealthCheckResponse* next) {
      if (std::this_thread::get_id() == test_thread) on_test_thread = true;
      std::lock_guard<std::mutex> lock(mu);
      if (queue.empty()) return false;
      next->set_status(queue.front());
      queue.pop_front();
      return true;
    });
    stream = s;
  });
  grpc::ClientContext ctx;
  auto reader = h.Watch(&ctx);
  ASSERT_NE(Taken(stream), nullptr);
  EXPECT_EQ(h.rpcs().in_flight()->load(), 1);
  auto push =
      [&](const std::vector<HealthCheckResponse::ServingStatus>& statuses) {
        std::lock_guard<std::mutex> lock(mu);
        queue.insert(queue.end(), statuses.begin(), statuses.end());
      };
  HealthCheckResponse resp;
  push({HealthCheckResponse::SERVING});
  stream.load()->Wake();
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  push(
      {HealthCheckResponse::NOT_SERVING, HealthCheckResponse::SERVICE_UNKNOWN});
  stream.load()->Wake();
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  push({HealthCheckResponse::SERVING});
  stream.load()->Finish(grpc::Status(grpc::StatusCode::ABORTED, "end"));
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  EXPECT_FALSE(reader->Read(&resp));
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(status.error_message(), "end");
  EXPECT_TRUE(DrainsSoon(h.rpcs()));
  EXPECT_FALSE(on_test_thread.load());
}

// A stream whose caller cancels reaches OnCancel at once, with nothing
// written meanwhile; finished from there, it is freed.
TEST(AsyncStreamTest, ACallerThatHangsUpReachesOnCancel) {
  absl::Notification cancelled;
  StreamHarness h([&](WatchStream* s) {
    s->SetSource([sent = false](HealthCheckResponse* next) mutable {
      if (sent) return false;
      sent = true;
      next->set_status(HealthCheckResponse::SERVING);
      return true;
    });
    s->OnCancel([s, &cancelled] {
      s->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
      cancelled.Notify();
    });
    s->Wake();
  });
  grpc::ClientContext ctx;
  auto reader = h.Watch(&ctx);
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  const absl::Time start = absl::Now();
  ctx.TryCancel();
  EXPECT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(reader->Read(&resp));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(DrainsSoon(h.rpcs()));
}

// An open stream counts against max_in_flight: the next is refused, naming
// the flag. Check, an unbounded method, still answers.
TEST(AsyncStreamTest, StreamsPastTheBoundAreRefusedUnboundedCallsAreNot) {
  StreamHarness h(ServeOnceFinishOnCancel, /*max_in_flight=*/1);
  grpc::ClientContext held_ctx;
  auto held = h.Watch(&held_ctx);
  HealthCheckResponse resp;
  ASSERT_TRUE(held->Read(&resp));
  grpc::ClientContext refused_ctx;
  auto refused = h.Watch(&refused_ctx);
  EXPECT_FALSE(refused->Read(&resp));
  grpc::Status status = refused->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("--max-calls-in-flight"),
            std::string::npos);
  EXPECT_TRUE(h.Check().ok());
  EXPECT_EQ(h.rpcs().in_flight()->load(), 1);
  held_ctx.TryCancel();
  EXPECT_FALSE(held->Read(&resp));
  held->Finish();
  EXPECT_TRUE(DrainsSoon(h.rpcs()));
}

// Server::Shutdown's deadline ends a stream its handler never finishes on
// its own, and Stop then returns: no wait for the client.
TEST(AsyncStreamTest, ShutdownDeadlineEndsOpenStreams) {
  StreamHarness h(ServeOnceFinishOnCancel);
  grpc::ClientContext ctx;
  auto reader = h.Watch(&ctx);
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  const absl::Time start = absl::Now();
  h.Stop(std::chrono::milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_FALSE(reader->Read(&resp));
  EXPECT_FALSE(reader->Finish().ok());
}

}  // namespace
}  // namespace idem
