// Unary and server-streaming methods on gRPC's completion-queue API, served
// by threads of the sidecar's own. Each thread owns a completion queue: it
// takes calls as gRPC delivers them and hands every new call it had ready to
// the method's handler in one batch, on that thread. A handler answers in place
// when it can (an in-process cache hit; a replay from Redis, with one pipelined
// round trip for the whole batch) and otherwise passes the call on to the
// store's threads, which finish it from there: the answer itself goes back
// to the call's own thread (see AsyncCall::Finish). A stream (AsyncStream)
// is state on its thread too, not a thread of its own: its writes go out
// one at a time from that thread, and its end is noticed there as soon as
// the client hangs up.
//
// Why not the callback API: there gRPC's own event threads read requests
// and run handlers, so any answer that waits (Redis, PostgreSQL) costs a
// hand-off to another thread and back, which costs more on a small machine
// than the lookup itself (docs/benchmarks.md). The model only pays when no
// callback service is registered at all: gRPC's callback threads would
// otherwise poll and read most requests too. Hence the sidecar's own
// health service (health_service.h) in place of gRPC's default one.
#ifndef IDEM_SERVER_RPC_ASYNC_SERVER_H_
#define IDEM_SERVER_RPC_ASYNC_SERVER_H_

#include <google/protobuf/arena.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/steady_wait.h"
#include "server/rpc/rpc_metrics.h"
#include "server/wire/proto_arena.h"

namespace idem {

// What a completion-queue event is for; the server's thread that takes the
// event calls Proceed with its `ok`.
class AsyncTag {
 public:
  virtual void Proceed(bool ok) = 0;

 protected:
  ~AsyncTag() = default;
};

template <typename Req, typename Resp>
class AsyncMethod;
template <typename Req, typename Resp>
class AsyncStreamMethod;

// A call whose answer is ready but must be sent by its queue's thread.
class PostedFinish {
 public:
  virtual void FinishHere() = 0;

 protected:
  ~PostedFinish() = default;
};

// Calls finished on other threads, handed to one queue's thread: they
// queue here, and the first of them sets an alarm that expires at once, so
// the queue's thread wakes once for all that came meanwhile and sends their
// answers where it polls. Sending an answer from another thread cost more:
// both threads then work on the same connection (gRPC hands the loser's
// share to its executor thread) and each answer wakes the queue's thread
// for its completion (docs/design-notes.md).
class FinishMailbox final : public AsyncTag {
 public:
  explicit FinishMailbox(grpc::ServerCompletionQueue* cq) : cq_(cq) {}

  // Whether this thread is the one that polls the mailbox's queue.
  bool IsCurrent() const;
  // Marks this thread as the one that polls `mailbox`'s queue.
  static void SetCurrent(const FinishMailbox* mailbox);

  // The queue's thread: it is about to wait for events (true), or it woke
  // (false).
  void SetWaiting(bool waiting) {
    may_send_here_.store(waiting, std::memory_order_relaxed);
  }

  // From any thread that finished a call of this queue: whether it should
  // send the answer itself. Once per wait of the queue's thread, the first
  // answer finished while it waits is sent by its finisher: a lone call
  // answers without waking the queue's thread first. Answers finished while
  // it works, or after that first one, are posted, and go out together.
  bool TakeTurn() {
    return may_send_here_.load(std::memory_order_relaxed) &&
           may_send_here_.exchange(false, std::memory_order_relaxed);
  }

  // From any thread.
  void Post(PostedFinish* call) {
    bool arm;
    {
      SteadyMutexLock lock(&mu_);
      posted_.push_back(call);
      arm = !armed_;
      armed_ = true;
    }
    // Only after the queue's thread took the last alarm (armed_ false) is
    // it set again.
    if (arm) alarm_.Set(cq_, gpr_time_0(GPR_CLOCK_MONOTONIC), this);
  }

 private:
  void Proceed(bool /*ok*/) override {
    std::vector<PostedFinish*> calls;
    {
      SteadyMutexLock lock(&mu_);
      calls.swap(posted_);
      armed_ = false;
    }
    for (PostedFinish* call : calls) call->FinishHere();
  }

