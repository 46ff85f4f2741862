// Black-box tests of the HTTP gateway (docs/gateway.md): a real sidecar with
// --http-listen in front of tests/gateway/upstream.js, a Node service that
// counts its executions in a file that survives its restarts, over a
// throwaway PostgreSQL. The clients are real: curl processes and Node's
// built-in fetch (tests/gateway/client.js); only the pipelining test writes
// its requests on a socket itself, as neither pipelines. Every test reads the
// upstream's count, so a request executed once too often fails it.
//
// Needs node and curl: a missing one fails the test.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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

constexpr char kTenant[] = "http";
constexpr char kProblemPrefix[] = "tag:idempotency-sidecar,2026:";

// The routes under test, then the default route again: once `routes` is
// set it no longer applies by itself, and a request that matches no route
// is proxied untouched.
constexpr char kConfig[] = R"(gateway:
  routes:
    - name: gw-required
      methods: [POST]
      path: /required/**
      key: required
    - name: gw-short-lease
      methods: [POST]
      path: /short/**
      key: required
      lease: 2s
      timeout: 1s
    - name: gw-small
      methods: [POST]
      path: /small/**
      key: optional
      max_body: 1024
    - name: http
      methods: [POST, PATCH]
      path: /**
      key: optional
)";

std::string Script(const std::string& name) {
  return std::string(IDEM_SOURCE_DIR) + "/tests/gateway/" + name;
}

// tests/gateway/upstream.js as a child process on a fixed port, so that it
// can be killed and started again behind the same gateway.
class Upstream {
 public:
  Upstream(std::string dir, int port) : dir_(std::move(dir)), port_(port) {}

  // Starts the process (again) and waits until it accepts connections.
  absl::Status Start() {
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(
        {"node", Script("upstream.js"), absl::StrCat("--port=", port_),
         "--log=" + dir_ + "/executions.jsonl"},
        {}, dir_ + "/upstream.log");
    if (!p.ok()) return p.status();
    process_ = *std::move(p);
    const absl::Time end = absl::Now() + absl::Seconds(15);
    while (!PortAcceptsConnections(port_)) {
      if (!process_->Running() || absl::Now() > end) {
        return absl::UnavailableError(
            absl::StrCat("upstream did not start:\n", process_->Log()));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::OkStatus();
  }

  int port() const { return port_; }
  Process& process() { return *process_; }
  std::string Log() const { return process_ ? process_->Log() : ""; }

  // How many times requests to `path` (without the query) were executed;
  // -1 (failing the test) when the upstream does not answer.
  int Count(const std::string& path) {
    absl::StatusOr<std::string> body = HttpGet(port_, "/__count?path=" + path);
    EXPECT_TRUE(body.ok()) << body.status() << "\n" << Log();
    if (!body.ok()) return -1;
    return json::parse(*body).at("count").get<int>();
  }

  // Connections this process accepted (each of these queries is one);
  // -1 (failing the test) when the upstream does not answer.
  int Accepted() {
    absl::StatusOr<std::string> body = HttpGet(port_, "/__connections");
    EXPECT_TRUE(body.ok()) << body.status() << "\n" << Log();
    if (!body.ok()) return -1;
    return json::parse(*body).at("accepted").get<int>();
  }

  // The executions of `path` so far, oldest first.
  std::vector<json> Executions(const std::string& path) {
    absl::StatusOr<std::string> body = HttpGet(port_, "/__log");
    EXPECT_TRUE(body.ok()) << body.status() << "\n" << Log();
    std::vector<json> out;
    if (!body.ok()) return out;
    for (const json& e : json::parse(*body)) {
      if (e.at("path") == path) out.push_back(e);
    }
    return out;
  }

 private:
  const std::string dir_;
  const int port_;
  std::unique_ptr<Process> process_;
};

// PostgreSQL, the upstream and one sidecar serving the gateway, for the
// whole binary.
struct Gateway {
  std::string dir;
  std::unique_ptr<Upstream> upstream;
  std::unique_ptr<SidecarEnv> env;
  int port = 0;

  std::string Url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", port, path);
  }
};

Gateway* gw = nullptr;

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    for (const char* tool : {"node", "curl"}) {
      absl::StatusOr<std::string> version = RunCommand({tool, "--version"});
      ASSERT_TRUE(version.ok())
          << tool << " is required by these tests: " << version.status();
    }
    absl::StatusOr<std::string> dir = MakeTempDir("idem-gateway-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    gateway_.dir = *dir;
    const std::string config = gateway_.dir + "/config.yaml";
    std::ofstream(config) << kConfig;

    gateway_.upstream = std::make_unique<Upstream>(gateway_.dir, FreePort());
    absl::Status started = gateway_.upstream->Start();
    ASSERT_TRUE(started.ok()) << started;

    gateway_.port = FreePort();
    absl::StatusOr<std::unique_ptr<SidecarEnv>> env = SidecarEnv::Start(
        IDEM_SIDECAR_PATH, 1,
        {absl::StrCat("--http-listen=127.0.0.1:", gateway_.port),
         absl::StrCat("--http-upstream=http://127.0.0.1:",
                      gateway_.upstream->port()),
         "--config=" + config});
    ASSERT_TRUE(env.ok()) << env.status();
    gateway_.env = *std::move(env);
    absl::Status listening = WaitForPort(gateway_.port, absl::Seconds(15));
    ASSERT_TRUE(listening.ok())
        << "gateway not listening: " << listening << "\n"
        << gateway_.env->sidecar(0).Log();
    gw = &gateway_;
  }

  void TearDown() override {
    gw = nullptr;
    gateway_.env.reset();
    gateway_.upstream.reset();
    if (!gateway_.dir.empty()) RemoveTempDir(gateway_.dir);
  }

 private:
  Gateway gateway_;
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Environment());

// --- Clients ---

// One curl transfer's answer.
struct CurlAnswer {
  HttpResponse response;
  int connects = -1;  // new connections this transfer opened (0: reused)
};

// Runs one curl process with `options` (its request options) over `urls`,
// one transfer each, in order and on one connection where curl can; returns
// each transfer's status, headers and body bytes.
absl::StatusOr<std::vector<CurlAnswer>> Curl(
    const std::vector<std::string>& options,
    const std::vector<std::string>& urls) {
  static int calls = 0;
  const std::string prefix = absl::StrCat(gw->dir, "/curl-", ++calls, "-");
  std::vector<std::string> argv = {
      "curl",
      "-sS",
      "--max-time",
      "20",
      "-w",
      R"({"info":%{json},"headers":%{header_json}})"
      "\n"};
  argv.insert(argv.end(), options.begin(), options.end());
  for (size_t i = 0; i < urls.size(); ++i) {
    argv.push_back("-o");
    argv.push_back(absl::StrCat(prefix, i));
    argv.push_back(urls[i]);
  }
  absl::StatusOr<std::string> out = RunCommand(argv);
  if (!out.ok()) return out.status();
  std::istringstream in(*out);
  std::vector<CurlAnswer> answers;
  for (size_t i = 0; i < urls.size(); ++i) {
    json transfer;
    in >> transfer;
    CurlAnswer a;
    a.response.status = transfer.at("info").at("http_code").get<int>();
    a.connects = transfer.at("info").at("num_connects").get<int>();
    for (const auto& [name, values] : transfer.at("headers").items()) {
      a.response.headers[name] =
          absl::StrJoin(values.get<std::vector<std::string>>(), ", ");
    }
    a.response.body = ReadFile(absl::StrCat(prefix, i));
    answers.push_back(std::move(a));
  }
  return answers;
}

// One curl request to the gateway's `path`: POST `body` with `headers`
// ("Name: value") when `method` is POST.
absl::StatusOr<HttpResponse> CurlOne(const std::string& method,
                                     const std::string& path,
                                     const std::vector<std::string>& headers,
                                     const std::string& body = "") {
  std::vector<std::string> options = {"-X", method};
  for (const std::string& h : headers) {
    options.push_back("-H");
    options.push_back(h);
  }
  if (!body.empty()) {
    options.push_back("-H");
    options.push_back("content-type: application/json");
    options.push_back("--data-binary");
    options.push_back(body);
  }
  absl::StatusOr<std::vector<CurlAnswer>> answers =
      Curl(options, {gw->Url(path)});
  if (!answers.ok()) return answers.status();
  return answers->front().response;
}

struct FetchRequest {
  std::string method = "POST";
  std::string path;
  std::map<std::string, std::string> headers;
  std::string body;
  bool retry_409 = false;
};

// Runs `requests` at once through Node's fetch (tests/gateway/client.js)
// and returns every attempt of each (one unless retry_409 retried 409s). An
// attempt that got no answer has status 0 and the error as its body.
absl::StatusOr<std::vector<std::vector<HttpResponse>>> Fetch(
    const std::vector<FetchRequest>& requests) {
  json spec = {{"requests", json::array()}};
  for (const FetchRequest& r : requests) {
    json request = {{"url", gw->Url(r.path)},
                    {"method", r.method},
                    {"headers", r.headers},
                    {"retry_409", r.retry_409}};
    if (!r.body.empty()) request["body"] = r.body;
    spec["requests"].push_back(request);
  }
  RunOptions options;
  options.timeout = absl::Seconds(60);
  absl::StatusOr<std::string> out =
      RunCommand({"node", Script("client.js"), spec.dump()}, options);
  if (!out.ok()) return out.status();
  const json parsed = json::parse(*out);
  std::vector<std::vector<HttpResponse>> results;
  for (const json& result : parsed.at("results")) {
    std::vector<HttpResponse> attempts;
    for (const json& attempt : result.at("attempts")) {
      HttpResponse r;
      if (attempt.contains("error")) {
        r.body = "error: " + attempt.at("error").get<std::string>();
      } else {
        r.status = attempt.at("status").get<int>();
        r.headers =
            attempt.at("headers").get<std::map<std::string, std::string>>();
        if (!absl::Base64Unescape(attempt.at("body_base64").get<std::string>(),
                                  &r.body)) {
          return absl::InternalError("client.js: bad base64 body");
        }
      }
      attempts.push_back(std::move(r));
    }
    results.push_back(std::move(attempts));
  }
  return results;
}

// --- Checks ---

std::string Show(const HttpResponse& r) {
  std::string out = absl::StrCat(r.status, "\n");
  for (const auto& [name, value] : r.headers) {
    absl::StrAppend(&out, name, ": ", value, "\n");
  }
  return absl::StrCat(out, "\n", r.body);
}

// Writes `raw`, several requests, at once on one connection to the gateway
// (pipelining, which curl and fetch do not do) and reads until `count`
// answers, each with a Content-Length, have arrived.
absl::StatusOr<std::vector<HttpResponse>> Pipeline(const std::string& raw,
                                                   size_t count) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  const timeval timeout{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(gw->port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      write(fd, raw.data(), raw.size()) != static_cast<ssize_t>(raw.size())) {
    close(fd);
    return absl::UnavailableError("connect or write to the gateway");
  }
  std::vector<HttpResponse> answers;
  std::string in;
  char buf[65536];
  while (answers.size() < count) {
    const size_t end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      HttpResponse r;
      std::vector<std::string> lines =
          absl::StrSplit(in.substr(0, end), "\r\n");
      std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
      if (status_line.size() < 2 ||
          !absl::SimpleAtoi(status_line[1], &r.status)) {
        close(fd);
        return absl::InternalError("bad status line: " + lines[0]);
      }
      for (size_t i = 1; i < lines.size(); ++i) {
        std::pair<std::string, std::string> kv =
            absl::StrSplit(lines[i], absl::MaxSplits(':', 1));
        r.headers[absl::AsciiStrToLower(kv.first)] =
            std::string(absl::StripAsciiWhitespace(kv.second));
      }
      size_t length = 0;
      if (!absl::SimpleAtoi(r.Header("content-length"), &length)) {
        close(fd);
        return absl::InternalError("no Content-Length:\n" + Show(r));
      }
      if (in.size() >= end + 4 + length) {
        r.body = in.substr(end + 4, length);
        in.erase(0, end + 4 + length);
        answers.push_back(std::move(r));
        continue;
      }
    }
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat(
          "connection ended after ", answers.size(), " answers: ", in));
    }
    in.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answers;
}

// Whether `r` is an application/problem+json document (RFC 9457) with one
// of `statuses` and the type ending in `kind`, and the fields docs/gateway.md
// promises: type, title, status, detail, and for a problem about a record
// (`key` given) its idempotency_key.
::testing::AssertionResult IsProblem(const HttpResponse& r,
                                     const std::vector<int>& statuses,
                                     const std::string& kind,
                                     const std::string& key = "") {
  bool status_ok = false;
  for (int s : statuses) status_ok = status_ok || r.status == s;
  if (!status_ok) {
    return ::testing::AssertionFailure()
           << "status " << r.status << ", want one of "
           << absl::StrJoin(statuses, "/") << ":\n"
           << Show(r);
  }
  if (!absl::StartsWith(r.Header("content-type"), "application/problem+json")) {
    return ::testing::AssertionFailure() << "not problem+json:\n" << Show(r);
  }
  const json doc = json::parse(r.body, nullptr, false);
  if (!doc.is_object()) {
    return ::testing::AssertionFailure() << "body is no JSON object:\n"
                                         << Show(r);
  }
  if (doc.value("type", "") != kProblemPrefix + kind) {
    return ::testing::AssertionFailure()
           << "type is not " << kProblemPrefix << kind << ":\n"
           << Show(r);
  }
  if (!doc.contains("title") || !doc["title"].is_string() ||
      !doc.contains("detail") || !doc["detail"].is_string() ||
      doc.value("status", 0) != r.status) {
    return ::testing::AssertionFailure()
           << "title, detail or status missing or wrong:\n"
           << Show(r);
  }
  if (!key.empty() && doc.value("idempotency_key", "") != key) {
    return ::testing::AssertionFailure()
           << "idempotency_key is not " << key << ":\n"
           << Show(r);
  }
  return ::testing::AssertionSuccess();
}

// Whether `r` carries a Retry-After of whole seconds.
::testing::AssertionResult HasRetryAfter(const HttpResponse& r) {
  int seconds = -1;
  if (absl::SimpleAtoi(r.Header("retry-after"), &seconds) && seconds >= 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no Retry-After seconds:\n"
                                       << Show(r);
}

// Whether `replay` is `first` replayed: same status, same body bytes, the
// same recorded headers, Idempotent-Replayed: true, the body's
// Content-Length, and neither the hop-by-hop Keep-Alive nor Set-Cookie (not
// recorded by default) of the upstream's answer.
::testing::AssertionResult IsReplayOf(const HttpResponse& replay,
                                      const HttpResponse& first) {
  if (replay.status != first.status || replay.body != first.body ||
      replay.Header("location") != first.Header("location") ||
      replay.Header("x-upstream-execution") !=
          first.Header("x-upstream-execution") ||
      replay.Header("idempotent-replayed") != "true" ||
      replay.Header("content-length") != absl::StrCat(replay.body.size()) ||
      !replay.Header("keep-alive").empty() ||
      !replay.Header("set-cookie").empty()) {
    return ::testing::AssertionFailure() << "not a replay of\n"
                                         << Show(first) << "\n--- got ---\n"
                                         << Show(replay);
  }
  return ::testing::AssertionSuccess();
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out.push_back('\'');
    out.push_back(c);
  }
  return out + "'";
}

// The status of the record (tenant http) or "" when there is none.
std::string RecordStatus(const std::string& operation, const std::string& key) {
  return gw->env->Sql(
      absl::StrCat("SELECT status FROM idempotency_record WHERE tenant_id = ",
                   Quote(kTenant), " AND operation = ", Quote(operation),
                   " AND idempotency_key = ", Quote(key)));
}

std::string RecordCount() {
  return gw->env->Sql("SELECT count(*) FROM idempotency_record");
}

class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(gw, nullptr) << "environment did not start";
    // A test that failed half-way may have left the upstream dead.
    if (!upstream().process().Running()) {
      absl::Status started = upstream().Start();
      ASSERT_TRUE(started.ok()) << started;
    }
  }

  Upstream& upstream() { return *gw->upstream; }
};

// a. 50 identical POSTs at once with one key: one execution; each caller
// gets the first answer or a 409 whose retry replays it byte for byte.
TEST_F(GatewayTest, ConcurrentDuplicatesExecuteOnce) {
  const std::string path = "/a/payments";
  constexpr int kCallers = 50;
  FetchRequest request;
  request.path = path;
  request.headers = {{"Idempotency-Key", "\"a-key\""},
                     {"content-type", "application/json"},
                     {"x-test-behavior", "delay=500"}};
  request.body = R"({"amount":10,"currency":"EUR"})";
  request.retry_409 = true;
  absl::StatusOr<std::vector<std::vector<HttpResponse>>> results =
      Fetch(std::vector<FetchRequest>(kCallers, request));
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), kCallers);

  EXPECT_EQ(upstream().Count(path), 1);
  // The executed answer: the one answer that is neither a 409 nor a replay.
  std::vector<const HttpResponse*> executed;
  std::string statuses;  // each caller's, for messages
  for (const std::vector<HttpResponse>& attempts : *results) {
    for (const HttpResponse& r : attempts) {
      absl::StrAppend(&statuses, r.status,
                      r.Header("idempotent-replayed").empty() ? "" : "r", " ");
      if (r.status != 409 && r.Header("idempotent-replayed").empty()) {
        executed.push_back(&r);
      }
    }
    statuses.push_back('|');
  }
  ASSERT_EQ(executed.size(), 1u) << statuses;
  const HttpResponse& first = *executed[0];
  ASSERT_EQ(first.status, 201) << Show(first);
  const int seq = upstream().Executions(path).at(0).at("seq").get<int>();
  EXPECT_EQ(json::parse(first.body, nullptr, false).value("execution", 0), seq);
  // The relayed answer is the upstream's, less its hop-by-hop fields.
  EXPECT_EQ(first.Header("set-cookie"), absl::StrCat("session=", seq))
      << Show(first);
  EXPECT_EQ(first.Header("keep-alive"), "") << Show(first);

  int conflicts = 0;
  for (const std::vector<HttpResponse>& attempts : *results) {
    ASSERT_FALSE(attempts.empty());
    const HttpResponse& last = attempts.back();
    if (&last == &first) continue;
    if (attempts.front().status == 409) ++conflicts;
    for (size_t i = 0; i + 1 < attempts.size(); ++i) {
      EXPECT_TRUE(
          IsProblem(attempts[i], {409}, "request-in-progress", "a-key"));
      EXPECT_TRUE(HasRetryAfter(attempts[i]));
    }
    EXPECT_TRUE(IsReplayOf(last, first));
  }
  // 49 callers arrived while the first waited 500 ms for its answer.
  EXPECT_GT(conflicts, 0) << statuses;
  EXPECT_EQ(RecordStatus("http", "a-key"), "SUCCEEDED");
}

// b. The same key with another body: 422 key-reused, not executed again.
TEST_F(GatewayTest, SameKeyOtherBodyIsKeyReused) {
  const std::string path = "/b/payments";
  absl::StatusOr<HttpResponse> first =
      CurlOne("POST", path, {"Idempotency-Key: \"b-key\""}, R"({"amount":10})");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->status, 201) << Show(*first);

  absl::StatusOr<HttpResponse> other =
      CurlOne("POST", path, {"Idempotency-Key: \"b-key\""}, R"({"amount":99})");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(IsProblem(*other, {422}, "key-reused", "b-key"));
  EXPECT_EQ(upstream().Count(path), 1);
  EXPECT_EQ(RecordStatus("http", "b-key"), "SUCCEEDED");
}

// c. A route with `key: required` and no key: 400 key-missing, no call.
TEST_F(GatewayTest, RequiredKeyMissingIsRejected) {
  const std::string path = "/required/payments";
  const std::string rows = RecordCount();
  absl::StatusOr<HttpResponse> r =
      CurlOne("POST", path, {}, R"({"amount":10})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(IsProblem(*r, {400}, "key-missing"));
  EXPECT_EQ(upstream().Count(path), 0);
  EXPECT_EQ(RecordCount(), rows);
}

// d. The upstream dies after executing, before answering: the outcome is
// unknown and the key is never executed again, neither while the lease runs
// nor once the record is UNKNOWN.
TEST_F(GatewayTest, UpstreamDeathLeavesTheOutcomeUnknown) {
  const std::string path = "/short/payments";
  const std::string body = R"({"amount":10})";
  const std::string key = "Idempotency-Key: d-key";
  absl::StatusOr<HttpResponse> r =
      CurlOne("POST", path, {key, "x-test-behavior: die-after-execute"}, body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(IsProblem(*r, {502, 504}, "outcome-unknown", "d-key"));
  absl::StatusOr<int> exit = upstream().process().Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 137) << upstream().Log();

  absl::Status restarted = upstream().Start();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_EQ(upstream().Count(path), 1);

  // Within the 2 s lease.
  absl::StatusOr<HttpResponse> during = CurlOne("POST", path, {key}, body);
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(during->status, 409) << Show(*during);
  EXPECT_TRUE(IsProblem(*during, {409}, "request-in-progress", "d-key") ||
              IsProblem(*during, {409}, "outcome-unknown", "d-key"))
      << Show(*during);
  EXPECT_EQ(upstream().Count(path), 1);

  // Past the lease: a Get applies the expiry, and the row says UNKNOWN.
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (gw->env->Sql("SELECT lease_expires_at <= now() FROM "
                      "idempotency_record WHERE tenant_id = 'http' AND "
                      "operation = 'gw-short-lease' AND "
                      "idempotency_key = 'd-key'") != "t" &&
         absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  pb::GetRequest get;
  *get.mutable_key() = Key(kTenant, "gw-short-lease", "d-key");
  pb::GetResponse record;
  grpc::Status s = gw->env->client(0).Get(Ctx().get(), get, &record);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(record.record().status(), pb::STATUS_UNKNOWN)
      << record.DebugString();
  EXPECT_EQ(RecordStatus("gw-short-lease", "d-key"), "UNKNOWN");

  absl::StatusOr<HttpResponse> after = CurlOne("POST", path, {key}, body);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(IsProblem(*after, {409}, "outcome-unknown", "d-key"));
  EXPECT_EQ(upstream().Count(path), 1);
}

// The upstream takes longer than the route's 1 s timeout: 504
// outcome-unknown at the timeout, and the retry does not execute.
TEST_F(GatewayTest, UpstreamTimeoutLeavesTheOutcomeUnknown) {
  const std::string path = "/short/slow";
  const std::string body = R"({"amount":10})";
  const std::string key = "Idempotency-Key: t-key";
  const absl::Time start = absl::Now();
  absl::StatusOr<HttpResponse> r =
      CurlOne("POST", path, {key, "x-test-behavior: delay=4000"}, body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(IsProblem(*r, {504}, "outcome-unknown", "t-key"));

  absl::StatusOr<HttpResponse> retry = CurlOne("POST", path, {key}, body);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->status, 409) << Show(*retry);
  EXPECT_EQ(upstream().Count(path), 1);
}

// e. A 503 is relayed and fails the record retryable: the retry executes
// again, and its answer is the one replayed from then on.
TEST_F(GatewayTest, RetryStatusLetsTheRetryExecute) {
  const std::string path = "/e/payments";
  FetchRequest request;
  request.path = path;
  request.headers = {{"Idempotency-Key", "\"e-key\""},
                     {"content-type", "application/json"},
                     {"x-test-behavior", "status=503"}};
  request.body = R"({"amount":10})";
  absl::StatusOr<std::vector<std::vector<HttpResponse>>> failed =
      Fetch({request});
  ASSERT_TRUE(failed.ok()) << failed.status();
  const HttpResponse& unavailable = failed->at(0).at(0);
  EXPECT_EQ(unavailable.status, 503) << Show(unavailable);
  EXPECT_EQ(json::parse(unavailable.body, nullptr, false).value("execution", 0),
            upstream().Executions(path).at(0).at("seq").get<int>())
      << "not the upstream's answer:\n"
      << Show(unavailable);
  EXPECT_EQ(upstream().Count(path), 1);
  EXPECT_EQ(RecordStatus("http", "e-key"), "FAILED");

  request.headers.erase("x-test-behavior");
  absl::StatusOr<std::vector<std::vector<HttpResponse>>> retried =
      Fetch({request});
  ASSERT_TRUE(retried.ok()) << retried.status();
  const HttpResponse& created = retried->at(0).at(0);
  EXPECT_EQ(upstream().Count(path), 2);
  EXPECT_EQ(created.status, 201) << Show(created);
  EXPECT_EQ(created.Header("idempotent-replayed"), "") << Show(created);
  EXPECT_EQ(json::parse(created.body, nullptr, false).value("execution", 0),
            upstream().Executions(path).at(1).at("seq").get<int>())
      << Show(created);

  absl::StatusOr<std::vector<std::vector<HttpResponse>>> replayed =
      Fetch({request});
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_TRUE(IsReplayOf(replayed->at(0).at(0), created));
  EXPECT_EQ(upstream().Count(path), 2);
  EXPECT_EQ(RecordStatus("http", "e-key"), "SUCCEEDED");
}

// f. A GET (with or without a key) and a POST without a key are proxied
// untouched: executed every time, no record.
TEST_F(GatewayTest, PassThroughExecutesEveryTime) {
  const std::string path = "/f/items";
  const std::string rows = RecordCount();
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<HttpResponse> get = CurlOne("GET", path + "?page=2", {});
    ASSERT_TRUE(get.ok()) << get.status();
    EXPECT_EQ(get->status, 201) << Show(*get);
    absl::StatusOr<HttpResponse> keyed =
        CurlOne("GET", path + "?page=3", {"Idempotency-Key: \"f-get\""});
    ASSERT_TRUE(keyed.ok()) << keyed.status();
    EXPECT_EQ(keyed->status, 201) << Show(*keyed);
    EXPECT_EQ(keyed->Header("idempotent-replayed"), "");
  }
  FetchRequest post;
  post.path = path + "?page=4";
  post.headers = {{"content-type", "text/plain"}};
  post.body = "plain \xC3\xA9 body";
  absl::StatusOr<std::vector<std::vector<HttpResponse>>> posts =
      Fetch({post, post});
  ASSERT_TRUE(posts.ok()) << posts.status();
  for (const std::vector<HttpResponse>& attempts : *posts) {
    EXPECT_EQ(attempts.at(0).status, 201) << Show(attempts.at(0));
    EXPECT_EQ(attempts.at(0).Header("idempotent-replayed"), "");
  }

  const std::vector<json> executions = upstream().Executions(path);
  ASSERT_EQ(executions.size(), 6u);
  std::string decoded;
  for (const json& e : executions) {
    ASSERT_TRUE(
        absl::Base64Unescape(e.at("body").get<std::string>(), &decoded));
    if (e.at("query") == "?page=4") {
      EXPECT_EQ(e.at("method"), "POST") << e.dump();
      EXPECT_EQ(decoded, post.body) << e.dump();
      EXPECT_TRUE(e.at("key").is_null()) << e.dump();
    } else if (e.at("query") == "?page=3") {
      EXPECT_EQ(e.at("method"), "GET") << e.dump();
      EXPECT_EQ(e.at("key"), "\"f-get\"") << e.dump();
    } else {
      EXPECT_EQ(e.at("query"), "?page=2") << e.dump();
      EXPECT_EQ(e.at("method"), "GET") << e.dump();
      EXPECT_TRUE(e.at("key").is_null()) << e.dump();
    }
  }
  EXPECT_EQ(RecordCount(), rows);
}

// Requests through the gateway, keyed and not, share its keep-alive
// connections to the service: four requests, at most one new connection
// (none if the last test's is still kept), besides the query's own.
TEST_F(GatewayTest, RequestsReuseConnectionsToTheService) {
  const std::string path = "/ka/items";
  const int before = upstream().Accepted();
  for (const auto& [method, key] :
       std::vector<std::pair<std::string, std::string>>{
           {"GET", ""},
           {"POST", "Idempotency-Key: \"ka-1\""},
           {"POST", "Idempotency-Key: \"ka-2\""},
           {"POST", ""}}) {
    std::vector<std::string> headers;
    if (!key.empty()) headers.push_back(key);
    absl::StatusOr<HttpResponse> res = CurlOne(method, path, headers, "{}");
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->status, 201) << Show(*res);
  }
  EXPECT_EQ(upstream().Count(path), 4);
  EXPECT_LE(upstream().Accepted() - before, 3);
}

// g. The bare key and its sf-string form name the same record.
TEST_F(GatewayTest, BareAndQuotedKeysAreOneRecord) {
  const std::string body = R"({"amount":10})";
  struct Case {
    std::string path, bare, quoted, key;
  };
  for (const Case& c : {Case{"/g/plain", "g-key-1", "\"g-key-1\"", "g-key-1"},
                        Case{"/g/escaped", "g\\k", "\"g\\\\k\"", "g\\k"}}) {
    absl::StatusOr<HttpResponse> bare =
        CurlOne("POST", c.path, {"Idempotency-Key: " + c.bare}, body);
    ASSERT_TRUE(bare.ok()) << bare.status();
    EXPECT_EQ(bare->status, 201) << Show(*bare);
    absl::StatusOr<HttpResponse> quoted =
        CurlOne("POST", c.path, {"Idempotency-Key: " + c.quoted}, body);
    ASSERT_TRUE(quoted.ok()) << quoted.status();
    EXPECT_TRUE(IsReplayOf(*quoted, *bare)) << c.quoted;
    EXPECT_EQ(upstream().Count(c.path), 1) << c.quoted;
    EXPECT_EQ(RecordStatus("http", c.key), "SUCCEEDED") << c.key;
  }
}

// h. Two requests on one curl invocation share a keep-alive connection and
// are both answered: a POST executed then replayed, a GET passed twice.
TEST_F(GatewayTest, KeepAliveAnswersEveryRequest) {
  const std::string post_path = "/h/payments";
  absl::StatusOr<std::vector<CurlAnswer>> posts = Curl(
      {"-X", "POST", "-H", "Idempotency-Key: \"h-key\"", "-H",
       "content-type: application/json", "--data-binary", R"({"amount":10})"},
      {gw->Url(post_path), gw->Url(post_path)});
  ASSERT_TRUE(posts.ok()) << posts.status();
  ASSERT_EQ(posts->size(), 2u);
  EXPECT_EQ(posts->at(0).response.status, 201) << Show(posts->at(0).response);
  EXPECT_TRUE(IsReplayOf(posts->at(1).response, posts->at(0).response));
  EXPECT_EQ(posts->at(1).connects, 0) << "second request on a new connection";
  EXPECT_EQ(upstream().Count(post_path), 1);

  const std::string get_path = "/h/items";
  absl::StatusOr<std::vector<CurlAnswer>> gets =
      Curl({}, {gw->Url(get_path), gw->Url(get_path)});
  ASSERT_TRUE(gets.ok()) << gets.status();
  ASSERT_EQ(gets->size(), 2u);
  for (const CurlAnswer& a : *gets) {
    EXPECT_EQ(a.response.status, 201) << Show(a.response);
  }
  EXPECT_EQ(gets->at(1).connects, 0) << "second request on a new connection";
  EXPECT_EQ(upstream().Count(get_path), 2);
}

// i. A body over the route's max_body: 413 body-too-large, no call; one of
// exactly max_body bytes goes through.
TEST_F(GatewayTest, BodyOverTheRouteLimitIsRejected) {
  const std::string path = "/small/upload";
  const std::string rows = RecordCount();
  absl::StatusOr<HttpResponse> big = CurlOne(
      "POST", path, {"Idempotency-Key: \"i-big\""}, std::string(4096, 'x'));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE(IsProblem(*big, {413}, "body-too-large"));
  EXPECT_EQ(upstream().Count(path), 0);
  EXPECT_EQ(RecordCount(), rows);

  absl::StatusOr<HttpResponse> fits = CurlOne(
      "POST", path, {"Idempotency-Key: \"i-fits\""}, std::string(1024, 'x'));
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->status, 201) << Show(*fits);
  EXPECT_EQ(upstream().Count(path), 1);
  EXPECT_EQ(RecordStatus("gw-small", "i-fits"), "SUCCEEDED");
}

// A key that is not one 1-200 byte visible-ASCII key: 400 key-invalid, no
// call; a bare key of exactly 200 bytes goes through.
TEST_F(GatewayTest, InvalidKeysAreRejected) {
  const std::string path = "/j/payments";
  const std::string body = R"({"amount":10})";
  const std::vector<std::vector<std::string>> invalid = {
      {"Idempotency-Key: \"j-1\"", "Idempotency-Key: \"j-2\""},
      {"Idempotency-Key: " + std::string(201, 'k')},
      {"Idempotency-Key: \"\""},
      {"Idempotency-Key: \"j key\""},
      {"Idempotency-Key: \"j-unterminated"},
  };
  for (const std::vector<std::string>& headers : invalid) {
    absl::StatusOr<HttpResponse> r = CurlOne("POST", path, headers, body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(IsProblem(*r, {400}, "key-invalid"))
        << absl::StrJoin(headers, " / ");
  }
  EXPECT_EQ(upstream().Count(path), 0);

  const std::string longest(200, 'k');
  absl::StatusOr<HttpResponse> fits =
      CurlOne("POST", path, {"Idempotency-Key: " + longest}, body);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->status, 201) << Show(*fits);
  EXPECT_EQ(upstream().Count(path), 1);
  EXPECT_EQ(RecordStatus("http", longest), "SUCCEEDED");
}

// An upstream that refuses the connection: 502 upstream-unavailable, the
// record fails retryable, and the retry executes once it is back.
TEST_F(GatewayTest, UnreachableUpstreamFailsRetryable) {
  const std::string path = "/k/payments";
  const std::string body = R"({"amount":10})";
  const std::string key = "Idempotency-Key: \"k-key\"";
  absl::StatusOr<int> killed = upstream().process().Kill();
  ASSERT_TRUE(killed.ok()) << killed.status();

  absl::StatusOr<HttpResponse> refused = CurlOne("POST", path, {key}, body);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(IsProblem(*refused, {502}, "upstream-unavailable"));
  EXPECT_EQ(RecordStatus("http", "k-key"), "FAILED");

  absl::Status started = upstream().Start();
  ASSERT_TRUE(started.ok()) << started;
  absl::StatusOr<HttpResponse> created = CurlOne("POST", path, {key}, body);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->status, 201) << Show(*created);
  EXPECT_EQ(created->Header("idempotent-replayed"), "");
  EXPECT_EQ(upstream().Count(path), 1);
  EXPECT_EQ(RecordStatus("http", "k-key"), "SUCCEEDED");
}

// Pipelined requests on one connection are executed one after the other
// and answered in order, the slow first one included.
TEST_F(GatewayTest, PipelinedRequestsAreAnsweredInOrder) {
  auto post = [](const std::string& key, const std::string& behavior) {
    const std::string body = R"({"amount":10})";
    return absl::StrCat("POST /l/payments HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                        "Idempotency-Key: \"", key, "\"\r\n", behavior,
                        "Content-Type: application/json\r\nContent-Length: ",
                        body.size(), "\r\n\r\n", body);
  };
  const std::string raw = absl::StrCat(
      post("l-1", "x-test-behavior: delay=300\r\n"),
      "GET /l/items HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", post("l-2", ""));
  absl::StatusOr<std::vector<HttpResponse>> answers = Pipeline(raw, 3);
  ASSERT_TRUE(answers.ok()) << answers.status();

  // The upstream's sequence numbers of the three requests, as sent.
  std::vector<int> want(3, 0);
  for (const json& e : upstream().Executions("/l/payments")) {
    want[e.at("key") == "\"l-1\"" ? 0 : 2] = e.at("seq").get<int>();
  }
  for (const json& e : upstream().Executions("/l/items")) {
    want[1] = e.at("seq").get<int>();
  }
  EXPECT_EQ(upstream().Count("/l/payments"), 2);
  EXPECT_EQ(upstream().Count("/l/items"), 1);
  // Executed one after the other, in the order sent.
  EXPECT_LT(want[0], want[1]);
  EXPECT_LT(want[1], want[2]);
  for (size_t i = 0; i < 3; ++i) {
    const HttpResponse& r = answers->at(i);
    EXPECT_EQ(r.status, 201) << Show(r);
    EXPECT_EQ(r.Header("x-upstream-execution"), absl::StrCat(want[i]))
        << "answer " << i << ":\n"
        << Show(r);
  }
}

// idem_http_requests_total counts each result under its route.
TEST_F(GatewayTest, MetricsCountResultsByRoute) {
  const std::string path = "/m/payments";
  auto counts = [] {
    std::map<std::string, double> out;
    absl::StatusOr<std::string> text =
        HttpGet(gw->env->sidecar(0).metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    for (const char* result : {"executed", "replayed", "mismatch"}) {
      const std::string series = absl::StrCat(
          "idem_http_requests_total{result=\"", result, "\",route=\"http\"}");
      out[result] = text.ok() ? MetricValue(*text, series) : -1;
      if (out[result] < 0) out[result] = 0;
    }
    return out;
  };
  const std::map<std::string, double> before = counts();
  for (const char* body :
       {R"({"amount":1})", R"({"amount":1})", R"({"amount":2})"}) {
    absl::StatusOr<HttpResponse> r =
        CurlOne("POST", path, {"Idempotency-Key: \"m-key\""}, body);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const std::map<std::string, double> after = counts();
  for (const char* result : {"executed", "replayed", "mismatch"}) {
    EXPECT_EQ(after.at(result) - before.at(result), 1) << result;
  }
}

}  // namespace
}  // namespace idem::testing
