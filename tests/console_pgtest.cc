// The operator console (docs/console.md) over a real sidecar and PostgreSQL:
// its JSON API's authentication, tenant scoping and headers, and a Resolve
// that writes the same audit row as idemctl's; then, in its own CTest entry,
// the page in a real browser (tests/console/browser_test.js).
#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/sidecar_env.h"
#include "tests/testing/files.h"
#include "tests/testing/ports.h"
#include "tests/testing/process.h"

namespace idem::testing {
namespace {

using json = nlohmann::json;

constexpr char kPaymentsToken[] = "tok-payments-0123456789abcdef";
constexpr char kOpsToken[] = "tok-ops-all-0123456789abcdef";
constexpr char kOpsBToken[] = "tok-ops-b-0123456789abcdef";

constexpr char kTokens[] = R"({"principals": [
  {"name": "payments", "token": "tok-payments-0123456789abcdef",
   "tenants": ["tenant-a", "tenant-browser"], "role": "service"},
  {"name": "ops", "token": "tok-ops-all-0123456789abcdef",
   "tenants": ["*"], "role": "operator"},
  {"name": "ops-b", "token": "tok-ops-b-0123456789abcdef",
   "tenants": ["tenant-b"], "role": "operator"}]})";

struct World {
  std::string dir;
  std::string tokens_path;
  int console_port = 0;
  std::unique_ptr<SidecarEnv> env;
};

World* world = nullptr;

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<std::string> dir = MakeTempDir("idem-console-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    w_.dir = *dir;
    w_.tokens_path = w_.dir + "/tokens.json";
    std::ofstream(w_.tokens_path) << kTokens;
    w_.console_port = FreePort();
    absl::StatusOr<std::unique_ptr<SidecarEnv>> e = SidecarEnv::Start(
        IDEM_SIDECAR_PATH, 1,
        {"--auth-tokens=" + w_.tokens_path,
         absl::StrCat("--console-listen=127.0.0.1:", w_.console_port)});
    ASSERT_TRUE(e.ok()) << e.status();
    w_.env = *std::move(e);
    world = &w_;
  }
  void TearDown() override {
    world = nullptr;
    w_.env.reset();
    RemoveTempDir(w_.dir);
  }

 private:
  World w_;
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Environment());

std::unique_ptr<grpc::ClientContext> AuthCtx(const std::string& token) {
  std::unique_ptr<grpc::ClientContext> ctx = Ctx();
  ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

HttpResponse Call(const std::string& method, const std::string& path,
                  const std::string& token, const std::string& body = "") {
  std::vector<std::pair<std::string, std::string>> headers;
  if (!token.empty()) headers.emplace_back("Authorization", "Bearer " + token);
  absl::StatusOr<HttpResponse> res =
      HttpCall(world->console_port, method, path, body, headers);
  EXPECT_TRUE(res.ok()) << res.status();
  return res.ok() ? *res : HttpResponse{};
}

json Json(const HttpResponse& res) {
  return json::parse(res.body, nullptr, /*allow_exceptions=*/false);
}

std::string KeyJson(const std::string& tenant, const std::string& key) {
  return json{{"tenant", tenant}, {"operation", "create-payment"}, {"key", key}}
      .dump();
}

// Makes the record UNKNOWN: a 1 s lease nobody completes, then Gets until
// the expiry shows.
void MakeUnknown(const std::string& tenant, const std::string& key) {
  pb::BeginRequest begin;
  *begin.mutable_key() = Key(tenant, "create-payment", key);
  begin.set_request_hash("h");
  begin.mutable_lease()->set_seconds(1);
  pb::BeginResponse began;
  grpc::Status s =
      world->env->client(0).Begin(AuthCtx(kOpsToken).get(), begin, &began);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(began.outcome(), pb::OUTCOME_ACQUIRED);
  pb::GetRequest get;
  *get.mutable_key() = begin.key();
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end) {
    pb::GetResponse got;
    s = world->env->client(0).Get(AuthCtx(kOpsToken).get(), get, &got);
    if (s.ok() && got.record().status() == pb::STATUS_UNKNOWN) return;
    absl::SleepFor(absl::Milliseconds(100));
  }
  FAIL() << "record " << key << " never became UNKNOWN";
}

class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(world, nullptr); }
};

TEST_F(ConsoleTest, AnOperatorTokenOpensTheSession) {
  HttpResponse res = Call("GET", "/api/session", kOpsToken);
  EXPECT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(Json(res)["principal"], "ops");
  EXPECT_EQ(Json(res)["auth"], true);
}