  grpc::ServerCompletionQueue* const cq_;
  std::atomic<bool> may_send_here_{false};
  grpc::Alarm alarm_;
  SteadyMutex mu_;
  std::vector<PostedFinish*> posted_ ABSL_GUARDED_BY(mu_);
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
};

// One unary call: what gRPC fills in and how to answer it. Request and
// response share one arena with a first block of its own.
template <typename Req, typename Resp>
class AsyncCall final : public AsyncTag, private PostedFinish {
 public:
  AsyncCall(const AsyncCall&) = delete;
  AsyncCall& operator=(const AsyncCall&) = delete;

  grpc::ServerContext& context() { return ctx_; }
  const Req& request() const { return *req_; }
  Resp* response() { return resp_; }
  // Runs `fn` on this call's thread if the caller hangs up (cancels, or its
  // deadline passes) before the answer went out: at once if it already did.
  // Only for methods served with `notify_when_done`; on the call's thread,
  // before it is finished.
  void OnCancel(std::function<void()> fn) {
    if (done_) {
      if (ctx_.IsCancelled()) fn();
      return;
    }
    on_cancel_ = std::move(fn);
  }
  // Answers with response() when `status` is OK, else with `status`. Once,
  // from any thread; the call must not be touched afterwards. From another
  // thread than the call's queue's, the answer is sent by that queue's
  // thread (FinishMailbox), unless that thread waits for events and this
  // is the first answer since (FinishMailbox::TakeTurn): then from here.
  void Finish(const grpc::Status& status) {
    finishing_.store(true, std::memory_order_relaxed);
    FinishMailbox* mailbox = method_->Mailbox(queue_);
    if (mailbox->IsCurrent() || mailbox->TakeTurn()) {
      responder_.Finish(*resp_, status, this);
      return;
    }
    status_ = status;
    mailbox->Post(this);
  }

 private:
  friend class AsyncMethod<Req, Resp>;
  static constexpr size_t kFirstBlock = 4096;

  AsyncCall(AsyncMethod<Req, Resp>* method, int queue, bool notify_when_done)
      : method_(method),
        queue_(queue),
        arena_(FirstBlock(block_)),
        req_(google::protobuf::Arena::CreateMessage<Req>(
            kProtoArenas ? &arena_ : nullptr)),
        resp_(google::protobuf::Arena::CreateMessage<Resp>(
            kProtoArenas ? &arena_ : nullptr)),
        // Before the call starts, as gRPC requires. The tag comes back
        // only for a call that started (then always: after the answer went
        // out, or when the caller left).
        events_(notify_when_done ? 2 : 1) {
    if (notify_when_done) ctx_.AsyncNotifyWhenDone(&done_tag_);
  }
  ~AsyncCall() {
    if (!kProtoArenas) {
      delete req_;
      delete resp_;
    }
  }

  static google::protobuf::ArenaOptions FirstBlock(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kFirstBlock;
    return options;
  }

  // The completion of AsyncNotifyWhenDone.
  class DoneTag final : public AsyncTag {
   public:
    explicit DoneTag(AsyncCall* call) : call_(call) {}
    void Proceed(bool /*ok*/) override { call_->OnDone(); }

   private:
    AsyncCall* const call_;
  };

  void Proceed(bool ok) override { method_->Proceed(this, ok); }
  void FinishHere() override { responder_.Finish(*resp_, status_, this); }
  void OnDone() {
    done_ = true;
    if (on_cancel_ && ctx_.IsCancelled()) {
      std::function<void()> fn = std::move(on_cancel_);
      fn();
    }
    method_->Release(this);
  }

  AsyncMethod<Req, Resp>* const method_;
  const int queue_;
  // Before arena_, which allocates from it until the arena is gone.
  alignas(alignof(std::max_align_t)) char block_[kFirstBlock];
  google::protobuf::Arena arena_;
  grpc::ServerContext ctx_;
  Req* const req_;
  Resp* const resp_;
  grpc::ServerAsyncResponseWriter<Resp> responder_{&ctx_};
  // Finish was called: its completion comes next. Set on any thread.
  std::atomic<bool> finishing_{false};
  grpc::Status status_;  // a posted Finish's
  // The rest only on the call's thread.
  DoneTag done_tag_{this};
  int events_;         // completions still to come once started
  bool done_ = false;  // the AsyncNotifyWhenDone tag came
  std::function<void()> on_cancel_;
};

// One server-streaming call. Its messages come from a source that the
// handler sets: the stream's thread asks it for the next one whenever no
// write is outstanding and it was woken, so that changes made meanwhile are
// coalesced into one message (gRPC allows one write at a time per stream).
// Wake and Finish may come from any thread; the stream's thread does the
// writing (FinishMailbox).
template <typename Req, typename Resp>
class AsyncStream final : public AsyncTag, private PostedFinish {
 public:
  // Fills in the next message and returns true, or returns false when there
  // is none to send now. On the stream's thread.
  using Source = std::function<bool(Resp*)>;

