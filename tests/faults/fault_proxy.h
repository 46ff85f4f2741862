// A TCP fault proxy for loopback: listens on 127.0.0.1 and forwards every
// connection to an upstream port on 127.0.0.1, and on command delays,
// black-holes, resets or cuts the traffic. Placed between a sidecar and
// PostgreSQL, a sidecar and Redis, or clients and a sidecar (netem is not
// available here; only loopback is a valid target).
#ifndef IDEM_TESTS_FAULTS_FAULT_PROXY_H_
#define IDEM_TESTS_FAULTS_FAULT_PROXY_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace idem::faults {

// Which way bytes flow: kUp is client -> upstream (requests), kDown is
// upstream -> client (replies).
enum class Direction { kUp = 0, kDown = 1, kBoth = 2 };

// Returns "up", "down" or "both"; ParseDirection is its inverse.
const char* DirectionName(Direction d);
bool ParseDirection(const std::string& name, Direction* out);

// Counters since Start.
struct ProxyStats {
  int64_t accepted = 0;
  int64_t resets = 0;  // connections reset by ResetAll or refused
  int64_t cuts = 0;    // connections cut by ArmCut
  int64_t bytes_up = 0;
  int64_t bytes_down = 0;
};

// Thread-safe. One thread accepts; each connection has its own thread that
// polls both sockets, so faults apply to connections already open.
class FaultProxy {
 public:
  // Listens on 127.0.0.1:listen_port (0: any free port) and forwards to
  // 127.0.0.1:upstream_port.
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(int upstream_port,
                                                           int listen_port = 0);

  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;
  // Resets every connection and joins every thread.
  ~FaultProxy();

  int port() const { return port_; }
  int upstream_port() const { return upstream_port_; }

  // Heals: no delay, no black hole, no refusal, no cut armed. Connections
  // already open carry on (bytes held by a black hole are delivered).
  void Pass();

  // Holds every chunk this long before forwarding it (both directions).
  void SetDelay(absl::Duration delay);

  // On: stops reading and forwarding in both directions while keeping the
  // sockets open (the peers see silence, as behind a dropped route); new
  // connections are accepted and stay silent. Off: traffic flows again.
  void SetBlackhole(bool on);

  // On: every new connection is reset (RST) as soon as it is accepted.
  void SetRefuse(bool on);

  // Resets (RST, SO_LINGER 0) both sides of every open connection now.
  void ResetAll();

  // Arms a cut: each connection forwards `bytes` more bytes in `direction`
  // (counted from now, or from its start if opened later) and is then reset
  // on both sides; at most `count` connections are cut, then the cut
  // disarms itself. Replaces any cut still armed.
  void ArmCut(Direction direction, int64_t bytes, int count);
  void DisarmCut();

  ProxyStats stats() const;

 private:
  struct Conn;

  FaultProxy(int listen_fd, int port, int upstream_port);
  void AcceptLoop();
  void Serve(Conn* conn);
  void JoinFinished(bool all);

  // A copy of the settings a connection acts on.
  struct Settings {
    absl::Duration delay;
    bool blackhole = false;
    uint64_t reset_generation = 0;
    uint64_t cut_generation = 0;
    Direction cut_direction = Direction::kBoth;
    int64_t cut_bytes = 0;
  };
  Settings Snapshot() const;
  // Takes one cut from the armed budget; false when none is left.
  bool ClaimCut(uint64_t generation);

  const int listen_fd_;
  const int port_;
  const int upstream_port_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;

  mutable absl::Mutex mu_;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
  bool blackhole_ ABSL_GUARDED_BY(mu_) = false;
  bool refuse_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t reset_generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cut_generation_ ABSL_GUARDED_BY(mu_) = 0;
  Direction cut_direction_ ABSL_GUARDED_BY(mu_) = Direction::kBoth;
  int64_t cut_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int cuts_left_ ABSL_GUARDED_BY(mu_) = 0;
  ProxyStats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex conns_mu_;
  std::list<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(conns_mu_);
};

}  // namespace idem::faults

#endif  // IDEM_TESTS_FAULTS_FAULT_PROXY_H_
