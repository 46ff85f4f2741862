#include "server/gateway/gateway.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/steady_wait.h"
#include "common/thread_name.h"
#include "server/base/host_port.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "server/gateway/problem.h"
#include "server/gateway/replay.h"
#include "server/gateway/request_identity.h"
#include "server/wire/snapshot_validation.h"

namespace idem::gateway {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// The largest request header; past it the connection is answered 431 and
// closed.
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;

// A connection keeps the buffer of its last replay for the next one up to
// this capacity; a larger one is freed once written.
constexpr size_t kKeptReplayBytes = 64 * 1024;

std::chrono::steady_clock::duration Chrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

absl::StatusOr<tcp::endpoint> Resolve(net::io_context& ioc,
                                      const std::string& flag,
                                      absl::string_view hostport,
                                      bool port_zero_ok) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(hostport, &host, &port) || (port == 0 && !port_zero_ok)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": want host:port, not \"", hostport, "\""));
  }
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    return absl::UnavailableError(absl::StrCat("--", flag, ": cannot resolve ",
                                               host, ": ", ec.message()));
  }
  return results.begin()->endpoint();
}

// The fields a message's Connection header names (RFC 9110 section 7.6.1),
// lower-case: hop-by-hop like the fixed ones.
std::vector<std::string> ConnectionOptions(const http::fields& fields) {
  std::vector<std::string> names;
  for (const auto& field : fields) {
    if (field.name() != http::field::connection) continue;
    for (absl::string_view option : absl::StrSplit(
             absl::string_view(field.value().data(), field.value().size()),
             ',')) {
      std::string name =
          absl::AsciiStrToLower(absl::StripAsciiWhitespace(option));
      if (!name.empty()) names.push_back(std::move(name));
    }
  }
  return names;
}

std::string Lower(beast::string_view s) {
  return absl::AsciiStrToLower(absl::string_view(s.data(), s.size()));
}

absl::string_view View(beast::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// Copies `from`'s end-to-end fields into `to` (hop-by-hop ones and those
// `from`'s Connection names left out).
template <bool isRequest>
void CopyEndToEnd(const http::header<isRequest, http::fields>& from,
                  http::header<isRequest, http::fields>& to) {
  const std::vector<std::string> named = ConnectionOptions(from);
  for (const auto& field : from) {
    const std::string name = Lower(field.name_string());
    if (IsHopByHop(name) ||
        std::find(named.begin(), named.end(), name) != named.end()) {
      continue;
    }
    to.insert(field.name_string(), field.value());
  }
}

// Idle keep-alive connections to the upstream (decision 21), as bare
// descriptors: a connection taken is bound anew to its taker's executor.
// Newest last; Take hands out the newest, so the oldest age out.
class UpstreamPool {
 public:
  UpstreamPool() = default;
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;
  ~UpstreamPool() {
    for (const Idle& c : idle_) ::close(c.fd);
  }

  void Limit(int cap, absl::Duration timeout) {
    cap_ = static_cast<size_t>(std::max(cap, 0));
    timeout_ = Chrono(timeout);
  }
  bool enabled() const { return cap_ > 0; }

  // A connection idle for less than the timeout that shows no sign of
  // being closed (no end of stream, reset or unasked-for bytes), or -1.
  int Take() {
    SteadyMutexLock lock(&mu_);
    const SteadyTime now = SteadyClock::now();
    while (!idle_.empty()) {
      const Idle c = idle_.back();
      idle_.pop_back();
      if (now - c.since >= timeout_) {
        CloseAll();
        return -1;
      }
      if (LooksOpen(c.fd)) return c.fd;
      ::close(c.fd);
    }
    return -1;
  }

  // Keeps `fd` for the next request: the oldest goes past the cap.
  void Put(int fd) {
    SteadyMutexLock lock(&mu_);
    if (cap_ == 0) {
      ::close(fd);
      return;
    }
    if (idle_.size() >= cap_) {
      ::close(idle_.front().fd);
      idle_.pop_front();
    }
    idle_.push_back({fd, SteadyClock::now()});
  }

  // Closes the connections past the timeout.
  void Sweep() {
    SteadyMutexLock lock(&mu_);
    const SteadyTime now = SteadyClock::now();
    while (!idle_.empty() && now - idle_.front().since >= timeout_) {
      ::close(idle_.front().fd);
      idle_.pop_front();
    }
  }

  int64_t size() {
    SteadyMutexLock lock(&mu_);
    return static_cast<int64_t>(idle_.size());
  }

 private:
  struct Idle {
    int fd;
    SteadyTime since;
  };

  static bool LooksOpen(int fd) {
    char byte;
    const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  void CloseAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Idle& c : idle_) ::close(c.fd);
    idle_.clear();
  }

  size_t cap_ = 0;
  std::chrono::steady_clock::duration timeout_{};
  SteadyMutex mu_;
  std::deque<Idle> idle_ ABSL_GUARDED_BY(mu_);
};

// Whether a request may be sent again after a reused connection broke
// before any byte of its answer: the idempotent methods of RFC 9110
// section 9.2.2.
bool Idempotent(http::verb method) {
  switch (method) {
    case http::verb::get:
    case http::verb::head:
    case http::verb::options:
    case http::verb::trace:
    case http::verb::put:
    case http::verb::delete_:
      return true;
    default:
      return false;
  }
}

