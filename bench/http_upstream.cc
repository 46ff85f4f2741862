// idem-bench-http-upstream: the trivial service behind the HTTP gateway in
// bench/run.py's gateway row. One thread, HTTP/1.1 with keep-alive
// (Boost.Beast, as the gateway): every POST gets the same small 201 JSON
// answer, every GET that body with 200 (the pass-through contenders),
// anything else 405. Driven by h2load --h1 directly, it gives the
// rate of a service that does nothing; through the gateway, with one
// Idempotency-Key, every request is a replay the service never sees, so
// the gateway's rate divided by this one is what a replay costs against
// the service's own answer.
//
//   idem-bench-http-upstream --listen 127.0.0.1:0  # prints "listening on ADDR"
//
// Exits 0 on SIGTERM or SIGINT, printing "requests N" (the requests it
// answered).
#include <CLI/CLI.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

namespace idem::bench {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr char kBody[] = R"({"id":"pay_1","status":"created","amount":10})";

// One client connection: read a request, answer it, repeat while the
// client keeps the connection alive.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, uint64_t* served)
      : stream_(std::move(socket)), served_(served) {}

  void Read() {
    request_ = {};
    http::async_read(
        stream_, buffer_, request_,
        beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

 private:
  void OnRead(beast::error_code ec, size_t) {
    if (ec) return Close();
    ++*served_;
    const bool post = request_.method() == http::verb::post;
    const bool get = request_.method() == http::verb::get;
    response_ = {};
    response_.version(request_.version());
    response_.keep_alive(request_.keep_alive());
    response_.result(post  ? http::status::created
                     : get ? http::status::ok
                           : http::status::method_not_allowed);
    if (post || get) {
      response_.set(http::field::content_type, "application/json");
      response_.body() = kBody;
    }
    response_.prepare_payload();
    http::async_write(
        stream_, response_,
        beast::bind_front_handler(&Session::OnWrite, shared_from_this()));
  }

  void OnWrite(beast::error_code ec, size_t) {
    if (ec || !response_.keep_alive()) return Close();
    Read();
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
  uint64_t* served_;
};

void Accept(tcp::acceptor& acceptor, uint64_t* served) {
  acceptor.async_accept(
      [&acceptor, served](beast::error_code ec, tcp::socket socket) {
        if (!ec) {
          socket.set_option(tcp::no_delay(true), ec);
          std::make_shared<Session>(std::move(socket), served)->Read();
        }
        if (acceptor.is_open()) Accept(acceptor, served);
      });
}

int Main(int argc, char** argv) {
  CLI::App app{"A trivial HTTP/1.1 service: 201 and a small JSON to any POST"};
  std::string listen = "127.0.0.1:0";
  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const size_t colon = listen.rfind(':');
  beast::error_code ec;
  const net::ip::address host =
      net::ip::make_address(listen.substr(0, colon), ec);
  int port = -1;
  if (colon != std::string::npos && !ec) {
    try {
      port = std::stoi(listen.substr(colon + 1));
    } catch (const std::exception&) {
      port = -1;
    }
  }
  if (port < 0 || port > 65535) {
    std::cerr << "idem-bench-http-upstream: --listen wants IP:PORT, not "
              << listen << "\n";
    return 2;
  }
  net::io_context ioc(1);
  tcp::acceptor acceptor(ioc);
  const tcp::endpoint endpoint(host, static_cast<uint16_t>(port));
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    std::cerr << "idem-bench-http-upstream: cannot listen on " << listen << ": "
              << ec.message() << "\n";
    return 2;
  }
  std::cout << "listening on " << host.to_string() << ":"
            << acceptor.local_endpoint().port() << std::endl;

  uint64_t served = 0;
  Accept(acceptor, &served);
  net::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&ioc](beast::error_code, int) { ioc.stop(); });
  ioc.run();
  std::cout << "requests " << served << std::endl;
  return 0;
}

}  // namespace
}  // namespace idem::bench

int main(int argc, char** argv) { return idem::bench::Main(argc, argv); }
