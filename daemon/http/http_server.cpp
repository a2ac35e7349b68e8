// HttpServer: the listener, the io threads and the connection registry (http_server.h).
#include "daemon/http/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <charconv>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/http/http_connection.h"

namespace kestrel::daemon::http {

namespace net = boost::asio;
using tcp = net::ip::tcp;

Expected<std::pair<std::string, uint16_t>> split_host_port(const std::string& address) {
  auto bad = [&] {
    return make_error(
        ErrorCode::kInvalidArgument,
        "HTTP address must be HOST:PORT (e.g. \"127.0.0.1:8080\" or \"[::1]:8080\"), got \"" + address + "\"");
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return bad();
  std::string host = address.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad();
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = address.substr(colon + 1);
  unsigned port = 0;
  const auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port > 65535) return bad();
  return std::make_pair(std::move(host), static_cast<uint16_t>(port));
}

class HttpServer::Impl {
 public:
  explicit Impl(const HttpServerOptions& options)
      : options_(options),
        api_(ApiOptions{options.api_key, options.max_concurrent_requests, RequestLimits{}, options.max_response_bytes}),
        acceptor_(net::make_strand(ioc_)),
        work_(net::make_work_guard(ioc_)),
        retry_(acceptor_.get_executor()) {}

  Status bind() {
    KESTREL_TRY_ASSIGN(auto host_port, split_host_port(options_.address));
    boost::system::error_code ec;
    tcp::resolver resolver(ioc_);
    const auto endpoints =
        resolver.resolve(host_port.first, std::to_string(host_port.second), tcp::resolver::numeric_service, ec);
    if (ec || endpoints.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "HTTP address " + options_.address + ": cannot resolve '" +
                                                         host_port.first + "': " + ec.message());
    }
    const tcp::endpoint endpoint = *endpoints.begin();
    auto fail = [&](const char* what) {
      return make_error(ErrorCode::kUnavailable, "HTTP server cannot " + std::string(what) + " " + options_.address +
                                                     ": " + ec.message() + " (address in use or not permitted?)");
    };
    if (acceptor_.open(endpoint.protocol(), ec)) return fail("open a socket for");
    if (acceptor_.set_option(net::socket_base::reuse_address(true), ec)) return fail("configure the socket for");
    if (acceptor_.bind(endpoint, ec)) return fail("bind");
    if (acceptor_.listen(net::socket_base::max_listen_connections, ec)) return fail("listen on");
    port_ = acceptor_.local_endpoint(ec).port();
    return ok_status();
  }

  void run() {
    net::post(acceptor_.get_executor(), [this] { accept(); });
    const int n = std::max(options_.io_threads, 1);
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { ioc_.run(); });
  }

  void stop(Clock::time_point deadline) {
    {
      std::lock_guard lock(stop_mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    net::post(acceptor_.get_executor(), [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      retry_.cancel();
    });
    for (const auto& c : live_connections()) c->close_when_idle();
    while (Clock::now() < deadline && api_.counters().connections.load() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (const auto& c : live_connections()) c->close_now();
    work_.reset();
    const auto hard = Clock::now() + std::chrono::seconds(2);
    while (Clock::now() < hard && api_.counters().connections.load() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    spdlog::info("HTTP server stopped");
  }

  OpenAiApi& api() { return api_; }
  int port() const { return port_; }

 private:
  std::vector<std::shared_ptr<HttpConnection>> live_connections() {
    std::lock_guard lock(connections_mu_);
    std::vector<std::shared_ptr<HttpConnection>> live;
    for (const auto& w : connections_) {
      if (auto c = w.lock()) live.push_back(std::move(c));
    }
    return live;
  }

  void accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
      if (ec) {
        // Out of file descriptors and the like: wait a little rather than spin on the error.
        spdlog::warn("http: accept failed: {}", ec.message());
        retry_.expires_after(std::chrono::milliseconds(100));
        retry_.async_wait([this](boost::system::error_code wait_ec) {
          if (!wait_ec) accept();
        });
        return;
      }
      const bool over = api_.counters().connections.load() >= static_cast<int64_t>(options_.max_connections);
      auto connection = std::make_shared<HttpConnection>(
          std::move(socket), api_,
          ConnectionLimits{options_.max_body_bytes, options_.read_timeout, options_.write_timeout});
      if (over) {
        Response r;
        r.status = 503;
        r.body = error_body(ApiError{503,
                                     "too many open connections: " + std::to_string(options_.max_connections) +
                                         " (http max_connections); retry later",
                                     "service_unavailable_error", "", "too_many_connections"});
        connection->refuse(std::move(r));
      } else {
        remember(connection);
        connection->start();
      }
      accept();
    });
  }

  void remember(const std::shared_ptr<HttpConnection>& c) {
    std::lock_guard lock(connections_mu_);
    std::erase_if(connections_, [](const std::weak_ptr<HttpConnection>& w) { return w.expired(); });
    connections_.push_back(c);
  }

  HttpServerOptions options_;
  OpenAiApi api_;  // before ioc_: handlers still queued when ioc_ is destroyed hold connections that use it
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  net::steady_timer retry_;
  int port_ = 0;
  std::vector<std::thread> threads_;
  std::mutex connections_mu_;
  std::vector<std::weak_ptr<HttpConnection>> connections_;
  std::mutex stop_mu_;
  bool stopped_ = false;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  if (impl_) impl_->stop(Clock::now());
}

Expected<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options) {
  if (options.max_body_bytes == 0 || options.max_concurrent_requests == 0 || options.max_connections == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "HTTP limits must be >= 1 (max_body_bytes, max_concurrent_requests, max_connections)");
  }
  auto impl = std::make_unique<Impl>(options);
  KESTREL_TRY(impl->bind());
  impl->run();
  spdlog::info("HTTP listening on {} (port {}){}", options.address, impl->port(),
               options.api_key.empty() ? "" : ", API key required on /v1/");
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::attach(Service& service, ServedModel model) { impl_->api().attach(service, std::move(model)); }

int HttpServer::port() const { return impl_->port(); }

void HttpServer::stop(Clock::time_point deadline) { impl_->stop(deadline); }

}  // namespace kestrel::daemon::http