struct Shared {
  GatewayOptions options;
  GatewayConfig config;
  Calls* calls;
  HttpMetrics* metrics;
  tcp::endpoint upstream;
  UpstreamPool pool;
  std::atomic<int64_t> connections{0};

  // Calls to core started and not yet posted back, and requests taken
  // and not yet answered: Stop waits for them. Atomics, so that a request
  // takes no lock for them: each side writes its own flag or count before
  // it reads the other's (sequentially consistent), so either Leave sees
  // `stopping` or Stop sees the call counted, and either a count's last
  // decrement sees `waiting` and signals under `mu`, or Stop, which reads
  // the counts under `mu` before it waits, sees it.
  std::atomic<int64_t> outside{0};
  std::atomic<int64_t> requests{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> waiting{false};
  SteadyMutex mu;
  SteadyCondVar changed;
  // Last: destroyed first, with the handlers (and connections) it still
  // holds, while the members above are alive.
  net::io_context ioc;

  explicit Shared(int threads) : ioc(threads) {}

  // Counts a call to core about to start; false once stopping.
  bool Leave() {
    ++outside;
    if (!stopping.load()) return true;
    Returned();
    return false;
  }
  void Returned() {
    if (--outside == 0) Wake();
  }
  void Begun() { ++requests; }
  void Ended() {
    if (--requests == 0) Wake();
  }
  // Tells a waiting Stop that a count reached zero.
  void Wake() {
    if (!waiting.load()) return;
    SteadyMutexLock lock(&mu);
    changed.SignalAll();
  }
  // The results of docs/gateway.md#metrics, in the order of `series`.
  static constexpr const char* kResults[] = {
      "proxied", "executed", "replayed",  "conflict", "mismatch",
      "unknown", "rejected", "cancelled", "error"};
  static constexpr size_t kNumResults = std::size(kResults);
  // Per route (config.routes, then none) and result, the metrics' series,
  // found on first use.
  std::unique_ptr<std::atomic<HttpMetrics::RequestSeries*>[]> series;

  // Per route and Begin outcome, and per replay source, the core's
  // counters, found on first use.
  static constexpr size_t kNumOutcomes =
      static_cast<size_t>(Outcome::kExpired) + 1;
  static constexpr const char* kSources[] = {"memory", "redis", "postgres"};
  static constexpr size_t kNumSources = std::size(kSources);
  std::unique_ptr<std::atomic<HttpMetrics::Counter*>[]> begins;
  std::atomic<HttpMetrics::Counter*> replays[kNumSources] = {};

  // The metric in `slot` (a counter or a request series), found with
  // `find` the first time.
  template <typename Metric, typename Find>
  static Metric* Found(std::atomic<Metric*>& slot, Find find) {
    Metric* c = slot.load(std::memory_order_acquire);
    if (c == nullptr) {
      c = find();
      slot.store(c, std::memory_order_release);
    }
    return c;
  }

  // Counts a Begin through `route` (recorded requests have one).
  void CountBegin(const Route& route, Outcome outcome) {
    if (metrics == nullptr) return;
    const size_t at = static_cast<size_t>(&route - config.routes.data());
    const size_t o = static_cast<size_t>(outcome);
    if (at >= config.routes.size() || o >= kNumOutcomes) {
      metrics->BeginOutcome(route.name, outcome);
      return;
    }
    Found(begins[at * kNumOutcomes + o], [&] {
      return metrics->BeginOutcomeCounter(route.name, outcome);
    })->Increment();
  }

  void CountReplay(const char* source) {
    if (metrics == nullptr) return;
    size_t i = 0;
    while (i < kNumSources && std::strcmp(kSources[i], source) != 0) ++i;
    if (i == kNumSources) {
      metrics->Replay(source);
      return;
    }
    Found(replays[i], [&] {
      return metrics->ReplayCounter(source);
    })->Increment();
  }

  void Count(const Route* route, const char* result, SteadyTime start) {
    if (metrics == nullptr) return;
    size_t r = 0;
    while (r < kNumResults && std::strcmp(kResults[r], result) != 0) ++r;
    const size_t routes = config.routes.size();
    const size_t at = route != nullptr
                          ? static_cast<size_t>(route - config.routes.data())
                          : routes;
    if (r == kNumResults || at > routes) {
      metrics->HttpRequest(route != nullptr ? route->name : "-", result,
                           SteadySince(start));
      return;
    }
    Found(series[at * kNumResults + r], [&] {
      return metrics->HttpRequestSeries(route != nullptr ? route->name : "-",
                                        result);
    })->Add(SteadySince(start));
  }
};

// One exchange with the upstream: on a pooled keep-alive connection or a
// new one, write the request, read the answer, all within the timeout.
// Runs on the client connection's executor. What may be sent again after a
// failure is decision 21's: a request none of whose bytes left the
// gateway always (on a new connection); after that, only a request the
// caller says may repeat, only when the connection was reused, and only
// when it ended or was reset before any byte of the answer.
class UpstreamCall : public std::enable_shared_from_this<UpstreamCall> {
 public:
  enum class Stage {
    kNotSent,   // nothing reached the service
    kUnknown,   // the request may have reached it; no answer
    kAnswered,  // `answer` holds its answer
  };
  struct Result {
    Stage stage = Stage::kNotSent;
    bool timed_out = false;
    std::string error;
    Response answer;
  };
  using Done = std::function<void(Result)>;

