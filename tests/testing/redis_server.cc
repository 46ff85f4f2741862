#include "tests/testing/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/files.h"
#include "tests/testing/ports.h"

namespace idem::testing {
namespace {

// Sends an inline PING and waits for "+PONG" until `deadline`.
absl::Status PingOnce(int port, absl::Time deadline) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(std::strerror(errno));
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  auto wait_for = [&](short events) -> bool {
    while (true) {
      int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0) return false;
      pollfd p{fd, events, 0};
      int rc = poll(&p, 1, static_cast<int>(ms));
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
  };
  absl::Status result = absl::UnavailableError(
      absl::StrCat("redis on port ", port, " did not answer PING"));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
      errno != EINPROGRESS) {
    close(fd);
    return result;
  }
  int so_error = 0;
  socklen_t len = sizeof(so_error);
  if (!wait_for(POLLOUT) ||
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 ||
      so_error != 0) {
    close(fd);
    return result;
  }
  const char kPing[] = "PING\r\n";
  if (send(fd, kPing, sizeof(kPing) - 1, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof(kPing) - 1)) {
    close(fd);
    return result;
  }
  std::string reply;
  while (reply.find('\n') == std::string::npos && wait_for(POLLIN)) {
    char buf[64];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (absl::StartsWith(reply, "+PONG")) return absl::OkStatus();
  return result;
}

}  // namespace

RedisServer::RedisServer(std::string dir, int port)
    : dir_(std::move(dir)), log_path_(dir_ + "/log"), port_(port) {}

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start() {
  absl::StatusOr<std::string> dir = MakeTempDir("idem-redis-");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<RedisServer> server(new RedisServer(*dir, FreePort()));
  absl::Status s = server->Spawn();
  if (!s.ok()) return s;
  return server;
}

RedisServer::~RedisServer() {
  process_.reset();  // SIGKILLs and reaps.
  RemoveTempDir(dir_);
}

std::string RedisServer::Address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

std::string RedisServer::Log() const { return ReadFile(log_path_); }

absl::Status RedisServer::Spawn() {
  if (process_ != nullptr && process_->Running()) {
    return absl::FailedPreconditionError(
        absl::StrCat("redis on port ", port_, " is still running"));
  }
  absl::StatusOr<std::unique_ptr<Process>> process =
      Process::Spawn({"redis-server", "--port", std::to_string(port_), "--bind",
                      "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
                      dir_, "--daemonize", "no", "--logfile", ""},
                     {}, log_path_, dir_);
  if (!process.ok()) return process.status();
  process_ = *std::move(process);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    if (Ping(absl::Milliseconds(500)).ok()) return absl::OkStatus();
    if (!process_->Running() || absl::Now() >= deadline) {
      process_->Kill().IgnoreError();
      return absl::UnavailableError(absl::StrCat(
          "redis-server on port ", port_, " did not start\n--- log (",
          log_path_, ") ---\n", ReadFileTail(log_path_)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status RedisServer::Kill() {
  if (process_ == nullptr) return absl::FailedPreconditionError("not started");
  absl::StatusOr<int> code = process_->Kill(SIGKILL);
  return code.status();
}

absl::Status RedisServer::StartAgain() { return Spawn(); }

absl::Status RedisServer::Pause() {
  if (process_ == nullptr) return absl::FailedPreconditionError("not started");
  return process_->Signal(SIGSTOP);
}

absl::Status RedisServer::Resume() {
  if (process_ == nullptr) return absl::FailedPreconditionError("not started");
  return process_->Signal(SIGCONT);
}

absl::Status RedisServer::Ping(absl::Duration timeout) const {
  return PingOnce(port_, absl::Now() + timeout);
}

absl::StatusOr<std::string> RedisServer::Cli(
    const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"redis-cli", "-h", "127.0.0.1", "-p",
                                   std::to_string(port_)};
  argv.insert(argv.end(), args.begin(), args.end());
  RunOptions options;
  options.timeout = absl::Seconds(10);
  absl::StatusOr<std::string> out = RunCommand(argv, options);
  if (!out.ok()) return out.status();
  std::string result = *std::move(out);
  while (!result.empty() && result.back() == '\n') result.pop_back();
  return result;
}

}  // namespace idem::testing
