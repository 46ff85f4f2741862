#ifndef IDEM_TESTS_TESTING_PROCESS_H_
#define IDEM_TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <csignal>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace idem::testing {

// A child process in its own process group whose stdout and stderr are
// appended to a log file. The destructor SIGKILLs the whole group and reaps
// the child. Thread-safe.
class Process {
 public:
  // Starts argv[0] (searched in PATH when it has no '/') with argv, the
  // current environment plus `env` ("NAME=value", overriding same names),
  // stdin from /dev/null, stdout+stderr appended to `log_path` (created if
  // missing), in directory `cwd` (empty: the current one).
  static absl::StatusOr<std::unique_ptr<Process>> Spawn(
      const std::vector<std::string>& argv, const std::vector<std::string>& env,
      const std::string& log_path, const std::string& cwd = "");

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();

  // Returns the child's pid (also its process group id).
  pid_t pid() const { return pid_; }

  // Returns the path of the log file given to Spawn.
  const std::string& log_path() const { return log_path_; }

  // Returns the content of the log file.
  std::string Log() const;

  // Returns true iff the child has not exited yet (reaps it if it has).
  bool Running();

  // Sends `sig` to the child only; FAILED_PRECONDITION if it has exited.
  absl::Status Signal(int sig);

  // Sends `sig` to every process of the child's process group.
  absl::Status SignalGroup(int sig);

  // Sends `sig` to the process group, then waits like Wait(timeout).
  absl::StatusOr<int> Kill(int sig = SIGKILL,
                           absl::Duration timeout = absl::Seconds(30));

  // Waits for the child to exit and returns its exit code, or 128 + the
  // signal number if a signal ended it (-1 if the status was lost);
  // DEADLINE_EXCEEDED if it is still running after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout = absl::InfiniteDuration());

 private:
  Process(pid_t pid, std::string log_path)
      : pid_(pid), log_path_(std::move(log_path)) {}

  // Reaps the child if it has exited; returns true iff it has.
  bool PollLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const pid_t pid_;
  const std::string log_path_;
  absl::Mutex mu_;
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
  int exit_code_ ABSL_GUARDED_BY(mu_) = -1;
};

// Options for RunCommand.
struct RunOptions {
  // Added to the current environment, "NAME=value".
  std::vector<std::string> env;
  // Working directory of the command; empty: the current one.
  std::string cwd;
  // The command (and its process group) is SIGKILLed after this long.
  absl::Duration timeout = absl::Minutes(2);
};

// Runs argv to completion (stdin from /dev/null) and returns its stdout; an
// error naming the command, its exit code and its stderr if it cannot be
// started or exits non-zero (UNKNOWN), or DEADLINE_EXCEEDED on timeout.
absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv,
                                       const RunOptions& options = {});

// Returns argv joined with spaces, for messages.
std::string CommandLine(const std::vector<std::string>& argv);

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_PROCESS_H_