TEST_F(ConsoleTest, ABusinessTokenIsForbiddenEverywhere) {
  EXPECT_EQ(Call("GET", "/api/session", kPaymentsToken).status, 403);
  EXPECT_EQ(Call("GET", "/api/vitals", kPaymentsToken).status, 403);
  for (const char* path : {"/api/list", "/api/get", "/api/history"}) {
    HttpResponse res =
        Call("POST", path, kPaymentsToken,
             absl::StrCat(R"({"key": )", KeyJson("tenant-a", "k"), "}"));
    EXPECT_EQ(res.status, 403) << path << ": " << res.body;
    EXPECT_EQ(Json(res)["code"], "PERMISSION_DENIED") << path;
  }
  HttpResponse res =
      Call("POST", "/api/resolve", kPaymentsToken,
           absl::StrCat(R"({"key": )", KeyJson("tenant-a", "k"),
                        R"(, "to": "STATUS_FAILED", "reason": "not mine"})"));
  EXPECT_EQ(res.status, 403) << res.body;
}

TEST_F(ConsoleTest, NoTokenOrAnUnknownOneIsUnauthenticated) {
  EXPECT_EQ(Call("GET", "/api/session", "").status, 401);
  EXPECT_EQ(Call("GET", "/api/session", "tok-nobody-0123456789").status, 401);
  EXPECT_EQ(Call("POST", "/api/list", "", "{}").status, 401);
  absl::StatusOr<HttpResponse> basic =
      HttpCall(world->console_port, "GET", "/api/session", "",
               {{"Authorization", "Basic b3BzOm9wcw=="}});
  ASSERT_TRUE(basic.ok());
  EXPECT_EQ(basic->status, 401);
}

TEST_F(ConsoleTest, AnOperatorOfOneTenantSeesOnlyThatTenant) {
  MakeUnknown("tenant-a", "scoped");
  EXPECT_EQ(Call("POST", "/api/list", kOpsBToken,
                 R"({"tenant": "tenant-a", "status": "STATUS_UNKNOWN"})")
                .status,
            403);
  // Every tenant at once is more than tenant-b.
  EXPECT_EQ(Call("POST", "/api/list", kOpsBToken, "{}").status, 403);
  EXPECT_EQ(
      Call("POST", "/api/get", kOpsBToken,
           absl::StrCat(R"({"key": )", KeyJson("tenant-a", "scoped"), "}"))
          .status,
      403);
  EXPECT_EQ(
      Call("POST", "/api/list", kOpsBToken, R"({"tenant": "tenant-b"})").status,
      200);
}

TEST_F(ConsoleTest, EveryAnswerCarriesTheSecurityHeaders) {
  const std::vector<std::tuple<std::string, std::string, std::string, int>>
      calls = {{"GET", "/", kOpsToken, 200},
               {"GET", "/app.js", "", 200},
               {"GET", "/app.css", "", 200},
               {"GET", "/chart.min.js", "", 200},
               {"GET", "/nothing-here", "", 404},
               {"GET", "/api/session", "", 401},
               {"GET", "/api/session", kPaymentsToken, 403},
               {"GET", "/api/vitals", kOpsToken, 200},
               {"POST", "/api/list", kOpsToken, 200},
               {"POST", "/api/get", kOpsToken, 400}};
  for (const auto& [method, path, token, status] : calls) {
    HttpResponse res = Call(method, path, token, method == "POST" ? "{}" : "");
    EXPECT_EQ(res.status, status) << method << " " << path << ": " << res.body;
    const std::string csp = res.Header("content-security-policy");
    EXPECT_TRUE(absl::StrContains(csp, "default-src 'self'")) << path << csp;
    EXPECT_TRUE(absl::StrContains(csp, "frame-ancestors 'none'")) << path;
    EXPECT_FALSE(absl::StrContains(csp, "unsafe-inline")) << path;
    EXPECT_EQ(res.Header("x-content-type-options"), "nosniff") << path;
  }
}

// The page names nothing of another origin and has no inline script.
TEST_F(ConsoleTest, ThePageLoadsOnlyItsOwnFiles) {
  HttpResponse page = Call("GET", "/", "");
  ASSERT_EQ(page.status, 200);
  EXPECT_TRUE(absl::StartsWith(page.Header("content-type"), "text/html"));
  size_t at = 0;
  int scripts = 0;
  while ((at = page.body.find("<script", at)) != std::string::npos) {
    const std::string tag = page.body.substr(at, page.body.find('>', at) - at);
    EXPECT_TRUE(absl::StrContains(tag, "src=\"/")) << tag;
    EXPECT_EQ(page.body.substr(page.body.find('>', at) + 1, 9), "</script>")
        << "inline script after " << tag;
    ++at;
    ++scripts;
  }
  EXPECT_EQ(scripts, 2);
  EXPECT_FALSE(absl::StrContains(page.body, "http://"));
  EXPECT_FALSE(absl::StrContains(page.body, "https://"));
  EXPECT_FALSE(absl::StrContains(page.body, "style=\""));
  EXPECT_FALSE(absl::StrContains(Call("GET", "/app.js", "").body, "http"));
}

