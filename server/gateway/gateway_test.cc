// The gateway over the memory store, with a real upstream and real sockets:
// the HTTP mechanics (pipelining, hop-by-hop fields, limits, Expect, HEAD,
// byte-for-byte replays) and what the upstream's failures leave in the
// record. The black-box tests over PostgreSQL and the sidecar binary are
// tests/gateway_pgtest.cc.
#include "server/gateway/gateway.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/await.h"
#include "gtest/gtest.h"
#include "server/core/calls.h"
#include "server/store/memory_store.h"

namespace idem::gateway {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// How the test's upstream treats its connections.
struct Behaviour {
  // Answers with Connection: close.
  bool close_always = false;
  // A connection with no request for this long is closed (0: never).
  int idle_close_ms = 0;
  // Every request after a connection's first is read and then the
  // connection closed without an answer, as a service closing an idle
  // connection just as the request arrives.
  bool hang_up_on_reuse = false;
};

// An HTTP/1.1 service with a thread per connection that keeps every
// request it reads and answers with `answer`, keep-alive as asked unless
// `behaviour` says otherwise.
class Upstream {
 public:
  // nullopt: hang up without answering.
  using AnswerFn = std::function<std::optional<Response>(const Request&)>;

  explicit Upstream(AnswerFn answer, Behaviour behaviour = Behaviour())
      : answer_(std::move(answer)), behaviour_(behaviour) {
    acceptor_.open(tcp::v4());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind({net::ip::make_address("127.0.0.1"), 0});
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { Serve(); });
  }
  ~Upstream() {
    stop_ = true;
    beast::error_code ignored;
    // Wakes the accept.
    tcp::socket poke(ioc_);
    poke.connect({net::ip::make_address("127.0.0.1"),
                  static_cast<unsigned short>(port_)},
                 ignored);
    thread_.join();
    {
      // Ends the reads of connections the gateway keeps open.
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : connections_) t.join();
  }

  int port() const { return port_; }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  // Connections accepted, and open now.
  int accepts() const { return accepts_.load(); }
  int open() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(open_.size());
  }

 private:
  void Serve() {
    while (!stop_) {
      auto socket = std::make_shared<tcp::socket>(ioc_);
      beast::error_code ec;
      acceptor_.accept(*socket, ec);
      if (ec || stop_) continue;
      ++accepts_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        open_.push_back(socket->native_handle());
      }
      connections_.emplace_back([this, socket] { Converse(*socket); });
    }
  }

  void Converse(tcp::socket& socket) {
    beast::error_code ec;
    beast::flat_buffer buffer;
    for (int nth = 0;; ++nth) {
      pollfd readable{socket.native_handle(), POLLIN, 0};
      if (behaviour_.idle_close_ms > 0 && buffer.size() == 0 &&
          poll(&readable, 1, behaviour_.idle_close_ms) == 0) {
        break;
      }
      Request req;
      http::read(socket, buffer, req, ec);
      if (ec) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(req);
      }
      if (nth > 0 && behaviour_.hang_up_on_reuse) break;
      std::optional<Response> res = answer_(req);
      if (!res) break;
      res->keep_alive(req.keep_alive() && !behaviour_.close_always);
      http::write(socket, *res, ec);
      if (ec || !res->keep_alive()) break;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_.erase(
          std::find(open_.begin(), open_.end(), socket.native_handle()));
    }
    socket.shutdown(tcp::socket::shutdown_both, ec);
    socket.close(ec);
  }

  AnswerFn answer_;
  const Behaviour behaviour_;
  net::io_context ioc_;
  tcp::acceptor acceptor_{ioc_};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepts_{0};
  std::mutex mu_;
  std::vector<Request> requests_;
  std::vector<int> open_;
  std::thread thread_;
  // Touched by the accepting thread only, and joined after it.
  std::vector<std::thread> connections_;
};

Response Created(const Request& req, const std::string& body) {
  Response res(http::status::created, 11);
  res.set(http::field::content_type, "application/json");
  res.set("location", "/things/1");
  res.body() = body.empty() ? absl::StrCat("{\"target\":\"",
                                           std::string(req.target()), "\"}")
                            : body;
  res.prepare_payload();
  return res;
}