  AsyncStream(const AsyncStream&) = delete;
  AsyncStream& operator=(const AsyncStream&) = delete;

  grpc::ServerContext& context() { return ctx_; }
  const Req& request() const { return req_; }

  // From the handler, on the stream's thread, before Wake or Finish.
  void SetSource(Source source) { source_ = std::move(source); }
  // Runs `fn` on the stream's thread as soon as the client hangs up (it
  // cancels, its deadline passes, or the server's shutdown ends the call)
  // before Finish was called; Finish must still be called, from `fn` or
  // later. From the handler, on the stream's thread.
  void OnCancel(std::function<void()> fn) { on_cancel_ = std::move(fn); }

  // The source may have a message. From any thread, before Finish.
  void Wake() { Post(nullptr); }
  // Ends the stream with `status` once the source has nothing more to send
  // (or the client is gone). Once, from any thread; the stream must not be
  // touched afterwards.
  void Finish(const grpc::Status& status) { Post(&status); }

 private:
  friend class AsyncStreamMethod<Req, Resp>;

  AsyncStream(AsyncStreamMethod<Req, Resp>* method, int queue)
      : method_(method), queue_(queue) {
    // Before the call starts, as gRPC requires; its tag comes back only for
    // a call that started.
    ctx_.AsyncNotifyWhenDone(&done_tag_);
  }
  ~AsyncStream() = default;

  // The completion of the outstanding Write or Finish.
  class OpTag final : public AsyncTag {
   public:
    explicit OpTag(AsyncStream* stream) : stream_(stream) {}
    void Proceed(bool ok) override { stream_->OpDone(ok); }

   private:
    AsyncStream* const stream_;
  };
  // The completion of AsyncNotifyWhenDone.
  class DoneTag final : public AsyncTag {
   public:
    explicit DoneTag(AsyncStream* stream) : stream_(stream) {}
    void Proceed(bool /*ok*/) override { stream_->Done(); }

   private:
    AsyncStream* const stream_;
  };

  // The call started (or, if not `ok`, never will).
  void Proceed(bool ok) override { method_->Started(this, ok); }

  // Always through the mailbox, also on the stream's own thread: a source
  // may take a lock that Wake's caller holds.
  void Post(const grpc::Status* status) {
    FinishMailbox* mailbox = method_->Mailbox(queue_);
    {
      SteadyMutexLock lock(&mu_);
      if (status != nullptr) {
        status_ = *status;
        finish_requested_ = true;
      }
      if (posted_) return;
      posted_ = true;
    }
    // posted_ keeps the stream alive until FinishHere.
    mailbox->Post(this);
  }

  void FinishHere() override {
    {
      SteadyMutexLock lock(&mu_);
      posted_ = false;
    }
    Pump();
  }

  // Starts the next write, or the Finish once there is nothing to write;
  // frees the stream when it is over.
  void Pump() {
    if (!writing_ && !finish_issued_) {
      // Once the call is over (done_ before finished_: the client hung
      // up), nothing more can be written.
      if (!broken_ && !done_ && source_ && source_(&out_)) {
        writing_ = true;
        writer_.Write(out_, &op_tag_);
        return;
      }
      grpc::Status status;
      {
        SteadyMutexLock lock(&mu_);
        finish_issued_ = finish_requested_;
        if (finish_issued_) status = status_;
      }
      if (finish_issued_) {
        writer_.Finish(status, &op_tag_);
        return;
      }
    }
    MaybeRelease();
  }

  void OpDone(bool ok) {
    if (finish_issued_) {
      finished_ = true;
      MaybeRelease();
      return;
    }
    writing_ = false;
    // The client is gone: nothing more can be written.
    if (!ok) broken_ = true;
    Pump();
  }

  void Done() {
    bool finish_requested;
    {
      SteadyMutexLock lock(&mu_);
      finish_requested = finish_requested_;
    }
    // The call ended before the handler finished it: the client hung up.
    if (on_cancel_ && !finish_requested) {
      std::function<void()> fn = std::move(on_cancel_);
      fn();
    }
    done_ = true;
    MaybeRelease();
  }

