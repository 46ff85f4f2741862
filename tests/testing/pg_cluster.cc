#include "tests/testing/pg_cluster.h"

#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tests/testing/files.h"
#include "tests/testing/ports.h"
#include "tests/testing/process.h"

namespace idem::testing {
namespace {

constexpr char kOwner[] = "postgres";

bool IsRoot() { return geteuid() == 0; }

// Returns the directory holding initdb and pg_ctl, or "" to use PATH.
std::string FindBinDir() {
  const char* env = std::getenv("IDEM_PG_BINDIR");
  if (env != nullptr && env[0] != '\0') return env;
  namespace fs = std::filesystem;
  std::error_code ec;
  int best_version = -1;
  std::string best;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    int version;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &version)) {
      continue;
    }
    fs::path bin = entry.path() / "bin";
    if (version > best_version && fs::exists(bin / "initdb", ec)) {
      best_version = version;
      best = bin.string();
    }
  }
  return best;
}

std::string Runuser() {
  for (const char* path : {"/usr/sbin/runuser", "/sbin/runuser"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "runuser";
}

// Returns the pids whose parent is `parent`, read from /proc.
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> result;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    int pid;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    // "pid (comm) state ppid ...": comm may contain spaces and parentheses.
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields =
        absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
    int ppid;
    if (fields.size() > 1 && absl::SimpleAtoi(fields[1], &ppid) &&
        ppid == parent) {
      result.push_back(pid);
    }
  }
  return result;
}

// Whether `pid` runs (a zombie, dead but not yet reaped, does not).
bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ||
         stat[close + 2] != 'Z';
}

absl::Status WithLog(const absl::Status& s, const std::string& log_path) {
  return absl::Status(
      s.code(), absl::StrCat(s.message(), "\n--- PostgreSQL log (", log_path,
                             ") ---\n", ReadFileTail(log_path)));
}

}  // namespace

PgCluster::PgCluster(std::string bindir, std::string dir, int port)
    : bindir_(std::move(bindir)),
      dir_(std::move(dir)),
      data_dir_(dir_ + "/data"),
      log_path_(dir_ + "/log"),
      port_(port) {}

std::string PgCluster::BinDir() { return FindBinDir(); }

absl::StatusOr<std::unique_ptr<PgCluster>> PgCluster::Start(
    const std::vector<std::string>& settings) {
  if (IsRoot() && getpwnam(kOwner) == nullptr) {
    return absl::FailedPreconditionError(
        "running as root needs a 'postgres' user to run PostgreSQL (the "
        "postgresql package creates it)");
  }
  absl::StatusOr<std::string> dir = MakeTempDir("idem-pg-");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<PgCluster> cluster(
      new PgCluster(FindBinDir(), *dir, FreePort()));
  absl::Status s = cluster->InitDb(settings);
  if (!s.ok()) return s;
  s = cluster->PgCtlStart();
  if (!s.ok()) return s;
  return cluster;
}

absl::StatusOr<std::unique_ptr<PgCluster>> PgCluster::StartStandby(
    const PgCluster& primary) {
  absl::StatusOr<std::string> dir = MakeTempDir("idem-pg-standby-");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<PgCluster> cluster(
      new PgCluster(primary.bindir_, *dir, FreePort()));
  absl::Status s = cluster->BaseBackup(primary);
  if (!s.ok()) return s;
  s = cluster->PgCtlStart();
  if (!s.ok()) return s;
  return cluster;
}

PgCluster::~PgCluster() {
  if (!paused_.empty()) Resume().IgnoreError();
  absl::StatusOr<pid_t> pid = PostmasterPid();
  if (running_ || (pid.ok() && kill(*pid, 0) == 0)) {
    if (!PgCtlStop("immediate").ok()) SignalAll(SIGKILL).IgnoreError();
  }
  RemoveTempDir(dir_);
}

std::vector<std::string> PgCluster::AsOwner(const std::string& bin) const {
  std::string path = bindir_.empty() ? bin : absl::StrCat(bindir_, "/", bin);
  if (!IsRoot()) return {path};
  return {Runuser(), "-u", kOwner, "--", path};
}

