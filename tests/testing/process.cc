#include "tests/testing/process.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/testing/files.h"

extern char** environ;

namespace idem::testing {
namespace {

// Where the child's stdout and stderr go: a file appended to, or two fds.
struct Output {
  std::string log_path;
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// Returns the current environment with `additions` replacing same names.
std::vector<std::string> MergedEnvironment(
    const std::vector<std::string>& additions) {
  std::vector<std::string> result;
  auto name_of = [](const std::string& entry) {
    return entry.substr(0, entry.find('='));
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    bool overridden = false;
    for (const std::string& add : additions) {
      if (name_of(add) == name_of(entry)) overridden = true;
    }
    if (!overridden) result.push_back(std::move(entry));
  }
  result.insert(result.end(), additions.begin(), additions.end());
  return result;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> result;
  result.reserve(strings.size() + 1);
  for (std::string& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

int ExitCode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

// Starts argv in a new process group with default signal dispositions, an
// empty signal mask, stdin from /dev/null and no inherited fds but 0-2.
absl::StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env,
                                 const std::string& cwd, const Output& out) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  std::vector<std::string> args = argv;
  std::vector<std::string> envs = MergedEnvironment(env);
  std::vector<char*> c_args = CStrings(args);
  std::vector<char*> c_envs = CStrings(envs);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                   O_RDONLY, 0);
  if (!out.log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO,
                                     out.log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  } else {
    posix_spawn_file_actions_adddup2(&actions, out.stdout_fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out.stderr_fd, STDERR_FILENO);
  }
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  if (!cwd.empty()) {
    posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  }
  sigset_t empty_mask;
  sigemptyset(&empty_mask);
  sigset_t all_signals;
  sigfillset(&all_signals);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP |
                                      POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &empty_mask);
  posix_spawnattr_setsigdefault(&attr, &all_signals);

  pid_t pid = -1;
  int rc = posix_spawnp(&pid, c_args[0], &actions, &attr, c_args.data(),
                        c_envs.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot start `", CommandLine(argv), "`: ", std::strerror(rc)));
  }
  return pid;
}

}  // namespace

std::string CommandLine(const std::vector<std::string>& argv) {
  return absl::StrJoin(argv, " ");
}

absl::StatusOr<std::unique_ptr<Process>> Process::Spawn(
    const std::vector<std::string>& argv, const std::vector<std::string>& env,
    const std::string& log_path, const std::string& cwd) {
  if (log_path.empty()) return absl::InvalidArgumentError("empty log_path");
  Output out;
  out.log_path = log_path;
  absl::StatusOr<pid_t> pid = SpawnChild(argv, env, cwd, out);
  if (!pid.ok()) return pid.status();
  return std::unique_ptr<Process>(new Process(*pid, log_path));
}

Process::~Process() {
  // The group outlives the leader while any member lives, so its id cannot
  // have been reused: this also kills grandchildren of an exited child.
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  Wait().IgnoreError();
}

std::string Process::Log() const { return ReadFile(log_path_); }

bool Process::PollLocked() {
  if (exited_) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    exited_ = true;
    exit_code_ = ExitCode(status);
  } else if (r < 0) {
    // ECHILD: someone else reaped it (e.g. SIGCHLD is ignored).
    exited_ = true;
    exit_code_ = -1;
  }
  return exited_;
}

bool Process::Running() {
  absl::MutexLock lock(&mu_);
  return !PollLocked();
}

absl::Status Process::Signal(int sig) {
  absl::MutexLock lock(&mu_);
  if (PollLocked()) {
    return absl::FailedPreconditionError(
        absl::StrCat("process ", pid_, " has exited with ", exit_code_));
  }
  if (kill(pid_, sig) != 0) {
    return absl::InternalError(
        absl::StrCat("kill(", pid_, ", ", sig, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status Process::SignalGroup(int sig) {
  absl::MutexLock lock(&mu_);
  if (kill(-pid_, sig) != 0) {
    if (errno == ESRCH) {
      return absl::FailedPreconditionError(
          absl::StrCat("process group ", pid_, " has no process left"));
    }
    return absl::InternalError(
        absl::StrCat("kill(-", pid_, ", ", sig, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Process::Kill(int sig, absl::Duration timeout) {
  absl::Status s = SignalGroup(sig);
  if (!s.ok() && !absl::IsFailedPrecondition(s)) return s;
  return Wait(timeout);
}

absl::StatusOr<int> Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (PollLocked()) return exit_code_;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running after ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv,
                                       const RunOptions& options) {
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  Output out;
  out.stdout_fd = out_pipe[1];
  out.stderr_fd = err_pipe[1];
  absl::StatusOr<pid_t> spawned =
      SpawnChild(argv, options.env, options.cwd, out);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (!spawned.ok()) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    return spawned.status();
  }
  const pid_t pid = *spawned;
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);

  std::string captured[2];
  int fds[2] = {out_pipe[0], err_pipe[0]};
  bool open[2] = {true, true};
  auto drain = [&](int i) {
    char buf[8192];
    while (open[i]) {
      ssize_t n = read(fds[i], buf, sizeof(buf));
      if (n > 0) {
        captured[i].append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        open[i] = false;
      } else if (errno != EINTR) {
        break;  // EAGAIN: nothing more for now.
      }
    }
  };

  const absl::Time deadline = absl::Now() + options.timeout;
  bool timed_out = false;
  int wait_status = 0;
  bool exited = false;
  while (!exited) {
    pollfd pfds[2];
    int n = 0;
    for (int i = 0; i < 2; ++i) {
      if (open[i]) pfds[n++] = pollfd{fds[i], POLLIN, 0};
    }
    if (n > 0) {
      poll(pfds, static_cast<nfds_t>(n), 20);
    } else {
      absl::SleepFor(absl::Milliseconds(2));
    }
    drain(0);
    drain(1);
    // The child may leave descendants holding the pipes (a daemon), so its
    // exit, not EOF, ends the command.
    pid_t r = waitpid(pid, &wait_status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) {
      exited = true;
      if (r < 0) wait_status = -1;
    } else if (absl::Now() >= deadline) {
      timed_out = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &wait_status, 0);
      exited = true;
    }
  }
  drain(0);
  drain(1);
  close(fds[0]);
  close(fds[1]);

  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("`", CommandLine(argv), "` did not finish within ",
                     absl::FormatDuration(options.timeout),
                     "; stderr: ", captured[1], "; stdout: ", captured[0]));
  }
  const int code = wait_status == -1 ? -1 : ExitCode(wait_status);
  if (code != 0) {
    return absl::UnknownError(
        absl::StrCat("`", CommandLine(argv), "` exited with code ", code,
                     "; stderr: ", captured[1], "; stdout: ", captured[0]));
  }
  return captured[0];
}

}  // namespace idem::testing