  void MaybeRelease() {
    if (!done_ || !finished_) return;
    {
      SteadyMutexLock lock(&mu_);
      if (posted_) return;  // FinishHere comes, and releases it then
    }
    method_->Release(this);
  }

  AsyncStreamMethod<Req, Resp>* const method_;
  const int queue_;
  grpc::ServerContext ctx_;
  Req req_;
  grpc::ServerAsyncWriter<Resp> writer_{&ctx_};
  SteadyMutex mu_;
  // In the mailbox; the stream is not freed before it is taken out.
  bool posted_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  // The rest only on the stream's thread.
  OpTag op_tag_{this};
  DoneTag done_tag_{this};
  Source source_;
  std::function<void()> on_cancel_;
  Resp out_;  // the message being written
  bool writing_ = false;
  bool broken_ = false;         // a write failed
  bool finish_issued_ = false;  // Finish went to gRPC
  bool finished_ = false;       // ... and completed
  bool done_ = false;           // the AsyncNotifyWhenDone tag came
};

// A method as AsyncServer's threads see it.
class AsyncMethodBase {
 public:
  virtual ~AsyncMethodBase() = default;
  // Asks gRPC for the method's next calls on `cq`, the queue of thread
  // `queue`.
  virtual void Start(int queue, grpc::ServerCompletionQueue* cq) = 0;
  // Hands the calls thread `queue` took since the last Flush to the handler.
  virtual void Flush(int queue) = 0;
};

// The default number of threads: one per two cores, at least one. On a
// 2-core machine one thread served 1.2-1.5 times as many replays as two, at
// less CPU per call: every thread polls the same sockets, and a call read by
// one thread for another's queue costs a wake-up (docs/design-notes.md).
int DefaultAsyncThreads();

// How AsyncServer serves a method.
struct AsyncMethodOptions {
  // Calls requested in advance on each queue.
  int ahead = 32;
  // Its calls learn when their caller hangs up (AsyncCall::OnCancel), at
  // the cost of one more completion per call. Streams always do.
  bool notify_when_done = false;
  // Its calls count against the server's max_in_flight. Health's and the
  // admin service's do not: Check and operators' calls must answer while
  // business calls saturate the instance.
  bool bounded = true;
};

// Serves unary and server-streaming methods of async services (registered
// with the builder by the caller) on `threads` completion queues, a thread
// each.
class AsyncServer {
  // Keeps a parameter out of template argument deduction.
  template <typename T>
  struct Identity {
    using type = T;
  };

 public:
  // Adds the queues to `builder`: before BuildAndStart. Past
  // `max_in_flight` calls of bounded methods taken and not yet answered (0:
  // no bound), a new one is answered RESOURCE_EXHAUSTED at once. `metrics` may
  // be null.
  AsyncServer(grpc::ServerBuilder* builder, int threads,
              int64_t max_in_flight = 0, RpcMetrics* metrics = nullptr);
  // Stop().
  ~AsyncServer();
  AsyncServer(const AsyncServer&) = delete;
  AsyncServer& operator=(const AsyncServer&) = delete;

  // How a method asks gRPC for its next call: one of the generated
  // service's Request<Method>, with `cq` as both queues.
  template <typename Req, typename Resp>
  using RequestFn = std::function<void(
      grpc::ServerContext*, Req*, grpc::ServerAsyncResponseWriter<Resp>*,
      grpc::ServerCompletionQueue* cq, void* tag)>;
  // Gets the new calls one thread had ready, on that thread; finishes each
  // one, there or later from any thread. Must not wait on anything slower
  // than a cache.
  template <typename Req, typename Resp>
  using HandleFn =
      std::function<void(const std::vector<AsyncCall<Req, Resp>*>&)>;

  // Serves a method; before Start.
  template <typename Req, typename Resp>
  void Add(RequestFn<Req, Resp> request, HandleFn<Req, Resp> handle,
           AsyncMethodOptions options = {}) {
    methods_.push_back(std::make_unique<AsyncMethod<Req, Resp>>(
        this, std::move(request), std::move(handle), options,
        static_cast<int>(queues_.size())));
  }

