#include "tests/faults/fault_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace idem::faults {
namespace {

constexpr size_t kMaxQueued = 1 << 20;
constexpr absl::Duration kTick = absl::Milliseconds(20);

// Closes `fd` with SO_LINGER 0, so the peer gets a RST.
void Rst(int fd) {
  if (fd < 0) return;
  linger l{};
  l.l_onoff = 1;
  l.l_linger = 0;
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

sockaddr_in Loopback(int port) {
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Connects to 127.0.0.1:port within `timeout`; the socket is non-blocking.
int ConnectUpstream(int port, absl::Duration timeout,
                    const std::atomic<bool>& stop) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = Loopback(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    NoDelay(fd);
    return fd;
  }
  if (errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (!stop.load() && absl::Now() < deadline) {
    pollfd p{fd, POLLOUT, 0};
    int rc = poll(&p, 1, 50);
    if (rc == 0 || (rc < 0 && errno == EINTR)) continue;
    int err = 0;
    socklen_t len = sizeof(err);
    if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
        err != 0) {
      break;
    }
    NoDelay(fd);
    return fd;
  }
  close(fd);
  return -1;
}

// Bytes read from one side, waiting to be written to the other.
struct Pending {
  std::deque<std::pair<absl::Time, std::string>> chunks;
  size_t bytes = 0;
  size_t offset = 0;  // into chunks.front()
  bool eof = false;
  bool shut = false;
  int64_t since_arm = 0;  // bytes forwarded since the current cut was armed
};

}  // namespace

const char* DirectionName(Direction d) {
  switch (d) {
    case Direction::kUp:
      return "up";
    case Direction::kDown:
      return "down";
    case Direction::kBoth:
      return "both";
  }
  return "?";
}

bool ParseDirection(const std::string& name, Direction* out) {
  for (Direction d : {Direction::kUp, Direction::kDown, Direction::kBoth}) {
    if (name == DirectionName(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

struct FaultProxy::Conn {
  int client_fd = -1;
  std::thread thread;
  std::atomic<bool> done{false};
};

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(int upstream_port,
                                                              int listen_port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = Loopback(listen_port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 512) != 0) {
    std::string error = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("fault proxy: bind/listen on ", listen_port, ": ", error));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<FaultProxy> proxy(
      new FaultProxy(fd, ntohs(addr.sin_port), upstream_port));
  proxy->acceptor_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
  return proxy;
}

FaultProxy::FaultProxy(int listen_fd, int port, int upstream_port)
    : listen_fd_(listen_fd), port_(port), upstream_port_(upstream_port) {}

FaultProxy::~FaultProxy() {
  stop_.store(true);
  acceptor_.join();
  close(listen_fd_);
  JoinFinished(/*all=*/true);
}

void FaultProxy::Pass() {
  absl::MutexLock lock(&mu_);
  delay_ = absl::ZeroDuration();
  blackhole_ = false;
  refuse_ = false;
  cuts_left_ = 0;
  cut_bytes_ = 0;
}

void FaultProxy::SetDelay(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  delay_ = delay;
}

void FaultProxy::SetBlackhole(bool on) {
  absl::MutexLock lock(&mu_);
  blackhole_ = on;
}

void FaultProxy::SetRefuse(bool on) {
  absl::MutexLock lock(&mu_);
  refuse_ = on;
}

void FaultProxy::ResetAll() {
  absl::MutexLock lock(&mu_);
  ++reset_generation_;
}

void FaultProxy::ArmCut(Direction direction, int64_t bytes, int count) {
  absl::MutexLock lock(&mu_);
  ++cut_generation_;
  cut_direction_ = direction;
  cut_bytes_ = std::max<int64_t>(1, bytes);
  cuts_left_ = count;
}

void FaultProxy::DisarmCut() {
  absl::MutexLock lock(&mu_);
  cuts_left_ = 0;
  cut_bytes_ = 0;
}

ProxyStats FaultProxy::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

FaultProxy::Settings FaultProxy::Snapshot() const {
  absl::MutexLock lock(&mu_);
  Settings s;
  s.delay = delay_;
  s.blackhole = blackhole_;
  s.reset_generation = reset_generation_;
  s.cut_generation = cut_generation_;
  s.cut_direction = cut_direction_;
  s.cut_bytes = cuts_left_ > 0 ? cut_bytes_ : 0;
  return s;
}

bool FaultProxy::ClaimCut(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation != cut_generation_ || cuts_left_ <= 0) return false;
  --cuts_left_;
  ++stats_.cuts;
  return true;
}

void FaultProxy::JoinFinished(bool all) {
  std::list<std::unique_ptr<Conn>> finished;
  {
    absl::MutexLock lock(&conns_mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) c->thread.join();
}

void FaultProxy::AcceptLoop() {
  while (!stop_.load()) {
    JoinFinished(/*all=*/false);
    pollfd p{listen_fd_, POLLIN, 0};
    int rc = poll(&p, 1, 50);
    if (rc <= 0) continue;
    int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    NoDelay(fd);
    bool refuse;
    {
      absl::MutexLock lock(&mu_);
      ++stats_.accepted;
      refuse = refuse_;
      if (refuse) ++stats_.resets;
    }
    if (refuse) {
      Rst(fd);
      continue;
    }
    auto conn = std::make_unique<Conn>();
    conn->client_fd = fd;
    Conn* raw = conn.get();
    absl::MutexLock lock(&conns_mu_);
    conns_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

void FaultProxy::Serve(Conn* conn) {
  Settings s = Snapshot();
  const uint64_t my_reset = s.reset_generation;
  uint64_t my_cut = s.cut_generation;
  uint64_t exempt_cut = ~uint64_t{0};  // a generation whose budget ran out
  int fds[2] = {conn->client_fd, -1};
  fds[1] = ConnectUpstream(upstream_port_, absl::Seconds(2), stop_);
  if (fds[1] < 0) {
    Rst(fds[0]);
    conn->done.store(true);
    return;
  }
  Pending pending[2];  // [0]: client -> upstream, [1]: upstream -> client
  char buf[65536];
  bool reset = false;
  bool closed = false;
  while (!reset && !closed) {
    s = Snapshot();
    if (stop_.load() || s.reset_generation != my_reset) {
      if (!stop_.load()) {
        absl::MutexLock lock(&mu_);
        ++stats_.resets;
      }
      reset = true;
      break;
    }
    if (s.cut_generation != my_cut) {
      my_cut = s.cut_generation;
      pending[0].since_arm = 0;
      pending[1].since_arm = 0;
    }
    if (s.blackhole) {
      absl::SleepFor(kTick);
      continue;
    }
    const absl::Time now = absl::Now();
    pollfd p[2] = {{fds[0], 0, 0}, {fds[1], 0, 0}};
    absl::Duration wait = kTick;
    for (int d = 0; d < 2; ++d) {
      Pending& q = pending[d];
      if (!q.eof && q.bytes < kMaxQueued) p[d].events |= POLLIN;
      if (!q.chunks.empty()) {
        absl::Time due = q.chunks.front().first;
        if (due <= now) {
          p[1 - d].events |= POLLOUT;
        } else {
          wait = std::min(wait, due - now);
        }
      }
    }
    int timeout_ms =
        static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(wait)));
    int rc = poll(p, 2, timeout_ms);
    if (rc < 0 && errno != EINTR) break;
    if (rc <= 0) continue;
    for (int d = 0; d < 2 && !reset; ++d) {
      if ((p[d].revents & (POLLIN | POLLHUP | POLLERR)) == 0 ||
          (p[d].events & POLLIN) == 0) {
        continue;
      }
      ssize_t n = recv(fds[d], buf, sizeof(buf), 0);
      if (n > 0) {
        pending[d].chunks.emplace_back(absl::Now() + s.delay,
                                       std::string(buf, n));
        pending[d].bytes += n;
      } else if (n == 0) {
        pending[d].eof = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        reset = true;  // the peer reset: pass it on
      }
    }
    for (int d = 0; d < 2 && !reset; ++d) {
      Pending& q = pending[d];
      const int to = fds[1 - d];
      if ((p[1 - d].revents & POLLOUT) == 0 || q.chunks.empty()) continue;
      const std::string& chunk = q.chunks.front().second;
      size_t want = chunk.size() - q.offset;
      const bool cut_here = s.cut_bytes > 0 && my_cut != exempt_cut &&
                            (s.cut_direction == Direction::kBoth ||
                             static_cast<int>(s.cut_direction) == d);
      if (cut_here) {
        want = std::min<size_t>(want, static_cast<size_t>(std::max<int64_t>(
                                          0, s.cut_bytes - q.since_arm)));
      }
      ssize_t n = want == 0 ? 0
                            : send(to, chunk.data() + q.offset, want,
                                   MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          reset = true;
        }
        continue;
      }
      q.offset += n;
      q.bytes -= n;
      q.since_arm += n;
      {
        absl::MutexLock lock(&mu_);
        (d == 0 ? stats_.bytes_up : stats_.bytes_down) += n;
      }
      if (q.offset == chunk.size()) {
        q.chunks.pop_front();
        q.offset = 0;
      }
      if (cut_here && q.since_arm >= s.cut_bytes) {
        if (ClaimCut(my_cut)) {
          reset = true;
        } else {
          exempt_cut = my_cut;
        }
      }
    }
    for (int d = 0; d < 2 && !reset; ++d) {
      Pending& q = pending[d];
      if (q.eof && q.chunks.empty() && !q.shut) {
        shutdown(fds[1 - d], SHUT_WR);
        q.shut = true;
      }
    }
    closed = pending[0].shut && pending[1].shut;
  }
  if (closed) {
    close(fds[0]);
    close(fds[1]);
  } else {
    Rst(fds[0]);
    Rst(fds[1]);
  }
  conn->done.store(true);
}

}  // namespace idem::faults
