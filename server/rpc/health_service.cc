#include "server/rpc/health_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace idem {

namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// How often a waiting Watch checks whether its client went away: gRPC's
// synchronous API has no notification for that.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(100);

}  // namespace

HealthService::HealthService(int max_watches, Metrics* metrics)
    : max_watches_(max_watches), metrics_(metrics) {
  // Like gRPC's default service: the server as a whole starts SERVING.
  serving_[""] = true;
}

grpc::Status HealthService::Check(grpc::ServerContext* /*context*/,
                                  const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  SteadyMutexLock lock(&mu_);
  auto it = serving_.find(request->service());
  if (it == serving_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "unknown service " + request->service());
  }
  response->set_status(it->second ? HealthCheckResponse::SERVING
                                  : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(
    grpc::ServerContext* context, const HealthCheckRequest* request,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  const std::string& name = request->service();
  // StatusLocked never returns UNKNOWN, so the first pass always sends.
  ServingStatus sent = HealthCheckResponse::UNKNOWN;
  HealthCheckResponse response;
  SteadyMutexLock lock(&mu_);
  if (watches_ >= max_watches_) {
    if (metrics_ != nullptr) metrics_->Refused("health_watches");
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("too many open health Watch streams "
                                     "(--max-health-watches=",
                                     max_watches_, "); use Check"));
  }
  ++watches_;
  if (metrics_ != nullptr) metrics_->SetHealthWatches(watches_);
  // Counted down however the stream ends.
  struct Open {
    HealthService* self;
    ~Open() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      --self->watches_;
      if (self->metrics_ != nullptr) {
        self->metrics_->SetHealthWatches(self->watches_);
      }
    }
  } open{this};
  while (true) {
    const ServingStatus status = StatusLocked(name);
    if (status != sent) {
      // Not under the lock: a Write may wait for the client's flow control.
      lock.Unlock();
      response.set_status(status);
      const bool written = writer->Write(response);
      lock.Lock();
      if (!written) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "stream closed");
      }
      sent = status;
      continue;  // The status may have changed during the Write.
    }
    if (shutdown_) return grpc::Status::OK;
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    changed_.WaitFor(&lock, kCancelPoll,
                     [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       return shutdown_ || StatusLocked(name) != sent;
                     });
  }
}

void HealthService::SetServingStatus(const std::string& service_name,
                                     bool serving) {
  SteadyMutexLock lock(&mu_);
  if (shutdown_) return;
  auto [it, inserted] = serving_.try_emplace(service_name, serving);
  if (!inserted) {
    if (it->second == serving) return;
    it->second = serving;
  }
  changed_.SignalAll();
}

void HealthService::SetServingStatus(bool serving) {
  SteadyMutexLock lock(&mu_);
  if (shutdown_) return;
  for (auto& [name, value] : serving_) value = serving;
  changed_.SignalAll();
}

void HealthService::Shutdown() {
  SteadyMutexLock lock(&mu_);
  shutdown_ = true;
  for (auto& [name, value] : serving_) value = false;
  changed_.SignalAll();
}

HealthService::ServingStatus HealthService::StatusLocked(
    const std::string& name) const {
  auto it = serving_.find(name);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING
                    : HealthCheckResponse::NOT_SERVING;
}

}  // namespace idem
