#include "tests/testing/sidecar_process.h"

#include <signal.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/files.h"
#include "tests/testing/ports.h"

namespace idem::testing {

SidecarProcess::SidecarProcess(std::string binary,
                               std::vector<std::string> args,
                               std::vector<std::string> env, std::string dir,
                               int port, int metrics_port,
                               absl::Duration timeout)
    : binary_(std::move(binary)),
      args_(std::move(args)),
      env_(std::move(env)),
      dir_(std::move(dir)),
      log_path_(dir_ + "/log"),
      port_(port),
      metrics_port_(metrics_port),
      timeout_(timeout) {}

absl::StatusOr<std::unique_ptr<SidecarProcess>> SidecarProcess::Start(
    const std::string& binary, const std::vector<std::string>& args, int port,
    const std::vector<std::string>& env, absl::Duration timeout) {
  for (const std::string& arg : args) {
    if (arg == "--listen" || absl::StartsWith(arg, "--listen=") ||
        arg == "--metrics-listen" ||
        absl::StartsWith(arg, "--metrics-listen=")) {
      return absl::InvalidArgumentError(
          absl::StrCat("SidecarProcess sets ", arg.substr(0, arg.find('=')),
                       " itself; pass the port instead"));
    }
  }
  absl::StatusOr<std::string> dir = MakeTempDir("idem-sidecar-");
  if (!dir.ok()) return dir.status();
  const int listen_port = port != 0 ? port : FreePort();
  int metrics_port = FreePort();
  while (metrics_port == listen_port) metrics_port = FreePort();
  std::unique_ptr<SidecarProcess> sidecar(new SidecarProcess(
      binary, args, env, *dir, listen_port, metrics_port, timeout));
  absl::Status s = sidecar->Spawn();
  if (!s.ok()) return s;
  return sidecar;
}

SidecarProcess::~SidecarProcess() {
  process_.reset();  // SIGKILLs and reaps.
  RemoveTempDir(dir_);
}

std::string SidecarProcess::Address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

std::string SidecarProcess::Log() const { return ReadFile(log_path_); }

absl::Status SidecarProcess::Spawn() {
  if (process_ != nullptr && process_->Running()) {
    return absl::FailedPreconditionError(
        absl::StrCat("sidecar on port ", port_, " is still running"));
  }
  std::vector<std::string> argv = {binary_};
  argv.insert(argv.end(), args_.begin(), args_.end());
  argv.push_back(absl::StrCat("--listen=127.0.0.1:", port_));
  argv.push_back(absl::StrCat("--metrics-listen=127.0.0.1:", metrics_port_));
  absl::StatusOr<std::unique_ptr<Process>> process =
      Process::Spawn(argv, env_, log_path_);
  if (!process.ok()) return process.status();
  process_ = *std::move(process);

  const absl::Time deadline = absl::Now() + timeout_;
  while (!PortAcceptsConnections(port_)) {
    if (!process_->Running()) {
      absl::StatusOr<int> code = process_->Wait();
      return absl::UnavailableError(absl::StrCat(
          "sidecar exited during start-up with code ", code.value_or(-1), ": `",
          CommandLine(argv), "`\n--- log (", log_path_, ") ---\n",
          ReadFileTail(log_path_)));
    }
    if (absl::Now() >= deadline) {
      process_->Kill().IgnoreError();
      return absl::DeadlineExceededError(absl::StrCat(
          "sidecar did not accept connections on ", Address(), " within ",
          absl::FormatDuration(timeout_), ": `", CommandLine(argv),
          "`\n--- log (", log_path_, ") ---\n", ReadFileTail(log_path_)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

absl::Status SidecarProcess::Kill() { return process_->Kill(SIGKILL).status(); }

absl::StatusOr<int> SidecarProcess::Terminate(absl::Duration timeout) {
  absl::Status s = process_->Signal(SIGTERM);
  if (!s.ok()) return s;
  process_->Signal(SIGCONT).IgnoreError();  // In case it was paused.
  absl::StatusOr<int> code = process_->Wait(timeout);
  if (!code.ok()) {
    process_->Kill(SIGKILL).IgnoreError();
    return absl::DeadlineExceededError(absl::StrCat(
        "sidecar ignored SIGTERM for ", absl::FormatDuration(timeout),
        " and was killed\n--- log ---\n", ReadFileTail(log_path_)));
  }
  return code;
}

absl::Status SidecarProcess::Pause() { return process_->Signal(SIGSTOP); }

absl::Status SidecarProcess::Resume() { return process_->Signal(SIGCONT); }

absl::Status SidecarProcess::StartAgain() { return Spawn(); }

}  // namespace idem::testing
