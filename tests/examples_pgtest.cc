// End to end: the callers in examples/ against a real sidecar over a
// throwaway PostgreSQL. Runs the Python and Node walkthroughs, then the
// payments demo (an HTTP service implementing the Idempotency-Key header) over
// HTTP: create, replay, mismatch, missing key, in-flight conflict, declined
// payments, an UNKNOWN attempt that is never re-executed, an unreachable
// sidecar, and one payments row per key carrying the sidecar's fencing token.
// Then the same acceptance checks, and an UNKNOWN attempt, with the demo's
// idempotency code switched off (DEMO_IDEMPOTENCY=off) behind the sidecar's
// HTTP gateway (--http-listen, docs/gateway.md).
//
// Needs python3-grpcio, protoc with grpc_python_plugin, node and npm (with
// access to the npm registry the first time): a missing one fails the test.
#include <sys/stat.h>
#include <sys/time.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"
#include "tests/testing/files.h"
#include "tests/testing/ports.h"
#include "tests/testing/process.h"

namespace idem::testing {
namespace {

SidecarEnv* env = nullptr;

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SidecarEnv>> e =
        SidecarEnv::Start(IDEM_SIDECAR_PATH, 1);
    ASSERT_TRUE(e.ok()) << e.status();
    env_ = *std::move(e);
    env = env_.get();
  }
  void TearDown() override {
    env = nullptr;
    env_.reset();
  }

 private:
  std::unique_ptr<SidecarEnv> env_;
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Environment());

// The repository's root: this file is <root>/tests/examples_pgtest.cc.
std::string RepoRoot() {
  absl::string_view file = __FILE__;
  absl::ConsumeSuffix(&file, "tests/examples_pgtest.cc");
  absl::ConsumeSuffix(&file, "/");
  return file.empty() ? "." : std::string(file);
}

