// The HTTP gateway (docs/gateway.md, decision 21): an HTTP/1.1 reverse proxy
// in front of an unmodified service that honours Idempotency-Key through
// core's records (Calls). Boost.Beast over one Asio event loop: a connection
// is state on a strand, core's answers are posted back to it, and
// nothing blocks a thread while it waits for the store, another attempt or
// the service.
#ifndef IDEM_SERVER_GATEWAY_GATEWAY_H_
#define IDEM_SERVER_GATEWAY_GATEWAY_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/calls.h"
#include "server/gateway/gateway_config.h"
#include "server/gateway/http_metrics.h"

namespace idem::gateway {

struct GatewayOptions {
  // host:port or [v6]:port; port 0 picks a free one (port()).
  std::string listen;
  // http://host:port (no path): the service behind the gateway.
  std::string upstream;
  // The tenant of every record the gateway makes.
  std::string tenant = "http";
  int threads = 1;
  int max_connections = 4096;
  // Request bodies, unless the route says otherwise.
  size_t max_body = size_t{1} << 20;
  // The service's answers, passed through or recorded.
  size_t max_answer = size_t{16} << 20;
  // Recorded answers: status, headers and body together
  // (--max-snapshot-bytes).
  size_t max_snapshot_bytes = 256 * 1024;
  absl::Duration upstream_timeout = absl::Seconds(30);
  // A connection with no request, or a request not read whole, this long
  // is closed.
  absl::Duration idle_timeout = absl::Seconds(60);
  // Idle keep-alive connections to the upstream kept for the next request
  // (decision 21); 0: a new connection for every request.
  int upstream_keepalive = 32;
  // An idle upstream connection older than this is closed, and never
  // reused: keep it below the service's own keep-alive timeout.
  absl::Duration upstream_keepalive_timeout = absl::Seconds(1);
};

// Thread-safe. Does not own `calls` or the metrics, which must outlive it.
class Gateway {
 public:
  // Resolves the upstream, binds, and serves on `options.threads` threads
  // (thread_names::kHttp). INVALID_ARGUMENT naming the flag when an address
  // is malformed, or UNAVAILABLE when it cannot be bound or resolved.
  // `metrics` may be null (then nothing is counted).
  static absl::StatusOr<std::unique_ptr<Gateway>> Start(GatewayOptions options,
                                                        GatewayConfig config,
                                                        Calls* calls,
                                                        HttpMetrics* metrics);
  // Stop(absl::ZeroDuration()).
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // The port it listens on.
  int port() const;
  // Client connections open now.
  int64_t connections() const;
  // Idle keep-alive connections to the upstream now.
  int64_t upstream_idle() const;

  // Stops accepting, lets requests in flight finish for up to `grace`, then
  // closes every connection and joins the threads. Waits, however long, for
  // the calls to core it started (they hold the connections): parked Begins
  // are answered at Calls::Shutdown(). Idempotent.
  void Stop(absl::Duration grace);

 private:
  struct Impl;
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::gateway

#endif  // IDEM_SERVER_GATEWAY_GATEWAY_H_
