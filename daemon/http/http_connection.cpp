// HttpConnection: one client connection's state machine on Boost.Beast (http_connection.h).
#include "daemon/http/http_connection.h"

#include <spdlog/spdlog.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <cstdio>
#include <utility>

namespace kestrel::daemon::http {
namespace {

namespace beast = boost::beast;
namespace net = boost::asio;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr std::chrono::seconds kDrainTime{2};

std::string reason_phrase(int status) {
  if (status == 499) return "Client Closed Request";  // nginx's; not in the registry
  const beast::string_view r = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return std::string(r.data(), r.size());
}

Response error_page(int status, const std::string& message, const char* code) {
  Response r;
  r.status = status;
  r.body = error_body(ApiError{status, message, "invalid_request_error", "", code});
  return r;
}

}  // namespace

HttpConnection::HttpConnection(tcp::socket socket, OpenAiApi& api, const ConnectionLimits& limits)
    : stream_(std::move(socket)), api_(api), limits_(limits) {
  api_.counters().connections.fetch_add(1, std::memory_order_relaxed);
}

HttpConnection::~HttpConnection() { api_.counters().connections.fetch_sub(1, std::memory_order_relaxed); }

void HttpConnection::start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
}

void HttpConnection::refuse(Response response) {
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), response = std::move(response)]() mutable {
    self->phase_ = Phase::kHandling;
    self->keep_alive_ = false;
    self->respond(std::move(response));
  });
}

void HttpConnection::close_when_idle() {
  net::post(stream_.get_executor(), [self = shared_from_this()] {
    if (self->phase_ == Phase::kReading) return self->shut();
    self->close_after_answer_ = true;
    self->keep_alive_ = false;
  });
}

void HttpConnection::close_now() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->shut(); });
}

void HttpConnection::post(std::function<void()> work) {
  net::post(stream_.get_executor(), [self = shared_from_this(), work = std::move(work)] { work(); });
}

// Reading -------------------------------------------------------------------------------------------------------