std::string Example(const std::string& path) {
  return RepoRoot() + "/examples/" + path;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// --- A minimal HTTP/1.1 client: one request per connection. ---

// --- The payments demo as a child process. ---

constexpr char kTenant[] = "payments-demo";
constexpr char kPayment[] =
    R"({"amount_minor": 1250, "currency": "EUR", "payee": "acme"})";

class Demo {
 public:
  // Starts examples/payments-demo/run.sh against the sidecar at `idem_addr`
  // and the test's PostgreSQL, with `extra_env` added; waits until it serves
  // HTTP (the first start installs the npm packages, hence the long wait).
  static absl::StatusOr<std::unique_ptr<Demo>> Start(
      const std::string& idem_addr,
      const std::vector<std::string>& extra_env = {}) {
    absl::StatusOr<std::string> dir = MakeTempDir("idem-demo-");
    if (!dir.ok()) return dir.status();
    auto demo = std::unique_ptr<Demo>(new Demo(*dir, FreePort()));
    std::vector<std::string> vars = {
        "IDEM_ADDR=" + idem_addr, "DEMO_POSTGRES=" + env->pg().ConnInfo(),
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
        return absl::UnavailableError(
            absl::StrCat("payments demo did not start:\n", demo->Log()));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return demo;
  }

  ~Demo() {
    process_.reset();
    RemoveTempDir(dir_);
  }

  int port() const { return port_; }
  Process& process() { return *process_; }
  std::string Log() const { return process_ ? process_->Log() : ""; }

  absl::StatusOr<HttpResponse> Pay(const std::string& key,
                                   const std::string& body = kPayment) {
    return HttpPost(port_, "/payments", body, {{"Idempotency-Key", key}});
  }

 private:
  Demo(std::string dir, int port) : dir_(std::move(dir)), port_(port) {}

  const std::string dir_;
  const int port_;
  std::unique_ptr<Process> process_;
};

// The sidecar's record of the demo's `key`, of `tenant` (the demo's own, or
// the gateway's); fails the test on an RPC error.
pb::Record SidecarRecord(const std::string& key,
                         const std::string& tenant = kTenant) {
  pb::GetRequest req;
  *req.mutable_key() = Key(tenant, "create-payment", key);
  pb::GetResponse resp;
  grpc::Status s = env->client(0).Get(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << key << ": " << s.error_message();
  return resp.record();
}

// Polls the sidecar until the record of `key` has `status`.
bool WaitForStatus(const std::string& key, pb::Status status) {
  const absl::Time end = absl::Now() + absl::Seconds(15);
  while (absl::Now() < end) {
    pb::GetRequest req;
    *req.mutable_key() = Key(kTenant, "create-payment", key);
    pb::GetResponse resp;
    if (env->client(0).Get(Ctx().get(), req, &resp).ok() &&
        resp.record().status() == status) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// The rows of the demo's payments table for `key`, as
// "payment_id|fencing_token" lines.
std::string PaymentRows(const std::string& key) {
  return env->Sql(
      absl::StrCat("SELECT payment_id || '|' || fencing_token FROM payments "
                   "WHERE idempotency_key = '",
                   key, "'"));
}

int64_t RowCount(const std::string& key) {
  int64_t n = -1;
  EXPECT_TRUE(
      absl::SimpleAtoi(env->Sql(absl::StrCat("SELECT count(*) FROM payments "
                                             "WHERE idempotency_key = '",
                                             key, "'")),
                       &n));
  return n;
}

// --- The HTTP gateway in front of the demo. ---

// The gateway's records: its default tenant, and the route's name as their
// operation.
constexpr char kGatewayTenant[] = "http";
constexpr char kGatewayConfig[] = R"(gateway:
  routes:
    - name: create-payment
      methods: [POST]
      path: /payments
      key: required
)";

// A sidecar over the test's PostgreSQL serving the HTTP gateway on its own
// port, in front of the service at 127.0.0.1:`upstream_port`, with `config`
// as its --config.
class Gateway {
 public:
  static absl::StatusOr<std::unique_ptr<Gateway>> Start(
      int upstream_port, const std::string& config_yaml = kGatewayConfig) {
    absl::StatusOr<std::string> dir = MakeTempDir("idem-gateway-");
    if (!dir.ok()) return dir.status();
    auto gateway = std::unique_ptr<Gateway>(new Gateway(*dir, FreePort()));
    const std::string config = *dir + "/gateway.yaml";
    if (!(std::ofstream(config) << config_yaml)) {
      return absl::InternalError("cannot write " + config);
    }
    std::vector<std::string> args = env->PostgresFlags();
    args.push_back("--config=" + config);
    args.push_back(absl::StrCat("--http-listen=127.0.0.1:", gateway->port_));
    args.push_back(
        absl::StrCat("--http-upstream=http://127.0.0.1:", upstream_port));
    absl::StatusOr<std::unique_ptr<SidecarProcess>> sidecar =
        SidecarProcess::Start(IDEM_SIDECAR_PATH, args);
    if (!sidecar.ok()) return sidecar.status();
    gateway->sidecar_ = *std::move(sidecar);
    if (absl::Status s = WaitForPort(gateway->port_, absl::Seconds(10));
        !s.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "gateway not listening: ", s.message(), "\n", gateway->Log()));
    }
    return gateway;
  }

  ~Gateway() {
    sidecar_.reset();
    RemoveTempDir(dir_);
  }

  int port() const { return port_; }
  std::string Log() const { return sidecar_ ? sidecar_->Log() : ""; }

  absl::StatusOr<HttpResponse> Pay(const std::string& key,
                                   const std::string& body) {
    return HttpPost(port_, "/payments", body, {{"Idempotency-Key", key}});
  }

 private:
  Gateway(std::string dir, int port) : dir_(std::move(dir)), port_(port) {}

  const std::string dir_;
  const int port_;
  std::unique_ptr<SidecarProcess> sidecar_;
};

// The demo with DEMO_IDEMPOTENCY=off. Its IDEM_ADDR has no listener: in this
// mode the demo must not need a sidecar.
absl::StatusOr<std::unique_ptr<Demo>> StartDemoOff(
    const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> vars = {"DEMO_IDEMPOTENCY=off"};
  vars.insert(vars.end(), extra_env.begin(), extra_env.end());
  return Demo::Start(absl::StrCat("127.0.0.1:", FreePort()), vars);
}

// A payment to `payee`; off mode stores no key, so the tests count a
// payment's rows by a payee of their own.
std::string PaymentTo(const std::string& payee, int64_t amount_minor = 1250) {
  return absl::StrCat(R"({"amount_minor": )", amount_minor,
                      R"(, "currency": "EUR", "payee": ")", payee, R"("})");
}

int64_t RowsOfPayee(const std::string& payee) {
  int64_t n = -1;
  EXPECT_TRUE(absl::SimpleAtoi(
      env->Sql(absl::StrCat("SELECT count(*) FROM payments WHERE payee = '",
                            payee, "'")),
      &n));
  return n;
}

// The gateway's record of `key` (fails the test on an RPC error).
pb::Record GatewayRecord(const std::string& key) {
  return SidecarRecord(key, kGatewayTenant);
}

// Polls the sidecar until the gateway's record of `key` has `status`.
bool WaitForGatewayStatus(const std::string& key, pb::Status status) {
  const absl::Time end = absl::Now() + absl::Seconds(15);
  while (absl::Now() < end) {
    if (GatewayRecord(key).status() == status) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// --- Tests ---

class ExamplesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(env, nullptr) << "environment did not start";
    ASSERT_TRUE(FileExists(Example("python/run.sh")))
        << "examples not found under " << RepoRoot();
  }

  // A key unique to the running test.
  static std::string TestKey(const std::string& tag) {
    return absl::StrCat(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
        tag);
  }
};

TEST_F(ExamplesTest, PythonWalkthrough) {
  RunOptions options;
  options.timeout = absl::Minutes(2);
  absl::StatusOr<std::string> out = RunCommand(
      {"bash", Example("python/run.sh"), env->sidecar(0).Address()}, options);
  ASSERT_TRUE(out.ok()) << out.status();
  std::cout << *out;
  EXPECT_TRUE(absl::StrContains(*out, "all steps behaved as docs/spec.md says"))
      << *out;
  EXPECT_EQ(env->Sql("SELECT count(*) FROM idempotency_record WHERE "
                     "tenant_id = 'examples' AND idempotency_key LIKE 'py-%' "
                     "AND status = 'SUCCEEDED'"),
            "1");
}

TEST_F(ExamplesTest, NodeWalkthrough) {
  RunOptions options;
  options.timeout = absl::Minutes(5);  // npm ci on the first run
  absl::StatusOr<std::string> out = RunCommand(
      {"bash", Example("node/run.sh"), env->sidecar(0).Address()}, options);
  ASSERT_TRUE(out.ok()) << out.status();
  std::cout << *out;
  EXPECT_TRUE(absl::StrContains(*out, "all steps behaved as docs/spec.md says"))
      << *out;
  EXPECT_EQ(env->Sql("SELECT count(*) FROM idempotency_record WHERE "
                     "tenant_id = 'examples' AND idempotency_key LIKE 'node-%' "
                     "AND status = 'SUCCEEDED'"),
            "1");
}

TEST_F(ExamplesTest, PaymentsDemoCreatesOnceAndReplays) {
  absl::StatusOr<std::unique_ptr<Demo>> demo =
      Demo::Start(env->sidecar(0).Address());
  ASSERT_TRUE(demo.ok()) << demo.status();
  Demo& d = **demo;
  const std::string key = TestKey("a");

  absl::StatusOr<HttpResponse> first = d.Pay(key);
  ASSERT_TRUE(first.ok()) << first.status() << d.Log();
  ASSERT_EQ(first->status, 201) << first->body << d.Log();
  EXPECT_TRUE(absl::StrContains(first->body, R"("payment_id":"pay_)"))
      << first->body;
  EXPECT_EQ(first->Header("idempotent-replayed"), "");
  EXPECT_TRUE(absl::StrContains(first->Header("location"), "/payments/pay_"))
      << first->Header("location");

  // The same payment, keys reordered and spaced otherwise: a replay of the
  // first response, byte for byte, with its headers.
  absl::StatusOr<HttpResponse> again =
      d.Pay(key, R"({"payee":"acme","currency":"EUR","amount_minor":1250})");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, 201) << again->body;
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(again->Header("idempotent-replayed"), "true");
  EXPECT_EQ(again->Header("location"), first->Header("location"));
  EXPECT_EQ(again->Header("content-type"), "application/json");

  // The same key with another payment.
  absl::StatusOr<HttpResponse> other = d.Pay(
      key, R"({"amount_minor": 9999, "currency": "EUR", "payee": "acme"})");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->status, 422) << other->body;
  EXPECT_FALSE(absl::StrContains(other->body, "payment_id")) << other->body;

  // No key at all.
  absl::StatusOr<HttpResponse> keyless =
      HttpPost(d.port(), "/payments", kPayment, {});
  ASSERT_TRUE(keyless.ok()) << keyless.status();
  EXPECT_EQ(keyless->status, 400) << keyless->body;
  EXPECT_TRUE(absl::StrContains(keyless->body, "Idempotency-Key"))
      << keyless->body;

  // One row, written with the token the sidecar granted.
  const pb::Record record = SidecarRecord(key);
  EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(record.result().body(), first->body);
  ASSERT_EQ(RowCount(key), 1);
  const std::string row = PaymentRows(key);
  EXPECT_EQ(row.substr(row.find('|') + 1),
            absl::StrCat(record.fencing_token()));
  EXPECT_TRUE(absl::StrContains(first->body, row.substr(0, row.find('|'))))
      << first->body;
}

TEST_F(ExamplesTest, PaymentsDemoReplaysADeclineWithoutWriting) {
  absl::StatusOr<std::unique_ptr<Demo>> demo =
      Demo::Start(env->sidecar(0).Address());
  ASSERT_TRUE(demo.ok()) << demo.status();
  const std::string key = TestKey("big");
  const std::string big =
      R"({"amount_minor": 500000000, "currency": "EUR", "payee": "acme"})";

  absl::StatusOr<HttpResponse> first = (*demo)->Pay(key, big);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->status, 402) << first->body;
  absl::StatusOr<HttpResponse> again = (*demo)->Pay(key, big);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, 402) << again->body;
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(again->Header("idempotent-replayed"), "true");
  EXPECT_EQ(SidecarRecord(key).status(), pb::STATUS_FAILED);
  EXPECT_EQ(RowCount(key), 0);
}

