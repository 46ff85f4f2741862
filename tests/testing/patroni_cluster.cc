#include "tests/testing/patroni_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/testing/files.h"
#include "tests/testing/pg_cluster.h"
#include "tests/testing/ports.h"

namespace idem::testing {
namespace {

constexpr char kOwner[] = "postgres";
constexpr char kScope[] = "idem-test";

bool IsRoot() { return geteuid() == 0; }

// Returns the path of `name` in PATH, or "".
std::string InPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string Runuser() {
  for (const char* path : {"/usr/sbin/runuser", "/sbin/runuser"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "runuser";
}

absl::Status ChownToOwner(const std::string& path) {
  if (!IsRoot()) return absl::OkStatus();
  passwd* pw = getpwnam(kOwner);
  if (pw == nullptr || chown(path.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
    return absl::InternalError(absl::StrCat("chown ", path, " to ", kOwner,
                                            ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The postmaster pid in `data_dir`/postmaster.pid, or 0.
pid_t PostmasterPid(const std::string& data_dir) {
  const std::string content = ReadFile(data_dir + "/postmaster.pid");
  int pid = 0;
  if (!absl::SimpleAtoi(content.substr(0, content.find('\n')), &pid)) return 0;
  return pid;
}

// Whether `pid` runs (a zombie does not).
bool Alive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ||
         stat[close + 2] != 'Z';
}

}  // namespace

absl::StatusOr<std::unique_ptr<PatroniCluster>> PatroniCluster::Start(
    const Options& options, absl::Duration timeout) {
  for (const char* bin : {"etcd", "patroni"}) {
    if (InPath(bin).empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(bin,
                       " is not installed (Debian: apt-get install etcd-server "
                       "patroni; scripts/deps.sh lists them)"));
    }
  }
  if (IsRoot() && getpwnam(kOwner) == nullptr) {
    return absl::FailedPreconditionError(
        "running as root needs a 'postgres' user to run PostgreSQL (the "
        "postgresql package creates it)");
  }
  absl::StatusOr<std::string> dir = MakeTempDir("idem-patroni-");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<PatroniCluster> c(new PatroniCluster(options, *dir));
  c->bindir_ = PgCluster::BinDir();
  if (c->bindir_.empty()) {
    return absl::FailedPreconditionError(
        "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin");
  }
  absl::Status s = ChownToOwner(c->dir_);
  if (!s.ok()) return s;
  s = c->StartEtcd();
  if (!s.ok()) return s;
  for (int i = 0; i < options.nodes; ++i) {
    Node node;
    node.name = absl::StrCat("node", i);
    node.dir = absl::StrCat(c->dir_, "/", node.name);
    node.data_dir = node.dir + "/data";
    node.config_path = node.dir + "/patroni.yml";
    node.pg_port = FreePort();
    node.rest_port = FreePort();
    std::error_code ec;
    std::filesystem::create_directory(node.dir, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("mkdir ", node.dir, ": ", ec.message()));
    }
    std::filesystem::permissions(node.dir, std::filesystem::perms::owner_all,
                                 ec);
    s = ChownToOwner(node.dir);
    if (!s.ok()) return s;
    s = c->WriteConfig(node);
    if (!s.ok()) return s;
    c->nodes_.push_back(std::move(node));
  }
  // All at once, as a user's service manager starts them: the first to take
  // the initialize key in etcd runs initdb, the others clone it.
  for (Node& node : c->nodes_) {
    std::vector<std::string> argv = {"patroni", node.config_path};
    if (IsRoot()) argv.insert(argv.begin(), {Runuser(), "-u", kOwner, "--"});
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(
        argv, {"LC_ALL=C.UTF-8"}, node.dir + "/patroni.log", node.dir);
    if (!p.ok()) return p.status();
    node.patroni = *std::move(p);
  }
  s = c->WaitHealthy(timeout);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), c->Logs()));
  }
  return c;
}

absl::Status PatroniCluster::StartEtcd() {
  etcd_port_ = FreePort();
  const std::string client = absl::StrCat("http://127.0.0.1:", etcd_port_);
  const std::string peer = absl::StrCat("http://127.0.0.1:", FreePort());
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(
      {"etcd", "--name=etcd", "--data-dir=" + dir_ + "/etcd",
       "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
       "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
       "--initial-cluster=etcd=" + peer, "--logger=zap", "--log-level=warn"},
      {}, dir_ + "/etcd.log", dir_);
  if (!p.ok()) return p.status();
  etcd_ = *std::move(p);
  absl::Status s = WaitForPort(etcd_port_, absl::Seconds(30));
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("etcd did not listen: ", s.message(),
                                     "\n--- etcd log ---\n", EtcdLog()));
  }
  return absl::OkStatus();
}

