// One HTTP request and the channel its answer goes back through: what the OpenAI API (openai_api.h) sees of a
// connection (http_connection.h), without Boost.Beast types.
//
// An answer is either one complete Response, or an event stream: start_events() sends the headers (200,
// text/event-stream, chunked), send_event() each server-sent event, end_events() the end. Output is queued and written
// one piece at a time; nothing here blocks.
//
// Threading: respond(), start_events(), send_event(), end_events() and pending_bytes() run on the connection's strand
// (the thread that called OpenAiApi::handle, or work given to post()). post() and peer_gone() may be called from any
// thread: the engine thread hands results to the strand through post(), and polls peer_gone() between ticks.
// Ownership: shared; the connection lives while an Exchange reference or one of its operations does.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kestrel::daemon::http {

struct HttpRequest {
  std::string method;         // "GET", "POST", ...
  std::string target;         // "/v1/models", with any query string
  std::string authorization;  // the Authorization header ("" when absent)
  std::string body;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Allow, WWW-Authenticate)
};

class Exchange {
 public:
  virtual ~Exchange() = default;

  virtual void respond(Response response) = 0;
  virtual void start_events() = 0;
  virtual void send_event(std::string event) = 0;
  virtual void end_events() = 0;
  // Bytes queued and not yet written to the socket: a client that stops reading makes this grow.
  virtual size_t pending_bytes() const = 0;

  // True once the client has closed its side or the connection failed; the answer then goes nowhere.
  virtual bool peer_gone() const = 0;
  // Runs `work` on the connection's strand, after what was posted before it.
  virtual void post(std::function<void()> work) = 0;
};

}  // namespace kestrel::daemon::http