void HttpConnection::read_header() {
  phase_ = Phase::kReading;
  parser_.emplace();
  parser_->header_limit(kMaxHeaderBytes);
  parser_->body_limit(limits_.max_body_bytes);
  stream_.expires_after(limits_.read_timeout);
  bhttp::async_read_header(stream_, buffer_, *parser_,
                           [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void HttpConnection::on_header(beast::error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec) return reject_request(ec);
  const auto& req = parser_->get();
  if (beast::iequals(req[bhttp::field::expect], "100-continue")) {
    queue("HTTP/1.1 100 Continue\r\n\r\n");  // the client waits for this before it sends the body
  }
  read_body();
}

void HttpConnection::read_body() {
  stream_.expires_after(limits_.read_timeout);
  bhttp::async_read(stream_, buffer_, *parser_,
                    [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
}

void HttpConnection::on_body(beast::error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec) return reject_request(ec);
  dispatch();
}

void HttpConnection::reject_request(beast::error_code ec) {
  if (ec == net::error::operation_aborted) return;
  Response r;
  if (ec == bhttp::error::body_limit) {
    // A Content-Length over the limit is refused as the header ends, before is_header_done(), so the parser's
    // content_length() may not be asked (Beast asserts it); the field itself is there, checked to be a number.
    const beast::string_view length = parser_->get()[bhttp::field::content_length];
    r = error_page(413,
                   "the request body " +
                       (length.empty() ? std::string("is larger than the limit")
                                       : "is " + std::string(length.data(), length.size()) + " bytes") +
                       "; kestreld accepts at most " + std::to_string(limits_.max_body_bytes) +
                       " bytes (http max_body_bytes)",
                   "request_too_large");
  } else if (ec == bhttp::error::header_limit) {
    r = error_page(431, "the request header is over " + std::to_string(kMaxHeaderBytes) + " bytes", "header_too_large");
  } else if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
             ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
    r = error_page(400, "malformed HTTP request: " + ec.message(), "bad_request");
  } else {
    // The client closed (between requests or mid-request), the read timed out, or the socket failed.
    spdlog::debug("http: connection closed while reading a request: {}", ec.message());
    return shut();
  }
  phase_ = Phase::kHandling;
  keep_alive_ = false;
  respond(std::move(r));
}

void HttpConnection::dispatch() {
  auto& req = parser_->get();
  keep_alive_ = req.keep_alive();
  http10_ = req.version() < 11;
  HttpRequest request;
  request.method = std::string(req.method_string());
  request.target = std::string(req.target());
  request.authorization = std::string(req[bhttp::field::authorization]);
  request.body = std::move(req.body());
  phase_ = Phase::kHandling;
  stream_.expires_never();
  watch_peer();
  api_.handle(std::move(request), shared_from_this());
}

// While answering, one read stays outstanding: it completes with EOF or an error when the client goes away, or with
// the first bytes of its next (pipelined) request, which stay in buffer_ for read_header().
void HttpConnection::watch_peer() {
  watching_ = true;
  stream_.async_read_some(buffer_.prepare(4096),
                          [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
}

void HttpConnection::on_watch(beast::error_code ec, size_t n) {
  watching_ = false;
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kClosing) return ec ? shut() : drain_then_close();
  if (!ec) {
    buffer_.commit(n);  // a pipelined request: read once this answer is out
    if (resume_after_watch_) {
      resume_after_watch_ = false;  // the read completed before the cancel reached it
      read_header();
    }
    return;
  }
  if (ec == net::error::operation_aborted && resume_after_watch_) {
    resume_after_watch_ = false;
    return read_header();
  }
  peer_gone_.store(true, std::memory_order_release);
  spdlog::debug("http: the client went away while its request was answered ({})", ec.message());
  shut();
}

// Writing -------------------------------------------------------------------------------------------------------

std::string HttpConnection::status_line(int status) const {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\nServer: kestreld\r\n";
}

void HttpConnection::respond(Response response) {
  if (phase_ != Phase::kHandling || answer_queued_) return;
  api_.counters().count_response(response.status);
  std::string out = status_line(response.status);
  out += "Content-Type: " + response.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(response.body.size()) + "\r\n";
  for (const auto& [name, value] : response.headers) out += name + ": " + value + "\r\n";
  if (!keep_alive_) out += "Connection: close\r\n";
  out += "\r\n";
  out += response.body;
  answer_queued_ = true;
  queue(std::move(out));
}

void HttpConnection::start_events() {
  if (phase_ != Phase::kHandling || answer_queued_) return;
  api_.counters().count_response(200);
  if (http10_) keep_alive_ = false;  // HTTP/1.0 has no chunked encoding: the stream ends with the connection
  std::string out = status_line(200);
  out += "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
  if (!http10_) out += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive_) out += "Connection: close\r\n";
  out += "\r\n";
  queue(std::move(out));
}

void HttpConnection::send_event(std::string event) {
  if (phase_ != Phase::kHandling || answer_queued_ || event.empty()) return;
  if (http10_) return queue(std::move(event));
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", event.size());
  std::string chunk = size;
  chunk += event;
  chunk += "\r\n";
  queue(std::move(chunk));
}

void HttpConnection::end_events() {
  if (phase_ != Phase::kHandling || answer_queued_) return;
  answer_queued_ = true;
  queue(http10_ ? std::string() : std::string("0\r\n\r\n"));
}

void HttpConnection::queue(std::string bytes) {
  if (phase_ == Phase::kClosed || phase_ == Phase::kClosing) return;
  queued_bytes_ += bytes.size();
  queue_.push_back(std::move(bytes));
  if (!write_in_flight_) write_next();
}

void HttpConnection::write_next() {
  writing_.clear();
  for (std::string& piece : queue_) writing_ += piece;
  queue_.clear();
  write_in_flight_ = true;
  stream_.expires_after(limits_.write_timeout);
  net::async_write(stream_, net::buffer(writing_),
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
}

void HttpConnection::on_write(beast::error_code ec) {
  write_in_flight_ = false;
  queued_bytes_ -= writing_.size();
  writing_.clear();
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    peer_gone_.store(true, std::memory_order_release);
    spdlog::debug("http: write failed: {}", ec.message());
    return shut();
  }
  if (!queue_.empty()) return write_next();
  if (phase_ == Phase::kReading) {
    stream_.expires_after(limits_.read_timeout);  // a "100 Continue" went out; the body is read on the read timer
    return;
  }
  stream_.expires_never();
  if (answer_queued_) answered();
}

void HttpConnection::answered() {
  answer_queued_ = false;
  if (!keep_alive_ || close_after_answer_ || peer_gone()) return graceful_close();
  phase_ = Phase::kReading;
  if (watching_) {
    resume_after_watch_ = true;  // on_watch reads the next request once the watch read is cancelled
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
    return;
  }
  read_header();
}

// Closing -------------------------------------------------------------------------------------------------------

void HttpConnection::graceful_close() {
  phase_ = Phase::kClosing;
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.expires_after(kDrainTime);
  if (!watching_) drain_then_close();  // else the watch read drains (on_watch)
}

// Reads and drops what the client still sends (an unread body, say) until it closes or kDrainTime passes, so that
// closing does not reset the connection before the client has read the answer.
void HttpConnection::drain_then_close() {
  watching_ = true;
  stream_.async_read_some(net::buffer(drain_buf_),
                          [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
}

void HttpConnection::shut() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  peer_gone_.store(true, std::memory_order_release);
  queue_.clear();
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
}

}  // namespace kestrel::daemon::http
