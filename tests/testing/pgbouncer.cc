#include "tests/testing/pgbouncer.h"

#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/files.h"
#include "tests/testing/ports.h"

namespace idem::testing {
namespace {

constexpr char kOwner[] = "postgres";

std::string Binary() {
  return access("/usr/sbin/pgbouncer", X_OK) == 0 ? "/usr/sbin/pgbouncer"
                                                  : "pgbouncer";
}

std::string Runuser() {
  for (const char* path : {"/usr/sbin/runuser", "/sbin/runuser"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "runuser";
}

}  // namespace

bool UsePgBouncer() {
  const char* env = std::getenv("IDEM_TEST_PGBOUNCER");
  return env != nullptr && std::string(env) == "1";
}

absl::StatusOr<std::unique_ptr<PgBouncer>> PgBouncer::Start(
    const PgCluster& pg, int server_connections) {
  absl::StatusOr<std::string> dir = MakeTempDir("idem-pgbouncer-");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<PgBouncer> bouncer(new PgBouncer(*dir, FreePort()));
  const std::string ini = *dir + "/pgbouncer.ini";
  const std::string users = *dir + "/userlist.txt";
  std::ofstream(users) << "\"postgres\" \"\"\n";
  std::ofstream conf(ini);
  conf << "[databases]\n"
       << "* = host=127.0.0.1 port=" << pg.port() << "\n"
       << "[pgbouncer]\n"
       << "listen_addr = 127.0.0.1\n"
       << "listen_port = " << bouncer->port_ << "\n"
       << "unix_socket_dir =\n"
       << "auth_type = trust\n"
       << "auth_file = " << users << "\n"
       << "pool_mode = transaction\n"
       << "default_pool_size = " << server_connections << "\n"
       << "max_client_conn = 1000\n"
       // Back soon after PostgreSQL restarts (the default waits 15 s).
       << "server_login_retry = 1\n"
       << "log_connections = 0\n"
       << "log_disconnections = 0\n";
  conf.close();
  if (!conf) {
    return absl::InternalError(absl::StrCat("cannot write ", ini));
  }
  std::vector<std::string> argv = {Binary(), ini};
  if (geteuid() == 0) {
    passwd* pw = getpwnam(kOwner);
    if (pw == nullptr) {
      return absl::FailedPreconditionError(
          "running as root needs a 'postgres' user to run PgBouncer");
    }
    for (const std::string& path : {*dir, ini, users}) {
      if (chown(path.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
        return absl::InternalError(
            absl::StrCat("chown ", path, ": ", std::strerror(errno)));
      }
    }
    argv.insert(argv.begin(), {Runuser(), "-u", kOwner, "--"});
  }
  const std::string log_path = *dir + "/log";
  absl::StatusOr<std::unique_ptr<Process>> process =
      Process::Spawn(argv, {}, log_path, *dir);
  if (!process.ok()) return process.status();
  bouncer->process_ = *std::move(process);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!PortAcceptsConnections(bouncer->port_)) {
    if (!bouncer->process_->Running() || absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "pgbouncer on port ", bouncer->port_, " did not start\n--- log (",
          log_path, ") ---\n", ReadFileTail(log_path)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return bouncer;
}

PgBouncer::~PgBouncer() {
  process_.reset();  // SIGKILLs and reaps.
  RemoveTempDir(dir_);
}

std::string PgBouncer::ConnInfo(const std::string& dbname) const {
  return absl::StrCat("host=127.0.0.1 port=", port_,
                      " user=postgres dbname=", dbname);
}

std::string PgBouncer::Log() const { return ReadFile(dir_ + "/log"); }

}  // namespace idem::testing