// A client connection speaking raw bytes.
class Client {
 public:
  explicit Client(int port) {
    socket_.connect({net::ip::make_address("127.0.0.1"),
                     static_cast<unsigned short>(port)});
  }
  void Send(const std::string& bytes) {
    net::write(socket_, net::buffer(bytes));
  }
  // The next response; an error status if there is none.
  Response Read(bool head = false) {
    http::response_parser<http::string_body> parser;
    parser.skip(head);
    parser.body_limit(1 << 24);
    beast::error_code ec;
    http::read(socket_, buffer_, parser, ec);
    if (ec) {
      Response none;
      none.result(599);
      none.body() = ec.message();
      return none;
    }
    return parser.release();
  }
  // Whether the server closed the connection (no more bytes).
  bool Closed() {
    beast::error_code ec;
    char byte;
    socket_.read_some(net::buffer(&byte, 1), ec);
    return ec == net::error::eof || ec == net::error::connection_reset;
  }

 private:
  net::io_context ioc_;
  tcp::socket socket_{ioc_};
  beast::flat_buffer buffer_;
};

// Whether `done` holds within five seconds.
bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

std::string Post(const std::string& target, const std::string& key,
                 const std::string& body, const std::string& extra = "") {
  return absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: t\r\n",
                      key.empty() ? "" : "Idempotency-Key: " + key + "\r\n",
                      extra, "Content-Length: ", body.size(), "\r\n\r\n", body);
}

class GatewayTest : public ::testing::Test {
 protected:
  void StartGateway(int upstream_port, GatewayConfig config = {},
                    GatewayOptions options = {}) {
    options.listen = "127.0.0.1:0";
    options.upstream = absl::StrCat("http://127.0.0.1:", upstream_port);
    absl::StatusOr<std::unique_ptr<Gateway>> started =
        Gateway::Start(options, std::move(config), &calls_, nullptr);
    ASSERT_TRUE(started.ok()) << started.status();
    gateway_ = *std::move(started);
  }
  absl::StatusOr<Record> Get(const std::string& key,
                             const std::string& operation = "http") {
    return Await<absl::StatusOr<Record>>([&](Calls::RecordFn done) {
      calls_.Get({"http", operation, key}, std::move(done));
    });
  }

  std::unique_ptr<Store> store_ = NewMemoryStore();
  PolicySet policies_;
  Calls calls_{store_.get(), store_->Changes(), &policies_, nullptr};
  std::unique_ptr<Gateway> gateway_;
};

TEST_F(GatewayTest, PipelinedRequestsAreAnsweredInOrder) {
  Upstream upstream([](const Request& req) { return Created(req, ""); });
  StartGateway(upstream.port());
  Client client(gateway_->port());
  client.Send(Post("/a", "k-a", "1") + "GET /b HTTP/1.1\r\nHost: t\r\n\r\n" +
              Post("/c", "k-c", "3") + Post("/a", "k-a", "1"));
  const char* expected[] = {"/a", "/b", "/c", "/a"};
  for (const char* target : expected) {
    Response res = client.Read();
    ASSERT_LT(res.result_int(), 300u) << res.body();
    EXPECT_EQ(res.body(), absl::StrCat("{\"target\":\"", target, "\"}"));
  }
  // The last one was a replay: the upstream ran three.
  EXPECT_EQ(upstream.requests().size(), 3u);
}

