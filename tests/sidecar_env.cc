#include "tests/sidecar_env.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace idem::testing {

absl::Status CitusGate() {
  return UseCitus() ? CitusAvailable() : absl::OkStatus();
}

namespace {

class CitusGateEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const absl::Status gate = CitusGate();
    if (gate.ok()) return;
    if (CitusRequired()) FAIL() << gate.message() << " (CI=true)";
    GTEST_SKIP() << "skipped (IDEM_TEST_CITUS=1): " << gate.message();
  }
};

const auto* const kCitusGate =
    ::testing::AddGlobalTestEnvironment(new CitusGateEnvironment());

}  // namespace

absl::StatusOr<std::unique_ptr<SidecarEnv>> SidecarEnv::Start(
    const std::string& binary, int sidecars,
    const std::vector<std::string>& args, const SidecarEnvOptions& options) {
  auto env = std::make_unique<SidecarEnv>();
  if (UseCitus()) {
    absl::StatusOr<std::unique_ptr<CitusCluster>> citus = CitusCluster::Start();
    if (!citus.ok()) return citus.status();
    env->citus_ = *std::move(citus);
  } else {
    absl::StatusOr<std::unique_ptr<PgCluster>> pg = PgCluster::Start();
    if (!pg.ok()) return pg.status();
    env->pg_ = *std::move(pg);
  }
  if (UsePgBouncer()) {
    absl::StatusOr<std::unique_ptr<PgBouncer>> bouncer =
        PgBouncer::Start(env->pg());
    if (!bouncer.ok()) return bouncer.status();
    env->bouncer_ = *std::move(bouncer);
  }
  if (options.redis) {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    if (!redis.ok()) return redis.status();
    env->redis_ = *std::move(redis);
    env->mac_key_file_ = ::testing::TempDir() + "/idem-redis-mac-key-" +
                         std::to_string(getpid());
    std::ofstream(env->mac_key_file_) << kRedisMacKey;
  }
  for (int i = 0; i < sidecars; ++i) {
    std::vector<std::string> a = args;
    const std::vector<std::string> postgres = env->PostgresFlags();
    a.insert(a.end(), postgres.begin(), postgres.end());
    if (env->redis_ != nullptr) {
      a.push_back("--redis=" + env->redis_->Address());
      a.push_back(env->RedisMacKeyFlag());
    }
    if (i == 0) a.emplace_back("--migrate");
    absl::StatusOr<std::unique_ptr<SidecarProcess>> s =
        SidecarProcess::Start(binary, a, 0, options.env);
    if (!s.ok()) return s.status();
    auto channel = grpc::CreateChannel((*s)->Address(),
                                       grpc::InsecureChannelCredentials());
    env->clients_.push_back(pb::Idempotency::NewStub(channel));
    env->admins_.push_back(pb::IdempotencyAdmin::NewStub(channel));
    env->health_.push_back(grpc::health::v1::Health::NewStub(channel));
    env->sidecars_.push_back(*std::move(s));
  }
  // Ready as Kubernetes would see it: the first store ping has answered.
  for (int i = 0; i < sidecars; ++i) {
    if (!WaitForHealth(*env->health_[i],
                       grpc::health::v1::HealthCheckResponse::SERVING,
                       absl::Seconds(15))) {
      return absl::DeadlineExceededError(
          absl::StrCat("sidecar ", i, " not SERVING within 15s\n--- log ---\n",
                       env->sidecars_[i]->Log()));
    }
  }
  return env;
}

std::vector<std::string> SidecarEnv::PostgresFlags() const {
  const PgCluster& pg = citus_ != nullptr ? citus_->coordinator() : *pg_;
  if (bouncer_ == nullptr) return {"--postgres=" + pg.ConnInfo()};
  return {"--postgres=" + bouncer_->ConnInfo(),
          "--postgres-direct=" + pg.ConnInfo(), "--pg-prepared=off"};
}

SidecarEnv::~SidecarEnv() {
  if (!mac_key_file_.empty()) std::remove(mac_key_file_.c_str());
}