  // `may_repeat`: the request may be sent twice (no record, idempotent
  // method).
  UpstreamCall(Shared& shared, net::any_io_executor executor, Request request,
               bool may_repeat, Done done)
      : shared_(shared),
        executor_(std::move(executor)),
        request_(std::move(request)),
        head_(request_.method() == http::verb::head),
        may_repeat_(may_repeat),
        done_(std::move(done)) {}

  void Run(absl::Duration timeout) {
    deadline_ = SteadyDeadline(timeout);
    const int fd = shared_.pool.Take();
    if (fd < 0) return Connect();
    stream_.emplace(executor_);
    beast::error_code ec;
    stream_->socket().assign(shared_.upstream.protocol(), fd, ec);
    if (ec) {
      ::close(fd);
      return Connect();
    }
    reused_ = true;
    Write();
  }

 private:
  void Connect() {
    reused_ = false;
    stream_.emplace(executor_);
    stream_->expires_at(deadline_);
    stream_->async_connect(shared_.upstream,
                           beast::bind_front_handler(&UpstreamCall::OnConnect,
                                                     shared_from_this()));
  }
  void OnConnect(beast::error_code ec) {
    if (ec) return Finish(Stage::kNotSent, ec);
    Write();
  }
  void Write() {
    stream_->expires_at(deadline_);
    parser_.emplace();
    parser_->body_limit(shared_.options.max_answer);
    parser_->header_limit(kMaxHeaderBytes);
    parser_->skip(head_);
    buffer_.clear();
    http::async_write(*stream_, request_,
                      beast::bind_front_handler(&UpstreamCall::OnWritten,
                                                shared_from_this()));
  }
  // A write that failed may have delivered all but the end of the request;
  // a service acting on a request it has not read whole is rare, but the
  // outcome is not known. One that failed before any byte sent nothing.
  void OnWritten(beast::error_code ec, size_t written) {
    if (ec && written == 0) {
      if (reused_ && ec != beast::error::timeout) return Connect();
      return Finish(Stage::kNotSent, ec);
    }
    if (ec) return Broken(ec);
    http::async_read(
        *stream_, buffer_, *parser_,
        beast::bind_front_handler(&UpstreamCall::OnRead, shared_from_this()));
  }
  void OnRead(beast::error_code ec, size_t) {
    if (ec) return Broken(ec);
    Result result;
    result.stage = Stage::kAnswered;
    const bool keep =
        parser_->keep_alive() && buffer_.size() == 0 && shared_.pool.enabled();
    result.answer = parser_->release();
    beast::error_code ignored;
    if (keep) {
      stream_->expires_never();
      const int fd = stream_->socket().release(ignored);
      if (!ignored) shared_.pool.Put(fd);
    } else {
      stream_->socket().shutdown(tcp::socket::shutdown_both, ignored);
    }
    stream_.reset();
    done_(std::move(result));
  }
  // The request was sent, whole or in part, and no answer came.
  void Broken(beast::error_code ec) {
    const bool hung_up =
        ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::broken_pipe;
    if (reused_ && may_repeat_ && hung_up && !parser_->got_some()) {
      return Connect();
    }
    Finish(Stage::kUnknown, ec);
  }
  void Finish(Stage stage, beast::error_code ec) {
    stream_.reset();
    Result result;
    result.stage = stage;
    result.timed_out = ec == beast::error::timeout;
    result.error = ec.message();
    done_(std::move(result));
  }

  Shared& shared_;
  net::any_io_executor executor_;
  std::optional<beast::tcp_stream> stream_;
  // Whether stream_ came from the pool.
  bool reused_ = false;
  SteadyTime deadline_;
  beast::flat_buffer buffer_;
  Request request_;
  bool head_;
  bool may_repeat_;
  std::optional<http::response_parser<http::string_body>> parser_;
  Done done_;
};

// Completes (`complete`) or fails `key`'s record, then `back`.
void SettleRecord(Calls& calls, const RecordKey& key, bool complete,
                  CompleteCommand done, FailCommand fail,
                  Calls::RecordFn back) {
  if (complete) {
    calls.Complete(key, std::move(done), std::move(back));
  } else {
    calls.Fail(key, std::move(fail), std::move(back));
  }
}

// A client connection. `Executor` is the io_context's own executor with one
// thread and a strand with more: a concrete type, so that no handler copies
// a type-erased executor.
template <typename Executor>
class Connection : public std::enable_shared_from_this<Connection<Executor>> {
 public:
  using Socket =
      typename tcp::socket::template rebind_executor<Executor>::other;

  Connection(Socket socket, Shared& shared)
      : shared_(shared), stream_(std::move(socket)) {}
  ~Connection() { --shared_.connections; }

  void Start() {
    beast::error_code ec;
    const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
    if (!ec) peer_ = peer.address().to_string();
    ReadHeader();
  }

 private:
  // What the request under way is.
  struct Current {
    SteadyTime start;
    const Route* route = nullptr;
    bool recorded = false;
    RecordKey key;
    std::string client_key;
    BeginCommand cmd;
    int64_t token = 0;
  };

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    // OnHeader sets the route's limit; until then Content-Length must not
    // fail the header. (Beast 1.74 compares lengths with an unset limit as
    // if it were below them: no boost::none here.)
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_.expires_after(Chrono(shared_.options.idle_timeout));
    http::async_read_header(
        stream_, buffer_, *parser_,
        beast::bind_front_handler(&Connection::OnHeader,
                                  this->shared_from_this()));
  }

