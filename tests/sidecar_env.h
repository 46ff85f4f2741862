// Test environment for end-to-end tests: a throwaway PostgreSQL with the
// schema applied and several real idempotency-sidecar processes over it, with
// gRPC stubs for each; optionally a Redis cache they share.
#ifndef IDEM_TESTS_SIDECAR_ENV_H_
#define IDEM_TESTS_SIDECAR_ENV_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "tests/testing/citus_cluster.h"
#include "tests/testing/pg_cluster.h"
#include "tests/testing/pgbouncer.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/sidecar_process.h"

namespace idem::testing {

namespace pb = ::idempotency::v1;

// What SidecarEnv::Start sets up besides PostgreSQL and the sidecars.
// The key of the cache's MAC that SidecarEnv's sidecars sign with.
inline constexpr char kRedisMacKey[] = "sidecar-env-redis-mac-key-of-32+bytes";

struct SidecarEnvOptions {
  // Start a RedisServer first and pass --redis=<its address> and
  // --redis-mac-key-file (holding kRedisMacKey) to every sidecar.
  bool redis = false;
  // Added to every sidecar's environment ("NAME=value").
  std::vector<std::string> env;
};

class SidecarEnv {
 public:
  // Starts PostgreSQL (and Redis if asked; with IDEM_TEST_PGBOUNCER=1 a
  // transaction-pooling PgBouncer in front of PostgreSQL; with
  // IDEM_TEST_CITUS=1 a Citus coordinator and two workers instead of one
  // PostgreSQL, see CitusGate), then `sidecars`
  // processes of `binary` with `args` (the first one with --migrate). Fails
  // with the logs when anything does not come up.
  static absl::StatusOr<std::unique_ptr<SidecarEnv>> Start(
      const std::string& binary, int sidecars,
      const std::vector<std::string>& args = {},
      const SidecarEnvOptions& options = {});

  ~SidecarEnv();

  // The PostgreSQL the sidecars use: with Citus, the coordinator.
  PgCluster& pg() { return citus_ != nullptr ? citus_->coordinator() : *pg_; }
  // The Citus cluster; null unless IDEM_TEST_CITUS=1.
  CitusCluster* citus() { return citus_.get(); }
  // The flags that point a sidecar at the store: --postgres=<the cluster>,
  // or through PgBouncer --postgres=<the bouncer>, --postgres-direct=<the
  // cluster> and --pg-prepared=off.
  std::vector<std::string> PostgresFlags() const;
  // The Redis server; only when started with options.redis.
  RedisServer& redis() { return *redis_; }
  // "--redis-mac-key-file=<a file holding kRedisMacKey>", for sidecars a
  // test starts itself; only when started with options.redis.
  std::string RedisMacKeyFlag() const {
    return "--redis-mac-key-file=" + mac_key_file_;
  }
  int size() const { return static_cast<int>(sidecars_.size()); }
  SidecarProcess& sidecar(int i) { return *sidecars_[i]; }
  pb::Idempotency::Stub& client(int i) { return *clients_[i]; }
  pb::IdempotencyAdmin::Stub& admin(int i) { return *admins_[i]; }
  grpc::health::v1::Health::Stub& health(int i) { return *health_[i]; }

  // Runs `sql` with psql and returns its trimmed output (fails the test on
  // error).
  std::string Sql(const std::string& sql);

 private:
  std::unique_ptr<PgCluster> pg_;        // unless IDEM_TEST_CITUS=1
  std::unique_ptr<CitusCluster> citus_;  // with IDEM_TEST_CITUS=1
  std::unique_ptr<PgBouncer> bouncer_;   // with IDEM_TEST_PGBOUNCER=1
  std::unique_ptr<RedisServer> redis_;
  std::string mac_key_file_;
  std::vector<std::unique_ptr<SidecarProcess>> sidecars_;
  std::vector<std::unique_ptr<pb::Idempotency::Stub>> clients_;
  std::vector<std::unique_ptr<pb::IdempotencyAdmin::Stub>> admins_;
  std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> health_;
};

// A gtest environment that starts one SidecarEnv for the whole test binary
// and points `*out` at it while it runs (null if it did not start: tests
// assert on that). `config_yaml`, when set, is written to a file passed as
// --config. Register with ::testing::AddGlobalTestEnvironment.
class SharedSidecarEnv : public ::testing::Environment {
 public:
  SharedSidecarEnv(SidecarEnv** out, int sidecars,
                   std::vector<std::string> args = {},
                   std::string config_yaml = "", SidecarEnvOptions options = {})
      : out_(out),
        sidecars_(sidecars),
        args_(std::move(args)),
        config_yaml_(std::move(config_yaml)),
        options_(std::move(options)) {}

  void SetUp() override;
  void TearDown() override;

 private:
  SidecarEnv** const out_;
  const int sidecars_;
  const std::vector<std::string> args_;
  const std::string config_yaml_;
  std::string config_path_;  // the file SetUp wrote config_yaml_ to, if any
  const SidecarEnvOptions options_;
  std::unique_ptr<SidecarEnv> env_;
};

// With IDEM_TEST_CITUS=1 where Citus is not installed: a gtest environment,
// registered by this library for every binary that links it, that skips
// every test saying why, or fails them under CI=true (CitusRequired).
// Returns what keeps the Citus tests from running (OK when nothing does).
absl::Status CitusGate();

// A context whose deadline is `timeout` from now.
std::unique_ptr<grpc::ClientContext> Ctx(
    absl::Duration timeout = absl::Seconds(10));

pb::RecordKey Key(const std::string& tenant, const std::string& operation,
                  const std::string& key);

// A snapshot with every byte value in its body, to prove byte-exact replays.
pb::Snapshot BinarySnapshot(int code, const std::string& tag);

// Checks `service` ("" for overall) on `stub`; the serving status, or
// UNKNOWN on an RPC error.
grpc::health::v1::HealthCheckResponse::ServingStatus HealthOf(
    grpc::health::v1::Health::Stub& stub, const std::string& service = "");

// Polls HealthOf until it equals `want` or `timeout` passes.
bool WaitForHealth(grpc::health::v1::Health::Stub& stub,
                   grpc::health::v1::HealthCheckResponse::ServingStatus want,
                   absl::Duration timeout);

// GETs http://127.0.0.1:<port><path> and returns the body; gives up when
// the server stays silent for 10 s.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;

  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// POSTs `body` as JSON to http://127.0.0.1:<port><path> with `headers` added
// and returns the parsed response (the server closes the connection).
// UNAVAILABLE when no complete response arrives (e.g. the server died).
absl::StatusOr<HttpResponse> HttpPost(
    int port, const std::string& path, const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& headers);

// The same with `method` (GET, POST, ...).
absl::StatusOr<HttpResponse> HttpCall(
    int port, const std::string& method, const std::string& path,
    const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& headers);

// The value of the Prometheus sample `series` (name{labels} exactly as
// exposed) in `text`, or -1 when absent.
double MetricValue(const std::string& text, const std::string& series);

}  // namespace idem::testing

#endif  // IDEM_TESTS_SIDECAR_ENV_H_
