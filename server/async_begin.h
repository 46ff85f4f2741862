// Begin on gRPC's completion-queue API, served by threads of the sidecar's
// own. Those threads take a call as gRPC delivers it and answer it in place
// when the caches can: a replay from Redis costs one pipelined round trip
// shared by every call the thread had ready, and no hand-off to another
// thread and back (which the callback API needs for anything that waits,
// and which cost more than the lookup: docs/benchmarks.md). Calls the caches
// cannot answer go on to the store's threads and finish from there.
#ifndef IDEM_SERVER_ASYNC_BEGIN_H_
#define IDEM_SERVER_ASYNC_BEGIN_H_

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "server/proto_arena.h"

namespace idem {

namespace pb = ::idempotency::v1;

// The Idempotency service with Begin on the completion-queue API and the
// holder's calls and Get on the callback API.
using IdempotencyBase = pb::Idempotency::WithAsyncMethod_Begin<
    pb::Idempotency::WithCallbackMethod_Heartbeat<
        pb::Idempotency::WithCallbackMethod_Complete<
            pb::Idempotency::WithCallbackMethod_Fail<
                pb::Idempotency::WithCallbackMethod_Get<
                    pb::Idempotency::Service>>>>>;

// One Begin call: what gRPC fills in and how to answer it. Request and
// response share one arena with a first block of its own.
class AsyncBegin {
 public:
  AsyncBegin();
  ~AsyncBegin();
  AsyncBegin(const AsyncBegin&) = delete;
  AsyncBegin& operator=(const AsyncBegin&) = delete;

  grpc::ServerContext& context() { return ctx_; }
  const pb::BeginRequest& request() const { return *req_; }
  pb::BeginResponse* response() { return resp_; }
  // Answers with response() when `status` is OK, else with `status`. Once,
  // from any thread; the call must not be touched afterwards.
  void Finish(const grpc::Status& status);

 private:
  friend class AsyncBeginServer;
  static constexpr size_t kFirstBlock = 4096;

  // Before arena_, which allocates from it until the arena is gone.
  alignas(alignof(std::max_align_t)) char block_[kFirstBlock];
  google::protobuf::Arena arena_;
  grpc::ServerContext ctx_;
  pb::BeginRequest* const req_;
  pb::BeginResponse* const resp_;
  grpc::ServerAsyncResponseWriter<pb::BeginResponse> responder_{&ctx_};
  bool finishing_ = false;  // Finish was called: its completion comes next
};

// Serves `service`'s Begin on `threads` completion queues, a thread each.
// A thread takes every call its queue has ready (up to 64) and passes them
// to `handle` together, on that thread; `handle` finishes each one, there or
// later from any thread, and must not wait on anything but the caches.
class AsyncBeginServer {
 public:
  using HandleFn = std::function<void(const std::vector<AsyncBegin*>&)>;

  // Adds the queues to `builder`: before BuildAndStart. `service` must be
  // registered with it and outlive this.
  AsyncBeginServer(IdempotencyBase* service, grpc::ServerBuilder* builder,
                   int threads, HandleFn handle);
  // Stop().
  ~AsyncBeginServer();
  AsyncBeginServer(const AsyncBeginServer&) = delete;
  AsyncBeginServer& operator=(const AsyncBeginServer&) = delete;

  // Starts taking calls: after BuildAndStart returned a server.
  void Start();
  // After Server::Shutdown: waits until every call taken has finished, then
  // shuts the queues and joins the threads. Idempotent.
  void Stop();

 private:
  static constexpr size_t kMaxBatch = 64;
  // Calls requested ahead on each queue.
  static constexpr int kRequestsPerQueue = 64;

  void Run(grpc::ServerCompletionQueue* cq);
  void Request(grpc::ServerCompletionQueue* cq);
  // One event of `cq`: a new call joins `batch`; a finished one is freed.
  void Take(grpc::ServerCompletionQueue* cq, void* tag, bool ok,
            std::vector<AsyncBegin*>& batch);

  IdempotencyBase* const service_;
  const HandleFn handle_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  int64_t in_flight_ = 0;  // calls taken and not yet finished; guarded by mu_
  bool stopped_ = false;   // guarded by mu_
};

}  // namespace idem

#endif  // IDEM_SERVER_ASYNC_BEGIN_H_