  // The same for `service`'s method whose Request<Method> is `request`
  // (e.g. &pb::Idempotency::AsyncService::RequestBegin).
  template <typename Service, typename Base, typename Req, typename Resp>
  void Add(Service* service,
           void (Base::*request)(grpc::ServerContext*, Req*,
                                 grpc::ServerAsyncResponseWriter<Resp>*,
                                 grpc::CompletionQueue*,
                                 grpc::ServerCompletionQueue*, void*),
           typename Identity<HandleFn<Req, Resp>>::type handle,
           AsyncMethodOptions options = {}) {
    Add<Req, Resp>(
        [service, request](grpc::ServerContext* ctx, Req* req,
                           grpc::ServerAsyncResponseWriter<Resp>* writer,
                           grpc::ServerCompletionQueue* cq, void* tag) {
          (service->*request)(ctx, req, writer, cq, cq, tag);
        },
        std::move(handle), options);
  }

  // Gets a new stream, on its thread; must call its Finish in the end.
  template <typename Req, typename Resp>
  using StreamHandleFn = std::function<void(AsyncStream<Req, Resp>*)>;

  // Serves the server-streaming method of `service` whose Request<Method>
  // is `request` (e.g. &grpc::health::v1::Health::AsyncService::RequestWatch);
  // before Start.
  template <typename Service, typename Base, typename Req, typename Resp>
  void AddStream(Service* service,
                 void (Base::*request)(grpc::ServerContext*, Req*,
                                       grpc::ServerAsyncWriter<Resp>*,
                                       grpc::CompletionQueue*,
                                       grpc::ServerCompletionQueue*, void*),
                 typename Identity<StreamHandleFn<Req, Resp>>::type handle,
                 AsyncMethodOptions options = {}) {
    methods_.push_back(std::make_unique<AsyncStreamMethod<Req, Resp>>(
        this,
        [service, request](grpc::ServerContext* ctx, Req* req,
                           grpc::ServerAsyncWriter<Resp>* writer,
                           grpc::ServerCompletionQueue* cq, void* tag) {
          (service->*request)(ctx, req, writer, cq, cq, tag);
        },
        std::move(handle), options, static_cast<int>(queues_.size())));
  }

  // A handler that gives `object`'s `handle` one call at a time.
  template <typename T, typename Req, typename Resp>
  static HandleFn<Req, Resp> Each(T* object,
                                  void (T::*handle)(AsyncCall<Req, Resp>*)) {
    return [object, handle](const std::vector<AsyncCall<Req, Resp>*>& calls) {
      for (AsyncCall<Req, Resp>* call : calls) (object->*handle)(call);
    };
  }

  // Calls of bounded methods taken and not yet answered; the counter
  // outlives the server (a metrics scrape may read it late).
  std::shared_ptr<const std::atomic<int64_t>> in_flight() const {
    return in_flight_;
  }

  // Starts taking calls: after BuildAndStart returned a server.
  void Start();
  // After Server::Shutdown: waits until every call taken has finished (open
  // streams end when Server::Shutdown's deadline cancels them, if not
  // before), then shuts the queues down and joins the threads. Idempotent.
  void Stop();

 private:
  template <typename Req, typename Resp>
  friend class AsyncMethod;
  template <typename Req, typename Resp>
  friend class AsyncStreamMethod;
  // Events one thread takes before handing the new calls over.
  static constexpr int kMaxBatch = 64;

  void Run(int queue);
  // A call was taken: OK if it may be served (under max_in_flight_ if
  // `bounded`), else the refusal to finish it with.
  grpc::Status Admit(bool bounded);
  // A call taken earlier, as Admit was told, is gone.
  void Released(bool bounded);

  const int64_t max_in_flight_;
  RpcMetrics* const metrics_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::unique_ptr<FinishMailbox>> mailboxes_;  // one per queue
  std::vector<std::unique_ptr<AsyncMethodBase>> methods_;
  std::vector<std::thread> threads_;
  // Calls taken, not yet finished.
  const std::shared_ptr<std::atomic<int64_t>> in_flight_ =
      std::make_shared<std::atomic<int64_t>>(0);
  // Calls of unbounded methods taken, not yet finished.
  std::atomic<int64_t> unbounded_{0};
  std::atomic<bool> stopped_{false};
};

// One method's requests and the calls each thread has taken but not yet
// handed over.
template <typename Req, typename Resp>
class AsyncMethod final : public AsyncMethodBase {
 public:
  using Call = AsyncCall<Req, Resp>;

