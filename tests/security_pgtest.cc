// Security with real processes: TLS and mutual TLS, principals from tokens
// and certificates, tenant isolation, operator authorization, per-tenant
// limits, hostile keys, oversize input and PostgreSQL least privilege.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"
#include "tests/testing/files.h"
#include "tests/testing/pki.h"
#include "tests/testing/ports.h"
#include "tests/testing/process.h"

namespace idem::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;

constexpr char kPaymentsToken[] = "tok-payments-0123456789abcdef";
constexpr char kOpsToken[] = "tok-ops-all-0123456789abcdef";
constexpr char kOpsBToken[] = "tok-ops-b-0123456789abcdef";
constexpr char kCertSan[] = "spiffe://test/payments";

std::string TokensJson(const std::string& payments_token) {
  return absl::StrCat(R"({"principals": [
    {"name": "payments", "token": ")",
                      payments_token,
                      R"(", "tenants": ["tenant-a"], "role": "service"},
    {"name": "ops", "token": ")",
                      kOpsToken, R"(", "tenants": ["*"], "role": "operator"},
    {"name": "ops-b", "token": ")",
                      kOpsBToken,
                      R"(", "tenants": ["tenant-b"], "role": "operator"}],
  "certificates": [
    {"san": ")",
                      kCertSan,
                      R"(", "name": "payments-cert", "tenants": ["tenant-a"],
     "role": "service"}]})");
}

struct World {
  std::unique_ptr<SidecarEnv> env;  // plaintext, tokens (auth on)
  Pki pki;
  std::string tokens_path;
  std::unique_ptr<SidecarProcess> tls;  // TLS + mTLS + tokens
};

World* world = nullptr;

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<std::string> dir = MakeTempDir("idem-pki-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    w_.pki.dir = *dir;
    ASSERT_TRUE(w_.pki.MakeCa("ca").ok());
    ASSERT_TRUE(w_.pki.MakeCa("other-ca").ok());
    ASSERT_TRUE(
        w_.pki.MakeCert("server", "ca", "DNS:localhost,IP:127.0.0.1").ok());
    ASSERT_TRUE(
        w_.pki.MakeCert("client", "ca", std::string("URI:") + kCertSan).ok());
    ASSERT_TRUE(
        w_.pki.MakeCert("unmapped", "ca", "URI:spiffe://test/stranger").ok());
    ASSERT_TRUE(
        w_.pki.MakeCert("foreign", "other-ca", std::string("URI:") + kCertSan)
            .ok());
    ASSERT_TRUE(
        w_.pki.MakeCert("expired", "ca", std::string("URI:") + kCertSan, "-1")
            .ok());
    w_.tokens_path = w_.pki.Path("tokens.json");
    std::ofstream(w_.tokens_path) << TokensJson(kPaymentsToken);
    absl::StatusOr<std::unique_ptr<SidecarEnv>> e = SidecarEnv::Start(
        IDEM_SIDECAR_PATH, 1, {"--auth-tokens=" + w_.tokens_path});
    ASSERT_TRUE(e.ok()) << e.status();
    w_.env = *std::move(e);
    absl::StatusOr<std::unique_ptr<SidecarProcess>> tls = SidecarProcess::Start(
        IDEM_SIDECAR_PATH, {"--postgres=" + w_.env->pg().ConnInfo(),
                            "--auth-tokens=" + w_.tokens_path,
                            "--tls-cert=" + w_.pki.Path("server.pem"),
                            "--tls-key=" + w_.pki.Path("server.key"),
                            "--tls-client-ca=" + w_.pki.Path("ca.pem")});
    ASSERT_TRUE(tls.ok()) << tls.status();
    w_.tls = *std::move(tls);
    world = &w_;
  }
  void TearDown() override {
    world = nullptr;
    w_.tls.reset();
    w_.env.reset();
    RemoveTempDir(w_.pki.dir);
  }

 private:
  World w_;
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Environment());

std::unique_ptr<grpc::ClientContext> AuthCtx(const std::string& token) {
  std::unique_ptr<grpc::ClientContext> ctx = Ctx();
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

pb::BeginRequest BeginReq(const std::string& tenant, const std::string& key) {
  pb::BeginRequest req;
  *req.mutable_key() = Key(tenant, "create-payment", key);
  req.set_request_hash("hash-1");
  return req;
}

// A channel to the TLS sidecar trusting `ca`, presenting `cert` (if any).
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& ca,
                                          const std::string& cert) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadFile(world->pki.Path(ca + ".pem"));
  if (!cert.empty()) {
    options.pem_cert_chain = ReadFile(world->pki.Path(cert + ".pem"));
    options.pem_private_key = ReadFile(world->pki.Path(cert + ".key"));
  }
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  return grpc::CreateCustomChannel(world->tls->Address(),
                                   grpc::SslCredentials(options), args);
}