  void OnHeader(beast::error_code ec, size_t) {
    if (ec) return ReadFailed(ec);
    shared_.Begun();
    call_ = Current{};
    call_.start = SteadyClock::now();
    const auto& header = parser_->get();
    version_ = header.version();
    // Only a chunked body has a trailer. Fields are nodes that stay put:
    // their addresses tell the header's from the trailer's.
    header_fields_.clear();
    if (parser_->chunked()) {
      for (const auto& field : header) header_fields_.push_back(&field);
    }
    absl::StatusOr<std::string> target = OriginForm(View(header.target()));
    if (!target.ok()) {
      Response res =
          Problem(ProblemKind::kBadRequest, 400, target.status().message(), {});
      res.keep_alive(false);
      return Write(std::move(res), "rejected");
    }
    target_ = *std::move(target);
    call_.route =
        MatchRoute(shared_.config, View(header.method_string()), target_);
    const bool has_key = header.find("idempotency-key") != header.end();
    if (call_.route != nullptr) {
      call_.recorded = call_.route->key == KeyRule::kRequired ||
                       (call_.route->key == KeyRule::kOptional && has_key);
    }
    const size_t limit =
        call_.recorded
            ? call_.route->max_body.value_or(shared_.options.max_body)
            : shared_.options.max_body;
    parser_->body_limit(limit);
    if (parser_->content_length() && *parser_->content_length() > limit) {
      return TooLarge(limit);
    }
    if (absl::EqualsIgnoreCase(View(header[http::field::expect]),
                               "100-continue")) {
      auto interim = std::make_shared<http::response<http::empty_body>>(
          http::status::continue_, header.version());
      http::async_write(stream_, *interim,
                        [self = this->shared_from_this(), interim](
                            beast::error_code wec, size_t) {
                          if (wec) {
                            self->EndRequest();
                            return self->Close();
                          }
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Connection::OnBody,
                                               this->shared_from_this()));
  }

  void OnBody(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit) {
      return TooLarge(parser_->get().body().size());
    }
    if (ec) {
      EndRequest();
      return ReadFailed(ec);
    }
    stream_.expires_never();
    request_ = parser_->release();
    DropTrailer();
    if (!call_.recorded) return Passthrough();
    Admit();
  }

  // Beast adds a chunked body's trailer fields to the header's. The route
  // was chosen on the header, and a trailer may not stand in for header
  // fields (RFC 9110 section 6.5.1): the key, scope and fingerprint come
  // from the header alone, and the trailer is not forwarded.
  void DropTrailer() {
    if (header_fields_.empty()) return;
    for (auto it = request_.begin(); it != request_.end();) {
      const bool header =
          std::find(header_fields_.begin(), header_fields_.end(), &*it) !=
          header_fields_.end();
      it = header ? std::next(it) : request_.erase(it);
    }
  }

