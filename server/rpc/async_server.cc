#include "server/rpc/async_server.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/thread_name.h"
#include "server/base/thread_names.h"

namespace idem {
namespace {

// The mailbox of the queue this thread polls, if any.
thread_local const FinishMailbox* current_mailbox = nullptr;

}  // namespace

bool FinishMailbox::IsCurrent() const { return current_mailbox == this; }

void FinishMailbox::SetCurrent(const FinishMailbox* mailbox) {
  current_mailbox = mailbox;
}

int DefaultAsyncThreads() {
  return static_cast<int>(
      std::max(1u, std::thread::hardware_concurrency() / 2));
}

AsyncServer::AsyncServer(grpc::ServerBuilder* builder, int threads,
                         int64_t max_in_flight, RpcMetrics* metrics)
    : max_in_flight_(max_in_flight), metrics_(metrics) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) {
    queues_.push_back(builder->AddCompletionQueue());
    mailboxes_.push_back(std::make_unique<FinishMailbox>(queues_.back().get()));
  }
}

AsyncServer::~AsyncServer() { Stop(); }

void AsyncServer::Start() {
  for (int i = 0; i < static_cast<int>(queues_.size()); ++i) {
    threads_.emplace_back([this, i] {
      NameThisThread(thread_names::kRpc);
      FinishMailbox::SetCurrent(mailboxes_[i].get());
      Run(i);
    });
  }
}

void AsyncServer::Stop() {
  if (stopped_.exchange(true)) return;
  // A call still running finishes on its own (the store's calls are bounded
  // by their timeouts), and its completion needs the queue.
  // Server::Shutdown already waited for it (a call holds its channel); this
  // keeps Stop safe on its own.
  while (in_flight_->load() > 0 || unbounded_.load() > 0) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  for (auto& queue : queues_) queue->Shutdown();
  if (threads_.empty()) {
    // Never started: a queue must still be drained before it goes.
    for (auto& queue : queues_) {
      void* tag;
      bool ok;
      while (queue->Next(&tag, &ok)) static_cast<AsyncTag*>(tag)->Proceed(ok);
    }
  }
  for (std::thread& t : threads_) t.join();
}

grpc::Status AsyncServer::Admit(bool bounded) {
  if (!bounded) {
    ++unbounded_;
    return grpc::Status::OK;
  }
  const int64_t now = ++*in_flight_;
  if (max_in_flight_ <= 0 || now <= max_in_flight_) return grpc::Status::OK;
  if (metrics_ != nullptr) metrics_->Refused("calls_in_flight");
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "too many calls in flight in this instance "
                      "(--max-calls-in-flight)");
}

void AsyncServer::Released(bool bounded) {
  if (bounded) {
    --*in_flight_;
  } else {
    --unbounded_;
  }
}

void AsyncServer::Run(int queue) {
  grpc::ServerCompletionQueue* cq = queues_[queue].get();
  for (auto& method : methods_) method->Start(queue, cq);
  void* tag;
  bool ok;
  FinishMailbox* mailbox = mailboxes_[queue].get();
  mailbox->SetWaiting(true);
  while (cq->Next(&tag, &ok)) {
    mailbox->SetWaiting(false);
    static_cast<AsyncTag*>(tag)->Proceed(ok);
    // Whatever else is ready joins it, so that, say, Begins' cache lookups
    // share one round trip.
    for (int n = 1; n < kMaxBatch &&
                    cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) ==
                        grpc::CompletionQueue::GOT_EVENT;
         ++n) {
      static_cast<AsyncTag*>(tag)->Proceed(ok);
    }
    for (auto& method : methods_) method->Flush(queue);
    mailbox->SetWaiting(true);
  }
}

}  // namespace idem
