// A stand-in for idempotency-sidecar used by testing_pgtest: it accepts TCP
// connections on --listen=HOST:PORT (and closes them) until SIGTERM, then
// exits 0. --exit-at-start=N makes it exit with N before listening;
// --start-delay-ms=N delays the listening; it prints $FAKE_SIDECAR_ECHO.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

volatile sig_atomic_t g_stop = 0;

void OnTerm(int) { g_stop = 1; }

bool ParsePort(const std::string& hostport, int* port) {
  size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) return false;
  *port = std::atoi(hostport.c_str() + colon + 1);
  return *port > 0;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  int metrics_port = 0;
  int delay_ms = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&arg](const char* prefix) -> const char* {
      size_t n = std::strlen(prefix);
      return arg.compare(0, n, prefix) == 0 ? arg.c_str() + n : nullptr;
    };
    if (const char* v = value("--listen=")) {
      if (!ParsePort(v, &port)) return 2;
    } else if (const char* v = value("--metrics-listen=")) {
      if (!ParsePort(v, &metrics_port)) return 2;
    } else if (const char* v = value("--exit-at-start=")) {
      std::printf("fake sidecar: exiting at start as asked\n");
      return std::atoi(v);
    } else if (const char* v = value("--start-delay-ms=")) {
      delay_ms = std::atoi(v);
    } else {
      std::fprintf(stderr, "fake sidecar: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (port == 0 || metrics_port == 0) {
    std::fprintf(stderr,
                 "fake sidecar: --listen and --metrics-listen needed\n");
    return 2;
  }
  const char* echo = std::getenv("FAKE_SIDECAR_ECHO");
  if (echo != nullptr) std::printf("FAKE_SIDECAR_ECHO=%s\n", echo);
  std::fflush(stdout);

  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnTerm;
  sigaction(SIGTERM, &sa, nullptr);

  if (delay_ms > 0) usleep(static_cast<useconds_t>(delay_ms) * 1000);

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 16) != 0) {
    std::perror("fake sidecar: bind/listen");
    return 1;
  }
  std::printf("fake sidecar: listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  while (!g_stop) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      int conn = accept(fd, nullptr, nullptr);
      if (conn >= 0) close(conn);
    }
  }
  std::printf("fake sidecar: SIGTERM, exiting\n");
  std::fflush(stdout);
  // Without the exit handlers: under ASan, LeakSanitizer's check at exit
  // once held this stub past the harness's 30 s bound for SIGTERM, and a
  // stub has no leaks worth that.
  std::_Exit(0);
}