void SharedSidecarEnv::SetUp() {
  // CitusGateEnvironment says why.
  if (!CitusGate().ok()) GTEST_SKIP();
  std::vector<std::string> args = args_;
  if (!config_yaml_.empty()) {
    config_path_ = ::testing::TempDir() + "/idem-config-" +
                   std::to_string(getpid()) + ".yaml";
    std::ofstream(config_path_) << config_yaml_;
    args.push_back("--config=" + config_path_);
  }
  absl::StatusOr<std::unique_ptr<SidecarEnv>> e =
      SidecarEnv::Start(IDEM_SIDECAR_PATH, sidecars_, args, options_);
  ASSERT_TRUE(e.ok()) << e.status();
  env_ = *std::move(e);
  *out_ = env_.get();
}

void SharedSidecarEnv::TearDown() {
  *out_ = nullptr;
  // No statement was refused as not supported (SQLSTATE 0A000), which is
  // how Citus answers a statement it cannot run on distributed tables.
  for (int i = 0; env_ != nullptr && i < env_->size(); ++i) {
    const std::string log = env_->sidecar(i).Log();
    EXPECT_FALSE(absl::StrContains(log, "0A000"))
        << "sidecar " << i << " ran a statement PostgreSQL refused:\n"
        << log;
  }
  env_.reset();
  if (!config_path_.empty()) std::remove(config_path_.c_str());
}

std::string SidecarEnv::Sql(const std::string& sql) {
  absl::StatusOr<std::string> out = pg().Psql(sql);
  EXPECT_TRUE(out.ok()) << sql << ": " << out.status();
  return out.ok() ? std::string(absl::StripAsciiWhitespace(*out)) : "";
}

std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

pb::RecordKey Key(const std::string& tenant, const std::string& operation,
                  const std::string& key) {
  pb::RecordKey k;
  k.set_tenant(tenant);
  k.set_operation(operation);
  k.set_key(key);
  return k;
}

pb::Snapshot BinarySnapshot(int code, const std::string& tag) {
  pb::Snapshot s;
  s.set_code(code);
  std::string body;
  for (int i = 0; i < 256; ++i) body.push_back(static_cast<char>(i));
  s.set_body(body + tag);
  s.set_content_type("application/octet-stream");
  (*s.mutable_headers())["x-tag"] = tag;
  (*s.mutable_headers())["location"] = "/payments/" + tag;
  return s;
}

grpc::health::v1::HealthCheckResponse::ServingStatus HealthOf(
    grpc::health::v1::Health::Stub& stub, const std::string& service) {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub.Check(Ctx(absl::Seconds(2)).get(), req, &resp);
  if (!s.ok()) return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  return resp.status();
}

bool WaitForHealth(grpc::health::v1::Health::Stub& stub,
                   grpc::health::v1::HealthCheckResponse::ServingStatus want,
                   absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (HealthOf(stub) == want) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return HealthOf(stub) == want;
}

absl::StatusOr<HttpResponse> HttpPost(
    int port, const std::string& path, const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  return HttpCall(port, "POST", path, body, headers);
}

absl::StatusOr<HttpResponse> HttpCall(
    int port, const std::string& method, const std::string& path,
    const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  timeval timeout{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port));
  }
  std::string request = absl::StrCat(
      method, " ", path,
      " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n",
      "Content-Type: application/json\r\nContent-Length: ", body.size(),
      "\r\n");
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&request, name, ": ", value, "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n = write(fd, request.data() + sent, request.size() - sent);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError("write");
    }
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, n);
  close(fd);
  if (n < 0) return absl::UnavailableError("read (timeout or reset)");

  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("no HTTP response: ", raw));
  }
  HttpResponse r;
  r.body = raw.substr(end + 4);
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &r.status)) {
    return absl::InternalError(absl::StrCat("bad status line: ", lines[0]));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(lines[i], absl::MaxSplits(':', 1));
    r.headers[absl::AsciiStrToLower(kv.first)] =
        std::string(absl::StripAsciiWhitespace(kv.second));
  }
  return r;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port));
  }
  // A server that never answers fails the call instead of hanging the test.
  const timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("write");
  }
  std::string response;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  if (n < 0) return absl::DeadlineExceededError("no HTTP answer within 10 s");
  size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return absl::InternalError("no HTTP body");
  return response.substr(body + 4);
}

double MetricValue(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = -1;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

}  // namespace idem::testing
