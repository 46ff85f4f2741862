// HealthService on AsyncServer over loopback gRPC: Check and Watch follow
// SetServingStatus; Watch sends only changes; Shutdown() ends open Watch
// calls, and a client that cancels its Watch frees its slot at once, so
// grpc::Server::Shutdown returns at once instead of waiting for its
// deadline. 1,100 open Watch streams take no thread each and do not slow
// Check; past --max-health-watches a Watch is refused, and Check answers
// while business calls fill --max-calls-in-flight.
#include "server/rpc/health_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "server/rpc/async_server.h"

namespace idem {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ServingStatus = HealthCheckResponse::ServingStatus;
namespace pb = ::idempotency::v1;
using BeginRpc = AsyncCall<pb::BeginRequest, pb::BeginResponse>;

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

  // Whether the stream sent a status before it ended (a refused one ends
  // without), or false if neither happens within `timeout`.
  bool Opened(absl::Duration timeout = kWait) {
    SteadyMutexLock lock(&mu_);
    cv_.WaitFor(&lock, timeout, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !received_.empty() || status_.has_value();
    });
    return !received_.empty();
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

// Threads of this process, client and server alike.
int ThreadCount() {
  const std::filesystem::directory_iterator tasks("/proc/self/task");
  return static_cast<int>(
      std::distance(begin(tasks), std::filesystem::directory_iterator()));
}

class HealthServiceTest : public ::testing::Test {
 protected:
  // `max_watches` as HealthService takes it; `max_in_flight` as AsyncServer
  // does, which also serves Begin calls that stay parked until Release().
  explicit HealthServiceTest(int max_watches = 64, int64_t max_in_flight = 0)
      : service_(max_watches), max_in_flight_(max_in_flight) {}

  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    builder.RegisterService(&business_);
    rpcs_ = std::make_unique<AsyncServer>(&builder, 2, max_in_flight_);
    rpcs_->Add(&business_, &pb::Idempotency::AsyncService::RequestBegin,
               [this](const std::vector<BeginRpc*>& calls) {
                 SteadyMutexLock lock(&parked_mu_);
                 parked_.insert(parked_.end(), calls.begin(), calls.end());
               });
    service_.ServeOn(rpcs_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
    rpcs_->Start();
    stub_ = NewStub();
  }

  // The Watch calls of a test have all been cancelled by now: none may hold
  // the server's shutdown.
  void TearDown() override {
    if (server_ == nullptr) return;
    Release();
    EXPECT_LT(ShutdownServer(absl::Seconds(2)), absl::Seconds(2))
        << "a Watch outlived its cancelled call";
    rpcs_->Stop();
  }

  // A stub on a connection of its own.
  std::unique_ptr<Health::Stub> NewStub() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return Health::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_),
                                  grpc::InsecureChannelCredentials(), args));
  }

  // Begin calls parked so far.
  size_t Parked() {
    SteadyMutexLock lock(&parked_mu_);
    return parked_.size();
  }

  // Answers the parked Begin calls.
  void Release() {
    SteadyMutexLock lock(&parked_mu_);
    for (BeginRpc* call : parked_) call->Finish(grpc::Status::OK);
    parked_.clear();
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
  // long it took. If it has not returned after `limit` (a Watch still
  // open), ends every Watch with service_.Shutdown(), so that a Watch deaf
  // to cancellation fails the test instead of hanging it.
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
  pb::Idempotency::AsyncService business_;
  const int64_t max_in_flight_;
  int port_ = 0;
  std::unique_ptr<AsyncServer> rpcs_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
  SteadyMutex parked_mu_;
  std::vector<BeginRpc*> parked_ ABSL_GUARDED_BY(parked_mu_);
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
  EXPECT_LT(ShutdownServer(absl::Seconds(2)), absl::Seconds(1));
}