absl::Status PatroniCluster::WriteConfig(const Node& node) const {
  const std::string rest = absl::StrCat("127.0.0.1:", node.rest_port);
  const std::string pg = absl::StrCat("127.0.0.1:", node.pg_port);
  std::ofstream f(node.config_path);
  f << "scope: " << kScope << "\n"
    << "name: " << node.name << "\n"
    << "log:\n  level: INFO\n"
    << "restapi:\n  listen: " << rest << "\n  connect_address: " << rest << "\n"
    << "etcd3:\n  host: 127.0.0.1:" << etcd_port_ << "\n"
    << "bootstrap:\n"
    << "  dcs:\n"
    << "    ttl: " << options_.ttl_s << "\n"
    << "    loop_wait: " << options_.loop_wait_s << "\n"
    << "    retry_timeout: " << options_.retry_timeout_s << "\n"
    << "    maximum_lag_on_failover: 1048576\n"
    << "    synchronous_mode: "
    << (options_.synchronous_mode ? "true" : "false") << "\n"
    << "    postgresql:\n"
    << "      use_pg_rewind: true\n"
    << "      parameters:\n"
    << "        max_connections: 200\n"
    << "        wal_log_hints: 'on'\n"
    << "  initdb:\n"
    << "    - encoding: UTF8\n"
    << "    - locale: C\n"
    << "    - auth: trust\n"
    << "  pg_hba:\n"
    << "    - local all all trust\n"
    << "    - host all all 127.0.0.1/32 trust\n"
    << "    - host replication all 127.0.0.1/32 trust\n"
    << "postgresql:\n"
    << "  listen: " << pg << "\n"
    << "  connect_address: " << pg << "\n"
    << "  data_dir: " << node.data_dir << "\n"
    << "  bin_dir: " << bindir_ << "\n"
    << "  pgpass: " << node.dir << "/pgpass\n"
    << "  authentication:\n"
    << "    superuser: {username: postgres}\n"
    << "    replication: {username: postgres}\n"
    << "    rewind: {username: postgres}\n"
    << "  parameters:\n"
    << "    unix_socket_directories: '" << node.dir << "'\n"
    << "    shared_buffers: 32MB\n"
    << "    log_line_prefix: '%m [%p] %q%u@%d '\n"
    << "watchdog:\n  mode: 'off'\n";
  f.close();
  if (!f) return absl::InternalError("cannot write " + node.config_path);
  return ChownToOwner(node.config_path);
}

PatroniCluster::~PatroniCluster() {
  // The agents first, or they would restart the servers stopped below.
  for (Node& node : nodes_) node.patroni.reset();
  for (Node& node : nodes_) {
    if (!Alive(PostmasterPid(node.data_dir))) continue;
    std::vector<std::string> argv = AsOwner("pg_ctl");
    argv.insert(argv.end(), {"-D", node.data_dir, "-m", "immediate", "-w", "-t",
                             "30", "-s", "stop"});
    RunOptions options;
    options.cwd = node.dir;
    options.timeout = absl::Seconds(45);
    if (!RunCommand(argv, options).ok()) {
      kill(PostmasterPid(node.data_dir), SIGKILL);
    }
  }
  etcd_.reset();
  RemoveTempDir(dir_);
}

std::vector<std::string> PatroniCluster::AsOwner(const std::string& bin) const {
  std::string path = absl::StrCat(bindir_, "/", bin);
  if (!IsRoot()) return {path};
  return {Runuser(), "-u", kOwner, "--", path};
}

std::string PatroniCluster::ConnInfo(const std::string& dbname) const {
  std::string hosts;
  std::string ports;
  for (const Node& node : nodes_) {
    absl::StrAppend(&hosts, hosts.empty() ? "" : ",", "127.0.0.1");
    absl::StrAppend(&ports, ports.empty() ? "" : ",", node.pg_port);
  }
  return absl::StrCat("host=", hosts, " port=", ports,
                      " user=postgres dbname=", dbname,
                      " target_session_attrs=read-write");
}

int PatroniCluster::RestStatus(int i, const std::string& path) const {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  // A stopped agent's kernel still accepts; its answer never comes.
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(nodes_[i].rest_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int code = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    std::string reply;
    char buf[512];
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      // "HTTP/1.0 200 OK\r\n...": the status line is all we need.
      while (reply.find("\r\n") == std::string::npos) {
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        reply.append(buf, static_cast<size_t>(n));
      }
    }
    std::vector<std::string> fields = absl::StrSplit(
        reply.substr(0, reply.find("\r\n")), ' ', absl::SkipEmpty());
    if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &code)) code = 0;
  }
  close(fd);
  return code;
}