  AsyncMethod(AsyncServer* server, AsyncServer::RequestFn<Req, Resp> request,
              AsyncServer::HandleFn<Req, Resp> handle,
              AsyncMethodOptions options, int queues)
      : server_(server),
        request_(std::move(request)),
        handle_(std::move(handle)),
        ahead_(options.ahead < 1 ? 1 : options.ahead),
        notify_when_done_(options.notify_when_done),
        bounded_(options.bounded),
        taken_(queues),
        cqs_(queues) {}

  void Start(int queue, grpc::ServerCompletionQueue* cq) override {
    cqs_[queue] = cq;
    for (int i = 0; i < ahead_; ++i) Request(queue);
  }

  void Flush(int queue) override {
    std::vector<Call*>& taken = taken_[queue];
    if (taken.empty()) return;
    handle_(taken);
    taken.clear();
  }

  void Proceed(Call* call, bool ok) {
    if (call->finishing_.load(std::memory_order_relaxed)) {
      // Its answer went out (or the call was cancelled).
      Release(call);
      return;
    }
    if (!ok) {
      // A request that the server's shutdown ended without a call: no
      // other completion of it comes.
      delete call;
      return;
    }
    // The next caller's call, requested before this one is answered.
    Request(call->queue_);
    if (grpc::Status refused = server_->Admit(bounded_); !refused.ok()) {
      call->Finish(refused);
      return;
    }
    taken_[call->queue_].push_back(call);
  }

  // One of a started call's completions came; the last frees it.
  void Release(Call* call) {
    if (--call->events_ > 0) return;
    delete call;
    server_->Released(bounded_);
  }

  FinishMailbox* Mailbox(int queue) { return server_->mailboxes_[queue].get(); }

 private:
  void Request(int queue) {
    auto* call = new Call(this, queue, notify_when_done_);
    request_(&call->ctx_, call->req_, &call->responder_, cqs_[queue], call);
  }

  AsyncServer* const server_;
  const AsyncServer::RequestFn<Req, Resp> request_;
  const AsyncServer::HandleFn<Req, Resp> handle_;
  const int ahead_;
  const bool notify_when_done_;
  const bool bounded_;
  // Per queue; each touched only by its queue's thread.
  std::vector<std::vector<Call*>> taken_;
  std::vector<grpc::ServerCompletionQueue*> cqs_;
};

// One server-streaming method: each new stream goes to the handler at once.
template <typename Req, typename Resp>
class AsyncStreamMethod final : public AsyncMethodBase {
 public:
  using Stream = AsyncStream<Req, Resp>;
  using RequestFn = std::function<void(
      grpc::ServerContext*, Req*, grpc::ServerAsyncWriter<Resp>*,
      grpc::ServerCompletionQueue* cq, void* tag)>;

  AsyncStreamMethod(AsyncServer* server, RequestFn request,
                    AsyncServer::StreamHandleFn<Req, Resp> handle,
                    AsyncMethodOptions options, int queues)
      : server_(server),
        request_(std::move(request)),
        handle_(std::move(handle)),
        ahead_(options.ahead < 1 ? 1 : options.ahead),
        bounded_(options.bounded),
        cqs_(queues) {}

  void Start(int queue, grpc::ServerCompletionQueue* cq) override {
    cqs_[queue] = cq;
    for (int i = 0; i < ahead_; ++i) Request(queue);
  }

  void Flush(int /*queue*/) override {}

  void Started(Stream* stream, bool ok) {
    if (!ok) {
      // Ended by the server's shutdown before a call came: no other
      // completion of it comes.
      delete stream;
      return;
    }
    Request(stream->queue_);
    if (grpc::Status refused = server_->Admit(bounded_); !refused.ok()) {
      stream->Finish(refused);
      return;
    }
    handle_(stream);
  }

  // The stream is over: its Finish and its done notification both came.
  void Release(Stream* stream) {
    delete stream;
    server_->Released(bounded_);
  }

  FinishMailbox* Mailbox(int queue) { return server_->mailboxes_[queue].get(); }

 private:
  void Request(int queue) {
    auto* stream = new Stream(this, queue);
    request_(&stream->ctx_, &stream->req_, &stream->writer_, cqs_[queue],
             stream);
  }

  AsyncServer* const server_;
  const RequestFn request_;
  const AsyncServer::StreamHandleFn<Req, Resp> handle_;
  const int ahead_;
  const bool bounded_;
  std::vector<grpc::ServerCompletionQueue*> cqs_;  // per queue
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_ASYNC_SERVER_H_