  // A read that failed: closed, timed out, or not HTTP.
  void ReadFailed(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted ||
        ec == net::error::connection_reset) {
      return Close();
    }
    const bool header_too_large = ec == http::error::header_limit;
    Response res(header_too_large
                     ? http::status::request_header_fields_too_large
                     : http::status::bad_request,
                 11);
    res.set(http::field::content_type, "text/plain");
    res.body() = absl::StrCat("bad request: ", ec.message(), "\n");
    res.keep_alive(false);
    res.prepare_payload();
    Write(std::move(res), "rejected", /*counted=*/false);
  }

  void TooLarge(size_t size) {
    Response res =
        Problem(ProblemKind::kBodyTooLarge, 413,
                absl::StrCat("the body is larger than this route's limit of ",
                             call_.recorded ? call_.route->max_body.value_or(
                                                  shared_.options.max_body)
                                            : shared_.options.max_body,
                             " bytes (at least ", size, ")"));
    // The rest of the body is unread: the connection cannot carry on.
    res.keep_alive(false);
    Write(std::move(res), "rejected");
  }

  // The Idempotency-Key, the record's identity and fingerprint; then Begin.
  void Admit() {
    const Route& route = *call_.route;
    int keys = 0;
    absl::string_view value;
    for (const auto& field : request_) {
      if (absl::EqualsIgnoreCase(View(field.name_string()),
                                 "idempotency-key")) {
        ++keys;
        value = View(field.value());
      }
    }
    if (keys == 0) {
      return Answer(Problem(ProblemKind::kKeyMissing, 400,
                            "this route requires an Idempotency-Key header"),
                    "rejected");
    }
    if (keys > 1) {
      return Answer(Problem(ProblemKind::kKeyInvalid, 400,
                            "Idempotency-Key: more than one field"),
                    "rejected");
    }
    absl::StatusOr<std::string> key = ParseIdempotencyKey(value);
    if (!key.ok()) {
      return Answer(
          Problem(ProblemKind::kKeyInvalid, 400, key.status().message()),
          "rejected");
    }
    call_.client_key = *key;
    std::vector<std::string> scope;
    for (const std::string& name : shared_.config.scope_headers) {
      scope.emplace_back(View(request_[name]));
    }
    call_.key = {shared_.options.tenant, route.name, ScopedKey(scope, *key)};
    std::vector<std::pair<std::string, std::string>> headers;
    for (const std::string& name : route.fingerprint_headers) {
      headers.emplace_back(name, std::string(View(request_[name])));
    }
    call_.cmd.request_hash = Fingerprint(View(request_.method_string()),
                                         target_, request_.body(), headers);
    call_.cmd.lease = LeaseOf(route, shared_.options.upstream_timeout);
    if (!shared_.Leave()) return Stopping();
    if (route.wait > absl::ZeroDuration()) {
      wait_ = shared_.calls->NewWait(SteadyDeadline(route.wait));
      WatchHangUp();
    }
    // Inline when the caches answered on this strand's thread; posted to
    // the strand from any other.
    shared_.calls->Begin(
        call_.key, call_.cmd, wait_,
        [self = this->shared_from_this()](absl::StatusOr<BeginResult> result) {
          net::dispatch(self->stream_.get_executor(),
                        [self, result = std::move(result)]() mutable {
                          self->OnBegin(std::move(result));
                        });
          self->shared_.Returned();
        });
  }

  // While a Begin may wait, the client's hang-up (the socket reads as
  // closed) cancels it, so that it stops waiting at once. Bytes of a
  // pipelined request end the watch: they are read after the answer.
  void WatchHangUp() {
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        [self = this->shared_from_this(), wait = wait_](beast::error_code ec) {
          if (ec) return;
          char byte;
          const ssize_t n = recv(self->stream_.socket().native_handle(), &byte,
                                 1, MSG_PEEK | MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                         errno != EINTR)) {
            self->shared_.calls->Cancel(wait);
          } else if (n < 0) {
            self->WatchHangUp();
          }
        });
  }

  void OnBegin(absl::StatusOr<BeginResult> result) {
    if (wait_ != nullptr) {
      // Ends the hang-up watch; the socket has no other operation now.
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      wait_.reset();
      if (result.status().code() == absl::StatusCode::kCancelled) {
        shared_.Count(call_.route, "cancelled", call_.start);
        EndRequest();
        return Close();
      }
    }
    if (!result.ok()) return StoreFailed(result.status());
    shared_.CountBegin(*call_.route, result->outcome);
    switch (result->outcome) {
      case Outcome::kAcquired:
        call_.token = result->record->fencing_token;
        return Execute();
      case Outcome::kCompleted:
      case Outcome::kFailed:
        shared_.CountReplay(result->cached ? result->cache_source : "postgres");
        return Replay(*result->record);
      case Outcome::kInProgress: {
        const int64_t seconds =
            std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(
                                     result->retry_after, absl::Seconds(1))));
        Response res = Problem(
            ProblemKind::kInProgress, 409,
            "the first request with this key is still running; retry after "
            "Retry-After seconds");
        res.set(http::field::retry_after, std::to_string(seconds));
        return Answer(std::move(res), "conflict");
      }
      case Outcome::kMismatch:
        return Answer(Problem(ProblemKind::kKeyReused, 422,
                              "this key was used with a different request "
                              "(method, target, body or fingerprint headers)"),
                      "mismatch");
      case Outcome::kUnknown:
        return Answer(
            Problem(ProblemKind::kOutcomeUnknown, 409,
                    "an earlier attempt with this key may have run and its "
                    "outcome is unknown; it will not run again until an "
                    "operator or the reconciler settles it"),
            "unknown");
      case Outcome::kExpired:
        return Answer(Problem(ProblemKind::kKeyExpired, 422,
                              "this key was used and its result is past "
                              "retention; use a new key"),
                      "mismatch");
    }
  }

  void StoreFailed(const absl::Status& status) {
    switch (status.code()) {
      case absl::StatusCode::kResourceExhausted: {
        Response res = Problem(ProblemKind::kOverloaded, 429, status.message());
        res.set(http::field::retry_after, "1");
        return Answer(std::move(res), "rejected");
      }
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kAborted:
      case absl::StatusCode::kCancelled: {
        Response res = Problem(
            ProblemKind::kUnavailable, 503,
            "the idempotency records cannot be reached; nothing was sent "
            "to the service");
        res.set(http::field::retry_after, "1");
        return Answer(std::move(res), "error");
      }
      default:
        Log(LogLevel::kError, "gateway: Begin failed",
            {{"operation", call_.key.operation},
             {"key", call_.key.key},
             {"error", status.ToString()}});
        return Answer(Problem(ProblemKind::kInternal, 500,
                              "internal error; nothing was sent to the "
                              "service"),
                      "error");
    }
  }

  // The request as the service gets it: end-to-end fields only.
  Request Upstream() const {
    Request out;
    out.version(11);
    out.method_string(request_.method_string());
    out.target(target_);
    CopyEndToEnd(request_.base(), out.base());
    // The service sees the gateway's address; these say whose request it
    // is (appended: only the last entry is the gateway's own word).
    if (!peer_.empty()) {
      const auto forwarded = out.find("x-forwarded-for");
      const std::string chain =
          forwarded == out.end()
              ? peer_
              : absl::StrCat(View(forwarded->value()), ", ", peer_);
      out.set("X-Forwarded-For", chain);
    }
    if (out.find("x-forwarded-proto") == out.end()) {
      out.set("X-Forwarded-Proto", "http");
    }
    out.body() = request_.body();
    out.keep_alive(shared_.pool.enabled());
    out.prepare_payload();
    return out;
  }

  void Passthrough() {
    Exchange(Upstream(),
             [self = this->shared_from_this()](UpstreamCall::Result r) {
               if (r.stage != UpstreamCall::Stage::kAnswered) {
                 self->CountUpstreamError(r);
                 return self->Answer(
                     self->Problem(
                         r.stage == UpstreamCall::Stage::kNotSent
                             ? ProblemKind::kUpstreamUnavailable
                             : ProblemKind::kOutcomeUnknown,
                         r.timed_out ? 504 : 502,
                         absl::StrCat("the service did not answer: ", r.error)),
                     "error");
               }
               self->Relay(std::move(r.answer), "proxied");
             });
  }

  // The acquired request goes to the service; its answer settles the record.
  void Execute() {
    Exchange(Upstream(),
             [self = this->shared_from_this()](UpstreamCall::Result r) {
               self->OnExecuted(std::move(r));
             });
  }

  void Exchange(Request request, UpstreamCall::Done done) {
    const absl::Duration timeout =
        call_.route != nullptr && call_.route->timeout
            ? *call_.route->timeout
            : shared_.options.upstream_timeout;
    const bool may_repeat = !call_.recorded && Idempotent(request.method());
    std::make_shared<UpstreamCall>(shared_, stream_.get_executor(),
                                   std::move(request), may_repeat,
                                   std::move(done))
        ->Run(timeout);
  }

  void CountUpstreamError(const UpstreamCall::Result& r) {
    if (shared_.metrics == nullptr) return;
    shared_.metrics->HttpUpstreamError(r.stage == UpstreamCall::Stage::kNotSent
                                           ? "not_sent"
                                       : r.timed_out ? "timeout"
                                                     : "broken");
  }

  void OnExecuted(UpstreamCall::Result r) {
    switch (r.stage) {
      case UpstreamCall::Stage::kNotSent: {
        CountUpstreamError(r);
        Snapshot error;
        error.code = 502;
        error.content_type = "text/plain";
        error.body = absl::StrCat("upstream unreachable: ", r.error);
        FailCommand fail{call_.token, std::move(error), /*retryable=*/true};
        return Settle(
            /*complete=*/false, {}, std::move(fail),
            [self = this->shared_from_this(), r = std::move(r)] {
              self->Answer(
                  self->Problem(
                      ProblemKind::kUpstreamUnavailable, 502,
                      absl::StrCat("the service could not be "
                                   "reached (",
                                   r.error, "); nothing was sent; retry"),
                      self->call_.client_key),
                  "error");
            });
      }
      case UpstreamCall::Stage::kUnknown:
        CountUpstreamError(r);
        Log(LogLevel::kWarn,
            "gateway: the service did not answer a request it may have run; "
            "the record turns UNKNOWN when its lease runs out",
            {{"operation", call_.key.operation},
             {"key", call_.key.key},
             {"error", r.error}});
        return Answer(
            Problem(ProblemKind::kOutcomeUnknown, r.timed_out ? 504 : 502,
                    absl::StrCat("the service may have run this request but "
                                 "did not answer (",
                                 r.error,
                                 "); it will not run again under this key "
                                 "until an operator or the reconciler "
                                 "settles it"),
                    call_.client_key),
            "unknown");
      case UpstreamCall::Stage::kAnswered:
        break;
    }
    Snapshot snapshot = SnapshotOf(r.answer);
    absl::Status storable = Storable(snapshot);
    if (!storable.ok()) {
      Log(LogLevel::kWarn,
          "gateway: the service's answer cannot be recorded; relayed, and "
          "the record turns UNKNOWN when its lease runs out",
          {{"operation", call_.key.operation},
           {"key", call_.key.key},
           {"error", std::string(storable.message())}});
      return Relay(std::move(r.answer), "unknown");
    }
    auto answer = std::make_shared<Response>(std::move(r.answer));
    auto relay = [self = this->shared_from_this(), answer] {
      self->Relay(std::move(*answer), "executed");
    };
    if (call_.route->Retries(static_cast<int>(answer->result_int()))) {
      return Settle(false, {},
                    FailCommand{call_.token, std::move(snapshot), true},
                    std::move(relay));
    }
    Settle(true, CompleteCommand{call_.token, std::move(snapshot)}, {},
           std::move(relay));
  }

  // Completes or fails the record, then `then` on the strand whatever the
  // store said (the answer is the service's either way; a record left
  // PROCESSING turns UNKNOWN at the lease's end).
  void Settle(bool complete, CompleteCommand done, FailCommand fail,
              std::function<void()> then) {
    if (!shared_.Leave()) return then();
    auto self = this->shared_from_this();
    auto back = [self,
                 then = std::move(then)](const absl::StatusOr<Record>& r) {
      if (!r.ok()) {
        Log(LogLevel::kWarn,
            "gateway: the service's answer was not recorded; the record "
            "turns UNKNOWN when its lease runs out",
            {{"operation", self->call_.key.operation},
             {"key", self->call_.key.key},
             {"error", r.status().ToString()}});
      }
      net::dispatch(self->stream_.get_executor(), then);
      self->shared_.Returned();
    };
    SettleRecord(*shared_.calls, call_.key, complete, std::move(done),
                 std::move(fail), std::move(back));
  }

  // The recorded part of the service's answer: status, Content-Type, the
  // route's headers (lower-case, repeats joined with ", ") and the body.
  Snapshot SnapshotOf(const Response& answer) const {
    Snapshot s;
    s.code = static_cast<int32_t>(answer.result_int());
    s.body = answer.body();
    const std::vector<std::string> named = ConnectionOptions(answer.base());
    for (const auto& field : answer) {
      const std::string name = Lower(field.name_string());
      if (name == "content-type") {
        s.content_type = std::string(View(field.value()));
        continue;
      }
      if (!call_.route->Records(name) ||
          std::find(named.begin(), named.end(), name) != named.end()) {
        continue;
      }
      std::string& value = s.headers[name];
      absl::StrAppend(&value, value.empty() ? "" : ", ", View(field.value()));
    }
    return s;
  }

  absl::Status Storable(const Snapshot& s) const {
    ::idempotency::v1::Snapshot pb;
    pb.set_code(s.code);
    pb.set_body(s.body);
    pb.set_content_type(s.content_type);
    for (const auto& [name, value] : s.headers) {
      (*pb.mutable_headers())[name] = value;
    }
    return CheckSnapshot(pb, "answer", shared_.options.max_snapshot_bytes);
  }

  // A replay is written from bytes serialized straight from the record
  // into the connection's buffer (AppendReplay), the same bytes as the
  // answer built field by field below.
  void Replay(const Record& record) {
    replay_.clear();
    if (!AppendReplay(record, version_, request_.keep_alive(), &replay_)) {
      return ReplayFields(record);
    }
    shared_.Count(call_.route, "replayed", call_.start);
    const bool keep_alive = request_.keep_alive();
    // Most replays fit the socket's send buffer: sent at once, with no
    // timer armed and no handler to run. The rest is written as any
    // answer, within the idle timeout.
    const ssize_t sent =
        ::send(stream_.socket().native_handle(), replay_.data(), replay_.size(),
               MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent == static_cast<ssize_t>(replay_.size())) {
      return Replayed({}, keep_alive);
    }
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return Replayed(beast::error_code(errno, beast::system_category()),
                      keep_alive);
    }
    const size_t done = sent > 0 ? static_cast<size_t>(sent) : 0;
    stream_.expires_after(Chrono(shared_.options.idle_timeout));
    net::async_write(
        stream_, net::buffer(replay_.data() + done, replay_.size() - done),
        [self = this->shared_from_this(), keep_alive](
            beast::error_code ec, size_t) { self->Replayed(ec, keep_alive); });
  }

  // The replay was written (or failed): the next request, or the end.
  void Replayed(beast::error_code ec, bool keep_alive) {
    EndRequest();
    if (replay_.capacity() > kKeptReplayBytes) std::string().swap(replay_);
    if (ec || !keep_alive || Stopped()) return Close();
    ReadHeader();
  }

  // A record with a field name not in lower case (made outside the
  // gateway): Beast's fields spell the answer.
  void ReplayFields(const Record& record) {
    Answer(ReplayResponse(record, version_), "replayed");
  }

  // The service's answer to the client: end-to-end fields, our framing.
  void Relay(Response answer, const char* result) {
    Response res(answer.result(), version_);
    res.reason(answer.reason());
    CopyEndToEnd(answer.base(), res.base());
    const bool head = request_.method() == http::verb::head;
    if (head) {
      // No body came; the service's length stands.
      const auto length = answer.find(http::field::content_length);
      if (length != answer.end()) res.set(length->name(), length->value());
    }
    res.body() = std::move(answer.body());
    Answer(std::move(res), result, /*prepare=*/!head);
  }

  Response Problem(ProblemKind kind, int status,
                   absl::string_view detail) const {
    return Problem(kind, status, detail, call_.client_key);
  }
  Response Problem(ProblemKind kind, int status, absl::string_view detail,
                   absl::string_view key) const {
    Response res(static_cast<http::status>(status), version_);
    res.set(http::field::content_type, "application/problem+json");
    res.body() = ProblemBody(kind, status, detail, key);
    return res;
  }

  void Stopping() {
    Response res = Problem(ProblemKind::kUnavailable, 503,
                           "the gateway is shutting down; nothing was sent "
                           "to the service");
    res.set(http::field::retry_after, "1");
    res.keep_alive(false);
    Write(std::move(res), "rejected");
  }

  // Answers the request read whole: keep-alive as the client asked.
  void Answer(Response res, const char* result, bool prepare = true) {
    res.keep_alive(request_.keep_alive());
    // These carry no body (RFC 9110 sections 15.2, 15.3.5, 15.4.5).
    const unsigned status = res.result_int();
    if (status < 200 || status == 204 || status == 304) res.body().clear();
    if (prepare) res.prepare_payload();
    Write(std::move(res), result);
  }

  void Write(Response res, const char* result, bool counted = true) {
    if (counted) shared_.Count(call_.route, result, call_.start);
    auto out = std::make_shared<Response>(std::move(res));
    stream_.expires_after(Chrono(shared_.options.idle_timeout));
    http::async_write(stream_, *out,
                      [self = this->shared_from_this(), out, counted](
                          beast::error_code ec, size_t) {
                        if (counted) self->EndRequest();
                        if (ec || !out->keep_alive() || self->Stopped()) {
                          return self->Close();
                        }
                        self->ReadHeader();
                      });
  }

  bool Stopped() { return shared_.stopping.load(); }

  void EndRequest() { shared_.Ended(); }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  Shared& shared_;
  beast::basic_stream<tcp, Executor> stream_;
  // The client's address, for X-Forwarded-For.
  std::string peer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Request request_;
  unsigned version_ = 11;
  // The request's target in origin form, and the fields of its header
  // when a trailer may follow (the rest came in the trailer).
  std::string target_;
  std::vector<const void*> header_fields_;
  Current call_;
  // The bytes of the replay being written (Replay).
  std::string replay_;
  // Set while a Begin through a route with `wait` is under way.
  std::shared_ptr<Calls::Wait> wait_;
};

}  // namespace