TEST_F(ExamplesTest, PaymentsDemoAnswers409WhileInFlight) {
  // A slow instance whose 4 s write outlives its 2 s lease: only heartbeats
  // keep the attempt alive. A second instance answers the concurrent retry.
  absl::StatusOr<std::unique_ptr<Demo>> slow = Demo::Start(
      env->sidecar(0).Address(), {"DEMO_SLOW_MS=4000", "DEMO_LEASE_MS=2000"});
  ASSERT_TRUE(slow.ok()) << slow.status();
  absl::StatusOr<std::unique_ptr<Demo>> fast =
      Demo::Start(env->sidecar(0).Address());
  ASSERT_TRUE(fast.ok()) << fast.status();
  const std::string key = TestKey("a");

  absl::StatusOr<HttpResponse> first = absl::UnknownError("not run");
  std::thread writer([&] { first = (*slow)->Pay(key); });
  ASSERT_TRUE(WaitForStatus(key, pb::STATUS_PROCESSING));
  absl::SleepFor(absl::Milliseconds(2300));  // past the first lease

  absl::StatusOr<HttpResponse> conflict = (*fast)->Pay(key);
  writer.join();
  ASSERT_TRUE(conflict.ok()) << conflict.status();
  EXPECT_EQ(conflict->status, 409) << conflict->body << (*fast)->Log();
  int retry_after = 0;
  EXPECT_TRUE(absl::SimpleAtoi(conflict->Header("retry-after"), &retry_after))
      << "Retry-After: " << conflict->Header("retry-after");
  EXPECT_GE(retry_after, 1);

  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->status, 201) << first->body << (*slow)->Log();
  absl::StatusOr<HttpResponse> replay = (*fast)->Pay(key);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->status, 201);
  EXPECT_EQ(replay->body, first->body);
  EXPECT_EQ(replay->Header("idempotent-replayed"), "true");

  const pb::Record record = SidecarRecord(key);
  EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
  ASSERT_EQ(RowCount(key), 1);
  const std::string row = PaymentRows(key);
  EXPECT_EQ(row.substr(row.find('|') + 1),
            absl::StrCat(record.fencing_token()));
}

