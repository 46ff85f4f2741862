#include "server/rpc/health_service.h"

#include "absl/strings/str_cat.h"

namespace idem {

namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

}  // namespace

HealthService::HealthService(int max_watches, RpcMetrics* metrics)
    : max_watches_(max_watches), metrics_(metrics) {
  // Like gRPC's default service: the server as a whole starts SERVING.
  serving_[""] = true;
}

void HealthService::ServeOn(AsyncServer* server) {
  // Few calls requested ahead: probes are rare next to business calls.
  AsyncMethodOptions options;
  options.ahead = 4;
  options.bounded = false;
  server->Add(this, &Health::AsyncService::RequestCheck,
              AsyncServer::Each(this, &HealthService::HandleCheck), options);
  server->AddStream(
      this, &Health::AsyncService::RequestWatch,
      [this](WatchRpc* stream) { HandleWatch(stream); }, options);
}

void HealthService::HandleCheck(CheckRpc* call) {
  const std::string& name = call->request().service();
  SteadyMutexLock lock(&mu_);
  auto it = serving_.find(name);
  if (it == serving_.end()) {
    call->Finish(
        grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service " + name));
    return;
  }
  call->response()->set_status(it->second ? HealthCheckResponse::SERVING
                                          : HealthCheckResponse::NOT_SERVING);
  call->Finish(grpc::Status::OK);
}

void HealthService::HandleWatch(WatchRpc* stream) {
  const std::string name = stream->request().service();
  SteadyMutexLock lock(&mu_);
  if (!shutdown_ && watches_ >= max_watches_) {
    if (metrics_ != nullptr) metrics_->Refused("health_watches");
    stream->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                absl::StrCat("too many open health Watch "
                                             "streams (--max-health-watches=",
                                             max_watches_, "); use Check")));
    return;
  }
  // Sends the status whenever it differs from the one sent last. StatusLocked
  // never returns UNKNOWN, so the first time always sends.
  stream->SetSource([this, name, sent = HealthCheckResponse::UNKNOWN](
                        HealthCheckResponse* next) mutable {
    SteadyMutexLock lock(&mu_);
    const ServingStatus status = StatusLocked(name);
    if (status == sent) return false;
    sent = status;
    next->set_status(status);
    return true;
  });
  if (shutdown_) {
    // The status, then the end.
    stream->Finish(grpc::Status::OK);
    return;
  }
  watchers_[name].insert(stream);
  ++watches_;
  CountWatchesLocked();
  stream->OnCancel([this, name, stream] {
    SteadyMutexLock lock(&mu_);
    auto it = watchers_.find(name);
    // Shutdown() may have finished it meanwhile.
    if (it == watchers_.end() || it->second.erase(stream) == 0) return;
    if (it->second.empty()) watchers_.erase(it);
    --watches_;
    CountWatchesLocked();
    stream->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  });
  stream->Wake();
}

void HealthService::SetServingStatus(const std::string& service_name,
                                     bool serving) {
  SteadyMutexLock lock(&mu_);
  if (shutdown_) return;
  // A new name starts as the opposite, so that setting it wakes its
  // watchers (they were sent SERVICE_UNKNOWN).
  auto it = serving_.try_emplace(service_name, !serving).first;
  SetLocked(it->first, &it->second, serving);
}

void HealthService::SetServingStatus(bool serving) {
  SteadyMutexLock lock(&mu_);
  if (shutdown_) return;
  for (auto& [name, value] : serving_) SetLocked(name, &value, serving);
}

void HealthService::Shutdown() {
  SteadyMutexLock lock(&mu_);
  if (shutdown_) return;
  shutdown_ = true;
  for (auto& [name, value] : serving_) value = false;
  // Each sends the final status first (its source), then ends.
  for (auto& [name, streams] : watchers_) {
    for (WatchRpc* stream : streams) stream->Finish(grpc::Status::OK);
  }
  watchers_.clear();
  watches_ = 0;
  CountWatchesLocked();
}

void HealthService::SetLocked(const std::string& name, bool* value,
                              bool serving) {
  if (*value == serving) return;
  *value = serving;
  auto it = watchers_.find(name);
  if (it == watchers_.end()) return;
  for (WatchRpc* stream : it->second) stream->Wake();
}

HealthService::ServingStatus HealthService::StatusLocked(
    const std::string& name) const {
  auto it = serving_.find(name);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING
                    : HealthCheckResponse::NOT_SERVING;
}

void HealthService::CountWatchesLocked() {
  if (metrics_ != nullptr) metrics_->SetHealthWatches(watches_);
}

}  // namespace idem