struct Gateway::Impl {
  explicit Impl(int threads)
      : shared(threads),
        acceptor(net::make_strand(shared.ioc)),
        sweeper(shared.ioc) {}

  // Closes idle upstream connections past their timeout, also when no
  // request comes to take them.
  void Sweep() {
    sweeper.expires_after(
        Chrono(std::max(shared.options.upstream_keepalive_timeout / 2,
                        absl::Milliseconds(10))));
    sweeper.async_wait([this](beast::error_code ec) {
      if (ec) return;
      shared.pool.Sweep();
      Sweep();
    });
  }

  using IoExecutor = net::io_context::executor_type;

  template <typename Executor>
  auto Accepted() {
    return [this](beast::error_code ec,
                  typename Connection<Executor>::Socket socket) {
      if (ec == net::error::operation_aborted) return;
      if (!ec) {
        if (shared.connections.load() >= shared.options.max_connections) {
          if (shared.metrics != nullptr) {
            shared.metrics->Refused("http_connections");
          }
          beast::error_code ignored;
          socket.close(ignored);
        } else {
          ++shared.connections;
          std::make_shared<Connection<Executor>>(std::move(socket), shared)
              ->Start();
        }
      }
      Accept();
    };
  }

  void Accept() {
    // A strand per connection only when several threads run handlers:
    // with one, the io_context's own executor orders them for free.
    if (shared.options.threads > 1) {
      acceptor.async_accept(net::make_strand(shared.ioc),
                            Accepted<net::strand<IoExecutor>>());
    } else {
      acceptor.async_accept(shared.ioc.get_executor(), Accepted<IoExecutor>());
    }
  }