TEST_F(ExamplesTest, PaymentsDemoFencesOffAStaleAttempt) {
  absl::StatusOr<std::unique_ptr<Demo>> slow =
      Demo::Start(env->sidecar(0).Address(), {"DEMO_SLOW_MS=3000"});
  ASSERT_TRUE(slow.ok()) << slow.status();
  absl::StatusOr<std::unique_ptr<Demo>> fast =
      Demo::Start(env->sidecar(0).Address());
  ASSERT_TRUE(fast.ok()) << fast.status();
  const std::string key = TestKey("a");

  // Token 1 is writing slowly when an operator forces the record to FAILED
  // (retryable), so the next request acquires token 2 and writes first.
  absl::StatusOr<HttpResponse> stale = absl::UnknownError("not run");
  std::thread writer([&] { stale = (*slow)->Pay(key); });
  ASSERT_TRUE(WaitForStatus(key, pb::STATUS_PROCESSING));
  pb::ResolveRequest req;
  *req.mutable_key() = Key(kTenant, "create-payment", key);
  req.set_to(pb::STATUS_FAILED);
  req.set_retryable(true);
  req.set_force(true);
  req.set_reason("holder presumed dead");
  req.set_actor("examples_pgtest");
  pb::ResolveResponse resp;
  grpc::Status s = env->admin(0).Resolve(Ctx().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  absl::StatusOr<HttpResponse> fresh = (*fast)->Pay(key);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->status, 201) << fresh->body << (*fast)->Log();
  EXPECT_EQ(SidecarRecord(key).fencing_token(), 2);

  // Token 1's write comes late: the payments table refuses it.
  writer.join();
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(stale->status, 409) << stale->body << (*slow)->Log();
  EXPECT_TRUE(absl::StrContains(stale->body, "superseded")) << stale->body;
  ASSERT_EQ(RowCount(key), 1);
  const std::string row = PaymentRows(key);
  EXPECT_EQ(row.substr(row.find('|') + 1), "2");
  EXPECT_TRUE(absl::StrContains(fresh->body, row.substr(0, row.find('|'))))
      << row << " vs " << fresh->body;
}