TEST_F(GatewayTest, ServesConnectionsOnStrandsWithSeveralThreads) {
  Upstream upstream([](const Request& req) { return Created(req, ""); });
  GatewayOptions options;
  options.threads = 2;
  StartGateway(upstream.port(), {}, options);
  std::vector<std::thread> clients;
  clients.reserve(4);
  std::atomic<int> replays{0};
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([this, c, &replays] {
      Client client(gateway_->port());
      const std::string target = absl::StrCat("/t", c);
      const std::string request = Post(target, absl::StrCat("k", c), "1");
      for (int i = 0; i < 20; ++i) {
        client.Send(request);
        Response res = client.Read();
        EXPECT_EQ(res.body(), absl::StrCat("{\"target\":\"", target, "\"}"));
        if (res["idempotent-replayed"] == "true") ++replays;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(upstream.requests().size(), 4u);
  EXPECT_EQ(replays.load(), 4 * 19);
}

TEST_F(GatewayTest, HopByHopFieldsStayOnTheirHop) {
  Upstream upstream([](const Request& req) {
    Response res = Created(req, "{}");
    res.set(http::field::connection, "x-internal");
    res.set("x-internal", "1");
    res.set("x-public", "2");
    res.set(http::field::keep_alive, "timeout=5");
    return res;
  });
  StartGateway(upstream.port());
  Client client(gateway_->port());
  const std::string request =
      Post("/p", "k1", "{}",
           "Connection: keep-alive, x-secret\r\nx-secret: 1\r\n"
           "Keep-Alive: timeout=9\r\nTE: trailers\r\nx-end: 2\r\n");
  client.Send(request);
  Response first = client.Read();
  client.Send(request);
  Response replay = client.Read();

  ASSERT_EQ(upstream.requests().size(), 1u);
  const Request seen = upstream.requests()[0];
  EXPECT_EQ(seen["x-end"], "2");
  EXPECT_EQ(seen["x-forwarded-for"], "127.0.0.1");
  EXPECT_EQ(seen["x-forwarded-proto"], "http");
  EXPECT_EQ(seen["idempotency-key"], "k1");
  for (const char* gone : {"x-secret", "keep-alive", "te"}) {
    EXPECT_EQ(seen.find(gone), seen.end()) << gone;
  }
  for (const Response* res : {&first, &replay}) {
    EXPECT_EQ(res->result_int(), 201u);
    EXPECT_EQ((*res)["x-public"], "2");
    EXPECT_EQ((*res)["location"], "/things/1");
    EXPECT_EQ(res->find("x-internal"), res->end());
    EXPECT_EQ((*res)[http::field::keep_alive], "");
    EXPECT_EQ(res->body(), "{}");
  }
  EXPECT_EQ(first.find("idempotent-replayed"), first.end());
  EXPECT_EQ(replay["idempotent-replayed"], "true");
}

TEST_F(GatewayTest, ReplaysBinaryBodiesByteForByte) {
  std::string body("\x00\xff\r\n\"binary\"", 12);
  Upstream upstream([&body](const Request& req) {
    Response res = Created(req, body);
    res.set(http::field::content_type, "application/octet-stream");
    return res;
  });
  StartGateway(upstream.port());
  Client client(gateway_->port());
  client.Send(Post("/p", "\"bin\"", "x"));
  EXPECT_EQ(client.Read().body(), body);
  client.Send(Post("/p", "bin", "x"));
  Response replay = client.Read();
  EXPECT_EQ(replay.body(), body);
  EXPECT_EQ(replay[http::field::content_type], "application/octet-stream");
  EXPECT_EQ(upstream.requests().size(), 1u);
}

TEST_F(GatewayTest, ReplaysLargerThanTheSendBufferAreWrittenWhole) {
  const std::string body(4 << 20, 'b');
  Upstream upstream([&body](const Request& req) { return Created(req, body); });
  GatewayOptions options;
  options.max_snapshot_bytes = 8 << 20;
  StartGateway(upstream.port(), {}, options);
  Client client(gateway_->port());
  const std::string request = Post("/p", "big", "x");
  client.Send(request);
  EXPECT_EQ(client.Read().body(), body);
  // Twice on one connection, the client slow to read: the part that did
  // not fit the socket is written later, and the next request follows.
  for (int i = 0; i < 2; ++i) {
    client.Send(request);
    absl::SleepFor(absl::Milliseconds(100));
    Response replay = client.Read();
    EXPECT_EQ(replay["idempotent-replayed"], "true");
    EXPECT_EQ(replay.body(), body);
  }
  EXPECT_EQ(upstream.requests().size(), 1u);
}

TEST_F(GatewayTest, LimitsAnswerBeforeTheUpstreamIsCalled) {
  Upstream upstream([](const Request& req) { return Created(req, ""); });
  GatewayOptions options;
  options.max_body = 100;
  StartGateway(upstream.port(), {}, options);
  {
    Client client(gateway_->port());
    client.Send(Post("/p", "k", std::string(101, 'b')));
    Response res = client.Read();
    EXPECT_EQ(res.result_int(), 413u);
    EXPECT_TRUE(absl::StrContains(res.body(), "body-too-large"));
    EXPECT_TRUE(client.Closed());
  }
  {
    Client client(gateway_->port());
    client.Send(absl::StrCat(
        "GET / HTTP/1.1\r\nx-big: ", std::string(20000, 'h'), "\r\n\r\n"));
    EXPECT_EQ(client.Read().result_int(), 431u);
  }
  {
    Client client(gateway_->port());
    client.Send(Post("/p", "bad key", "{}"));
    Response res = client.Read();
    EXPECT_EQ(res.result_int(), 400u);
    EXPECT_TRUE(absl::StrContains(res.body(), "key-invalid"));
    client.Send(Post("/p", "k", "{}", "Idempotency-Key: k2\r\n"));
    EXPECT_EQ(client.Read().result_int(), 400u);
  }
  EXPECT_TRUE(upstream.requests().empty());
}

TEST_F(GatewayTest, AnswersExpectContinueThenReadsTheBody) {
  Upstream upstream(
      [](const Request& req) { return Created(req, req.body()); });
  StartGateway(upstream.port());
  Client client(gateway_->port());
  client.Send(
      "POST /p HTTP/1.1\r\nHost: t\r\nIdempotency-Key: e\r\n"
      "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  EXPECT_EQ(client.Read().result_int(), 100u);
  client.Send("hello");
  Response res = client.Read();
  EXPECT_EQ(res.result_int(), 201u);
  EXPECT_EQ(res.body(), "hello");
}

TEST_F(GatewayTest, PassesHeadAnswersWithTheirLength) {
  Upstream upstream([](const Request& req) {
    Response res(http::status::ok, 11);
    res.set(http::field::content_length, "10");
    EXPECT_EQ(req.method(), http::verb::head);
    return res;
  });
  StartGateway(upstream.port());
  Client client(gateway_->port());
  client.Send("HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n");
  Response res = client.Read(/*head=*/true);
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_EQ(res[http::field::content_length], "10");
  client.Send("HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(client.Read(/*head=*/true).result_int(), 200u);
}

TEST_F(GatewayTest, ARefusedUpstreamFailsTheRecordRetryable) {
  int port;
  {
    Upstream gone([](const Request& req) { return Created(req, ""); });
    port = gone.port();
  }
  StartGateway(port);
  Client client(gateway_->port());
  client.Send(Post("/p", "r1", "{}"));
  Response res = client.Read();
  EXPECT_EQ(res.result_int(), 502u);
  EXPECT_TRUE(absl::StrContains(res.body(), "upstream-unavailable"));
  absl::StatusOr<Record> record = Get("r1");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->status, Status::kFailed);
  EXPECT_TRUE(record->retryable);
}

TEST_F(GatewayTest, NoAnswerAfterSendingLeavesTheRecordInProgress) {
  std::atomic<int> calls{0};
  Upstream upstream([&calls](const Request&) -> std::optional<Response> {
    ++calls;
    return std::nullopt;
  });
  absl::StatusOr<GatewayConfig> config = ParseGatewayConfig(
      "gateway: {routes: [{name: pay, methods: [POST], path: /p, "
      "timeout: 1s, lease: 30s}]}");
  ASSERT_TRUE(config.ok());
  StartGateway(upstream.port(), *config);
  Client client(gateway_->port());
  client.Send(Post("/p", "u1", "{}"));
  Response res = client.Read();
  EXPECT_EQ(res.result_int(), 502u);
  EXPECT_TRUE(absl::StrContains(res.body(), "outcome-unknown")) << res.body();
  absl::StatusOr<Record> record = Get("u1", "pay");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->status, Status::kProcessing);
  // The retry does not run it again.
  client.Send(Post("/p", "u1", "{}"));
  Response retry = client.Read();
  EXPECT_EQ(retry.result_int(), 409u);
  EXPECT_NE(retry[http::field::retry_after], "");
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(GatewayTest, RequestsShareAKeepAliveConnectionToTheUpstream) {
  Upstream upstream([](const Request& req) { return Created(req, ""); });
  StartGateway(upstream.port());
  Client client(gateway_->port());
  for (int i = 0; i < 3; ++i) {
    client.Send("GET /g HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_EQ(client.Read().result_int(), 201u);
    client.Send(Post("/p", absl::StrCat("ka", i), "{}"));
    EXPECT_EQ(client.Read().result_int(), 201u);
  }
  EXPECT_EQ(upstream.requests().size(), 6u);
  EXPECT_EQ(upstream.accepts(), 1);
  EXPECT_EQ(gateway_->upstream_idle(), 1);
  for (const Request& seen : upstream.requests()) {
    EXPECT_TRUE(seen.keep_alive());
  }
}

TEST_F(GatewayTest, AReusedConnectionThatBreaksIsRetriedOnlyWhenSafe) {
  Behaviour behaviour;
  behaviour.hang_up_on_reuse = true;
  Upstream upstream([](const Request& req) { return Created(req, ""); },
                    behaviour);
  StartGateway(upstream.port());
  Client client(gateway_->port());
  client.Send("GET /a HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(client.Read().result_int(), 201u);
  // Sent on the kept connection, which breaks with no answer: a GET
  // without a key goes again, once, on a new connection.
  client.Send("GET /b HTTP/1.1\r\nHost: t\r\n\r\n");
  Response b = client.Read();
  EXPECT_EQ(b.result_int(), 201u);
  EXPECT_EQ(b.body(), "{\"target\":\"/b\"}");
  EXPECT_EQ(upstream.accepts(), 2);
  // A POST without a key may have run: not sent again.
  client.Send(Post("/c", "", "{}"));
  Response c = client.Read();
  EXPECT_EQ(c.result_int(), 502u);
  EXPECT_TRUE(absl::StrContains(c.body(), "outcome-unknown")) << c.body();
  EXPECT_EQ(upstream.accepts(), 2);
  // A keyed POST on a new connection runs; the next one, on the kept
  // connection, may have run when it breaks: not sent again, and its
  // record is left to turn UNKNOWN.
  client.Send(Post("/p", "s1", "{}"));
  EXPECT_EQ(client.Read().result_int(), 201u);
  client.Send(Post("/p", "s2", "{}"));
  Response s2 = client.Read();
  EXPECT_EQ(s2.result_int(), 502u);
  EXPECT_TRUE(absl::StrContains(s2.body(), "outcome-unknown")) << s2.body();
  absl::StatusOr<Record> record = Get("s2");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->status, Status::kProcessing);
  std::vector<std::string> targets;
  for (const Request& seen : upstream.requests()) {
    targets.emplace_back(seen.target());
  }
  EXPECT_EQ(targets,
            (std::vector<std::string>{"/a", "/b", "/b", "/c", "/p", "/p"}));
  EXPECT_EQ(upstream.accepts(), 3);
}

TEST_F(GatewayTest, AConnectionTheUpstreamClosedWhileIdleIsNotUsed) {
  Behaviour behaviour;
  behaviour.idle_close_ms = 50;
  Upstream upstream([](const Request& req) { return Created(req, ""); },
                    behaviour);
  GatewayOptions options;
  options.upstream_keepalive_timeout = absl::Seconds(30);
  StartGateway(upstream.port(), {}, options);
  Client client(gateway_->port());
  client.Send(Post("/p", "i1", "{}"));
  EXPECT_EQ(client.Read().result_int(), 201u);
  EXPECT_TRUE(Eventually([&] { return upstream.open() == 0; }));
  EXPECT_EQ(gateway_->upstream_idle(), 1);
  client.Send(Post("/p", "i2", "{}"));
  EXPECT_EQ(client.Read().result_int(), 201u);
  EXPECT_EQ(upstream.requests().size(), 2u);
  EXPECT_EQ(upstream.accepts(), 2);
}

TEST_F(GatewayTest, KeepAliveHoldsItsBounds) {
  Upstream upstream([](const Request& req) {
    absl::SleepFor(absl::Milliseconds(200));
    return Created(req, "");
  });
  GatewayOptions options;
  options.upstream_keepalive = 2;
  options.upstream_keepalive_timeout = absl::Milliseconds(300);
  StartGateway(upstream.port(), {}, options);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<Client>(gateway_->port()));
    clients.back()->Send("GET /g HTTP/1.1\r\nHost: t\r\n\r\n");
  }
  for (auto& client : clients) EXPECT_EQ(client->Read().result_int(), 201u);
  EXPECT_EQ(upstream.accepts(), 4);
  // Past the cap the oldest idle connections are closed.
  EXPECT_EQ(gateway_->upstream_idle(), 2);
  EXPECT_TRUE(Eventually([&] { return upstream.open() == 2; }));
  // Past the idle timeout, all of them, with no request to notice.
  EXPECT_TRUE(Eventually([&] { return gateway_->upstream_idle() == 0; }));
  EXPECT_TRUE(Eventually([&] { return upstream.open() == 0; }));
}

TEST_F(GatewayTest, NoKeepAliveWhenTheUpstreamClosesOrItIsOff) {
  Behaviour behaviour;
  behaviour.close_always = true;
  Upstream closing([](const Request& req) { return Created(req, ""); },
                   behaviour);
  StartGateway(closing.port());
  Client client(gateway_->port());
  for (int i = 0; i < 2; ++i) {
    client.Send("GET /g HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_EQ(client.Read().result_int(), 201u);
  }
  EXPECT_EQ(closing.accepts(), 2);
  EXPECT_EQ(gateway_->upstream_idle(), 0);
  gateway_.reset();

  Upstream upstream([](const Request& req) { return Created(req, ""); });
  GatewayOptions off;
  off.upstream_keepalive = 0;
  StartGateway(upstream.port(), {}, off);
  Client other(gateway_->port());
  for (int i = 0; i < 2; ++i) {
    other.Send("GET /g HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_EQ(other.Read().result_int(), 201u);
  }
  EXPECT_EQ(upstream.accepts(), 2);
  EXPECT_FALSE(upstream.requests()[0].keep_alive());
}

TEST_F(GatewayTest, StopLetsTheRequestInFlightFinish) {
  Upstream upstream([](const Request& req) {
    absl::SleepFor(absl::Milliseconds(300));
    return Created(req, "done");
  });
  StartGateway(upstream.port());
  Client client(gateway_->port());
  client.Send(Post("/p", "s1", "{}"));
  absl::SleepFor(absl::Milliseconds(100));
  gateway_->Stop(absl::Seconds(5));
  Response res = client.Read();
  EXPECT_EQ(res.result_int(), 201u);
  EXPECT_EQ(res.body(), "done");
  absl::StatusOr<Record> record = Get("s1");
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->status, Status::kSucceeded);
}

GatewayConfig Config(const std::string& yaml) {
  absl::StatusOr<GatewayConfig> config = ParseGatewayConfig(yaml);
  if (!config.ok()) ADD_FAILURE() << config.status();
  return config.value_or(GatewayConfig());
}

TEST_F(GatewayTest, ScopeHeadersKeepCallersKeysApart) {
  Upstream upstream([](const Request& req) { return Created(req, ""); });
  StartGateway(upstream.port(),
               Config("gateway: {scope_headers: [authorization]}"));
  Client client(gateway_->port());
  for (const char* who : {"alice", "bob", "alice"}) {
    client.Send(Post("/p", "same", "{}",
                     absl::StrCat("Authorization: Bearer ", who, "\r\n")));
    EXPECT_EQ(client.Read().result_int(), 201u) << who;
  }
  // Alice's second request replayed; Bob's ran under its own record.
  EXPECT_EQ(upstream.requests().size(), 2u);
}

TEST_F(GatewayTest, FingerprintHeadersAndRetryStatusesFollowTheRoute) {
  std::atomic<int> calls{0};
  Upstream upstream([&calls](const Request& req) {
    if (++calls == 1) {
      Response res(http::status::conflict, 11);
      res.body() = "busy";
      res.prepare_payload();
      return res;
    }
    return Created(req, "");
  });
  StartGateway(upstream.port(),
               Config("gateway: {routes: [{name: pay, methods: [POST], "
                      "path: /p, fingerprint_headers: [x-account], "
                      "retry_statuses: [409]}]}"));
  Client client(gateway_->port());
  client.Send(Post("/p", "f1", "{}", "x-account: a\r\n"));
  EXPECT_EQ(client.Read().result_int(), 409u);
  absl::StatusOr<Record> failed = Get("f1", "pay");
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->status, Status::kFailed);
  EXPECT_TRUE(failed->retryable);
  // 409 is a retry status here: the next attempt runs.
  client.Send(Post("/p", "f1", "{}", "x-account: a\r\n"));
  EXPECT_EQ(client.Read().result_int(), 201u);
  client.Send(Post("/p", "f1", "{}", "x-account: b\r\n"));
  Response other = client.Read();
  EXPECT_EQ(other.result_int(), 422u);
  EXPECT_TRUE(absl::StrContains(other.body(), "key-reused"));
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(GatewayTest, RecordsOnlyAllowedHeadersAndJoinsRepeats) {
  Upstream upstream([](const Request& req) {
    Response res = Created(req, "{}");
    res.insert("x-a", "1");
    res.insert("x-a", "2");
    res.set("x-b", "3");
    res.set("x-c", "4");
    return res;
  });
  StartGateway(upstream.port(),
               Config("gateway: {routes: [{name: h, snapshot_headers: "
                      "{allow: [x-a, x-b]}}]}"));
  Client client(gateway_->port());
  client.Send(Post("/p", "h1", "{}"));
  Response first = client.Read();
  EXPECT_EQ(first["x-c"], "4");  // relayed as the service sent it
  client.Send(Post("/p", "h1", "{}"));
  Response replay = client.Read();
  EXPECT_EQ(replay["x-a"], "1, 2");
  EXPECT_EQ(replay["x-b"], "3");
  EXPECT_EQ(replay.find("x-c"), replay.end());
  EXPECT_EQ(replay.find("location"), replay.end());
  EXPECT_EQ(replay[http::field::content_type], "application/json");
}

TEST_F(GatewayTest, ADuplicateOnAWaitingRouteGetsTheFirstAnswer) {
  Upstream upstream([](const Request& req) {
    absl::SleepFor(absl::Milliseconds(300));
    return Created(req, "first");
  });
  StartGateway(upstream.port(),
               Config("gateway: {routes: [{name: w, wait: 5s}]}"));
  Client first(gateway_->port());
  Client second(gateway_->port());
  first.Send(Post("/p", "w1", "{}"));
  absl::SleepFor(absl::Milliseconds(100));
  second.Send(Post("/p", "w1", "{}"));
  Response a = first.Read();
  Response b = second.Read();
  EXPECT_EQ(a.body(), "first");
  EXPECT_EQ(b.result_int(), 201u);
  EXPECT_EQ(b.body(), "first");
  EXPECT_EQ(b["idempotent-replayed"], "true");
  EXPECT_EQ(upstream.requests().size(), 1u);
}

TEST_F(GatewayTest, ConnectionBoundsAndIdleTimeout) {
  Upstream upstream([](const Request& req) { return Created(req, ""); });
  GatewayOptions options;
  options.max_connections = 1;
  options.idle_timeout = absl::Milliseconds(300);
  StartGateway(upstream.port(), {}, options);
  Client held(gateway_->port());
  held.Send("GET / HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(held.Read().result_int(), 201u);
  Client refused(gateway_->port());
  EXPECT_TRUE(refused.Closed());
  // Idle past the timeout: closed, which frees the slot.
  const absl::Time start = absl::Now();
  EXPECT_TRUE(held.Closed());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::SleepFor(absl::Milliseconds(50));
  Client next(gateway_->port());
  next.Send("GET / HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(next.Read().result_int(), 201u);
}

TEST_F(GatewayTest, TrailersAndTargetSpellingsCannotStepAroundARoute) {
  Upstream upstream([](const Request& req) { return Created(req, ""); });
  StartGateway(upstream.port(),
               Config("gateway: {routes: [{name: pay, methods: [POST], "
                      "path: /payments, key: required}]}"));
  Client client(gateway_->port());
  // The key only in a chunked body's trailer: the header had none.
  client.Send(
      "POST /payments HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
      "\r\n2\r\n{}\r\n0\r\nIdempotency-Key: t1\r\n\r\n");
  Response trailer = client.Read();
  EXPECT_EQ(trailer.result_int(), 400u);
  EXPECT_TRUE(absl::StrContains(trailer.body(), "key-missing"));
  for (const char* target :
       {"http://t/payments", "/payments/", "//payments", "/%70ayments"}) {
    client.Send(Post(target, "", "{}"));
    Response res = client.Read();
    EXPECT_EQ(res.result_int(), 400u) << target;
  }
  // With the key in the header, a trailer field is not forwarded.
  client.Send(
      "POST /payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: t2\r\n"
      "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nx-late: 1\r\n"
      "Host: late\r\nIdempotency-Key: late\r\n\r\n");
  EXPECT_EQ(client.Read().result_int(), 201u);
  client.Send("POST ftp://t/payments HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  Response bad = client.Read();
  EXPECT_EQ(bad.result_int(), 400u);
  EXPECT_TRUE(absl::StrContains(bad.body(), "bad-request"));
  ASSERT_EQ(upstream.requests().size(), 1u);
  const Request seen = upstream.requests()[0];
  EXPECT_EQ(seen.find("x-late"), seen.end());
  EXPECT_EQ(seen.count("host"), 1u);
  EXPECT_EQ(seen["idempotency-key"], "t2");
  EXPECT_EQ(seen.body(), "{}");
  EXPECT_EQ(seen.target(), "/payments");
}

}  // namespace
}  // namespace idem::gateway