  Shared shared;
  tcp::acceptor acceptor;
  net::steady_timer sweeper;
  int port = 0;
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
};

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Start(GatewayOptions options,
                                                        GatewayConfig config,
                                                        Calls* calls,
                                                        HttpMetrics* metrics) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError("--http-threads: must be positive");
  }
  auto impl = std::make_unique<Impl>(options.threads);
  Shared& shared = impl->shared;
  absl::string_view upstream = options.upstream;
  if (!absl::ConsumePrefix(&upstream, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-upstream: want http://host:port, not \"",
                     options.upstream, "\""));
  }
  absl::ConsumeSuffix(&upstream, "/");
  if (upstream.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "--http-upstream: a path is not supported; the request's own is "
        "sent");
  }
  std::string hostport(upstream);
  if (hostport.find(':') == std::string::npos ||
      absl::EndsWith(hostport, "]")) {
    hostport += ":80";
  }
  absl::StatusOr<tcp::endpoint> to =
      Resolve(shared.ioc, "http-upstream", hostport, false);
  if (!to.ok()) return to.status();
  absl::StatusOr<tcp::endpoint> at =
      Resolve(shared.ioc, "http-listen", options.listen, true);
  if (!at.ok()) return at.status();
  shared.upstream = *to;
  shared.options = std::move(options);
  shared.config = std::move(config);
  shared.calls = calls;
  shared.metrics = metrics;
  shared.series = std::make_unique<std::atomic<HttpMetrics::RequestSeries*>[]>(
      (shared.config.routes.size() + 1) * Shared::kNumResults);
  shared.begins = std::make_unique<std::atomic<HttpMetrics::Counter*>[]>(
      shared.config.routes.size() * Shared::kNumOutcomes);
  shared.pool.Limit(shared.options.upstream_keepalive,
                    shared.options.upstream_keepalive_timeout);
  beast::error_code ec;
  impl->acceptor.open(at->protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(*at, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--http-listen: cannot listen on ", shared.options.listen,
                     ": ", ec.message()));
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  if (shared.pool.enabled()) impl->Sweep();
  for (int i = 0; i < shared.options.threads; ++i) {
    impl->threads.emplace_back([ioc = &shared.ioc] {
      NameThisThread(thread_names::kHttp);
      ioc->run();
    });
  }
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Gateway::~Gateway() { Stop(absl::ZeroDuration()); }

int Gateway::port() const { return impl_->port; }

int64_t Gateway::connections() const {
  return impl_->shared.connections.load();
}

int64_t Gateway::upstream_idle() const { return impl_->shared.pool.size(); }

void Gateway::Stop(absl::Duration grace) {
  if (impl_->stopped.exchange(true)) return;
  Shared& shared = impl_->shared;
  net::post(impl_->acceptor.get_executor(), [impl = impl_.get()] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
  });
  shared.waiting = true;
  SteadyMutexLock lock(&shared.mu);
  shared.changed.WaitFor(&lock, grace,
                         [&shared] { return shared.requests.load() == 0; });
  shared.stopping = true;
  // Core's completions post to connections on this loop: it runs
  // until the last has come back.
  while (shared.outside.load() > 0) {
    shared.changed.WaitFor(&lock, absl::Seconds(1),
                           [&shared] { return shared.outside.load() == 0; });
  }
  lock.Unlock();
  shared.ioc.stop();
  for (std::thread& t : impl_->threads) t.join();
}

}  // namespace idem::gateway
