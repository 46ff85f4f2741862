#include "server/async_begin.h"

#include <utility>

#include "common/thread_name.h"

namespace idem {
namespace {

google::protobuf::ArenaOptions FirstBlock(char* block, size_t size) {
  google::protobuf::ArenaOptions options;
  options.initial_block = block;
  options.initial_block_size = size;
  return options;
}

}  // namespace

AsyncBegin::AsyncBegin()
    : arena_(FirstBlock(block_, kFirstBlock)),
      req_(google::protobuf::Arena::CreateMessage<pb::BeginRequest>(
          kProtoArenas ? &arena_ : nullptr)),
      resp_(google::protobuf::Arena::CreateMessage<pb::BeginResponse>(
          kProtoArenas ? &arena_ : nullptr)) {}

AsyncBegin::~AsyncBegin() {
  if (!kProtoArenas) {
    delete req_;
    delete resp_;
  }
}

void AsyncBegin::Finish(const grpc::Status& status) {
  finishing_ = true;
  responder_.Finish(*resp_, status, this);
}

AsyncBeginServer::AsyncBeginServer(IdempotencyBase* service,
                                   grpc::ServerBuilder* builder, int threads,
                                   HandleFn handle)
    : service_(service), handle_(std::move(handle)) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) {
    queues_.push_back(builder->AddCompletionQueue());
  }
}

AsyncBeginServer::~AsyncBeginServer() { Stop(); }

void AsyncBeginServer::Start() {
  for (auto& queue : queues_) {
    grpc::ServerCompletionQueue* cq = queue.get();
    threads_.emplace_back([this, cq] {
      NameThisThread("idem-begin");
      Run(cq);
    });
  }
}

void AsyncBeginServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    // A call still running finishes on its own (the store's calls are
    // bounded by their timeouts); its completion needs the queue.
    mu_.Await(absl::Condition(
        +[](int64_t* n) { return *n == 0; }, &in_flight_));
  }
  for (auto& queue : queues_) queue->Shutdown();
  if (threads_.empty()) {
    // Never started: drain the queues here.
    for (auto& queue : queues_) {
      void* tag;
      bool ok;
      while (queue->Next(&tag, &ok)) delete static_cast<AsyncBegin*>(tag);
    }
  }
  for (std::thread& t : threads_) t.join();
}

void AsyncBeginServer::Request(grpc::ServerCompletionQueue* cq) {
  auto* call = new AsyncBegin;
  service_->RequestBegin(&call->ctx_, call->req_, &call->responder_, cq, cq,
                         call);
}

void AsyncBeginServer::Take(grpc::ServerCompletionQueue* cq, void* tag, bool ok,
                            std::vector<AsyncBegin*>& batch) {
  auto* call = static_cast<AsyncBegin*>(tag);
  if (call->finishing_) {
    // Its answer went out (or the call was cancelled): free it.
    delete call;
    absl::MutexLock lock(&mu_);
    --in_flight_;
    return;
  }
  if (!ok) {
    // A request the server's shutdown ended without a call.
    delete call;
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  // The next caller's call, requested before this one is answered.
  Request(cq);
  batch.push_back(call);
}

void AsyncBeginServer::Run(grpc::ServerCompletionQueue* cq) {
  for (int i = 0; i < kRequestsPerQueue; ++i) Request(cq);
  std::vector<AsyncBegin*> batch;
  batch.reserve(kMaxBatch);
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) {
    Take(cq, tag, ok, batch);
    // Whatever else is ready joins it, so their lookups share a round trip.
    while (batch.size() < kMaxBatch &&
           cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) ==
               grpc::CompletionQueue::GOT_EVENT) {
      Take(cq, tag, ok, batch);
    }
    if (batch.empty()) continue;
    handle_(batch);
    batch.clear();
  }
}

}  // namespace idem