absl::Status PgCluster::ChownDir() {
  if (IsRoot()) {
    passwd* pw = getpwnam(kOwner);
    if (pw == nullptr || chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
      return absl::InternalError(absl::StrCat("chown ", dir_, " to ", kOwner,
                                              ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status PgCluster::BaseBackup(const PgCluster& primary) {
  absl::Status s = ChownDir();
  if (!s.ok()) return s;
  std::vector<std::string> argv = AsOwner("pg_basebackup");
  argv.insert(
      argv.end(),
      {"-h", "127.0.0.1", "-p", std::to_string(primary.port_), "-U", "postgres",
       "-D", data_dir_, "-R", "-X", "stream", "-c", "fast", "--no-sync"});
  RunOptions options;
  options.env = {"LC_ALL=C", "PGCONNECT_TIMEOUT=10"};
  options.cwd = dir_;
  options.timeout = absl::Seconds(60);
  absl::StatusOr<std::string> out = RunCommand(argv, options);
  if (!out.ok()) return out.status();
  // The primary's settings came along; later lines win.
  std::ofstream conf(data_dir_ + "/postgresql.conf", std::ios::app);
  conf << "\n# Added by idem::testing::PgCluster (standby).\n"
       << "port = " << port_ << "\n"
       << "unix_socket_directories = '" << dir_ << "'\n";
  conf.close();
  if (!conf) {
    return absl::InternalError(
        absl::StrCat("cannot append to ", data_dir_, "/postgresql.conf"));
  }
  return absl::OkStatus();
}

absl::Status PgCluster::InitDb(const std::vector<std::string>& settings) {
  absl::Status s = ChownDir();
  if (!s.ok()) return s;
  std::vector<std::string> argv = AsOwner("initdb");
  argv.insert(argv.end(),
              {"-D", data_dir_, "-U", "postgres", "-A", "trust", "-E", "UTF8",
               "--locale=C", "--no-sync", "--no-instructions"});
  RunOptions options;
  options.env = {"LC_ALL=C"};
  options.cwd = dir_;
  absl::StatusOr<std::string> out = RunCommand(argv, options);
  if (!out.ok()) return out.status();

  std::ofstream conf(data_dir_ + "/postgresql.conf", std::ios::app);
  conf << "\n# Added by idem::testing::PgCluster.\n"
       << "port = " << port_ << "\n"
       << "listen_addresses = '127.0.0.1'\n"
       << "unix_socket_directories = '" << dir_ << "'\n"
       << "max_connections = 200\n"
       << "shared_buffers = 32MB\n"
       << "fsync = on\n"
       << "synchronous_commit = on\n"
       << "full_page_writes = on\n"
       << "log_line_prefix = '%m [%p] %q%u@%d '\n";
  for (const std::string& line : settings) conf << line << "\n";
  conf.close();
  if (!conf) {
    return absl::InternalError(
        absl::StrCat("cannot append to ", data_dir_, "/postgresql.conf"));
  }
  return absl::OkStatus();
}

absl::Status PgCluster::PgCtlStart() {
  std::vector<std::string> argv = AsOwner("pg_ctl");
  argv.insert(argv.end(), {"-D", data_dir_, "-l", log_path_, "-w", "-t", "30",
                           "-s", "start"});
  RunOptions options;
  options.env = {"LC_ALL=C"};
  options.cwd = dir_;
  options.timeout = absl::Seconds(45);
  absl::StatusOr<std::string> out = RunCommand(argv, options);
  if (!out.ok()) return WithLog(out.status(), log_path_);
  running_ = true;
  absl::Status s = WaitReady(absl::Seconds(30));
  if (!s.ok()) return WithLog(s, log_path_);
  return absl::OkStatus();
}

absl::Status PgCluster::PgCtlStop(const std::string& mode) {
  if (!paused_.empty()) {
    absl::Status s = Resume();
    if (!s.ok()) return s;
  }
  std::vector<std::string> argv = AsOwner("pg_ctl");
  argv.insert(argv.end(),
              {"-D", data_dir_, "-m", mode, "-w", "-t", "60", "-s", "stop"});
  RunOptions options;
  options.cwd = dir_;
  options.timeout = absl::Seconds(75);
  absl::StatusOr<std::string> out = RunCommand(argv, options);
  if (!out.ok()) return WithLog(out.status(), log_path_);
  running_ = false;
  return absl::OkStatus();
}

absl::Status PgCluster::WaitReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> out = Psql("SELECT 1", absl::Seconds(5));
    if (out.ok()) return absl::OkStatus();
    last = out.status();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("PostgreSQL on port ", port_, " not ready within ",
                   absl::FormatDuration(timeout), ": ", last.message()));
}

std::string PgCluster::ConnInfo(const std::string& dbname) const {
  return absl::StrCat("host=127.0.0.1 port=", port_,
                      " user=postgres dbname=", dbname);
}

std::string PgCluster::Log() const { return ReadFile(log_path_); }

absl::Status PgCluster::Stop() { return PgCtlStop("fast"); }

absl::Status PgCluster::StopImmediate() { return PgCtlStop("immediate"); }

absl::Status PgCluster::StartAgain() { return PgCtlStart(); }

absl::StatusOr<pid_t> PgCluster::PostmasterPid() const {
  std::string content = ReadFile(data_dir_ + "/postmaster.pid");
  std::string first_line = content.substr(0, content.find('\n'));
  int pid;
  if (!absl::SimpleAtoi(first_line, &pid) || pid <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no running postmaster for ", data_dir_));
  }
  return pid;
}

absl::Status PgCluster::SignalAll(int sig) {
  absl::StatusOr<pid_t> postmaster = PostmasterPid();
  if (!postmaster.ok()) return postmaster.status();
  if (kill(*postmaster, sig) != 0) {
    return absl::InternalError(absl::StrCat("kill(", *postmaster, ", ", sig,
                                            "): ", std::strerror(errno)));
  }
  for (pid_t child : ChildrenOf(*postmaster)) kill(child, sig);
  return absl::OkStatus();
}

absl::Status PgCluster::Kill() {
  absl::StatusOr<pid_t> postmaster = PostmasterPid();
  if (!postmaster.ok()) return postmaster.status();
  // The children are listed first: once the postmaster is gone they belong
  // to init.
  const std::vector<pid_t> children = ChildrenOf(*postmaster);
  if (kill(*postmaster, SIGKILL) != 0) {
    return absl::InternalError(absl::StrCat(
        "kill(", *postmaster, ", SIGKILL): ", std::strerror(errno)));
  }
  for (pid_t child : children) kill(child, SIGKILL);
  running_ = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Alive(*postmaster)) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "postmaster ", *postmaster, " still there 10 s after SIGKILL"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::OkStatus();
}

absl::Status PgCluster::Promote() {
  std::vector<std::string> argv = AsOwner("pg_ctl");
  argv.insert(argv.end(), {"-D", data_dir_, "-w", "-t", "60", "-s", "promote"});
  RunOptions options;
  options.cwd = dir_;
  options.timeout = absl::Seconds(75);
  absl::StatusOr<std::string> out = RunCommand(argv, options);
  if (!out.ok()) return WithLog(out.status(), log_path_);
  absl::StatusOr<std::string> recovery =
      Psql("SELECT pg_is_in_recovery()", absl::Seconds(10));
  if (!recovery.ok()) return recovery.status();
  if (*recovery != "f") {
    return absl::InternalError("still in recovery after pg_ctl promote");
  }
  return absl::OkStatus();
}

absl::Status PgCluster::Pause() {
  if (!paused_.empty()) return absl::FailedPreconditionError("already paused");
  absl::StatusOr<pid_t> postmaster = PostmasterPid();
  if (!postmaster.ok()) return postmaster.status();
  // The postmaster first, so that it forks no child after the listing.
  if (kill(*postmaster, SIGSTOP) != 0) {
    return absl::InternalError(absl::StrCat(
        "kill(", *postmaster, ", SIGSTOP): ", std::strerror(errno)));
  }
  paused_.push_back(*postmaster);
  for (pid_t child : ChildrenOf(*postmaster)) {
    if (kill(child, SIGSTOP) == 0) paused_.push_back(child);
  }
  return absl::OkStatus();
}

absl::Status PgCluster::Resume() {
  if (paused_.empty()) return absl::FailedPreconditionError("not paused");
  // Children first: the postmaster finds them running when it wakes.
  for (auto it = paused_.rbegin(); it != paused_.rend(); ++it) {
    kill(*it, SIGCONT);
  }
  paused_.clear();
  return absl::OkStatus();
}

bool PgCluster::Ready(absl::Duration timeout) const {
  return Psql("SELECT 1", timeout).ok();
}

absl::StatusOr<std::string> PgCluster::Psql(const std::string& sql,
                                            absl::Duration timeout,
                                            const std::string& dbname) const {
  std::string psql = bindir_.empty() ? "psql" : bindir_ + "/psql";
  RunOptions options;
  options.timeout = timeout;
  options.env = {
      "PGCONNECT_TIMEOUT=" +
          std::to_string(std::max<int64_t>(
              2, absl::ToInt64Seconds(std::min(timeout, absl::Seconds(30))))),
      "PGOPTIONS=", "PGPASSWORD=", "PGSSLMODE=disable", "LC_ALL=C"};
  absl::StatusOr<std::string> out = RunCommand(
      {psql, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
       "-p", std::to_string(port_), "-U", "postgres", "-d", dbname, "-c", sql},
      options);
  if (!out.ok()) return out.status();
  std::string result = *std::move(out);
  while (!result.empty() && result.back() == '\n') result.pop_back();
  return result;
}

}  // namespace idem::testing