TEST_F(ExamplesTest, PaymentsDemoWritesOncePerKeyUnderConcurrentRetries) {
  absl::StatusOr<std::unique_ptr<Demo>> a =
      Demo::Start(env->sidecar(0).Address(), {"DEMO_SLOW_MS=300"});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::unique_ptr<Demo>> b =
      Demo::Start(env->sidecar(0).Address(), {"DEMO_SLOW_MS=300"});
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string key = TestKey("a");

  // 50 identical POSTs at once, each retrying its 409s like a client
  // honouring Retry-After: one payment, 50 identical final answers.
  constexpr int kCallers = 50;
  std::vector<absl::StatusOr<HttpResponse>> responses(
      kCallers, absl::UnknownError("not run"));
  std::atomic<int> conflicts{0};
  std::vector<std::thread> callers;
  callers.reserve(kCallers);
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int attempt = 0; attempt < 100; ++attempt) {
        responses[i] = (i % 2 ? *a : *b)->Pay(key);
        if (!responses[i].ok() || responses[i]->status != 409) return;
        EXPECT_FALSE(responses[i]->Header("retry-after").empty());
        ++conflicts;
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_GT(conflicts.load(), 0);

  int created = 0;
  std::string body;
  for (const absl::StatusOr<HttpResponse>& r : responses) {
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 201) << r->body;
    if (r->Header("idempotent-replayed").empty()) ++created;
    if (body.empty()) body = r->body;
    EXPECT_EQ(r->body, body);
  }
  EXPECT_EQ(created, 1);
  ASSERT_EQ(RowCount(key), 1);
  const std::string row = PaymentRows(key);
  EXPECT_EQ(row.substr(row.find('|') + 1),
            absl::StrCat(SidecarRecord(key).fencing_token()));
}

