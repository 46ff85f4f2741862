#include "server/console/console.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/steady_wait.h"
#include "common/thread_name.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "server/base/host_port.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "server/console/assets.h"
#include "server/rpc/admin_calls.h"
#include "server/rpc/validation.h"
#include "server/wire/convert.h"

namespace idem::console {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;
using json = nlohmann::json;

// No script or style but the console's own files, no framing, no guessing
// of content types: the page handles records' contents, which anyone who
// can make a request writes.
constexpr char kCsp[] =
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// A request's header and body; a Resolve's result is bounded by
// --max-snapshot-bytes, base64 in JSON (4/3), plus the other fields.
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;
size_t MaxBody(const Limits& limits) {
  return limits.max_snapshot_bytes * 2 + 64 * 1024;
}
constexpr auto kIdleTimeout = std::chrono::seconds(60);

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kAlreadyExists:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

const char* ContentType(absl::string_view path) {
  if (absl::EndsWith(path, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(path, ".js")) return "text/javascript; charset=utf-8";
  if (absl::EndsWith(path, ".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

Response Answer(int status, const std::string& content_type, std::string body) {
  Response res(static_cast<http::status>(status), 11);
  res.set(http::field::content_type, content_type);
  res.set("Content-Security-Policy", kCsp);
  res.set("X-Content-Type-Options", "nosniff");
  res.set("X-Frame-Options", "DENY");
  res.set("Referrer-Policy", "no-referrer");
  res.set(http::field::cache_control, "no-store");
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

Response JsonAnswer(int status, const std::string& body) {
  return Answer(status, "application/json", body);
}

Response Error(const absl::Status& status) {
  json body = {{"code", absl::StatusCodeToString(status.code())},
               {"message", std::string(status.message())}};
  return JsonAnswer(HttpStatus(status.code()), body.dump());
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options)
           .ok()) {
    return "{}";
  }
  return out;
}

absl::Status FromJson(const std::string& body,
                      google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  const auto status = google::protobuf::util::JsonStringToMessage(
      body.empty() ? "{}" : body, message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("body: ", std::string(status.message())));
  }
  return absl::OkStatus();
}

json VitalsJson(const Vitals* vitals) {
  json samples = json::array();
  if (vitals != nullptr) {
    for (const VitalsSample& s : vitals->Samples()) {
      json begins = json::object();
      for (const auto& [outcome, rate] : s.begins_per_second) {
        begins[outcome] = rate;
      }
      samples.push_back({{"at", absl::ToUnixMillis(s.at)},
                         {"begins_per_second", begins},
                         {"begin_p50_seconds", s.begin_p50_seconds},
                         {"begin_p99_seconds", s.begin_p99_seconds},
                         {"waiters", s.waiters},
                         {"redis_up", s.redis_up},
                         {"unknown_records", s.unknown_records},
                         {"calls_in_flight", s.calls_in_flight},
                         {"pg_in_use", s.pg_in_use}});
    }
  }
  return {{"interval_seconds",
           vitals != nullptr ? absl::ToDoubleSeconds(vitals->interval()) : 0},
          {"samples", samples}};
}

struct Shared {
  ConsoleOptions options;
  ServiceContext c;
  Vitals* vitals;

  // Store calls started and not yet returned: Stop waits for them.
  SteadyMutex mu;
  SteadyCondVar changed;
  int64_t outside ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Last: destroyed first, with the handlers (and connections) it holds.
  net::io_context ioc{1};

  // Counts a store call about to start; false once stopping.
  bool Leave() {
    SteadyMutexLock lock(&mu);
    if (stopping) return false;
    ++outside;
    return true;
  }
  void Returned() {
    SteadyMutexLock lock(&mu);
    --outside;
    changed.SignalAll();
  }
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, Shared& shared)
      : shared_(shared), stream_(std::move(socket)) {}

  void Start() { Read(); }

 private:
  using Reply = std::function<void(Response)>;

  void Read() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(MaxBody(shared_.c.limits));
    stream_.expires_after(kIdleTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        beast::bind_front_handler(&Connection::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit || ec == http::error::header_limit) {
      Response res = Error(absl::InvalidArgumentError("request too large"));
      res.keep_alive(false);
      return Write(std::move(res));
    }
    if (ec) return Close();
    stream_.expires_never();
    request_ = parser_->release();
    Handle();
  }

  // Writes `res` on this connection's thread; store answers come here
  // through Post.
  void Write(Response res) {
    res.keep_alive(res.keep_alive() && request_.keep_alive());
    auto owned = std::make_shared<Response>(std::move(res));
    stream_.expires_after(kIdleTimeout);
    http::async_write(
        stream_, *owned,
        [self = shared_from_this(), owned](beast::error_code ec, size_t) {
          if (ec || !owned->keep_alive()) return self->Close();
          self->Read();
        });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  // A Reply that may be called from a store's thread: the answer is
  // written from the event loop.
  Reply Post() {
    return [self = shared_from_this()](Response res) {
      Shared& shared = self->shared_;
      net::post(self->stream_.get_executor(),
                [self, res = std::move(res)]() mutable {
                  self->Write(std::move(res));
                });
      shared.Returned();
    };
  }

  void Handle() {
    const std::string target(request_.target());
    const std::string path = target.substr(0, target.find('?'));
    if (!absl::StartsWith(path, "/api/")) return ServeAsset(path);
    absl::StatusOr<Principal> caller = Identify();
    if (!caller.ok()) return Write(Error(caller.status()));
    // Operators only, before anything of the request is read.
    absl::Status op = Operator(*caller);
    if (!op.ok()) return Write(Error(op));
    const bool get = request_.method() == http::verb::get;
    const bool post = request_.method() == http::verb::post;
    if (path == "/api/session" && get) return Session(*caller);
    if (path == "/api/vitals" && get) return VitalsAnswer();
    if (!post) {
      if (path == "/api/list" || path == "/api/get" || path == "/api/history" ||
          path == "/api/resolve") {
        return Write(Error(absl::InvalidArgumentError("use POST")));
      }
      return Write(Error(absl::NotFoundError(path)));
    }
    if (!shared_.Leave()) {
      return Write(Error(absl::UnavailableError("shutting down")));
    }
    Reply reply = Post();
    if (path == "/api/list") return List(*caller, reply);
    if (path == "/api/get") return Get(*caller, reply);
    if (path == "/api/history") return History(*caller, reply);
    if (path == "/api/resolve") return Resolve(*caller, reply);
    reply(Error(absl::NotFoundError(path)));
  }

  void ServeAsset(const std::string& path) {
    if (request_.method() != http::verb::get) {
      return Write(Error(absl::InvalidArgumentError("use GET")));
    }
    const Asset* asset = FindAsset(path == "/" ? "/index.html" : path);
    if (asset == nullptr) return Write(Error(absl::NotFoundError(path)));
    Response res = Answer(
        200, ContentType(asset->path),
        std::string(reinterpret_cast<const char*>(asset->data), asset->size));
    // The assets change only with the binary.
    res.set(http::field::cache_control, "no-cache");
    Write(std::move(res));
  }

  // The caller, as the gRPC services identify one: the bearer token (no
  // client certificates here); with auth off an anonymous operator.
  absl::StatusOr<Principal> Identify() {
    const ServiceContext& c = shared_.c;
    if (c.auth == nullptr)
      return Principal{"anonymous", Role::kOperator, {"*"}};
    const auto it = request_.find(http::field::authorization);
    std::string bearer;
    if (it != request_.end()) {
      const absl::string_view value(it->value().data(), it->value().size());
      if (!absl::StartsWith(value, "Bearer ")) {
        if (c.metrics != nullptr) c.metrics->AuthFailed("unauthenticated");
        return absl::UnauthenticatedError(
            "authorization: expected \"Bearer <token>\"");
      }
      bearer = std::string(value.substr(7));
    }
    absl::StatusOr<Principal> caller = c.auth->Identify(bearer, {});
    if (!caller.ok() && c.metrics != nullptr) {
      c.metrics->AuthFailed("unauthenticated");
    }
    return caller;
  }

  // An operator of any tenant may use the console; each call then checks
  // its tenant.
  absl::Status Operator(const Principal& caller) {
    if (caller.role == Role::kOperator) return absl::OkStatus();
    if (shared_.c.metrics != nullptr) {
      shared_.c.metrics->AuthFailed("permission_denied");
    }
    return absl::PermissionDeniedError(
        absl::StrCat("principal \"", caller.name, "\" is not an operator"));
  }

  void Session(const Principal& caller) {
    json body = {{"principal", caller.name},
                 {"role", "operator"},
                 {"tenants", caller.tenants},
                 {"auth", shared_.c.auth != nullptr}};
    Write(JsonAnswer(200, body.dump()));
  }

  void VitalsAnswer() {
    Write(JsonAnswer(200, VitalsJson(shared_.vitals).dump()));
  }

  // The record named by `key`, the caller allowed on its tenant.
  absl::StatusOr<RecordKey> KeyFor(const Principal& caller,
                                   const pb::RecordKey& key, bool has_key) {
    absl::StatusOr<RecordKey> parsed = ParseKey(key, has_key);
    if (!parsed.ok()) return parsed.status();
    absl::Status allowed =
        Allowed(shared_.c, caller, /*admin=*/true, parsed->tenant);
    if (!allowed.ok()) return allowed;
    return parsed;
  }

  void Get(const Principal& caller, const Reply& reply) {
    pb::GetRequest req;
    absl::Status parsed = FromJson(request_.body(), &req);
    if (!parsed.ok()) return reply(Error(parsed));
    absl::StatusOr<RecordKey> key = KeyFor(caller, req.key(), req.has_key());
    if (!key.ok()) return reply(Error(key.status()));
    shared_.c.calls->Get(*key, [reply](absl::StatusOr<Record> record) {
      if (!record.ok()) return reply(Error(record.status()));
      pb::GetResponse resp;
      ToProto(*record, /*with_result=*/true, resp.mutable_record());
      reply(JsonAnswer(200, ToJson(resp)));
    });
  }

  void Resolve(const Principal& caller, const Reply& reply) {
    pb::ResolveRequest req;
    absl::Status parsed = FromJson(request_.body(), &req);
    if (!parsed.ok()) return reply(Error(parsed));
    absl::StatusOr<RecordKey> key = KeyFor(caller, req.key(), req.has_key());
    if (!key.ok()) return reply(Error(key.status()));
    absl::StatusOr<ResolveCommand> cmd = ParseResolve(req, shared_.c.limits);
    if (!cmd.ok()) return reply(Error(cmd.status()));
    auto resp = std::make_shared<pb::ResolveResponse>();
    ResolveRecord(shared_.c, *key, *std::move(cmd), caller.name, "console",
                  resp.get(), JsonReply(reply, resp));
  }

  void History(const Principal& caller, const Reply& reply) {
    pb::HistoryRequest req;
    absl::Status parsed = FromJson(request_.body(), &req);
    if (!parsed.ok()) return reply(Error(parsed));
    absl::StatusOr<RecordKey> key = KeyFor(caller, req.key(), req.has_key());
    if (!key.ok()) return reply(Error(key.status()));
    absl::StatusOr<HistoryQuery> query = ParseHistory(req, *key);
    if (!query.ok()) return reply(Error(query.status()));
    auto resp = std::make_shared<pb::HistoryResponse>();
    HistoryPage(shared_.c, *query, resp.get(), JsonReply(reply, resp));
  }

  void List(const Principal& caller, const Reply& reply) {
    pb::ListRequest req;
    absl::Status parsed = FromJson(request_.body(), &req);
    if (!parsed.ok()) return reply(Error(parsed));
    absl::StatusOr<ListQuery> query = ParseList(req);
    if (!query.ok()) return reply(Error(query.status()));
    absl::Status allowed =
        Allowed(shared_.c, caller, /*admin=*/true, query->tenant);
    if (!allowed.ok()) return reply(Error(allowed));
    auto resp = std::make_shared<pb::ListResponse>();
    ListPage(shared_.c, *std::move(query), req.page_token(), resp.get(),
             JsonReply(reply, resp));
  }

  // Answers `resp` as JSON once the admin call that fills it is done.
  template <typename Resp>
  static AdminDone JsonReply(const Reply& reply, std::shared_ptr<Resp> resp) {
    return [reply, resp = std::move(resp)](const absl::Status& s) {
      reply(s.ok() ? JsonAnswer(200, ToJson(*resp)) : Error(s));
    };
  }

  Shared& shared_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Request request_;
};

void Accept(Shared& shared, tcp::acceptor& acceptor) {
  acceptor.async_accept(
      net::make_strand(shared.ioc),
      [&shared, &acceptor](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted) return;
        if (!ec) {
          std::make_shared<Connection>(std::move(socket), shared)->Start();
        }
        Accept(shared, acceptor);
      });
}

}  // namespace

struct Console::Impl {
  Shared shared;
  tcp::acceptor acceptor{shared.ioc};
  int port = 0;
  std::thread thread;
  std::atomic<bool> stopped{false};
};

absl::StatusOr<std::unique_ptr<Console>> Console::Start(ConsoleOptions options,
                                                        ServiceContext context,
                                                        Vitals* vitals) {
  auto impl = std::make_unique<Impl>();
  Shared& shared = impl->shared;
  shared.options = std::move(options);
  shared.c = context;
  shared.vitals = vitals;
  std::string host;
  int port = 0;
  if (!SplitHostPort(shared.options.listen, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--console-listen: want host:port, not \"",
                     shared.options.listen, "\""));
  }
  beast::error_code ec;
  tcp::resolver resolver(shared.ioc);
  auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "--console-listen: cannot resolve ", host, ": ", ec.message()));
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  if (context.auth == nullptr && !endpoint.address().is_loopback()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--console-listen=", shared.options.listen,
        " is not a loopback address, and nothing identifies callers: pass "
        "--auth-tokens, whose operator tokens the console then asks for"));
  }
  tcp::acceptor& acceptor = impl->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--console-listen: cannot listen on ",
                     shared.options.listen, ": ", ec.message()));
  }
  impl->port = acceptor.local_endpoint().port();
  Accept(shared, acceptor);
  impl->thread = std::thread([&shared] {
    NameThisThread(thread_names::kConsole);
    shared.ioc.run();
  });
  return std::unique_ptr<Console>(new Console(std::move(impl)));
}

Console::Console(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Console::~Console() { Stop(); }

int Console::port() const { return impl_->port; }

void Console::Stop() {
  if (impl_->stopped.exchange(true)) return;
  Shared& shared = impl_->shared;
  net::post(shared.ioc, [impl = impl_.get()] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
  });
  {
    SteadyMutexLock lock(&shared.mu);
    shared.stopping = true;
    while (shared.outside > 0) shared.changed.Wait(&lock);
  }
  shared.ioc.stop();
  impl_->thread.join();
}

}  // namespace idem::console
