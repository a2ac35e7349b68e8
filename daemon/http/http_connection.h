// HttpConnection: one client's TCP connection to kestreld's HTTP server, on Boost.Beast, with no thread of its own:
// every operation is asynchronous and runs on the connection's strand of the server's io_context.
//
// One request at a time (HTTP/1.1 keep-alive; a pipelined request waits until the answer before it is written):
//   reading    the header, then (after "100 Continue" when the client expects it) the body, within read_timeout;
//              a body over max_body_bytes is answered 413 from its Content-Length (or as it arrives), a header over
//              64 KiB 431, anything malformed 400
//   handling   OpenAiApi::handle answers through the Exchange methods; meanwhile one read stays outstanding, so a
//              client that disconnects is noticed at once (peer_gone(): the engine then cancels its generation)
//   writing    queued output goes out in one write at a time, each within write_timeout; then the next request,
//              or a graceful close (shutdown of our side, the client's leftover bytes read and dropped for up to
//              2 s, so it sees the answer rather than a reset)
//
// Threading: the Exchange methods as http_exchange.h says; close_when_idle() and close_now() from any thread.
// Ownership: shared_ptr; alive while an operation or an Exchange user holds it. Counts itself in
// HttpCounters::connections.
#pragma once

#include <array>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "daemon/http/http_exchange.h"
#include "daemon/http/openai_api.h"

namespace kestrel::daemon::http {

struct ConnectionLimits {
  uint64_t max_body_bytes = 4 << 20;
  std::chrono::seconds read_timeout{30};
  std::chrono::seconds write_timeout{60};
};

class HttpConnection final : public Exchange, public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(boost::asio::ip::tcp::socket socket, OpenAiApi& api, const ConnectionLimits& limits);
  ~HttpConnection() override;

  // Starts reading requests.
  void start();
  // Answers `response` without reading a request, then closes (over the server's connection limit).
  void refuse(Response response);
  // Closes now if no request is being answered, else after the answer (server shutdown).
  void close_when_idle();
  // Closes the socket now; an answer in progress is dropped.
  void close_now();

  void respond(Response response) override;
  void start_events() override;
  void send_event(std::string event) override;
  void end_events() override;
  size_t pending_bytes() const override { return queued_bytes_; }
  bool peer_gone() const override { return peer_gone_.load(std::memory_order_acquire); }
  void post(std::function<void()> work) override;

 private:
  enum class Phase { kReading, kHandling, kClosing, kClosed };

  void read_header();
  void on_header(boost::beast::error_code ec);
  void read_body();
  void on_body(boost::beast::error_code ec);
  void reject_request(boost::beast::error_code ec);
  void dispatch();
  void watch_peer();
  void on_watch(boost::beast::error_code ec, size_t n);
  void queue(std::string bytes);
  void write_next();
  void on_write(boost::beast::error_code ec);
  void answered();
  void graceful_close();
  void drain_then_close();
  void shut();
  std::string status_line(int status) const;

  boost::beast::tcp_stream stream_;
  OpenAiApi& api_;
  ConnectionLimits limits_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;

  // Strand state.
  Phase phase_ = Phase::kReading;
  bool keep_alive_ = true;
  bool http10_ = false;              // the request is HTTP/1.0: no chunked encoding, close after the answer
  bool close_after_answer_ = false;  // close_when_idle() came while answering
  bool answer_queued_ = false;       // the answer's last bytes are queued
  bool watching_ = false;            // the disconnect watch read is outstanding
  bool resume_after_watch_ = false;  // the watch was cancelled to read the next request
  std::deque<std::string> queue_;
  std::string writing_;  // the bytes of the write in flight
  bool write_in_flight_ = false;
  size_t queued_bytes_ = 0;
  std::array<char, 4096> drain_buf_{};

  std::atomic<bool> peer_gone_{false};
};

}  // namespace kestrel::daemon::http