TEST_F(ExamplesTest, PaymentsDemoNeverReexecutesAnUnknownAttempt) {
  absl::StatusOr<std::unique_ptr<Demo>> doomed = Demo::Start(
      env->sidecar(0).Address(), {"DEMO_SLOW_MS=4000", "DEMO_LEASE_MS=1000"});
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  absl::StatusOr<std::unique_ptr<Demo>> demo =
      Demo::Start(env->sidecar(0).Address());
  ASSERT_TRUE(demo.ok()) << demo.status();
  const std::string key = TestKey("a");

  // The instance dies in the middle of its write; its lease runs out.
  std::thread writer([&] { (void)(*doomed)->Pay(key); });
  ASSERT_TRUE(WaitForStatus(key, pb::STATUS_PROCESSING));
  ASSERT_TRUE((*doomed)->process().Kill().ok());
  writer.join();
  ASSERT_TRUE(WaitForStatus(key, pb::STATUS_UNKNOWN));

  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<HttpResponse> r = (*demo)->Pay(key);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 503) << r->body;
    EXPECT_TRUE(absl::StrContains(r->body, "will not be executed again"))
        << r->body;
  }
  EXPECT_EQ(RowCount(key), 0);

  // An operator settles it; retries get the settled result.
  pb::ResolveRequest req;
  *req.mutable_key() = Key(kTenant, "create-payment", key);
  req.set_to(pb::STATUS_SUCCEEDED);
  req.mutable_result()->set_code(201);
  req.mutable_result()->set_body(R"({"payment_id":"pay_settled"})");
  req.mutable_result()->set_content_type("application/json");
  req.set_reason("no payment at the provider; settled by hand");
  req.set_actor("examples_pgtest");
  pb::ResolveResponse resp;
  grpc::Status s = env->admin(0).Resolve(Ctx().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  absl::StatusOr<HttpResponse> settled = (*demo)->Pay(key);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(settled->status, 201);
  EXPECT_EQ(settled->body, R"({"payment_id":"pay_settled"})");
  EXPECT_EQ(settled->Header("idempotent-replayed"), "true");
  EXPECT_EQ(RowCount(key), 0);
}

TEST_F(ExamplesTest, PaymentsDemoAnswers503WithoutTheSidecar) {
  absl::StatusOr<std::unique_ptr<Demo>> demo =
      Demo::Start(absl::StrCat("127.0.0.1:", FreePort()));
  ASSERT_TRUE(demo.ok()) << demo.status();
  const std::string key = TestKey("a");
  absl::StatusOr<HttpResponse> r = (*demo)->Pay(key);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_FALSE(r->Header("retry-after").empty());
  EXPECT_EQ(RowCount(key), 0);
}

TEST_F(ExamplesTest, PaymentsDemoOffExecutesEveryRequest) {
  absl::StatusOr<std::unique_ptr<Demo>> demo = StartDemoOff();
  ASSERT_TRUE(demo.ok()) << demo.status();
  Demo& d = **demo;
  const std::string payee = TestKey("payee");

  // Straight to the demo, with and without a key: each is a new payment.
  absl::StatusOr<HttpResponse> keyed = d.Pay(TestKey("a"), PaymentTo(payee));
  ASSERT_TRUE(keyed.ok()) << keyed.status() << d.Log();
  EXPECT_EQ(keyed->status, 201) << keyed->body << d.Log();
  absl::StatusOr<HttpResponse> keyless =
      HttpPost(d.port(), "/payments", PaymentTo(payee), {});
  ASSERT_TRUE(keyless.ok()) << keyless.status();
  EXPECT_EQ(keyless->status, 201) << keyless->body;
  EXPECT_NE(keyless->body, keyed->body);
  EXPECT_TRUE(absl::StrContains(keyless->Header("location"), "/payments/pay_"))
      << keyless->Header("location");
  EXPECT_EQ(keyless->Header("idempotent-replayed"), "");

  // Neither key nor fencing token in the rows.
  EXPECT_EQ(RowsOfPayee(payee), 2);
  EXPECT_EQ(env->Sql(absl::StrCat(
                "SELECT count(*) FROM payments WHERE payee = '", payee,
                "' AND idempotency_key IS NULL AND fencing_token IS NULL")),
            "2");
}

