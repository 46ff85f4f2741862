#ifndef IDEM_TESTS_TESTING_REDIS_SERVER_H_
#define IDEM_TESTS_TESTING_REDIS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/process.h"

namespace idem::testing {

// A throwaway redis-server (from PATH) on 127.0.0.1 and a free port, without
// persistence, its files and log in a temporary directory. Not thread-safe.
class RedisServer {
 public:
  // Creates /tmp/idem-redis-XXXXXX, starts redis-server in it and waits (up
  // to 10 s) until it answers PING; the error carries its log on failure.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start();

  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  // Kills the server and removes the directory.
  ~RedisServer();

  // Returns the TCP port (the same across restarts).
  int port() const { return port_; }

  // Returns "127.0.0.1:<port>".
  std::string Address() const;

  // Returns the server log.
  std::string Log() const;

  // Kills the server with SIGKILL and reaps it; every key is lost.
  absl::Status Kill();

  // Starts a killed server again, empty, on the same port, and waits until
  // it answers PING.
  absl::Status StartAgain();

  // Sends SIGSTOP to the server: clients connect but get no answer.
  absl::Status Pause();

  // Sends SIGCONT to the server.
  absl::Status Resume();

  // Returns OK iff the server answers PING with PONG within `timeout`.
  absl::Status Ping(absl::Duration timeout = absl::Seconds(2)) const;

  // Runs `redis-cli -h 127.0.0.1 -p <port> args...` (10 s at most) and
  // returns its stdout without the trailing newline.
  absl::StatusOr<std::string> Cli(const std::vector<std::string>& args) const;

  // Same as Cli({args...}), e.g. Cli("SET", "k", "v").
  template <typename... Args>
  absl::StatusOr<std::string> Cli(const Args&... args) const {
    return Cli(std::vector<std::string>{std::string(args)...});
  }

 private:
  RedisServer(std::string dir, int port);

  absl::Status Spawn();

  const std::string dir_;
  const std::string log_path_;
  const int port_;
  std::unique_ptr<Process> process_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_REDIS_SERVER_H_
