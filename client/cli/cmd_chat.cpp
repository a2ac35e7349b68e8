// `kestrel chat`: an interactive streaming chat with a running kestreld, in the Qwen chat format.
//
// One daemon session holds the whole conversation: each turn sends only the new text,
//   <|im_start|>user\n{line}<|im_end|>\n<|im_start|>assistant\n
// (an optional --system message goes before the first turn), with parse_special so the markers become their special
// tokens, and streams the answer until <|im_end|> or the model's end-of-generation token. The next turn first closes
// the answer ("\n" after a sampled <|im_end|>, "<|im_end|>\n" after any other end such as max tokens or Ctrl-C), so
// the session's history is exactly the chat template's rendering of the conversation.
//
// Lines starting with '/' are commands: /reset (forget the conversation: ResetSession), /quit. EOF (Ctrl-D) exits.
// Ctrl-C while an answer streams aborts that answer (Abort on the session; the stream ends with finish "aborted")
// and the chat goes on; at the prompt it is ignored with a hint.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "client/cli/cli11.h"
#include "client/cli/cli_format.h"
#include "client/cli/client_flags.h"
#include "client/cli/commands.h"

namespace kestrel::cli {
namespace {

struct ChatOptions {
  ConnectFlags connect;
  SamplingFlags sampling;
  std::string system;
  int32_t max_tokens = 512;
  int32_t n_ctx = 0;
};

// Set by SIGINT; read by the abort watcher while an answer streams.
std::atomic<bool> g_interrupted{false};
std::atomic<bool> g_answering{false};

extern "C" void on_sigint(int) {
  if (g_answering.load()) {
    g_interrupted.store(true);
  } else {
    constexpr char kHint[] = "\n(type /quit or press Ctrl-D to leave)\n> ";
    ssize_t n = write(STDERR_FILENO, kHint, sizeof(kHint) - 1);
    (void)n;
  }
}

// While an answer streams, a watcher thread turns Ctrl-C into Abort for the session (the stream then ends with
// FINISH_REASON_ABORTED and the tokens so far stay in the session).
class AbortWatcher {
 public:
  AbortWatcher(client::Client* c, uint64_t session) : client_(c), session_(session) {
    g_interrupted.store(false);
    g_answering.store(true);
    thread_ = std::thread([this] { loop(); });
  }
  ~AbortWatcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
    g_answering.store(false);
  }
  AbortWatcher(const AbortWatcher&) = delete;
  AbortWatcher& operator=(const AbortWatcher&) = delete;

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (!done_ && g_interrupted.exchange(false)) {
        v1::AbortRequest req;
        req.set_session_id(session_);
        (void)client_->abort(req);  // a stream that just ended has nothing to abort: not an error here
      }
    }
  }
  client::Client* client_;
  uint64_t session_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

int run_chat(const ChatOptions& o) {
  auto client = connect_client(o.connect);
  if (!client) {
    print_error("", client.error().message);
    return 1;
  }
  client::Client& c = **client;
  v1::CreateSessionRequest create;
  create.set_n_ctx(o.n_ctx);
  *create.mutable_sampling() = to_proto(o.sampling);
  auto session = c.create_session(create);
  if (!session) {
    print_error("", session.error().message);
    return 1;
  }
  const uint64_t sid = session->session_id();
  // <|im_end|> as one token, to stop on it even when the model does not list it among its eos ids.
  v1::TokenizeRequest tok_req;
  tok_req.set_text("<|im_end|>");
  tok_req.set_parse_special(true);
  auto im_end = c.tokenize(tok_req);
  const bool have_im_end = im_end && im_end->tokens_size() == 1;

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  const bool tty = isatty(STDIN_FILENO) != 0;
  if (tty)
    std::fprintf(stderr, "kestrel chat: session %llu, /reset forgets, /quit or Ctrl-D leaves\n",
                 (unsigned long long)sid);
  bool first_turn = true;
  std::string pending_close;  // what the last answer still needs to be a closed turn
  int rc = 0;
  std::string line;
  for (;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      v1::ResetSessionRequest reset;
      reset.set_session_id(sid);
      if (auto r = c.reset_session(reset); !r) {
        print_error("", r.error().message);
        rc = 1;
        break;
      }
      first_turn = true;
      pending_close.clear();
      std::fputs("(conversation reset)\n", stderr);
      continue;
    }
    if (line.empty()) continue;
    if (line[0] == '/') {
      std::fprintf(stderr, "unknown command %s (commands: /reset, /quit)\n", line.c_str());
      continue;
    }
    std::string turn = pending_close;
    if (first_turn && !o.system.empty()) turn += "<|im_start|>system\n" + o.system + "<|im_end|>\n";
    turn += "<|im_start|>user\n" + line + "<|im_end|>\n<|im_start|>assistant\n";

    v1::GenerateRequest req;
    req.set_session_id(sid);
    req.set_text(turn);
    req.set_parse_special(true);
    req.set_max_tokens(o.max_tokens);
    if (have_im_end) req.add_stop_tokens(im_end->tokens(0));
    bool ended_with_im_end = false;
    Expected<v1::GenerateChunk> last = make_error(ErrorCode::kInternal, "no answer");
    {
      AbortWatcher watcher(&c, sid);
      last = c.generate(req, [&](const v1::GenerateChunk& chunk) {
        if (!chunk.text().empty()) {
          std::fwrite(chunk.text().data(), 1, chunk.text().size(), stdout);
          std::fflush(stdout);
        }
        if (have_im_end && chunk.tokens_size() > 0) {
          ended_with_im_end = chunk.tokens(chunk.tokens_size() - 1) == im_end->tokens(0);
        }
        return true;
      });
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!last) {
      print_error("", last.error().message);
      rc = 1;
      break;
    }
    first_turn = false;
    // The template closes every answer with "<|im_end|>\n": after an answer that sampled <|im_end|> (it is in the
    // session's history) only the newline is missing; any other end (max tokens, another eos, Ctrl-C) needs both.
    pending_close = ended_with_im_end ? "\n" : "<|im_end|>\n";
    const v1::FinishReason why = last->finish_reason();
    if (why != v1::FINISH_REASON_STOP_TOKEN) std::fprintf(stderr, "(%s)\n", finish_reason_text(why).c_str());
  }
  sa.sa_handler = SIG_DFL;
  sigaction(SIGINT, &sa, nullptr);
  v1::CloseSessionRequest close;
  close.set_session_id(sid);
  (void)c.close_session(close);  // the daemon also closes idle sessions after their TTL
  return rc;
}

}  // namespace

void add_chat(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<ChatOptions>();
  CLI::App* cmd = app.add_subcommand("chat", "interactive streaming chat with a running kestreld (Qwen chat format)");
  cmd->add_option("--system", opts->system, "system message sent before the first turn");
  cmd->add_option("-n,--max-tokens", opts->max_tokens, "tokens per answer at most")->capture_default_str();
  cmd->add_option("-c,--ctx-size", opts->n_ctx, "session context in tokens (0: the daemon's default)")
      ->capture_default_str();
  add_connect_flags(cmd, &opts->connect);
  add_sampling_flags(cmd, &opts->sampling);
  cmd->callback([opts, exit_code] { *exit_code = run_chat(*opts); });
}

}  // namespace kestrel::cli