TEST_F(ExamplesTest, PaymentsDemoBehindTheGatewayCreatesOnceAndReplays) {
  absl::StatusOr<std::unique_ptr<Demo>> demo = StartDemoOff();
  ASSERT_TRUE(demo.ok()) << demo.status();
  absl::StatusOr<std::unique_ptr<Gateway>> gateway =
      Gateway::Start((*demo)->port());
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  Gateway& g = **gateway;
  const std::string key = TestKey("a");
  const std::string payee = TestKey("payee");
  const std::string payment = PaymentTo(payee);

  absl::StatusOr<HttpResponse> first = g.Pay(key, payment);
  ASSERT_TRUE(first.ok()) << first.status() << g.Log();
  ASSERT_EQ(first->status, 201) << first->body << (*demo)->Log() << g.Log();
  EXPECT_TRUE(absl::StrContains(first->body, R"("payment_id":"pay_)"))
      << first->body;
  EXPECT_EQ(first->Header("idempotent-replayed"), "");
  EXPECT_TRUE(absl::StrContains(first->Header("location"), "/payments/pay_"))
      << first->Header("location");
  EXPECT_EQ(RowsOfPayee(payee), 1);

  // The retry: the first answer, byte for byte, with its headers, and no
  // second payment.
  absl::StatusOr<HttpResponse> again = g.Pay(key, payment);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, 201) << again->body;
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(again->Header("idempotent-replayed"), "true");
  EXPECT_EQ(again->Header("location"), first->Header("location"));
  EXPECT_EQ(again->Header("content-type"), "application/json");
  EXPECT_EQ(RowsOfPayee(payee), 1);

  // The same key with another payment, and with the same payment written
  // otherwise: the gateway compares the body's bytes, not its JSON.
  for (const std::string& other :
       {PaymentTo(payee, 9999),
        absl::StrCat(R"({"payee":")", payee,
                     R"(","currency":"EUR","amount_minor":1250})")}) {
    absl::StatusOr<HttpResponse> r = g.Pay(key, other);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 422) << other << ": " << r->body;
    EXPECT_TRUE(absl::StrContains(r->body, "key-reused")) << r->body;
    EXPECT_EQ(r->Header("content-type"), "application/problem+json");
  }

  // No key at all: refused before the demo sees it.
  absl::StatusOr<HttpResponse> keyless =
      HttpPost(g.port(), "/payments", payment, {});
  ASSERT_TRUE(keyless.ok()) << keyless.status();
  EXPECT_EQ(keyless->status, 400) << keyless->body;
  EXPECT_TRUE(absl::StrContains(keyless->body, "key-missing")) << keyless->body;
  EXPECT_EQ(RowsOfPayee(payee), 1);

  // The gateway's record holds the first answer.
  const pb::Record record = GatewayRecord(key);
  EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(record.result().code(), 201);
  EXPECT_EQ(record.result().body(), first->body);
}

TEST_F(ExamplesTest, PaymentsDemoBehindTheGatewayReplaysADecline) {
  absl::StatusOr<std::unique_ptr<Demo>> demo = StartDemoOff();
  ASSERT_TRUE(demo.ok()) << demo.status();
  absl::StatusOr<std::unique_ptr<Gateway>> gateway =
      Gateway::Start((*demo)->port());
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  const std::string key = TestKey("big");
  const std::string payee = TestKey("payee");
  const std::string big = PaymentTo(payee, 500000000);

  absl::StatusOr<HttpResponse> first = (*gateway)->Pay(key, big);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->status, 402) << first->body << (*gateway)->Log();
  EXPECT_EQ(first->Header("idempotent-replayed"), "");
  absl::StatusOr<HttpResponse> again = (*gateway)->Pay(key, big);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, 402) << again->body;
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(again->Header("idempotent-replayed"), "true");
  EXPECT_EQ(again->Header("content-type"), "application/problem+json");

  // A final answer: recorded with Complete, whatever its status.
  const pb::Record record = GatewayRecord(key);
  EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(record.result().code(), 402);
  EXPECT_EQ(RowsOfPayee(payee), 0);
}

