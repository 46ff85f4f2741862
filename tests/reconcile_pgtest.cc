// End to end: the reconcile loop (docs/spec.md#expiry) with the payments demo
// (examples/payments-demo) as the business service whose
// idempotency.v1.Reconciler.Probe the sidecars call. Two sidecars over one
// throwaway PostgreSQL, configured with `probe:` for create-payment; a demo
// instance that serves HTTP and the probe; demo instances that die on purpose
// (DEMO_CRASH) between their own commit and Complete, or before writing:
//  - died after its write: UNKNOWN, then SUCCEEDED by the reconciler with
//    the very response Complete would have stored; one payment; replayed;
//  - died before its write: UNKNOWN, then FAILED retryable; the client's
//    retry executes once, with fencing token 2;
//  - INDETERMINATE, or a probe nobody answers: the record stays UNKNOWN once
//    the operation's reconcile_attempts are spent (and no more probes come);
//  - `idemctl reconcile --dry-run` previews the verdicts on a second
//    environment whose sidecar has no probe configured, changing nothing;
//  - a fake business service in this process: an APPLIED answer a Complete
//    could not store leaves the record UNKNOWN and is counted; probes over
//    TLS and mutual TLS settle with the right CA and client certificate and
//    not without them.
//
// Needs node and npm (with access to the npm registry the first time): if the
// demo's packages cannot be installed the environment fails, and so does this
// test.
#include <sys/time.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "idempotency/v1/reconciler.grpc.pb.h"
#include "tests/sidecar_env.h"
#include "tests/testing/files.h"
#include "tests/testing/pki.h"
#include "tests/testing/ports.h"
#include "tests/testing/process.h"

namespace idem::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;

constexpr char kTenant[] = "payments-demo";
constexpr char kOperation[] = "create-payment";
constexpr char kPayment[] =
    R"({"amount_minor": 1250, "currency": "EUR", "payee": "acme"})";
// reconcile_attempts of create-payment and of refund in the test's config.
constexpr int kPaymentAttempts = 3;
constexpr int kRefundAttempts = 2;

std::string Example(const std::string& path) {
  return absl::StrCat(IDEM_SOURCE_DIR, "/examples/", path);
}

// The last `n` bytes of `text`, for failure messages.
std::string Tail(const std::string& text, size_t n = 6000) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

// --- A minimal HTTP/1.1 client: one request per connection. ---

// --- The payments demo as a child process. ---

