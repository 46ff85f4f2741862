#include "tests/testing/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace idem::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Test ports come from [kLowestPort, the ephemeral range).
constexpr int kLowestPort = 20000;

// The lowest port the kernel gives outgoing connections as their source
// port (net.ipv4.ip_local_port_range).
int EphemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (!(in >> low) || low <= kLowestPort + 1000) return 32768;
  return low;
}

// Whether a listener could bind 127.0.0.1:port now.
bool Bindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    std::perror("FreePort: socket");
    std::abort();
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = Loopback(port);
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

int FreePort() {
  // Not from the ephemeral range, where bind(port 0) picks: any process's
  // outgoing connection can take such a port as its source port between
  // this check and the server's bind (seen with many tests in parallel).
  static std::mt19937 rng(std::random_device{}() ^
                          static_cast<unsigned>(getpid()));
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::uniform_int_distribution<int> pick(kLowestPort, EphemeralLow() - 1);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(rng);
    if (Bindable(port)) return port;
  }
  std::fprintf(stderr, "FreePort: no free port below %d\n", EphemeralLow());
  std::abort();
}

bool PortAcceptsConnections(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr = Loopback(port);
  int rc;
  do {
    rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  close(fd);
  return rc == 0;
}

absl::Status WaitForPort(int port, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!PortAcceptsConnections(port)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("nothing accepted connections on 127.0.0.1:", port,
                       " within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

}  // namespace idem::testing
