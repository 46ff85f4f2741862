// What the gRPC side reports, besides the core's figures: call latency,
// refused callers and open health streams.
#ifndef IDEM_SERVER_RPC_RPC_METRICS_H_
#define IDEM_SERVER_RPC_RPC_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "server/core/core_metrics.h"

namespace idem {

class RpcMetrics : public virtual CoreMetrics {
 public:
  // idem_rpc_duration_seconds{method}.
  virtual void ObserveRpc(const std::string& method, absl::Duration d) = 0;
  // A call refused for who made it; `code`: "unauthenticated",
  // "permission_denied".
  virtual void AuthFailed(const char* code) = 0;
  // idem_health_watches: open grpc.health.v1.Health/Watch streams.
  virtual void SetHealthWatches(int64_t watches) = 0;
};

// Measures the time from construction to destruction (on the steady clock)
// into idem_rpc_duration_seconds{method}. `metrics` may be null.
class RpcTimer {
 public:
  RpcTimer(RpcMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(SteadyClock::now()) {}
  ~RpcTimer() {
    if (metrics_ != nullptr) {
      metrics_->ObserveRpc(method_, SteadySince(start_));
    }
  }
  RpcTimer(const RpcTimer&) = delete;
  RpcTimer& operator=(const RpcTimer&) = delete;

 private:
  RpcMetrics* const metrics_;
  const char* const method_;
  const SteadyTime start_;
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_RPC_METRICS_H_
