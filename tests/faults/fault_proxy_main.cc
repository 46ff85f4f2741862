// fault_proxy: the FaultProxy as a small program, for trying faults by hand.
//
//   fault_proxy --listen=PORT --upstream=PORT [--control=PORT]
//
// Forwards 127.0.0.1:PORT to 127.0.0.1:UPSTREAM until SIGINT or SIGTERM.
// Commands, one per line, on the control port (e.g. `echo "delay 200" | nc
// 127.0.0.1 CONTROL`), each answered with one line:
//   pass                    heal everything
//   delay MS                hold every chunk MS milliseconds
//   blackhole on|off        stop / resume forwarding, sockets stay open
//   refuse on|off           reset every new connection
//   reset                   reset every open connection
//   cut up|down|both BYTES [COUNT]
//                           cut COUNT (default 1) connections after BYTES more
//                           bytes in that direction
//   stats                   counters
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/faults/fault_proxy.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

bool FlagValue(const std::string& arg, const std::string& name, int* out) {
  const std::string prefix = "--" + name + "=";
  return absl::StartsWith(arg, prefix) &&
         absl::SimpleAtoi(arg.substr(prefix.size()), out);
}

std::string Execute(idem::faults::FaultProxy& proxy, const std::string& line) {
  std::vector<std::string> w =
      absl::StrSplit(line, ' ', absl::SkipWhitespace());
  if (w.empty()) return "error: empty command";
  int n = 0;
  if (w[0] == "pass" && w.size() == 1) {
    proxy.Pass();
  } else if (w[0] == "delay" && w.size() == 2 && absl::SimpleAtoi(w[1], &n)) {
    proxy.SetDelay(absl::Milliseconds(n));
  } else if (w[0] == "blackhole" && w.size() == 2) {
    proxy.SetBlackhole(w[1] == "on");
  } else if (w[0] == "refuse" && w.size() == 2) {
    proxy.SetRefuse(w[1] == "on");
  } else if (w[0] == "reset" && w.size() == 1) {
    proxy.ResetAll();
  } else if (w[0] == "cut" && (w.size() == 3 || w.size() == 4)) {
    idem::faults::Direction d;
    int64_t bytes = 0;
    int count = 1;
    if (!idem::faults::ParseDirection(w[1], &d) ||
        !absl::SimpleAtoi(w[2], &bytes) ||
        (w.size() == 4 && !absl::SimpleAtoi(w[3], &count))) {
      return "error: cut up|down|both BYTES [COUNT]";
    }
    proxy.ArmCut(d, bytes, count);
  } else if (w[0] == "stats" && w.size() == 1) {
    idem::faults::ProxyStats s = proxy.stats();
    return absl::StrCat("accepted=", s.accepted, " resets=", s.resets,
                        " cuts=", s.cuts, " bytes_up=", s.bytes_up,
                        " bytes_down=", s.bytes_down);
  } else {
    return "error: unknown command: " + line;
  }
  return "ok";
}

// Serves one control connection to its end.
void ServeControl(idem::faults::FaultProxy& proxy, int fd) {
  std::string buffer;
  char chunk[1024];
  while (!g_stop) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n <= 0) break;
    buffer.append(chunk, n);
    size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      std::string line(absl::StripAsciiWhitespace(buffer.substr(0, nl)));
      buffer.erase(0, nl + 1);
      std::string reply = Execute(proxy, line) + "\n";
      if (write(fd, reply.data(), reply.size()) < 0) return;
    }
  }
  std::string rest(absl::StripAsciiWhitespace(buffer));
  if (!rest.empty()) {
    std::string reply = Execute(proxy, rest) + "\n";
    if (write(fd, reply.data(), reply.size()) < 0) return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int listen_port = 0;
  int upstream_port = 0;
  int control_port = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (FlagValue(arg, "listen", &listen_port) ||
        FlagValue(arg, "upstream", &upstream_port) ||
        FlagValue(arg, "control", &control_port)) {
      continue;
    }
    std::fprintf(stderr,
                 "usage: fault_proxy --listen=PORT --upstream=PORT "
                 "[--control=PORT]\n");
    return 2;
  }
  if (upstream_port <= 0) {
    std::fprintf(stderr, "fault_proxy: --upstream=PORT is required\n");
    return 2;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
  auto proxy = idem::faults::FaultProxy::Start(upstream_port, listen_port);
  if (!proxy.ok()) {
    std::fprintf(stderr, "fault_proxy: %s\n",
                 std::string(proxy.status().message()).c_str());
    return 1;
  }
  int control = -1;
  if (control_port > 0) {
    control = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(control, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(control_port));
    if (bind(control, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(control, 8) != 0) {
      std::fprintf(stderr, "fault_proxy: cannot listen on control port %d\n",
                   control_port);
      return 1;
    }
  }
  std::printf("fault_proxy: 127.0.0.1:%d -> 127.0.0.1:%d%s\n", (*proxy)->port(),
              upstream_port,
              control >= 0
                  ? absl::StrCat(", control 127.0.0.1:", control_port).c_str()
                  : "");
  std::fflush(stdout);
  while (!g_stop) {
    if (control < 0) {
      pause();
      continue;
    }
    pollfd p{control, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int fd = accept(control, nullptr, nullptr);
    if (fd < 0) continue;
    ServeControl(**proxy, fd);
    close(fd);
  }
  if (control >= 0) close(control);
  return 0;
}