TEST_F(ConsoleTest, ResolveWritesTheAuditRowWithTheOperatorAsActor) {
  MakeUnknown("tenant-a", "stuck-1");
  // The queue lists it, oldest first.
  HttpResponse listed =
      Call("POST", "/api/list", kOpsToken,
           R"({"tenant": "tenant-a", "status": "STATUS_UNKNOWN"})");
  ASSERT_EQ(listed.status, 200) << listed.body;
  bool found = false;
  const json records = Json(listed)["records"];
  for (const json& r : records) {
    found |= r["key"]["key"] == "stuck-1" && r["status"] == "STATUS_UNKNOWN";
  }
  EXPECT_TRUE(found) << listed.body;

  // The request's actor is not taken: with auth on, the caller is.
  HttpResponse resolved = Call(
      "POST", "/api/resolve", kOpsToken,
      absl::StrCat(R"({"key": )", KeyJson("tenant-a", "stuck-1"),
                   R"(, "to": "STATUS_FAILED", "reason": "no charge in the)",
                   R"( ledger", "actor": "someone-else"})"));
  ASSERT_EQ(resolved.status, 200) << resolved.body;
  EXPECT_EQ(Json(resolved)["record"]["status"], "STATUS_FAILED");
  EXPECT_EQ(Json(resolved)["record"]["resolved_by"], "ops");

  HttpResponse history =
      Call("POST", "/api/history", kOpsToken,
           absl::StrCat(R"({"key": )", KeyJson("tenant-a", "stuck-1"), "}"));
  ASSERT_EQ(history.status, 200) << history.body;
  const json entries = Json(history)["entries"];
  ASSERT_FALSE(entries.empty()) << history.body;
  const json& last = entries.back();
  EXPECT_EQ(last["from"], "STATUS_UNKNOWN");
  EXPECT_EQ(last["to"], "STATUS_FAILED");
  EXPECT_EQ(last["actor"], "ops");
  EXPECT_EQ(last["reason"], "no charge in the ledger");

  // The same row idemctl's Resolve writes, and gRPC Get agrees.
  EXPECT_EQ(
      world->env->Sql("SELECT actor || '|' || reason || '|' || to_status FROM "
                      "idempotency_audit WHERE tenant_id = 'tenant-a' AND "
                      "idempotency_key = 'stuck-1' ORDER BY id DESC LIMIT 1"),
      "ops|no charge in the ledger|FAILED");
  pb::GetRequest get;
  *get.mutable_key() = Key("tenant-a", "create-payment", "stuck-1");
  pb::GetResponse got;
  grpc::Status s =
      world->env->client(0).Get(AuthCtx(kPaymentsToken).get(), get, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.record().status(), pb::STATUS_FAILED);
  EXPECT_EQ(got.record().resolved_by(), "ops");
  EXPECT_EQ(got.record().resolve_reason(), "no charge in the ledger");

  // A second Resolve finds nothing left to settle.
  HttpResponse again =
      Call("POST", "/api/resolve", kOpsToken,
           absl::StrCat(R"({"key": )", KeyJson("tenant-a", "stuck-1"),
                        R"(, "to": "STATUS_SUCCEEDED", "reason": "twice",)",
                        R"( "result": {"code": 200, "body": ""}})"));
  EXPECT_EQ(again.status, 409) << again.body;
}

TEST_F(ConsoleTest, ABadRequestSaysWhichField) {
  HttpResponse res =
      Call("POST", "/api/resolve", kOpsToken,
           absl::StrCat(R"({"key": )", KeyJson("tenant-a", "nobody"),
                        R"(, "to": "STATUS_FAILED"})"));
  EXPECT_EQ(res.status, 400) << res.body;
  EXPECT_TRUE(
      absl::StartsWith(Json(res)["message"].get<std::string>(), "reason"))
      << res.body;
  EXPECT_EQ(Call("POST", "/api/list", kOpsToken, "{not json").status, 400);
  EXPECT_EQ(Call("GET", "/api/list", kOpsToken).status, 400);
}