// Without HealthService::Shutdown, grpc::Server::Shutdown's deadline ends
// the open Watch streams, and AsyncServer::Stop then returns at once.
TEST_F(HealthServiceTest, ServerShutdownDeadlineEndsOpenWatches) {
  Watcher watch(stub_.get(), "");
  ASSERT_EQ(watch.Next(), HealthCheckResponse::SERVING);
  const SteadyTime start = SteadyClock::now();
  server_->Shutdown(DeadlineIn(absl::Milliseconds(200)));
  rpcs_->Stop();
  EXPECT_LT(SteadySince(start), absl::Seconds(2));
  std::optional<grpc::Status> end = watch.End();
  ASSERT_TRUE(end.has_value());
  EXPECT_FALSE(end->ok());
}

class FewWatchesTest : public HealthServiceTest {
 protected:
  FewWatchesTest() : HealthServiceTest(/*max_watches=*/2) {}
};

// Past --max-health-watches a Watch is refused, naming the flag; Check still
// answers, and a Watch that ends frees its slot.
TEST_F(FewWatchesTest, WatchPastTheBoundIsRefusedWhileCheckAnswers) {
  Watcher first(stub_.get(), "");
  Watcher second(stub_.get(), "");
  ASSERT_EQ(first.Next(), HealthCheckResponse::SERVING);
  ASSERT_EQ(second.Next(), HealthCheckResponse::SERVING);
  Watcher third(stub_.get(), "");
  EXPECT_FALSE(third.Opened());
  std::optional<grpc::Status> end = third.End();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(end->error_message().find("--max-health-watches=2"),
            std::string::npos)
      << end->error_message();
  EXPECT_EQ(Check(""), "SERVING");
  // The open ones still get changes.
  service_.SetServingStatus("", false);
  EXPECT_EQ(first.Next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(second.Next(), HealthCheckResponse::NOT_SERVING);
  first.Cancel();
  ASSERT_TRUE(first.End().has_value());
  Watcher fourth(stub_.get(), "");
  EXPECT_EQ(fourth.Next(), HealthCheckResponse::NOT_SERVING);
}

class OneWatchTest : public HealthServiceTest {
 protected:
  OneWatchTest() : HealthServiceTest(/*max_watches=*/1) {}
};

// A Watch whose client cancels frees its slot as soon as the cancellation
// arrives, not at the next poll: a new Watch gets in within 25 ms in at
// least half of 20 rounds (with a 100 ms poll, the odds of that are about
// one in a hundred).
TEST_F(OneWatchTest, CancelledWatchFreesItsSlotAtOnce) {
  // A Watch, once the slot is free; how many were refused before it.
  auto open = [this](int* refused) {
    const SteadyTime start = SteadyClock::now();
    while (true) {
      auto watch = std::make_unique<Watcher>(stub_.get(), "");
      if (watch->Opened() || SteadySince(start) > kWait) return watch;
      ++*refused;
    }
  };
  int refused = 0;
  std::unique_ptr<Watcher> held = open(&refused);
  std::vector<absl::Duration> freed;
  for (int round = 0; round < 20; ++round) {
    ASSERT_EQ(held->Next(), HealthCheckResponse::SERVING) << "round " << round;
    const SteadyTime start = SteadyClock::now();
    held->Cancel();
    held = open(&refused);
    freed.push_back(SteadySince(start));
  }
  EXPECT_EQ(held->Next(), HealthCheckResponse::SERVING);
  // The median, so that a stall of this busy machine does not count.
  std::sort(freed.begin(), freed.end());
  EXPECT_LT(freed[freed.size() / 2], absl::Milliseconds(25))
      << "slowest " << freed.back() << ", " << refused << " refused";
}

class SaturatedTest : public HealthServiceTest {
 protected:
  SaturatedTest() : HealthServiceTest(64, /*max_in_flight=*/1) {}
};

// With --max-calls-in-flight taken by a parked business call (a new one is
// refused), Check and Watch still answer: they are not counted against it.
TEST_F(SaturatedTest, CheckAndWatchAnswerWhileBusinessCallsSaturate) {
  auto business = pb::Idempotency::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  auto begin = [&business] {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(kWait));
    pb::BeginRequest request;
    pb::BeginResponse response;
    return business->Begin(&context, request, &response);
  };
  grpc::Status parked;
  std::thread client([&] { parked = begin(); });
  const SteadyTime start = SteadyClock::now();
  while (Parked() < 1 && SteadySince(start) < kWait) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(Parked(), 1u);
  grpc::Status refused = begin();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  EXPECT_EQ(Check(""), "SERVING");
  {
    Watcher watch(stub_.get(), "");
    EXPECT_EQ(watch.Next(), HealthCheckResponse::SERVING);
  }
  Release();
  client.join();
  EXPECT_TRUE(parked.ok()) << parked.error_message();
}