// Both sidecars poll the tokens file once a second, each on its own: a test
// that rewrites it waits until the TLS one serves the client certificate
// again, so that the next test does not meet that sidecar's older view.
bool TlsSidecarServesTheCertificate() {
  auto stub = pb::Idempotency::NewStub(TlsChannel("ca", "client"));
  pb::GetRequest get;
  *get.mutable_key() = Key("tenant-a", "create-payment", "absent");
  pb::GetResponse resp;
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end) {
    if (stub->Get(Ctx().get(), get, &resp).error_code() ==
        grpc::StatusCode::NOT_FOUND) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(world, nullptr) << "setup failed"; }
  pb::Idempotency::Stub& client() { return world->env->client(0); }
  pb::IdempotencyAdmin::Stub& admin() { return world->env->admin(0); }
};

TEST_F(SecurityTest, CallsWithoutAKnownIdentityAreUnauthenticated) {
  pb::BeginResponse resp;
  for (const std::string& token : {std::string(), std::string("nope-token")}) {
    EXPECT_EQ(client()
                  .Begin(AuthCtx(token).get(), BeginReq("tenant-a", "k"), &resp)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  auto ctx = Ctx();
  ctx->AddMetadata("authorization", std::string("Basic ") + kPaymentsToken);
  EXPECT_EQ(
      client().Begin(ctx.get(), BeginReq("tenant-a", "k"), &resp).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  // Even a malformed request learns nothing but that it is unauthenticated.
  EXPECT_EQ(client()
                .Begin(AuthCtx("").get(), BeginReq("bad tenant", ""), &resp)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  pb::ListResponse list;
  EXPECT_EQ(
      admin().List(AuthCtx("").get(), pb::ListRequest(), &list).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
}

// A scanner's failed calls are all counted but barely logged: at most a
// WARN line a second, never ERROR.
TEST_F(SecurityTest, AuthenticationFailuresAreCountedNotFlooded) {
  SidecarProcess& sidecar = world->env->sidecar(0);
  auto failures = [&](const std::string& code) {
    absl::StatusOr<std::string> text =
        HttpGet(sidecar.metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok());
    return std::max(
        0.0, MetricValue(*text, absl::StrCat("idem_auth_failures_total{code=\"",
                                             code, "\"}")));
  };
  auto lines = [&](const std::string& needle) {
    int n = 0;
    for (absl::string_view line : absl::StrSplit(sidecar.Log(), '\n')) {
      if (absl::StrContains(line, needle)) ++n;
    }
    return n;
  };
  // Past the second of any earlier test's line: the first failure logs.
  absl::SleepFor(absl::Milliseconds(1100));
  const double unauthenticated = failures("unauthenticated");
  const double denied = failures("permission_denied");
  const int logged = lines("UNAUTHENTICATED") + lines("PERMISSION_DENIED");
  const int errors = lines("\"level\":\"error\"");
  const absl::Time start = absl::Now();
  constexpr int kCalls = 200;
  pb::BeginResponse resp;
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(client()
                  .Begin(AuthCtx("scanner-token").get(),
                         BeginReq("tenant-a", "k"), &resp)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(client()
                  .Begin(AuthCtx(kPaymentsToken).get(),
                         BeginReq("tenant-b", "k"), &resp)
                  .error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_EQ(failures("unauthenticated") - unauthenticated, kCalls);
  EXPECT_EQ(failures("permission_denied") - denied, kCalls);
  const int new_lines =
      lines("UNAUTHENTICATED") + lines("PERMISSION_DENIED") - logged;
  EXPECT_GE(new_lines, 1);
  EXPECT_LE(new_lines, seconds + 2) << "over " << seconds << " s";
  EXPECT_EQ(lines("\"level\":\"error\""), errors) << sidecar.Log();
}

TEST_F(SecurityTest, CrossTenantAccessIsRefusedForEveryRpc) {
  pb::BeginResponse begin;
  ASSERT_TRUE(
      client()
          .Begin(AuthCtx(kOpsToken).get(), BeginReq("tenant-b", "x"), &begin)
          .ok());
  const pb::RecordKey other = Key("tenant-b", "create-payment", "x");
  using C = grpc::StatusCode;
  pb::HeartbeatRequest hb;
  *hb.mutable_key() = other;
  hb.set_fencing_token(1);
  pb::HeartbeatResponse hb_resp;
  pb::CompleteRequest complete;
  *complete.mutable_key() = other;
  complete.set_fencing_token(1);
  *complete.mutable_result() = BinarySnapshot(200, "x");
  pb::CompleteResponse complete_resp;
  pb::FailRequest fail;
  *fail.mutable_key() = other;
  fail.set_fencing_token(1);
  pb::FailResponse fail_resp;
  pb::GetRequest get;
  *get.mutable_key() = other;
  pb::GetResponse get_resp;
  pb::ResolveRequest resolve;
  *resolve.mutable_key() = other;
  resolve.set_to(pb::STATUS_FAILED);
  resolve.set_reason("r");
  resolve.set_force(true);
  pb::ResolveResponse resolve_resp;
  pb::HistoryRequest history;
  *history.mutable_key() = other;
  pb::HistoryResponse history_resp;
  pb::ListRequest list;
  list.set_tenant("tenant-b");
  pb::ListRequest list_all;
  pb::ListResponse list_resp;
  const std::string t = kPaymentsToken;
  const std::vector<std::pair<std::string, grpc::Status>> calls = {
      {"Begin",
       client().Begin(AuthCtx(t).get(), BeginReq("tenant-b", "x"), &begin)},
      {"Heartbeat", client().Heartbeat(AuthCtx(t).get(), hb, &hb_resp)},
      {"Complete",
       client().Complete(AuthCtx(t).get(), complete, &complete_resp)},
      {"Fail", client().Fail(AuthCtx(t).get(), fail, &fail_resp)},
      {"Get", client().Get(AuthCtx(t).get(), get, &get_resp)},
      // An operator of tenant-b only, and a service principal, on admin.
      {"Resolve(ops-b on tenant-a)", admin().Resolve(
                                         AuthCtx(kOpsBToken).get(),
                                         [&] {
                                           pb::ResolveRequest r = resolve;
                                           r.mutable_key()->set_tenant(
                                               "tenant-a");
                                           return r;
                                         }(),
                                         &resolve_resp)},
      {"List(ops-b, every tenant)",
       admin().List(AuthCtx(kOpsBToken).get(), list_all, &list_resp)},
      {"Resolve(service)",
       admin().Resolve(AuthCtx(t).get(), resolve, &resolve_resp)},
      {"History(service)",
       admin().History(AuthCtx(t).get(), history, &history_resp)},
      {"List(service)", admin().List(AuthCtx(t).get(), list, &list_resp)},
  };
  for (const auto& [name, status] : calls) {
    EXPECT_EQ(status.error_code(), C::PERMISSION_DENIED) << name;
  }
  // Nothing changed.
  ASSERT_TRUE(client().Get(AuthCtx(kOpsToken).get(), get, &get_resp).ok());
  EXPECT_EQ(get_resp.record().status(), pb::STATUS_PROCESSING);
  EXPECT_EQ(get_resp.record().fencing_token(), 1);
  // The scoped operator may act on its own tenant.
  EXPECT_TRUE(
      admin().History(AuthCtx(kOpsBToken).get(), history, &history_resp).ok());
  EXPECT_TRUE(admin().List(AuthCtx(kOpsBToken).get(), list, &list_resp).ok());
}

// 10,000 guessed keys of another tenant, some of them real: nothing leaks.
TEST_F(SecurityTest, GuessedKeysOfAnotherTenantLeakNothing) {
  for (int k = 0; k < 10; ++k) {
    pb::BeginResponse resp;
    ASSERT_TRUE(client()
                    .Begin(AuthCtx(kOpsBToken).get(),
                           BeginReq("tenant-b", absl::StrCat("order-", k)),
                           &resp)
                    .ok());
  }
  const std::string before = world->env->Sql(
      "SELECT count(*), max(updated_at) FROM idempotency_record");
  int denied = 0;
  int leaked = 0;
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::atomic<int> d{0}, l{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto channel = grpc::CreateChannel(world->env->sidecar(0).Address(),
                                         grpc::InsecureChannelCredentials());
      auto stub = pb::Idempotency::NewStub(channel);
      for (int k = t; k < 10000; k += 4) {
        const std::string key = absl::StrCat("order-", k);
        grpc::Status s;
        if (k % 2 == 0) {
          pb::GetRequest req;
          *req.mutable_key() = Key("tenant-b", "create-payment", key);
          pb::GetResponse resp;
          s = stub->Get(AuthCtx(kPaymentsToken).get(), req, &resp);
          if (resp.has_record()) ++l;
        } else {
          pb::BeginResponse resp;
          s = stub->Begin(AuthCtx(kPaymentsToken).get(),
                          BeginReq("tenant-b", key), &resp);
          if (resp.has_record() || resp.outcome() != 0) ++l;
        }
        if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) ++d;
        if (s.ok()) ++l;
      }
    });
  }
  for (auto& t : threads) t.join();
  denied = d;
  leaked = l;
  EXPECT_EQ(denied, 10000);
  EXPECT_EQ(leaked, 0);
  EXPECT_EQ(world->env->Sql(
                "SELECT count(*), max(updated_at) FROM idempotency_record"),
            before);
}

TEST_F(SecurityTest, ResolveRecordsTheAuthenticatedPrincipal) {
  pb::BeginRequest req = BeginReq("tenant-a", "resolve-me");
  req.mutable_lease()->set_seconds(1);
  pb::BeginResponse begin;
  ASSERT_TRUE(client().Begin(AuthCtx(kPaymentsToken).get(), req, &begin).ok());
  absl::SleepFor(absl::Milliseconds(1200));
  pb::GetRequest get;
  *get.mutable_key() = req.key();
  pb::GetResponse got;
  ASSERT_TRUE(client().Get(AuthCtx(kPaymentsToken).get(), get, &got).ok());
  ASSERT_EQ(got.record().status(), pb::STATUS_UNKNOWN);
  pb::ResolveRequest resolve;
  *resolve.mutable_key() = req.key();
  resolve.set_to(pb::STATUS_FAILED);
  resolve.set_retryable(true);
  resolve.set_reason("not in the ledger");
  resolve.set_actor("somebody-else");
  pb::ResolveResponse resp;
  ASSERT_TRUE(admin().Resolve(AuthCtx(kOpsToken).get(), resolve, &resp).ok());
  EXPECT_EQ(resp.record().resolved_by(), "ops");
  pb::HistoryRequest history;
  *history.mutable_key() = req.key();
  pb::HistoryResponse entries;
  ASSERT_TRUE(
      admin().History(AuthCtx(kOpsToken).get(), history, &entries).ok());
  ASSERT_EQ(entries.entries_size(), 2);
  EXPECT_EQ(entries.entries(1).actor(), "ops");
}

TEST_F(SecurityTest, TokenFileReloadTakesEffect) {
  const std::string renewed = "tok-payments-renewed-0123456789";
  std::ofstream(world->tokens_path, std::ios::trunc) << TokensJson(renewed);
  pb::GetRequest get;
  *get.mutable_key() = Key("tenant-a", "create-payment", "absent");
  pb::GetResponse resp;
  const absl::Time end = absl::Now() + absl::Seconds(10);
  grpc::Status s;
  while (absl::Now() < end) {
    s = client().Get(AuthCtx(renewed).get(), get, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(
      client().Get(AuthCtx(kPaymentsToken).get(), get, &resp).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  std::ofstream(world->tokens_path, std::ios::trunc)
      << TokensJson(kPaymentsToken);
  const absl::Time back = absl::Now() + absl::Seconds(10);
  while (absl::Now() < back &&
         client().Get(AuthCtx(kPaymentsToken).get(), get, &resp).error_code() !=
             grpc::StatusCode::NOT_FOUND) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(TlsSidecarServesTheCertificate());
}

// Removing the tokens file revokes every principal within the watcher's
// poll (the old sidecar kept serving the removed tokens); writing it back
// restores them.
TEST_F(SecurityTest, RemovingTheTokensFileRevokesEveryCaller) {
  pb::GetRequest get;
  *get.mutable_key() = Key("tenant-a", "create-payment", "absent");
  pb::GetResponse resp;
  auto code = [&] {
    return client().Get(AuthCtx(kPaymentsToken).get(), get, &resp).error_code();
  };
  ASSERT_EQ(code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_EQ(std::remove(world->tokens_path.c_str()), 0);
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && code() != grpc::StatusCode::UNAUTHENTICATED) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(code(), grpc::StatusCode::UNAUTHENTICATED);
  std::ofstream(world->tokens_path, std::ios::trunc)
      << TokensJson(kPaymentsToken);
  const absl::Time back = absl::Now() + absl::Seconds(10);
  while (absl::Now() < back && code() != grpc::StatusCode::NOT_FOUND) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(TlsSidecarServesTheCertificate());
}

TEST_F(SecurityTest, MutualTlsIdentifiesByCertificateAndRefusesTheRest) {
  auto stub = pb::Idempotency::NewStub(TlsChannel("ca", "client"));
  pb::BeginResponse resp;
  grpc::Status s =
      stub->Begin(Ctx().get(), BeginReq("tenant-a", "mtls"), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(stub->Begin(Ctx().get(), BeginReq("tenant-b", "mtls"), &resp)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A verified certificate whose SAN names no principal.
  EXPECT_EQ(pb::Idempotency::NewStub(TlsChannel("ca", "unmapped"))
                ->Begin(Ctx().get(), BeginReq("tenant-a", "m2"), &resp)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // A token over TLS still works with a certificate.
  EXPECT_TRUE(
      stub->Begin(AuthCtx(kOpsToken).get(), BeginReq("tenant-b", "mtls"), &resp)
          .ok());
  // Wrong CA, no certificate, expired certificate: the handshake fails.
  for (const char* cert : {"foreign", "", "expired"}) {
    grpc::Status refused = pb::Idempotency::NewStub(TlsChannel("ca", cert))
                               ->Begin(Ctx(absl::Seconds(3)).get(),
                                       BeginReq("tenant-a", "m3"), &resp);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE)
        << "cert " << cert << ": " << refused.error_message();
  }
  // A client that does not trust the server's CA refuses it too.
  EXPECT_FALSE(pb::Idempotency::NewStub(TlsChannel("other-ca", "client"))
                   ->Begin(Ctx(absl::Seconds(3)).get(),
                           BeginReq("tenant-a", "m4"), &resp)
                   .ok());
  // Plaintext to the TLS port fails.
  EXPECT_FALSE(pb::Idempotency::NewStub(
                   grpc::CreateChannel(world->tls->Address(),
                                       grpc::InsecureChannelCredentials()))
                   ->Begin(Ctx(absl::Seconds(3)).get(),
                           BeginReq("tenant-a", "m5"), &resp)
                   .ok());
}

TEST_F(SecurityTest, IdemctlSpeaksTlsAndTokens) {
  pb::BeginResponse resp;
  ASSERT_TRUE(
      client()
          .Begin(AuthCtx(kOpsToken).get(), BeginReq("tenant-a", "cli"), &resp)
          .ok());
  const std::string token_file = world->pki.Path("ops.token");
  std::ofstream(token_file) << kOpsToken << "\n";
  const std::vector<std::string> key = {
      "--tenant", "tenant-a", "--operation", "create-payment", "--key", "cli"};
  auto idemctl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {IDEMCTL_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  };
  std::vector<std::string> plain = {"--addr", world->env->sidecar(0).Address(),
                                    "--token-file", token_file, "get"};
  plain.insert(plain.end(), key.begin(), key.end());
  absl::StatusOr<std::string> out = idemctl(plain);
  EXPECT_TRUE(out.ok()) << out.status();
  std::vector<std::string> no_token = {"--addr",
                                       world->env->sidecar(0).Address(), "get"};
  no_token.insert(no_token.end(), key.begin(), key.end());
  out = idemctl(no_token);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(std::string(out.status().message()).find("exited with code 1"),
            std::string::npos)
      << out.status();
  // Mutual TLS: the client certificate's principal may read tenant-a.
  std::vector<std::string> mtls = {"--addr",
                                   world->tls->Address(),
                                   "--tls-ca",
                                   world->pki.Path("ca.pem"),
                                   "--tls-cert",
                                   world->pki.Path("client.pem"),
                                   "--tls-key",
                                   world->pki.Path("client.key"),
                                   "--tls-server-name",
                                   "localhost",
                                   "get"};
  mtls.insert(mtls.end(), key.begin(), key.end());
  out = idemctl(mtls);
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->find("PROCESSING"), std::string::npos) << *out;
}

// Runs last among the TLS tests: it rotates the server certificate.
TEST_F(SecurityTest, ServerCertificateReloadKeepsOpenConnections) {
  auto old_channel = TlsChannel("ca", "client");
  auto old_stub = pb::Idempotency::NewStub(old_channel);
  pb::BeginResponse resp;
  ASSERT_TRUE(
      old_stub->Begin(Ctx().get(), BeginReq("tenant-a", "reload-1"), &resp)
          .ok());
  // Rotate the server's certificate to one from a new CA.
  Pki& pki = world->pki;
  ASSERT_TRUE(pki.MakeCa("new-ca").ok());
  ASSERT_TRUE(
      pki.MakeCert("rotated", "new-ca", "DNS:localhost,IP:127.0.0.1").ok());
  // Key first, then the chain: the watcher only takes a matching pair.
  ASSERT_TRUE(
      RunCommand({"cp", pki.Path("rotated.key"), pki.Path("server.key")}).ok());
  ASSERT_TRUE(
      RunCommand({"cp", pki.Path("rotated.pem"), pki.Path("server.pem")}).ok());
  const absl::Time end = absl::Now() + absl::Seconds(15);
  grpc::Status s;
  while (absl::Now() < end) {
    s = pb::Idempotency::NewStub(TlsChannel("new-ca", "client"))
            ->Begin(Ctx(absl::Seconds(2)).get(),
                    BeginReq("tenant-a", "reload-2"), &resp);
    if (s.ok()) break;
    absl::SleepFor(absl::Milliseconds(300));
  }
  EXPECT_TRUE(s.ok()) << "new certificate never served: " << s.error_message();
  // The connection made before the rotation still works.
  EXPECT_TRUE(
      old_stub->Begin(Ctx().get(), BeginReq("tenant-a", "reload-3"), &resp)
          .ok());
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
}

// One tenant over its rate limit is refused while another's calls go on at
// their usual latency.
TEST(LimitsTest, RateLimitIsPerTenant) {
  ASSERT_NE(world, nullptr);
  absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH, {"--postgres=" + world->env->pg().ConnInfo(),
                          "--tenant-rate=20", "--tenant-burst=20"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto channel =
      grpc::CreateChannel((*s)->Address(), grpc::InsecureChannelCredentials());
  auto stub = pb::Idempotency::NewStub(channel);
  auto get = [&](const std::string& tenant) {
    pb::GetRequest req;
    *req.mutable_key() = Key(tenant, "create-payment", "absent");
    pb::GetResponse resp;
    const absl::Time start = absl::Now();
    grpc::Status st = stub->Get(Ctx().get(), req, &resp);
    return std::make_pair(st.error_code(), absl::Now() - start);
  };
  std::vector<absl::Duration> baseline;
  baseline.reserve(10);
  for (int i = 0; i < 10; ++i) baseline.push_back(get("quiet").second);
  std::atomic<int> exhausted{0};
  std::atomic<int> allowed{0};
  std::thread noisy([&] {
    for (int i = 0; i < 300; ++i) {
      auto [code, took] = get("noisy");
      if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
      if (code == grpc::StatusCode::NOT_FOUND) ++allowed;
    }
  });
  std::vector<absl::Duration> during;
  int quiet_refused = 0;
  for (int i = 0; i < 10; ++i) {
    auto [code, took] = get("quiet");
    if (code != grpc::StatusCode::NOT_FOUND) ++quiet_refused;
    during.push_back(took);
    absl::SleepFor(absl::Milliseconds(20));
  }
  noisy.join();
  EXPECT_EQ(quiet_refused, 0);
  EXPECT_GT(exhausted.load(), 200);
  EXPECT_GE(allowed.load(), 20);
  std::sort(baseline.begin(), baseline.end());
  std::sort(during.begin(), during.end());
  EXPECT_LT(during[5], baseline[5] * 10 + absl::Milliseconds(5))
      << "median " << during[5] << " vs " << baseline[5];
}

TEST(LimitsTest, ProcessingCapIsPerTenant) {
  ASSERT_NE(world, nullptr);
  absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH, {"--postgres=" + world->env->pg().ConnInfo(),
                          "--max-processing-per-tenant=3"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto stub = pb::Idempotency::NewStub(
      grpc::CreateChannel((*s)->Address(), grpc::InsecureChannelCredentials()));
  auto begin = [&](const std::string& tenant, const std::string& key) {
    pb::BeginResponse resp;
    grpc::Status st = stub->Begin(Ctx().get(), BeginReq(tenant, key), &resp);
    return st.ok() ? resp.outcome() : -st.error_code();
  };
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(begin("capped", absl::StrCat("k", k)), pb::OUTCOME_ACQUIRED);
  }
  EXPECT_EQ(begin("capped", "k3"), -grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(begin("uncapped", "k0"), pb::OUTCOME_ACQUIRED);
  // Existing records are still answered at the cap.
  EXPECT_EQ(begin("capped", "k0"), pb::OUTCOME_IN_PROGRESS);
  pb::CompleteRequest done;
  *done.mutable_key() = Key("capped", "create-payment", "k0");
  done.set_fencing_token(1);
  *done.mutable_result() = BinarySnapshot(200, "ok");
  pb::CompleteResponse resp;
  ASSERT_TRUE(stub->Complete(Ctx().get(), done, &resp).ok());
  EXPECT_EQ(begin("capped", "k0"), pb::OUTCOME_COMPLETED);
  EXPECT_EQ(begin("capped", "k3"), pb::OUTCOME_ACQUIRED);
}

// Keys shaped like SQL are data: stored and replayed verbatim.
TEST(HostileInputTest, SqlShapedKeysAreStoredVerbatim) {
  ASSERT_NE(world, nullptr);
  pb::Idempotency::Stub& client = world->env->client(0);
  const std::vector<std::string> keys = {
      "';DROP/**/TABLE/**/idempotency_record;--",
      "\"||pg_sleep(5)||\"",
      "$1$2$3",
      "%s%n%x",
      "\\'\\\\\\x00",
      "1'OR'1'='1",
      "a:b.c_d-e~!@#$%^&*()[]{}<>?/|`",
  };
  for (const std::string& key : keys) {
    pb::BeginRequest req;
    *req.mutable_key() = Key("tenant-a", "op:v1.x_y-z", key);
    req.set_request_hash(std::string("\0'\"", 3));
    pb::BeginResponse resp;
    ASSERT_TRUE(client.Begin(AuthCtx(kPaymentsToken).get(), req, &resp).ok())
        << key;
    ASSERT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED) << key;
    pb::CompleteRequest done;
    *done.mutable_key() = req.key();
    done.set_fencing_token(1);
    pb::Snapshot snap = BinarySnapshot(200, key);
    (*snap.mutable_headers())["x-sql"] =
        "'); DELETE FROM idempotency_audit; --";
    *done.mutable_result() = snap;
    pb::CompleteResponse done_resp;
    ASSERT_TRUE(
        client.Complete(AuthCtx(kPaymentsToken).get(), done, &done_resp).ok());
    pb::BeginResponse replay;
    ASSERT_TRUE(client.Begin(AuthCtx(kPaymentsToken).get(), req, &replay).ok());
    EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
    EXPECT_EQ(replay.record().key().key(), key);
    EXPECT_EQ(replay.record().key().operation(), "op:v1.x_y-z");
    EXPECT_EQ(replay.record().request_hash(), std::string("\0'\"", 3));
    EXPECT_TRUE(MessageDifferencer::Equals(replay.record().result(), snap));
  }
  EXPECT_EQ(world->env->Sql("SELECT count(*) FROM idempotency_record WHERE "
                            "operation = 'op:v1.x_y-z'"),
            absl::StrCat(keys.size()));
}

// Oversize input is refused before any database work.
TEST(HostileInputTest, OversizeInputIsRefusedBeforeTheDatabase) {
  ASSERT_NE(world, nullptr);
  SidecarProcess& sidecar = world->env->sidecar(0);
  auto store_ops = [&] {
    absl::StatusOr<std::string> text =
        HttpGet(sidecar.metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok());
    double total = 0;
    for (const char* op : {"read", "insert", "update"}) {
      total += std::max(
          0.0, MetricValue(*text, absl::StrCat(
                                      "idem_store_duration_seconds_count{op=\"",
                                      op, "\",store=\"postgres\"}")));
    }
    return total;
  };
  const double before = store_ops();
  pb::Idempotency::Stub& client = world->env->client(0);
  pb::BeginRequest long_key = BeginReq("tenant-a", std::string(256, 'k'));
  pb::BeginRequest long_tenant = BeginReq(std::string(129, 't'), "k");
  pb::BeginRequest long_hash = BeginReq("tenant-a", "k");
  long_hash.set_request_hash(std::string(65, 'h'));
  pb::BeginResponse resp;
  for (const pb::BeginRequest& req : {long_key, long_tenant, long_hash}) {
    EXPECT_EQ(client.Begin(AuthCtx(kOpsToken).get(), req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  pb::CompleteRequest big;
  *big.mutable_key() = Key("tenant-a", "create-payment", "big");
  big.set_fencing_token(1);
  big.mutable_result()->set_body(std::string(256 * 1024 + 1, 'x'));
  pb::CompleteResponse done;
  EXPECT_EQ(client.Complete(AuthCtx(kOpsToken).get(), big, &done).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Past the message size limit gRPC refuses it before our code runs.
  big.mutable_result()->set_body(std::string(8 << 20, 'x'));
  EXPECT_EQ(client.Complete(AuthCtx(kOpsToken).get(), big, &done).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(store_ops(), before);
}

TEST(ListenTest, NonLoopbackNeedsSecurityOrInsecure) {
  ASSERT_NE(world, nullptr);
  const std::string listen = absl::StrCat("--listen=0.0.0.0:", FreePort());
  absl::StatusOr<std::string> out = RunCommand(
      {IDEM_SIDECAR_PATH, "--store=memory", listen, "--metrics-listen=off"});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(std::string(out.status().message()).find("--insecure"),
            std::string::npos)
      << out.status();
  // TLS alone identifies nobody: still refused, naming both ways out.
  out = RunCommand({IDEM_SIDECAR_PATH, "--store=memory", listen,
                    "--metrics-listen=off",
                    "--tls-cert=" + world->pki.Path("server.pem"),
                    "--tls-key=" + world->pki.Path("server.key")});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(std::string(out.status().message()).find("--auth-tokens"),
            std::string::npos)
      << out.status();
  EXPECT_NE(std::string(out.status().message()).find("--insecure"),
            std::string::npos)
      << out.status();
  // With tokens it serves.
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(
      {IDEM_SIDECAR_PATH, "--store=memory", listen, "--metrics-listen=off",
       "--auth-tokens=" + world->tokens_path},
      {}, world->pki.Path("listen.log"));
  ASSERT_TRUE(p.ok()) << p.status();
  const int port = std::stoi(listen.substr(listen.rfind(':') + 1));
  EXPECT_TRUE(WaitForPort(port, absl::Seconds(10)).ok()) << (*p)->Log();
}

// Secrets (the DSN's password, bearer tokens) never reach the log, not even
// in the errors of a database that cannot be reached, at debug level.
TEST(LogTest, NoSecretInTheLog) {
  ASSERT_NE(world, nullptr);
  const std::string password = "Sup3r-Secret-Pw";
  absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH,
      {absl::StrCat("--postgres=postgresql://postgres:", password,
                    "@127.0.0.1:", FreePort(), "/postgres"),
       "--auth-tokens=" + world->tokens_path, "--log-level=debug",
       "--pg-statement-timeout=1s"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto stub = pb::Idempotency::NewStub(
      grpc::CreateChannel((*s)->Address(), grpc::InsecureChannelCredentials()));
  for (const std::string& token :
       {std::string(kPaymentsToken), std::string(kOpsToken),
        std::string("tok-wrong-0123456789abcdef")}) {
    pb::BeginResponse resp;
    grpc::Status st =
        stub->Begin(AuthCtx(token).get(), BeginReq("tenant-a", "k"), &resp);
    EXPECT_FALSE(st.ok());
  }
  absl::SleepFor(absl::Milliseconds(1500));
  ASSERT_TRUE((*s)->Terminate().ok());
  const std::string log = (*s)->Log();
  EXPECT_NE(log.find("store unreachable"), std::string::npos) << log;
  for (const std::string& secret :
       {password, std::string(kPaymentsToken), std::string(kOpsToken),
        std::string("tok-wrong-0123456789abcdef")}) {
    EXPECT_EQ(log.find(secret), std::string::npos) << secret << " in " << log;
  }
}

// The runtime role of sql/roles/least_privilege.sql serves without any DDL
// right; the migrator owns the schema.
TEST(LeastPrivilegeTest, RuntimeRoleServesButCannotChangeTheSchema) {
  ASSERT_NE(world, nullptr);
  PgCluster& pg = world->env->pg();
  ASSERT_TRUE(pg.Psql("CREATE DATABASE idem_lp").ok());
  const std::string sql =
      ReadFile(std::string(IDEM_SOURCE_DIR) + "/sql/roles/least_privilege.sql");
  ASSERT_FALSE(sql.empty());
  absl::StatusOr<std::string> roles =
      pg.Psql(sql, absl::Seconds(60), "idem_lp");
  ASSERT_TRUE(roles.ok()) << roles.status();
  const std::string base =
      absl::StrCat("host=127.0.0.1 port=", pg.port(), " dbname=idem_lp user=");
  absl::StatusOr<std::string> migrated = RunCommand(
      {IDEM_SIDECAR_PATH, "migrate", "--postgres=" + base + "idem_migrator"});
  ASSERT_TRUE(migrated.ok()) << migrated.status();
  absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH, {"--postgres=" + base + "idem_runtime",
                          "--reaper-interval=100ms", "--purge-interval=100ms"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto stub = pb::Idempotency::NewStub(
      grpc::CreateChannel((*s)->Address(), grpc::InsecureChannelCredentials()));
  pb::BeginRequest req = BeginReq("t", "lp");
  req.mutable_lease()->set_seconds(1);
  pb::BeginResponse resp;
  ASSERT_TRUE(stub->Begin(Ctx().get(), req, &resp).ok());
  ASSERT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  // The reaper (UPDATE + audit INSERT) works as the runtime role too.
  absl::SleepFor(absl::Milliseconds(1500));
  ASSERT_TRUE(stub->Begin(Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_UNKNOWN);
  absl::StatusOr<std::string> placed = pg.Psql(
      "SELECT schemaname, count(*) FROM pg_tables WHERE tablename LIKE "
      "'idempotency%' GROUP BY 1",
      absl::Seconds(60), "idem_lp");
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(*placed, "idempotency|3");
  std::vector<std::string> ddl = {
      "CREATE TABLE idempotency.evil (x int)",
      "DROP TABLE idempotency.idempotency_record",
      // One statement in two literals.
      // NOLINTNEXTLINE(bugprone-suspicious-missing-comma)
      "ALTER TABLE idempotency.idempotency_record DROP CONSTRAINT "
      "idempotency_record_status_check",
      "TRUNCATE idempotency.idempotency_audit",
      "CREATE TABLE public.evil (x int)"};
  for (const std::string& statement : ddl) {
    absl::StatusOr<std::string> refused =
        RunCommand({"psql", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
                    absl::StrCat(pg.port()), "-U", "idem_runtime", "-d",
                    "idem_lp", "-c", statement});
    EXPECT_FALSE(refused.ok()) << statement;
  }
}

}  // namespace
}  // namespace idem::testing