TEST_F(ConsoleTest, VitalsMoveWithTheLoad) {
  for (int i = 0; i < 20; ++i) {
    pb::BeginRequest begin;
    *begin.mutable_key() =
        Key("tenant-a", "create-payment", absl::StrCat("load-", i));
    begin.set_request_hash("h");
    pb::BeginResponse began;
    ASSERT_TRUE(world->env->client(0)
                    .Begin(AuthCtx(kPaymentsToken).get(), begin, &began)
                    .ok());
  }
  absl::SleepFor(absl::Milliseconds(2500));
  HttpResponse res = Call("GET", "/api/vitals", kOpsToken);
  ASSERT_EQ(res.status, 200) << res.body;
  const json vitals = Json(res);
  EXPECT_EQ(vitals["interval_seconds"], 1.0);
  ASSERT_GE(vitals["samples"].size(), 2u) << res.body;
  double acquired = 0;
  bool latency = false;
  double busiest = 0;
  for (const json& s : vitals["samples"]) {
    if (s["begins_per_second"].contains("ACQUIRED")) {
      const double rate = s["begins_per_second"]["ACQUIRED"].get<double>();
      acquired += rate;
      busiest = std::max(busiest, rate);
    }
    latency |= s["begin_p99_seconds"].get<double>() > 0;
  }
  // The 20 Begins within a second or two (other tests' Begins add a few).
  EXPECT_GE(acquired, 19.5) << res.body;
  EXPECT_GE(busiest, 5) << res.body;
  EXPECT_TRUE(latency) << res.body;
  // The pool's gauge, within --pg-pool-size (16).
  const double in_use = vitals["samples"].back()["pg_in_use"].get<double>();
  EXPECT_GE(in_use, 0) << res.body;
  EXPECT_LE(in_use, 16) << res.body;
}

// Without --auth-tokens the console serves loopback only.
TEST(ConsoleStartTest, WithoutTokensANonLoopbackAddressIsRefused) {
  ASSERT_NE(world, nullptr);
  absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH,
      {"--postgres=" + world->env->pg().ConnInfo(),
       absl::StrCat("--console-listen=0.0.0.0:", FreePort())},
      0, {}, absl::Seconds(10));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "--auth-tokens"))
      << s.status();

  const int port = FreePort();
  s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH, {"--postgres=" + world->env->pg().ConnInfo(),
                          absl::StrCat("--console-listen=127.0.0.1:", port)});
  ASSERT_TRUE(s.ok()) << s.status();
  // The sidecar is ready once its gRPC port answers; the console's listener
  // may open a moment later (much later under a sanitizer).
  absl::StatusOr<HttpResponse> session =
      HttpCall(port, "GET", "/api/session", "", {});
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (!session.ok() && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(50));
    session = HttpCall(port, "GET", "/api/session", "", {});
  }
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(session->status, 200);
  EXPECT_EQ(Json(*session)["auth"], false);
}

// The page in Debian's chromium (tests/console/browser_test.js), while a
// load runs so that the overview's charts move. Its own CTest entry
// (console_browser_pgtest); needs chromium, node and npm (the npm registry
// the first time): a missing one fails it.
TEST(ConsoleBrowserTest, AnOperatorResolvesAnUnknownRecordInChromium) {
  ASSERT_NE(world, nullptr);
  MakeUnknown("tenant-browser", "browser-stuck-1");
  std::atomic<bool> done{false};
  std::thread load([&done] {
    for (int i = 0; !done.load(); ++i) {
      pb::BeginRequest begin;
      *begin.mutable_key() =
          Key("tenant-a", "create-payment", absl::StrCat("browser-load-", i));
      begin.set_request_hash("h");
      pb::BeginResponse began;
      world->env->client(0).Begin(AuthCtx(kPaymentsToken).get(), begin, &began);
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  absl::StatusOr<std::unique_ptr<Process>> browser = Process::Spawn(
      {"bash", std::string(IDEM_SOURCE_DIR) + "/tests/console/run.sh"},
      {absl::StrCat("CONSOLE_URL=http://127.0.0.1:", world->console_port),
       absl::StrCat("CONSOLE_OPS_TOKEN=", kOpsToken),
       absl::StrCat("CONSOLE_BUSINESS_TOKEN=", kPaymentsToken),
       "CONSOLE_TENANT=tenant-browser", "CONSOLE_KEY=browser-stuck-1",
       absl::StrCat("CONSOLE_SCREENSHOTS=", IDEM_CONSOLE_SCREENSHOTS)},
      world->dir + "/browser.log");
  absl::StatusOr<int> exit = absl::UnknownError("not started");
  if (browser.ok()) exit = (*browser)->Wait(absl::Minutes(5));
  done = true;
  load.join();
  ASSERT_TRUE(browser.ok()) << browser.status();
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << (*browser)->Log();
  EXPECT_EQ(*exit, 0) << (*browser)->Log();

  // gRPC Get agrees with what the page showed.
  pb::GetRequest get;
  *get.mutable_key() =
      Key("tenant-browser", "create-payment", "browser-stuck-1");
  pb::GetResponse got;
  grpc::Status s =
      world->env->client(0).Get(AuthCtx(kPaymentsToken).get(), get, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.record().status(), pb::STATUS_FAILED);
  EXPECT_EQ(got.record().resolved_by(), "ops");
  EXPECT_EQ(got.record().resolve_reason(),
            "no charge in the ledger (browser test)");
}

}  // namespace
}  // namespace idem::testing