class Demo {
 public:
  // Starts examples/payments-demo/run.sh against the sidecar at `idem_addr`
  // and the PostgreSQL of `env` (the demo's payments table lives there too),
  // with `extra_env` added; waits until it serves HTTP (its probe, if any, is
  // up before that). The first start installs the npm packages: a failure
  // there is an error carrying the log.
  static absl::StatusOr<std::unique_ptr<Demo>> Start(
      SidecarEnv& env, const std::string& idem_addr,
      const std::vector<std::string>& extra_env = {}) {
    absl::StatusOr<std::string> dir = MakeTempDir("idem-recdemo-");
    if (!dir.ok()) return dir.status();
    auto demo = std::unique_ptr<Demo>(new Demo(*dir, FreePort()));
    std::vector<std::string> vars = {
        "IDEM_ADDR=" + idem_addr, "DEMO_POSTGRES=" + env.pg().ConnInfo(),
        absl::StrCat("DEMO_LISTEN=127.0.0.1:", demo->port_),
        absl::StrCat("DEMO_TENANT=", kTenant)};
    vars.insert(vars.end(), extra_env.begin(), extra_env.end());
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(
        {"bash", Example("payments-demo/run.sh")}, vars, *dir + "/demo.log");
    if (!p.ok()) return p.status();
    demo->process_ = *std::move(p);
    const absl::Time end = absl::Now() + absl::Minutes(5);
    while (!PortAcceptsConnections(demo->port_)) {
      if (!demo->process_->Running() || absl::Now() > end) {
        return absl::UnavailableError(absl::StrCat(
            "payments demo did not start (are node and npm installed, and the "
            "npm registry reachable for the first install?):\n",
            demo->Log()));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return demo;
  }

  ~Demo() {
    process_.reset();
    RemoveTempDir(dir_);
  }

  Process& process() { return *process_; }
  std::string Log() const { return process_ ? process_->Log() : ""; }

  absl::StatusOr<HttpResponse> Pay(const std::string& key) {
    return HttpPost(port_, "/payments", kPayment,
                    {{"Idempotency-Key", absl::StrCat("\"", key, "\"")}});
  }

  // How many Probe calls about `key` (create-payment) this demo answered.
  int ProbeCalls(const std::string& key) const {
    const std::string needle =
        absl::StrCat("Probe ", kTenant, "/", kOperation, "/", key, " token=");
    const std::string log = Log();
    int n = 0;
    for (size_t at = log.find(needle); at != std::string::npos;
         at = log.find(needle, at + 1)) {
      ++n;
    }
    return n;
  }

 private:
  Demo(std::string dir, int port) : dir_(std::move(dir)), port_(port) {}

  const std::string dir_;
  const int port_;
  std::unique_ptr<Process> process_;
};

// --- Records, rows, snapshots ---

pb::Record GetRecord(SidecarEnv& env, const pb::RecordKey& key) {
  pb::GetRequest req;
  *req.mutable_key() = key;
  pb::GetResponse resp;
  grpc::Status s = env.client(0).Get(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << key.key() << ": " << s.error_message();
  return resp.record();
}

// Polls until the record of `key` has `status`; `last` gets the last record
// seen.
bool WaitForStatus(SidecarEnv& env, const pb::RecordKey& key, pb::Status status,
                   pb::Record* last,
                   absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    pb::GetRequest req;
    *req.mutable_key() = key;
    pb::GetResponse resp;
    if (env.client(0).Get(Ctx().get(), req, &resp).ok()) {
      *last = resp.record();
      if (resp.record().status() == status) return true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

std::vector<pb::AuditEntry> History(SidecarEnv& env, const pb::RecordKey& key) {
  pb::HistoryRequest req;
  *req.mutable_key() = key;
  pb::HistoryResponse resp;
  grpc::Status s = env.admin(0).History(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return {resp.entries().begin(), resp.entries().end()};
}

// The audit entries of `key` written by the reconciler.
std::vector<pb::AuditEntry> ReconcilerEntries(SidecarEnv& env,
                                              const pb::RecordKey& key) {
  std::vector<pb::AuditEntry> out;
  for (const pb::AuditEntry& e : History(env, key)) {
    if (e.actor() == "reconciler") out.push_back(e);
  }
  return out;
}

int64_t RowCount(SidecarEnv& env, const std::string& key) {
  int64_t n = -1;
  EXPECT_TRUE(absl::SimpleAtoi(
      env.Sql(absl::StrCat(
          "SELECT count(*) FROM payments WHERE idempotency_key = '", key, "'")),
      &n));
  return n;
}

// "payment_id|fencing_token" of the payments row of `key`.
std::pair<std::string, std::string> PaymentRow(SidecarEnv& env,
                                               const std::string& key) {
  std::pair<std::string, std::string> row = absl::StrSplit(
      env.Sql(absl::StrCat("SELECT payment_id || '|' || fencing_token FROM "
                           "payments WHERE idempotency_key = '",
                           key, "'")),
      absl::MaxSplits('|', 1));
  return row;
}

// The 201 snapshot the demo stores for the payment `payment_id` of kPayment:
// the same bytes whether Complete stored it or the reconciler did.
pb::Snapshot ExpectedSnapshot(const std::string& payment_id) {
  pb::Snapshot s;
  s.set_code(201);
  s.set_body(absl::StrCat(R"({"payment_id":")", payment_id,
                          R"(","amount_minor":1250,"currency":"EUR",)",
                          R"("payee":"acme"})"));
  s.set_content_type("application/json");
  (*s.mutable_headers())["location"] = "/payments/" + payment_id;
  return s;
}

// Begins `key` with a 1 s lease and never reports: the lease runs out and
// the record turns UNKNOWN. Returns the fencing token granted (0 on error).
int64_t BeginAndAbandon(SidecarEnv& env, const pb::RecordKey& key) {
  pb::BeginRequest req;
  *req.mutable_key() = key;
  req.set_request_hash(std::string(32, '\x5a'));
  req.mutable_lease()->set_seconds(1);
  pb::BeginResponse resp;
  grpc::Status s = env.client(0).Begin(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED) << resp.DebugString();
  return resp.fencing_token();
}

// Inserts a payments row for `key` as if attempt `token` had written it.
void InsertPaymentRow(SidecarEnv& env, const std::string& key, int token) {
  env.Sql(absl::StrCat(
      "INSERT INTO payments (idempotency_key, payment_id, amount_minor, "
      "currency, payee, fencing_token) VALUES ('",
      key, "', 'pay_manual-", key, "', 1250, 'EUR', 'acme', ", token, ")"));
}

// Calls the demo's Reconciler.Probe directly.
pb::ProbeResponse Probe(int port, const pb::Record& record) {
  auto stub = pb::Reconciler::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  pb::ProbeRequest req;
  *req.mutable_key() = record.key();
  req.set_request_hash(record.request_hash());
  req.set_fencing_token(record.fencing_token());
  pb::ProbeResponse resp;
  grpc::Status s = stub->Probe(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

// The sum over the sidecars of `env` of one metric sample (absent counts 0).
double MetricSum(SidecarEnv& env, const std::string& series) {
  double sum = 0;
  for (int i = 0; i < env.size(); ++i) {
    absl::StatusOr<std::string> text =
        HttpGet(env.sidecar(i).metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) continue;
    const double v = MetricValue(*text, series);
    if (v > 0) sum += v;
  }
  return sum;
}

std::string SidecarLogs(SidecarEnv& env) {
  std::string out;
  for (int i = 0; i < env.size(); ++i) {
    absl::StrAppend(&out, "\n--- sidecar ", i, " ---\n",
                    Tail(env.sidecar(i).Log()));
  }
  return out;
}

// --- A business service's Reconciler in this process ---

// The snapshot the fake probe answers APPLIED with, unless the key asks for
// a broken one.
pb::Snapshot FakeSnapshot() {
  pb::Snapshot s;
  s.set_code(201);
  s.set_body(R"({"ok":true})");
  s.set_content_type("application/json");
  (*s.mutable_headers())["location"] = "/things/1";
  return s;
}

// Answers APPLIED with FakeSnapshot(), broken as the key's first word says:
// nul-content-type, nul-header, crlf-header (a header value that would
// split the replayed header line), oversize (a body of the whole 256 KiB
// limit, so with the content type past it) or nul-detail (NOT_APPLIED with
// NUL in the detail).
class FakeProbe final : public pb::Reconciler::Service {
 public:
  grpc::Status Probe(grpc::ServerContext* /*context*/,
                     const pb::ProbeRequest* req,
                     pb::ProbeResponse* resp) override {
    const std::string& key = req->key().key();
    resp->set_verdict(pb::ProbeResponse::VERDICT_APPLIED);
    pb::Snapshot* result = resp->mutable_result();
    *result = FakeSnapshot();
    if (absl::StartsWith(key, "nul-content-type")) {
      result->set_content_type(std::string("application/json\0; evil", 23));
    } else if (absl::StartsWith(key, "nul-header")) {
      (*result->mutable_headers())["x-trace"] = std::string("a\0b", 3);
    } else if (absl::StartsWith(key, "crlf-header")) {
      (*result->mutable_headers())["x-trace"] = "a\r\nSet-Cookie: b=c";
    } else if (absl::StartsWith(key, "oversize")) {
      result->set_body(std::string(256 * 1024, 'x'));
    } else if (absl::StartsWith(key, "nul-detail")) {
      resp->clear_result();
      resp->set_verdict(pb::ProbeResponse::VERDICT_NOT_APPLIED);
      resp->set_detail(std::string("no payment\0; evil", 17));
    }
    return grpc::Status::OK;
  }
};

// Serves `service` on a free loopback port with `credentials`.
std::unique_ptr<grpc::Server> Serve(
    FakeProbe* service, std::shared_ptr<grpc::ServerCredentials> credentials,
    int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", std::move(credentials), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// TLS server credentials from `pki`'s `cert`, requiring client certificates
// signed by its "ca" when `mutual`.
std::shared_ptr<grpc::ServerCredentials> TlsCredentials(const Pki& pki,
                                                        const std::string& cert,
                                                        bool mutual) {
  grpc::SslServerCredentialsOptions options(
      mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back(
      {ReadFile(pki.Path(cert + ".key")), ReadFile(pki.Path(cert + ".pem"))});
  if (mutual) options.pem_root_certs = ReadFile(pki.Path("ca.pem"));
  return grpc::SslServerCredentials(options);
}

// --- The shared environment ---

// Two sidecars whose config gives create-payment the demo's probe and refund
// a probe nobody answers; one demo instance serving HTTP and the probe.
struct World {
  std::string dir;
  // The sidecars' --config.
  std::string config;
  int probe_port = 0;
  int tls_port = 0;
  int dead_port = 0;
  // The fake probe: plaintext, TLS, and TLS requiring client certificates.
  Pki pki;
  FakeProbe fake;
  std::unique_ptr<grpc::Server> fake_plain;
  std::unique_ptr<grpc::Server> fake_tls;
  std::unique_ptr<grpc::Server> fake_mtls;
  std::unique_ptr<SidecarEnv> env;
  std::unique_ptr<Demo> demo;

  ~World() {
    for (auto* server : {&fake_plain, &fake_tls, &fake_mtls}) {
      if (*server != nullptr) (*server)->Shutdown();
    }
  }
};

// reconcile_attempts of the operations probing the fake.
constexpr int kFakeAttempts = 2;

World* world = nullptr;
// Why the environment did not start (OK once it has); every test fails with
// it rather than being skipped, e.g. when the demo's npm packages cannot be
// installed.
absl::Status setup_status = absl::UnknownError("environment not set up");

absl::StatusOr<std::unique_ptr<World>> StartWorld() {
  auto w = std::make_unique<World>();
  absl::StatusOr<std::string> dir = MakeTempDir("idem-reconcile-");
  if (!dir.ok()) return dir.status();
  w->dir = *dir;
  w->probe_port = FreePort();
  w->dead_port = FreePort();
  // The fake's certificate names a host the probe address does not: the
  // config's server_name must say it.
  w->pki.dir = w->dir;
  for (absl::Status s :
       {w->pki.MakeCa("ca"), w->pki.MakeCa("other-ca"),
        w->pki.MakeCert("service", "ca", "DNS:payments.internal"),
        w->pki.MakeCert("client", "ca", "URI:spiffe://test/sidecar")}) {
    if (!s.ok()) return s;
  }
  int plain_port = 0;
  int tls_port = 0;
  int mtls_port = 0;
  w->fake_plain =
      Serve(&w->fake, grpc::InsecureServerCredentials(), &plain_port);
  w->fake_tls =
      Serve(&w->fake, TlsCredentials(w->pki, "service", false), &tls_port);
  w->fake_mtls =
      Serve(&w->fake, TlsCredentials(w->pki, "service", true), &mtls_port);
  if (plain_port == 0 || tls_port == 0 || mtls_port == 0) {
    return absl::UnavailableError("the fake probe did not start");
  }
  const auto fake_op = [&](const std::string& name, int port,
                           const std::string& tls) {
    return absl::StrCat("  ", name, ": {lease: 1s, probe: \"127.0.0.1:", port,
                        "\", reconcile_attempts: ", kFakeAttempts,
                        tls.empty() ? "" : ", probe_tls: " + tls, "}\n");
  };
  const std::string ca = w->pki.Path("ca.pem");
  w->tls_port = tls_port;
  const std::string config = w->dir + "/policies.yaml";
  w->config = config;
  std::ofstream(config) << absl::StrCat(
      "operations:\n"
      "  create-payment:\n"
      "    lease: 2s\n"
      "    probe: 127.0.0.1:",
      w->probe_port, "\n    reconcile_attempts: ", kPaymentAttempts,
      "\n  refund: {lease: 1s, probe: \"127.0.0.1:", w->dead_port,
      "\", reconcile_attempts: ", kRefundAttempts, "}\n",
      fake_op("fake-plain", plain_port, ""),
      fake_op("fake-tls", tls_port,
              absl::StrCat("{ca: ", ca, ", server_name: payments.internal}")),
      fake_op("fake-tls-other-ca", tls_port,
              absl::StrCat("{ca: ", w->pki.Path("other-ca.pem"),
                           ", server_name: payments.internal}")),
      fake_op("fake-tls-plaintext", tls_port, ""),
      fake_op("fake-mtls", mtls_port,
              absl::StrCat("{ca: ", ca, ", cert: ", w->pki.Path("client.pem"),
                           ", key: ", w->pki.Path("client.key"),
                           ", server_name: payments.internal}")),
      fake_op("fake-mtls-no-cert", mtls_port,
              absl::StrCat("{ca: ", ca, ", server_name: payments.internal}")));
  absl::StatusOr<std::unique_ptr<SidecarEnv>> env =
      SidecarEnv::Start(IDEM_SIDECAR_PATH, 2,
                        {"--config=" + config, "--reconcile-interval=200ms",
                         "--reaper-interval=200ms"});
  if (!env.ok()) return env.status();
  w->env = *std::move(env);
  absl::StatusOr<std::unique_ptr<Demo>> demo = Demo::Start(
      *w->env, w->env->sidecar(0).Address(),
      {absl::StrCat("DEMO_PROBE_LISTEN=127.0.0.1:", w->probe_port)});
  if (!demo.ok()) return demo.status();
  w->demo = *std::move(demo);
  return w;
}

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<World>> w = StartWorld();
    setup_status = w.status();
    if (!w.ok()) return;
    world_ = *std::move(w);
    world = world_.get();
  }

  void TearDown() override {
    world = nullptr;
    if (world_ != nullptr) RemoveTempDir(world_->dir);
    world_.reset();
  }

 private:
  std::unique_ptr<World> world_;
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Environment());

class ReconcileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(setup_status.ok())
        << "the environment did not start: " << setup_status;
  }

  SidecarEnv& env() { return *world->env; }
  Demo& demo() { return *world->demo; }

  static std::string TestKey(const std::string& tag) {
    return absl::StrCat(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
        tag);
  }

  // Starts a demo instance that dies at `crash` ("before-write" or
  // "after-write") with a 1 s lease, talking to the second sidecar.
  std::unique_ptr<Demo> CrashingDemo(const std::string& crash) {
    absl::StatusOr<std::unique_ptr<Demo>> d =
        Demo::Start(env(), env().sidecar(1).Address(),
                    {"DEMO_CRASH=" + crash, "DEMO_LEASE_MS=1000"});
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *std::move(d) : nullptr;
  }
};

TEST_F(ReconcileTest, CrashAfterWriteSettlesSucceededWithTheDemosResponse) {
  // A payment completed the normal way: the shape Complete stores.
  const std::string normal_key = TestKey("normal");
  absl::StatusOr<HttpResponse> normal = demo().Pay(normal_key);
  ASSERT_TRUE(normal.ok()) << normal.status();
  ASSERT_EQ(normal->status, 201) << normal->body << demo().Log();
  const pb::Record normal_record =
      GetRecord(env(), Key(kTenant, kOperation, normal_key));
  ASSERT_EQ(normal_record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_TRUE(MessageDifferencer::Equals(
      normal_record.result(),
      ExpectedSnapshot(PaymentRow(env(), normal_key).first)))
      << normal_record.result().DebugString();

  // An instance commits its payment and dies before Complete.
  const std::string key = TestKey("crash");
  const pb::RecordKey rkey = Key(kTenant, kOperation, key);
  std::unique_ptr<Demo> crashing = CrashingDemo("after-write");
  ASSERT_NE(crashing, nullptr);
  absl::StatusOr<HttpResponse> lost = crashing->Pay(key);
  EXPECT_FALSE(lost.ok()) << lost->status << " " << lost->body;
  absl::StatusOr<int> exit_code = crashing->process().Wait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 137) << crashing->Log();
  ASSERT_EQ(RowCount(env(), key), 1);
  const auto [payment_id, row_token] = PaymentRow(env(), key);
  EXPECT_EQ(row_token, "1");

  // Lease out: UNKNOWN; the reconciler asks the demo and settles it.
  pb::Record record;
  ASSERT_TRUE(WaitForStatus(env(), rkey, pb::STATUS_SUCCEEDED, &record))
      << record.DebugString() << "\ndemo:\n"
      << Tail(demo().Log()) << SidecarLogs(env());
  EXPECT_EQ(record.fencing_token(), 1);
  EXPECT_EQ(record.resolved_by(), "reconciler");
  EXPECT_TRUE(
      MessageDifferencer::Equals(record.result(), ExpectedSnapshot(payment_id)))
      << record.result().DebugString();
  const pb::ProbeResponse probe = Probe(world->probe_port, record);
  EXPECT_EQ(probe.verdict(), pb::ProbeResponse::VERDICT_APPLIED);
  EXPECT_TRUE(MessageDifferencer::Equals(probe.result(), record.result()))
      << probe.DebugString();

  const std::vector<pb::AuditEntry> by_reconciler =
      ReconcilerEntries(env(), rkey);
  ASSERT_EQ(by_reconciler.size(), 1u);
  EXPECT_EQ(by_reconciler[0].from(), pb::STATUS_UNKNOWN);
  EXPECT_EQ(by_reconciler[0].to(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(by_reconciler[0].fencing_token(), 1);
  EXPECT_FALSE(by_reconciler[0].reason().empty());

  // The client's retry replays the settled response; still one payment.
  absl::StatusOr<HttpResponse> replay = demo().Pay(key);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->status, 201) << replay->body;
  EXPECT_EQ(replay->Header("idempotent-replayed"), "true");
  EXPECT_EQ(replay->body, ExpectedSnapshot(payment_id).body());
  EXPECT_EQ(replay->Header("location"), "/payments/" + payment_id);
  EXPECT_EQ(replay->Header("content-type"), "application/json");
  EXPECT_EQ(RowCount(env(), key), 1);
}

TEST_F(ReconcileTest, CrashBeforeWriteSettlesFailedRetryableAndRetryRunsOnce) {
  const std::string key = TestKey("crash");
  const pb::RecordKey rkey = Key(kTenant, kOperation, key);
  std::unique_ptr<Demo> crashing = CrashingDemo("before-write");
  ASSERT_NE(crashing, nullptr);
  absl::StatusOr<HttpResponse> lost = crashing->Pay(key);
  EXPECT_FALSE(lost.ok()) << lost->status << " " << lost->body;
  absl::StatusOr<int> exit_code = crashing->process().Wait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 137) << crashing->Log();
  EXPECT_EQ(RowCount(env(), key), 0);

  pb::Record record;
  ASSERT_TRUE(WaitForStatus(env(), rkey, pb::STATUS_FAILED, &record))
      << record.DebugString() << "\ndemo:\n"
      << Tail(demo().Log()) << SidecarLogs(env());
  EXPECT_TRUE(record.retryable());
  EXPECT_EQ(record.fencing_token(), 1);
  const std::vector<pb::AuditEntry> by_reconciler =
      ReconcilerEntries(env(), rkey);
  ASSERT_EQ(by_reconciler.size(), 1u);
  EXPECT_EQ(by_reconciler[0].from(), pb::STATUS_UNKNOWN);
  EXPECT_EQ(by_reconciler[0].to(), pb::STATUS_FAILED);
  EXPECT_EQ(by_reconciler[0].fencing_token(), 1);
  EXPECT_EQ(RowCount(env(), key), 0);

  // The demo restarted without the crash hook; the client retries: it runs,
  // once, as attempt 2.
  crashing.reset();
  absl::StatusOr<std::unique_ptr<Demo>> restarted =
      Demo::Start(env(), env().sidecar(1).Address());
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  absl::StatusOr<HttpResponse> retry = (*restarted)->Pay(key);
  ASSERT_TRUE(retry.ok()) << retry.status();
  ASSERT_EQ(retry->status, 201) << retry->body << (*restarted)->Log();
  EXPECT_EQ(retry->Header("idempotent-replayed"), "");
  ASSERT_EQ(RowCount(env(), key), 1);
  const auto [payment_id, row_token] = PaymentRow(env(), key);
  EXPECT_EQ(row_token, "2");
  EXPECT_EQ(retry->body, ExpectedSnapshot(payment_id).body());
  record = GetRecord(env(), rkey);
  EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(record.fencing_token(), 2);
  EXPECT_TRUE(
      MessageDifferencer::Equals(record.result(), ExpectedSnapshot(payment_id)))
      << record.result().DebugString();

  absl::StatusOr<HttpResponse> again = (*restarted)->Pay(key);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, 201);
  EXPECT_EQ(again->Header("idempotent-replayed"), "true");
  EXPECT_EQ(again->body, retry->body);
  EXPECT_EQ(RowCount(env(), key), 1);
}

TEST_F(ReconcileTest, IndeterminateStaysUnknownOnceTheAttemptsAreSpent) {
  const std::string key = TestKey("a");
  const pb::RecordKey rkey = Key(kTenant, kOperation, key);
  // A payment of a newer attempt than the record's: the demo cannot tell.
  InsertPaymentRow(env(), key, 7);
  const std::string kGivenUp = "idem_reconcile_given_up_total";
  const std::string kIndeterminate =
      R"(idem_reconcile_total{verdict="indeterminate"})";
  const double given_up = MetricSum(env(), kGivenUp);
  const double indeterminate = MetricSum(env(), kIndeterminate);
  ASSERT_EQ(BeginAndAbandon(env(), rkey), 1);

  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (MetricSum(env(), kGivenUp) < given_up + 1 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(MetricSum(env(), kGivenUp), given_up + 1) << SidecarLogs(env());
  // Well past the next backoff: no further probe comes.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(demo().ProbeCalls(key), kPaymentAttempts) << Tail(demo().Log());
  EXPECT_EQ(MetricSum(env(), kIndeterminate), indeterminate + kPaymentAttempts);
  const pb::Record record = GetRecord(env(), rkey);
  EXPECT_EQ(record.status(), pb::STATUS_UNKNOWN);
  EXPECT_EQ(record.fencing_token(), 1);
  EXPECT_TRUE(ReconcilerEntries(env(), rkey).empty());
  EXPECT_EQ(RowCount(env(), key), 1);

  const pb::ProbeResponse probe = Probe(world->probe_port, record);
  EXPECT_EQ(probe.verdict(), pb::ProbeResponse::VERDICT_INDETERMINATE);
  EXPECT_TRUE(absl::StrContains(probe.detail(), "attempt 7")) << probe.detail();
}

TEST_F(ReconcileTest, UnreachableProbeLeavesTheRecordUnknown) {
  const pb::RecordKey rkey = Key("shop", "refund", TestKey("a"));
  const std::string kGivenUp = "idem_reconcile_given_up_total";
  const std::string kErrors = R"(idem_reconcile_total{verdict="error"})";
  const double given_up = MetricSum(env(), kGivenUp);
  const double errors = MetricSum(env(), kErrors);
  ASSERT_EQ(BeginAndAbandon(env(), rkey), 1);

  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (MetricSum(env(), kGivenUp) < given_up + 1 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(MetricSum(env(), kGivenUp), given_up + 1) << SidecarLogs(env());
  absl::SleepFor(absl::Seconds(2));
  EXPECT_EQ(MetricSum(env(), kErrors), errors + kRefundAttempts);
  const pb::Record record = GetRecord(env(), rkey);
  EXPECT_EQ(record.status(), pb::STATUS_UNKNOWN);
  EXPECT_TRUE(ReconcilerEntries(env(), rkey).empty());
}

// --- The fake probe: what its answers settle ---

// Polls until every record of `keys` has had `attempts` probes (or 20 s
// pass), then waits a little for the last verdict to be applied.
void WaitForProbes(SidecarEnv& env, const std::vector<pb::RecordKey>& keys,
                   int attempts) {
  std::string in;
  for (const pb::RecordKey& k : keys) {
    absl::StrAppend(&in, in.empty() ? "" : ", ", "('", k.operation(), "', '",
                    k.key(), "')");
  }
  const std::string sql = absl::StrCat(
      "SELECT count(*) FROM idempotency_record WHERE (operation, "
      "idempotency_key) IN (",
      in, ") AND reconcile_attempts >= ", attempts);
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (env.Sql(sql) != absl::StrCat(keys.size()) && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(env.Sql(sql), absl::StrCat(keys.size())) << SidecarLogs(env);
  absl::SleepFor(absl::Milliseconds(500));
}

TEST_F(ReconcileTest, ProbeAnswerACompleteCouldNotStoreLeavesTheRecordUnknown) {
  const std::string kInvalid = R"(idem_reconcile_total{verdict="invalid"})";
  const double invalid = MetricSum(env(), kInvalid);
  std::vector<pb::RecordKey> broken;
  for (const char* kind : {"nul-content-type", "nul-header", "crlf-header",
                           "oversize", "nul-detail"}) {
    broken.push_back(
        Key("shop", "fake-plain", absl::StrCat(kind, "-", TestKey("a"))));
  }
  const pb::RecordKey valid = Key("shop", "fake-plain", TestKey("valid"));
  for (const pb::RecordKey& k : broken) ASSERT_EQ(BeginAndAbandon(env(), k), 1);
  ASSERT_EQ(BeginAndAbandon(env(), valid), 1);

  // The same service's valid answer settles its record.
  pb::Record record;
  ASSERT_TRUE(WaitForStatus(env(), valid, pb::STATUS_SUCCEEDED, &record))
      << record.DebugString() << SidecarLogs(env());
  EXPECT_TRUE(MessageDifferencer::Equals(record.result(), FakeSnapshot()))
      << record.result().DebugString();

  WaitForProbes(env(), broken, kFakeAttempts);
  for (const pb::RecordKey& k : broken) {
    record = GetRecord(env(), k);
    EXPECT_EQ(record.status(), pb::STATUS_UNKNOWN) << record.DebugString();
    EXPECT_TRUE(ReconcilerEntries(env(), k).empty()) << k.key();
  }
  EXPECT_EQ(MetricSum(env(), kInvalid),
            invalid + static_cast<double>(broken.size()) * kFakeAttempts)
      << SidecarLogs(env());
  std::string logs = SidecarLogs(env());
  EXPECT_TRUE(absl::StrContains(logs, "what a Complete could not store"))
      << logs;
}

TEST_F(ReconcileTest, ProbeOverTlsSettlesOnlyWithTheRightCaAndCertificate) {
  const pb::RecordKey tls = Key("shop", "fake-tls", TestKey("a"));
  const pb::RecordKey mtls = Key("shop", "fake-mtls", TestKey("a"));
  const std::vector<pb::RecordKey> refused = {
      Key("shop", "fake-tls-other-ca", TestKey("a")),
      Key("shop", "fake-tls-plaintext", TestKey("a")),
      Key("shop", "fake-mtls-no-cert", TestKey("a"))};
  for (const pb::RecordKey& k : {tls, mtls}) {
    ASSERT_EQ(BeginAndAbandon(env(), k), 1);
  }
  for (const pb::RecordKey& k : refused) {
    ASSERT_EQ(BeginAndAbandon(env(), k), 1);
  }

  for (const pb::RecordKey& k : {tls, mtls}) {
    pb::Record record;
    ASSERT_TRUE(WaitForStatus(env(), k, pb::STATUS_SUCCEEDED, &record))
        << k.operation() << ": " << record.DebugString() << SidecarLogs(env());
    EXPECT_TRUE(MessageDifferencer::Equals(record.result(), FakeSnapshot()));
    EXPECT_EQ(record.resolved_by(), "reconciler");
  }
  WaitForProbes(env(), refused, kFakeAttempts);
  for (const pb::RecordKey& k : refused) {
    const pb::Record record = GetRecord(env(), k);
    EXPECT_EQ(record.status(), pb::STATUS_UNKNOWN)
        << k.operation() << ": " << record.DebugString();
    EXPECT_TRUE(ReconcilerEntries(env(), k).empty()) << k.operation();
  }
}

// --- idemctl reconcile --dry-run ---

absl::StatusOr<std::string> Idemctl(const std::string& addr,
                                    std::vector<std::string> args) {
  std::vector<std::string> argv = {IDEMCTL_PATH, "--addr", addr};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

const google::protobuf::Value& Field(const google::protobuf::Struct& s,
                                     const std::string& name) {
  static const google::protobuf::Value* const kNull =
      new google::protobuf::Value();
  auto it = s.fields().find(name);
  return it == s.fields().end() ? *kNull : it->second;
}

// The preview probes as the sidecars do: at each operation's probe with its
// probe_tls from --config, and shows INVALID for an answer they refuse.
TEST_F(ReconcileTest, IdemctlDryRunUsesProbeTlsAndTheSidecarsChecks) {
  std::vector<std::string> broken;
  for (const char* kind : {"nul-header", "crlf-header", "nul-detail"}) {
    broken.push_back(absl::StrCat(kind, "-", TestKey("a")));
  }
  const std::string other_ca = TestKey("other-ca");
  std::vector<pb::RecordKey> keys = {
      Key("shop", "fake-tls-other-ca", other_ca)};
  for (const std::string& k : broken) {
    keys.push_back(Key("shop", "fake-plain", k));
  }
  for (const pb::RecordKey& k : keys) {
    ASSERT_EQ(BeginAndAbandon(env(), k), 1);
  }
  for (const pb::RecordKey& k : keys) {
    pb::Record r;
    ASSERT_TRUE(WaitForStatus(env(), k, pb::STATUS_UNKNOWN, &r))
        << r.DebugString();
  }
  // Previews of one operation as a JSON document, by key.
  const std::string addr = env().sidecar(0).Address();
  const auto preview = [&addr](const std::string& operation,
                               std::vector<std::string> flags) {
    std::vector<std::string> args = {"--json",   "reconcile", "--dry-run",
                                     "--tenant", "shop",      "--operation",
                                     operation};
    args.insert(args.end(), flags.begin(), flags.end());
    std::map<std::string, google::protobuf::Struct> by_key;
    absl::StatusOr<std::string> json = Idemctl(addr, args);
    EXPECT_TRUE(json.ok()) << json.status();
    if (!json.ok()) return by_key;
    google::protobuf::Struct doc;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &doc).ok())
        << *json;
    for (const google::protobuf::Value& v :
         Field(doc, "records").list_value().values()) {
      by_key[Field(Field(v.struct_value(), "key").struct_value(), "key")
                 .string_value()] = v.struct_value();
    }
    return by_key;
  };

  // Answers a Complete could not store: INVALID, left UNKNOWN.
  auto plain = preview("fake-plain", {"--config", world->config});
  for (const std::string& k : broken) {
    ASSERT_TRUE(plain.count(k)) << k;
    EXPECT_EQ(Field(plain[k], "verdict").string_value(), "INVALID") << k;
    EXPECT_EQ(Field(plain[k], "action").string_value(), "leave_unknown") << k;
  }
  EXPECT_EQ(Field(plain[broken[0]], "invalid")
                .string_value()
                .rfind("result.headers: ", 0),
            0u);
  EXPECT_EQ(Field(plain[broken[1]], "invalid")
                .string_value()
                .rfind("result.headers: ", 0),
            0u);
  EXPECT_EQ(
      Field(plain[broken[2]], "invalid").string_value().rfind("detail", 0), 0u);

  // The sidecars' probe_tls names the wrong CA: the handshake fails, as it
  // does for them; so does plaintext to the TLS port.
  auto wrong_ca = preview("fake-tls-other-ca", {"--config", world->config});
  EXPECT_EQ(Field(wrong_ca[other_ca], "verdict").string_value(), "ERROR");
  auto plaintext =
      preview("fake-tls-other-ca",
              {"--probe", absl::StrCat("127.0.0.1:", world->tls_port)});
  EXPECT_EQ(Field(plaintext[other_ca], "verdict").string_value(), "ERROR");
  // A config whose probe_tls names the right CA and server name: APPLIED.
  const std::string config = world->dir + "/idemctl-policies.yaml";
  std::ofstream(config) << absl::StrCat(
      "operations:\n  fake-tls-other-ca: {probe: \"127.0.0.1:", world->tls_port,
      "\", probe_tls: {ca: ", world->pki.Path("ca.pem"),
      ", server_name: payments.internal}}\n");
  auto right_ca = preview("fake-tls-other-ca", {"--config", config});
  EXPECT_EQ(Field(right_ca[other_ca], "verdict").string_value(),
            "VERDICT_APPLIED");
  EXPECT_EQ(Field(right_ca[other_ca], "action").string_value(),
            "settle_succeeded");

  // Nothing was changed.
  for (const pb::RecordKey& k : keys) {
    EXPECT_EQ(GetRecord(env(), k).status(), pb::STATUS_UNKNOWN) << k.key();
  }
}

TEST_F(ReconcileTest, IdemctlDryRunPreviewsTheVerdictsAndChangesNothing) {
  // A second environment whose sidecar has no probe configured, so that its
  // UNKNOWN records wait for the preview (and an operator).
  absl::StatusOr<std::unique_ptr<SidecarEnv>> started =
      SidecarEnv::Start(IDEM_SIDECAR_PATH, 1, {"--reaper-interval=200ms"});
  ASSERT_TRUE(started.ok()) << started.status();
  SidecarEnv& env2 = **started;
  const std::string addr = env2.sidecar(0).Address();
  const int probe_port = FreePort();
  const std::string probe_addr = absl::StrCat("127.0.0.1:", probe_port);
  absl::StatusOr<std::unique_ptr<Demo>> prober =
      Demo::Start(env2, addr, {"DEMO_PROBE_LISTEN=" + probe_addr});
  ASSERT_TRUE(prober.ok()) << prober.status();

  const std::string applied = TestKey("applied");
  const std::string not_applied = TestKey("not-applied");
  const std::string indeterminate = TestKey("indeterminate");
  const std::string refund = TestKey("refund");
  for (const auto& [key, crash] :
       {std::pair<std::string, std::string>{applied, "after-write"},
        std::pair<std::string, std::string>{not_applied, "before-write"}}) {
    absl::StatusOr<std::unique_ptr<Demo>> d =
        Demo::Start(env2, addr, {"DEMO_CRASH=" + crash, "DEMO_LEASE_MS=1000"});
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_FALSE((*d)->Pay(key).ok());
    EXPECT_EQ((*d)->process().Wait(absl::Seconds(10)).value_or(-1), 137);
  }
  InsertPaymentRow(env2, indeterminate, 7);
  ASSERT_EQ(BeginAndAbandon(env2, Key(kTenant, kOperation, indeterminate)), 1);
  ASSERT_EQ(BeginAndAbandon(env2, Key(kTenant, "refund", refund)), 1);
  std::vector<pb::RecordKey> keys = {
      Key(kTenant, kOperation, applied), Key(kTenant, kOperation, not_applied),
      Key(kTenant, kOperation, indeterminate), Key(kTenant, "refund", refund)};
  for (const pb::RecordKey& k : keys) {
    pb::Record r;
    ASSERT_TRUE(WaitForStatus(env2, k, pb::STATUS_UNKNOWN, &r))
        << r.DebugString();
  }
  const std::string payment_id = PaymentRow(env2, applied).first;

  // Without --dry-run: a usage error, nothing asked, nothing changed.
  absl::StatusOr<std::string> refused =
      Idemctl(addr, {"reconcile", "--probe", probe_addr});
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(
      absl::StrContains(refused.status().message(), "exited with code 2"))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--dry-run"))
      << refused.status();
  EXPECT_EQ((*prober)->ProbeCalls(applied), 0);

  // --json: one document with a verdict per record.
  absl::StatusOr<std::string> json = Idemctl(
      addr, {"--json", "reconcile", "--probe", probe_addr, "--dry-run"});
  ASSERT_TRUE(json.ok()) << json.status();
  google::protobuf::Struct doc;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &doc).ok())
      << *json;
  EXPECT_TRUE(Field(doc, "dry_run").bool_value());
  EXPECT_EQ(Field(doc, "probe").string_value(), probe_addr);
  std::map<std::string, google::protobuf::Struct> by_key;
  for (const google::protobuf::Value& v :
       Field(doc, "records").list_value().values()) {
    by_key[Field(Field(v.struct_value(), "key").struct_value(), "key")
               .string_value()] = v.struct_value();
  }
  ASSERT_EQ(by_key.size(), 4u) << *json;
  const google::protobuf::Struct& a = by_key[applied];
  EXPECT_EQ(Field(a, "verdict").string_value(), "VERDICT_APPLIED") << *json;
  EXPECT_EQ(Field(a, "action").string_value(), "settle_succeeded");
  EXPECT_EQ(Field(a, "fencing_token").string_value(), "1");
  const google::protobuf::Struct& result = Field(a, "result").struct_value();
  std::string body;
  ASSERT_TRUE(
      absl::Base64Unescape(Field(result, "body").string_value(), &body));
  EXPECT_EQ(body, ExpectedSnapshot(payment_id).body());
  EXPECT_EQ(Field(result, "code").number_value(), 201);
  EXPECT_EQ(Field(result, "content_type").string_value(), "application/json");
  EXPECT_EQ(Field(by_key[not_applied], "verdict").string_value(),
            "VERDICT_NOT_APPLIED");
  EXPECT_EQ(Field(by_key[not_applied], "action").string_value(),
            "settle_failed_retryable");
  EXPECT_EQ(Field(by_key[indeterminate], "verdict").string_value(),
            "VERDICT_INDETERMINATE");
  EXPECT_EQ(Field(by_key[indeterminate], "action").string_value(),
            "leave_unknown");
  EXPECT_TRUE(absl::StrContains(
      Field(by_key[indeterminate], "detail").string_value(), "attempt 7"));
  // The demo only answers for create-payment: an error, left alone.
  EXPECT_EQ(Field(by_key[refund], "verdict").string_value(), "ERROR");
  EXPECT_EQ(Field(by_key[refund], "action").string_value(), "leave_unknown");
  EXPECT_EQ(Field(Field(by_key[refund], "error").struct_value(), "code")
                .string_value(),
            "INVALID_ARGUMENT");
  const google::protobuf::Struct& summary =
      Field(doc, "summary").struct_value();
  EXPECT_EQ(Field(summary, "settle_succeeded").number_value(), 1);
  EXPECT_EQ(Field(summary, "settle_failed_retryable").number_value(), 1);
  EXPECT_EQ(Field(summary, "leave_unknown").number_value(), 2);

  // The table, filtered to the operation the demo implements.
  absl::StatusOr<std::string> table =
      Idemctl(addr, {"reconcile", "--probe", probe_addr, "--dry-run",
                     "--operation", kOperation, "--tenant", kTenant});
  ASSERT_TRUE(table.ok()) << table.status();
  for (const std::string& want :
       {applied, not_applied, indeterminate, std::string("settle SUCCEEDED"),
        std::string("settle FAILED retryable"), std::string("INDETERMINATE"),
        std::string("3 UNKNOWN records: 1 would settle SUCCEEDED, 1 FAILED "
                    "retryable, 1 stay UNKNOWN")}) {
    EXPECT_TRUE(absl::StrContains(*table, want)) << want << " in\n" << *table;
  }
  EXPECT_FALSE(absl::StrContains(*table, refund)) << *table;

  // A probe nobody answers: every record is left, the command still works.
  absl::StatusOr<std::string> dead = Idemctl(
      addr, {"reconcile", "--probe", absl::StrCat("127.0.0.1:", FreePort()),
             "--dry-run", "--probe-timeout", "1s"});
  ASSERT_TRUE(dead.ok()) << dead.status();
  EXPECT_TRUE(absl::StrContains(*dead,
                                "0 would settle SUCCEEDED, 0 FAILED "
                                "retryable, 4 stay UNKNOWN"))
      << *dead;

  // A preview changes nothing.
  for (const pb::RecordKey& k : keys) {
    const pb::Record r = GetRecord(env2, k);
    EXPECT_EQ(r.status(), pb::STATUS_UNKNOWN) << r.DebugString();
    EXPECT_TRUE(ReconcilerEntries(env2, k).empty());
  }
  EXPECT_EQ(RowCount(env2, applied), 1);
  EXPECT_EQ(RowCount(env2, not_applied), 0);
}

}  // namespace
}  // namespace idem::testing