// Watch calls on "" read through one completion queue by the test's thread:
// no thread per stream on the client's side either.
class AsyncWatches {
 public:
  // Opens `count` of them, in turn on each of `stubs`.
  AsyncWatches(const std::vector<std::unique_ptr<Health::Stub>>& stubs,
               int count) {
    watches_.reserve(count);
    HealthCheckRequest request;
    for (int i = 0; i < count; ++i) {
      auto watch = std::make_unique<Watch>();
      watch->context.set_deadline(DeadlineIn(absl::Seconds(120)));
      watch->reader = stubs[i % stubs.size()]->PrepareAsyncWatch(
          &watch->context, request, &cq_);
      watch->reader->StartCall(&watch->started);
      watches_.push_back(std::move(watch));
    }
  }
  // Cancels what is still open and drains the queue.
  ~AsyncWatches() {
    for (auto& watch : watches_) watch->context.TryCancel();
    PumpUntil([this] { return Ended() == watches_.size(); }, absl::Seconds(30));
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) Proceed(tag, ok);
  }
  AsyncWatches(const AsyncWatches&) = delete;
  AsyncWatches& operator=(const AsyncWatches&) = delete;

  // Takes events until `done` holds; false if it did not within `timeout`.
  template <typename Done>
  bool PumpUntil(Done done, absl::Duration timeout) {
    const SteadyTime deadline =
        SteadyClock::now() + absl::ToChronoNanoseconds(timeout);
    while (!done()) {
      void* tag;
      bool ok;
      const auto next = cq_.AsyncNext(
          &tag, &ok,
          std::chrono::system_clock::now() + std::chrono::milliseconds(100));
      if (next == grpc::CompletionQueue::GOT_EVENT) Proceed(tag, ok);
      if (next == grpc::CompletionQueue::SHUTDOWN ||
          SteadyClock::now() > deadline) {
        return done();
      }
    }
    return true;
  }

  // Streams whose latest status is `status`.
  size_t With(ServingStatus status) const {
    return static_cast<size_t>(
        std::count_if(watches_.begin(), watches_.end(),
                      [status](const auto& w) { return w->last == status; }));
  }
  // Streams that ended, and of those, with OK.
  size_t Ended() const {
    return static_cast<size_t>(
        std::count_if(watches_.begin(), watches_.end(),
                      [](const auto& w) { return w->ended; }));
  }
  size_t EndedOk() const {
    return static_cast<size_t>(std::count_if(
        watches_.begin(), watches_.end(),
        [](const auto& w) { return w->ended && w->status.ok(); }));
  }
  // Messages received in all.
  size_t Received() const {
    size_t n = 0;
    for (const auto& w : watches_) n += w->received;
    return n;
  }

 private:
  struct Watch;
  // One kind of completion of one stream.
  struct Tag {
    Watch* watch;
    enum { kStarted, kRead, kFinished } kind;
  };
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncReader<HealthCheckResponse>> reader;
    HealthCheckResponse response;
    Tag started{this, Tag::kStarted};
    Tag read{this, Tag::kRead};
    Tag finished{this, Tag::kFinished};
    ServingStatus last = HealthCheckResponse::UNKNOWN;
    size_t received = 0;
    bool ended = false;
    grpc::Status status;
  };

  static void Proceed(void* raw, bool ok) {
    Tag* tag = static_cast<Tag*>(raw);
    Watch* w = tag->watch;
    switch (tag->kind) {
      case Tag::kRead:
        if (ok) {
          w->last = w->response.status();
          ++w->received;
        }
        [[fallthrough]];
      case Tag::kStarted:
        if (ok) {
          w->reader->Read(&w->response, &w->read);
        } else {
          w->reader->Finish(&w->status, &w->finished);
        }
        break;
      case Tag::kFinished:
        w->ended = true;
        break;
    }
  }

  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Watch>> watches_;
};