TEST_F(ExamplesTest, PaymentsDemoBehindTheGatewayWritesOnceUnderRetries) {
  absl::StatusOr<std::unique_ptr<Demo>> demo =
      StartDemoOff({"DEMO_SLOW_MS=300"});
  ASSERT_TRUE(demo.ok()) << demo.status();
  absl::StatusOr<std::unique_ptr<Gateway>> gateway =
      Gateway::Start((*demo)->port());
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  const std::string key = TestKey("a");
  const std::string payee = TestKey("payee");
  const std::string payment = PaymentTo(payee);

  // 50 identical POSTs at once, each retrying its 409s like a client
  // honouring Retry-After: one payment, 50 identical final answers.
  constexpr int kCallers = 50;
  std::vector<absl::StatusOr<HttpResponse>> responses(
      kCallers, absl::UnknownError("not run"));
  std::atomic<int> conflicts{0};
  std::vector<std::thread> callers;
  callers.reserve(kCallers);
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int attempt = 0; attempt < 100; ++attempt) {
        responses[i] = (*gateway)->Pay(key, payment);
        if (!responses[i].ok() || responses[i]->status != 409) return;
        EXPECT_TRUE(
            absl::StrContains(responses[i]->body, "request-in-progress"))
            << responses[i]->body;
        EXPECT_FALSE(responses[i]->Header("retry-after").empty());
        ++conflicts;
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_GT(conflicts.load(), 0);

  int created = 0;
  std::string body;
  for (const absl::StatusOr<HttpResponse>& r : responses) {
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 201) << r->body << (*gateway)->Log();
    if (r->Header("idempotent-replayed").empty()) ++created;
    if (body.empty()) body = r->body;
    EXPECT_EQ(r->body, body);
  }
  EXPECT_EQ(created, 1);
  EXPECT_EQ(RowsOfPayee(payee), 1);
  EXPECT_EQ(GatewayRecord(key).result().body(), body);
}

TEST_F(ExamplesTest, PaymentsDemoBehindTheGatewayNeverReexecutesAnUnknown) {
  // The demo dies right after its row commits, before answering; the
  // route's 2 s lease then runs out.
  const std::string config =
      absl::StrCat(kGatewayConfig, "      lease: 2s\n", "      timeout: 1s\n");
  absl::StatusOr<std::unique_ptr<Demo>> doomed =
      StartDemoOff({"DEMO_CRASH=after-write"});
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  absl::StatusOr<std::unique_ptr<Gateway>> first =
      Gateway::Start((*doomed)->port(), config);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string key = TestKey("a");
  const std::string payee = TestKey("payee");
  const std::string payment = PaymentTo(payee);

  absl::StatusOr<HttpResponse> lost = (*first)->Pay(key, payment);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->status, 502) << lost->body << (*first)->Log();
  EXPECT_TRUE(absl::StrContains(lost->body, "outcome-unknown")) << lost->body;
  EXPECT_EQ(RowsOfPayee(payee), 1);

  // Another gateway in front of a live demo: the key is never run again.
  absl::StatusOr<std::unique_ptr<Demo>> demo = StartDemoOff();
  ASSERT_TRUE(demo.ok()) << demo.status();
  absl::StatusOr<std::unique_ptr<Gateway>> second =
      Gateway::Start((*demo)->port(), config);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(WaitForGatewayStatus(key, pb::STATUS_UNKNOWN));
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<HttpResponse> r = (*second)->Pay(key, payment);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 409) << r->body;
    EXPECT_TRUE(absl::StrContains(r->body, "outcome-unknown")) << r->body;
  }
  EXPECT_EQ(RowsOfPayee(payee), 1);
}

}  // namespace
}  // namespace idem::testing
