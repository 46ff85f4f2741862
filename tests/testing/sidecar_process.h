#ifndef IDEM_TESTS_TESTING_SIDECAR_PROCESS_H_
#define IDEM_TESTS_TESTING_SIDECAR_PROCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/process.h"

namespace idem::testing {

// An idempotency-sidecar child process serving on 127.0.0.1, its log in a
// temporary directory. Not thread-safe.
class SidecarProcess {
 public:
  // Runs `binary` (tests pass IDEM_SIDECAR_PATH) with `args` plus
  // --listen=127.0.0.1:<port> (a FreePort() when port is 0) and
  // --metrics-listen=127.0.0.1:<another FreePort()>, and `env` ("NAME=value")
  // added to the environment; waits up to `timeout` until the port accepts a
  // TCP connection. If the process exits or the wait times out, returns an
  // error carrying its log. `args` must not set --listen or --metrics-listen.
  static absl::StatusOr<std::unique_ptr<SidecarProcess>> Start(
      const std::string& binary, const std::vector<std::string>& args,
      int port = 0, const std::vector<std::string>& env = {},
      absl::Duration timeout = absl::Seconds(20));

  SidecarProcess(const SidecarProcess&) = delete;
  SidecarProcess& operator=(const SidecarProcess&) = delete;
  // Kills the process (SIGKILL) and removes the log directory.
  ~SidecarProcess();

  // Returns "127.0.0.1:<port>", the gRPC address.
  std::string Address() const;
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  // Returns the pid of the current process.
  pid_t pid() const { return process_->pid(); }
  // Returns true iff the process has not exited.
  bool Running() { return process_->Running(); }

  // Returns the log of every run so far (stdout and stderr).
  std::string Log() const;

  // Kills the process with SIGKILL and reaps it.
  absl::Status Kill();

  // Sends SIGTERM (and SIGCONT, should it be paused) and waits up to
  // `timeout` for the exit; returns the exit code (128 + signal if a signal
  // ended it). After the timeout the process is SIGKILLed and
  // DEADLINE_EXCEEDED returned.
  absl::StatusOr<int> Terminate(absl::Duration timeout = absl::Seconds(30));

  // Sends SIGSTOP (Pause) or SIGCONT (Resume) to the process.
  absl::Status Pause();
  absl::Status Resume();

  // Starts the exited process again with the same arguments and ports and
  // waits as Start does.
  absl::Status StartAgain();

 private:
  SidecarProcess(std::string binary, std::vector<std::string> args,
                 std::vector<std::string> env, std::string dir, int port,
                 int metrics_port, absl::Duration timeout);

  absl::Status Spawn();

  const std::string binary_;
  const std::vector<std::string> args_;
  const std::vector<std::string> env_;
  const std::string dir_;
  const std::string log_path_;
  const int port_;
  const int metrics_port_;
  const absl::Duration timeout_;
  std::unique_ptr<Process> process_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_SIDECAR_PROCESS_H_