absl::StatusOr<int> PatroniCluster::Leader() const {
  for (int i = 0; i < size(); ++i) {
    if (alive(i) && RestStatus(i, "/leader") == 200) return i;
  }
  return absl::NotFoundError("no Patroni node holds the leader lock");
}

absl::StatusOr<int> PatroniCluster::SyncStandby() const {
  for (int i = 0; i < size(); ++i) {
    if (alive(i) && RestStatus(i, "/sync") == 200) return i;
  }
  return absl::NotFoundError("no Patroni node is a synchronous standby");
}

absl::Status PatroniCluster::WaitHealthy(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no leader";
  while (true) {
    for (int i = 0; i < size(); ++i) {
      if (alive(i) && !nodes_[i].patroni->Running()) {
        return absl::InternalError(
            absl::StrCat("Patroni of ", nodes_[i].name, " exited"));
      }
    }
    absl::StatusOr<int> leader = Leader();
    if (leader.ok()) {
      absl::StatusOr<std::string> recovery =
          Psql(*leader, "SELECT pg_is_in_recovery()", absl::Seconds(5));
      if (!recovery.ok() || *recovery != "f") {
        last = absl::StrCat(nodes_[*leader].name,
                            " leads but does not accept writes yet");
      } else if (!options_.synchronous_mode) {
        return absl::OkStatus();
      } else {
        absl::StatusOr<int> sync = SyncStandby();
        absl::StatusOr<std::string> state =
            sync.ok() ? Psql(*leader,
                             absl::StrCat("SELECT count(*) FROM "
                                          "pg_stat_replication WHERE "
                                          "sync_state = 'sync' AND "
                                          "application_name = '",
                                          nodes_[*sync].name, "'"),
                             absl::Seconds(5))
                      : absl::StatusOr<std::string>(sync.status());
        if (state.ok() && *state == "1") return absl::OkStatus();
        last = absl::StrCat(nodes_[*leader].name,
                            " leads, no synchronous standby streams yet");
      }
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("Patroni cluster not healthy within ",
                       absl::FormatDuration(timeout), ": ", last));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::Status PatroniCluster::KillNode(int i) {
  Node& node = nodes_[i];
  if (node.patroni == nullptr) {
    return absl::FailedPreconditionError(node.name + " is already dead");
  }
  const pid_t postmaster = PostmasterPid(node.data_dir);
  // Patroni starts the postmaster in a process group of its own, which
  // every backend inherits: one kill() takes them all at once.
  const pid_t group = postmaster > 0 ? getpgid(postmaster) : -1;
  absl::Status s = node.patroni->SignalGroup(SIGKILL);
  if (group > 1 && group != getpgrp()) {
    kill(-group, SIGKILL);
  } else if (postmaster > 0) {
    kill(postmaster, SIGKILL);
  }
  node.patroni->Wait(absl::Seconds(10)).IgnoreError();
  node.patroni.reset();
  if (!s.ok()) return s;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Alive(postmaster)) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "postmaster ", postmaster, " still there 10 s after SIGKILL"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PatroniCluster::Psql(int i, const std::string& sql,
                                                 absl::Duration timeout) const {
  RunOptions options;
  options.timeout = timeout;
  options.env = {"PGCONNECT_TIMEOUT=5",
                 "PGOPTIONS=", "PGPASSWORD=", "PGSSLMODE=disable", "LC_ALL=C"};
  absl::StatusOr<std::string> out =
      RunCommand({bindir_ + "/psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                  "-h", "127.0.0.1", "-p", std::to_string(nodes_[i].pg_port),
                  "-U", "postgres", "-d", "postgres", "-c", sql},
                 options);
  if (!out.ok()) return out.status();
  std::string result = *std::move(out);
  while (!result.empty() && result.back() == '\n') result.pop_back();
  return result;
}

std::string PatroniCluster::NodeLog(int i) const {
  return ReadFile(nodes_[i].dir + "/patroni.log");
}

std::string PatroniCluster::EtcdLog() const {
  return ReadFile(dir_ + "/etcd.log");
}

std::string PatroniCluster::Logs() const {
  std::string out;
  for (const Node& node : nodes_) {
    absl::StrAppend(&out, "\n--- ", node.name,
                    " (Patroni and PostgreSQL) ---\n",
                    ReadFileTail(node.dir + "/patroni.log", 4000));
  }
  absl::StrAppend(&out, "\n--- etcd ---\n",
                  ReadFileTail(dir_ + "/etcd.log", 2000));
  return out;
}

}  // namespace idem::testing