class ManyWatchesTest : public HealthServiceTest {
 protected:
  ManyWatchesTest() : HealthServiceTest(/*max_watches=*/1200) {}

  // The slowest of 20 Check calls.
  absl::Duration SlowestCheck() {
    absl::Duration slowest;
    for (int i = 0; i < 20; ++i) {
      const SteadyTime start = SteadyClock::now();
      const std::string status = Check("");
      EXPECT_TRUE(status == "SERVING" || status == "NOT_SERVING") << status;
      slowest = std::max(slowest, SteadySince(start));
    }
    return slowest;
  }
};

// 1,100 open Watch streams, over 11 connections: Check answers within
// 100 ms, the process keeps under 100 threads, a change reaches every
// stream, and Shutdown ends them all with OK after the final status.
TEST_F(ManyWatchesTest, CheckAnswersFastWith1100OpenWatches) {
  constexpr int kWatches = 1100;
  std::vector<std::unique_ptr<Health::Stub>> stubs(11);
  for (auto& stub : stubs) stub = NewStub();
  AsyncWatches watches(stubs, kWatches);
  ASSERT_TRUE(watches.PumpUntil(
      [&] { return watches.With(HealthCheckResponse::SERVING) == kWatches; },
      absl::Seconds(60)))
      << watches.With(HealthCheckResponse::SERVING) << " streams open";
  const int threads = ThreadCount();
  EXPECT_LT(threads, 100);
  const absl::Duration open = SlowestCheck();
  EXPECT_LT(open, absl::Milliseconds(100));

  // Check while 1,100 writes go out.
  service_.SetServingStatus("", false);
  const absl::Duration broadcast = SlowestCheck();
  EXPECT_LT(broadcast, absl::Milliseconds(100));
  EXPECT_TRUE(watches.PumpUntil(
      [&] {
        return watches.With(HealthCheckResponse::NOT_SERVING) == kWatches;
      },
      absl::Seconds(60)));
  EXPECT_LT(ThreadCount(), 100);
  std::cout << "1100 watches: " << threads << " threads; slowest Check "
            << absl::FormatDuration(open)
            << " (while notifying: " << absl::FormatDuration(broadcast)
            << ")\n";

  service_.SetServingStatus("", true);
  ASSERT_TRUE(watches.PumpUntil(
      [&] { return watches.With(HealthCheckResponse::SERVING) == kWatches; },
      absl::Seconds(60)));
  service_.Shutdown();
  EXPECT_TRUE(watches.PumpUntil([&] { return watches.Ended() == kWatches; },
                                absl::Seconds(60)));
  EXPECT_EQ(watches.EndedOk(), static_cast<size_t>(kWatches));
  EXPECT_EQ(watches.With(HealthCheckResponse::NOT_SERVING),
            static_cast<size_t>(kWatches));
  // SERVING, NOT_SERVING, SERVING, NOT_SERVING: nothing twice.
  EXPECT_EQ(watches.Received(), static_cast<size_t>(4 * kWatches));
}

}  // namespace
}  // namespace idem
