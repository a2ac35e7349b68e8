// `kestrel chat`: an interactive streaming chat with a running kestreld, rendered with the model's chat template.
//
// The conversation is rendered with the Jinja template the daemon's model carries (ModelInfo.chat_template, or
// --chat-template FILE) by core/chat, as transformers would render it, with add_generation_prompt and the thinking
// switch (--no-think: enable_thinking = false). One daemon session holds the conversation: each turn sends the part
// of the rendering the session does not hold yet, or resets the session and sends all of it when the template renders
// the history differently from what the session holds (ChatConversation). The answer streams until <|im_end|> or the
// model's end-of-generation token and becomes the assistant message. A model without a template, or a template the
// interpreter cannot render, is an error before the chat starts; a conversation the template refuses (its
// raise_exception) is reported and the message dropped.
//
// Input: on a terminal, libedit line editing with a history file (line_reader.h); otherwise plain lines from stdin.
// Lines starting with '/' are commands: /reset (forget the conversation: ResetSession), /quit. EOF (Ctrl-D) exits.
// Ctrl-C while an answer streams aborts that answer (Abort on the session; the stream ends with finish "aborted")
// and the chat goes on; at the prompt it is ignored with a hint.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "client/cli/chat_conversation.h"
#include "client/cli/cli11.h"
#include "client/cli/cli_format.h"
#include "client/cli/client_flags.h"
#include "client/cli/commands.h"
#include "client/cli/line_reader.h"
#include "core/chat/chat_template.h"

namespace kestrel::cli {
namespace {

struct ChatOptions {
  ConnectFlags connect;
  SamplingFlags sampling;
  std::string system;
  std::string chat_template;  // a Jinja file instead of the model's template
  std::string history;        // history file; empty: the default place
  bool no_history = false;
  bool no_think = false;
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

Expected<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kNotFound, "--chat-template " + path + ": cannot open");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The exact bytes of `tokens` (DetokenizeResponse.raw).
Expected<std::string> token_bytes(client::Client& c, const std::vector<int32_t>& tokens) {
  v1::DetokenizeRequest req;
  req.mutable_tokens()->Add(tokens.begin(), tokens.end());
  KESTREL_TRY_ASSIGN(v1::DetokenizeResponse resp, c.detokenize(req));
  return resp.raw();
}

// The template to render with and the globals it sees besides messages (bos_token / eos_token as transformers passes
// the tokenizer's special tokens, enable_thinking when --no-think).
struct TemplateSetup {
  chat::ChatTemplate tmpl;
  nlohmann::ordered_json globals;
};

Expected<TemplateSetup> load_template(client::Client& c, const ChatOptions& o) {
  KESTREL_TRY_ASSIGN(v1::ModelInfo info, c.model_info());
  std::string source;
  std::string origin;
  if (!o.chat_template.empty()) {
    KESTREL_TRY_ASSIGN(source, read_text_file(o.chat_template));
    origin = o.chat_template;
  } else {
    source = info.chat_template();
    origin = "the model's chat template";
    if (source.empty()) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "the model (" + info.model_path() +
                            ") carries no chat template (tokenizer.chat_template); pass --chat-template FILE");
    }
  }
  auto tmpl = chat::ChatTemplate::parse(source);
  if (!tmpl) return make_error(tmpl.error().code, origin + ": " + tmpl.error().message);
  nlohmann::ordered_json globals = nlohmann::ordered_json::object();
  if (info.bos_token_id() >= 0) {
    KESTREL_TRY_ASSIGN(std::string bos, token_bytes(c, {info.bos_token_id()}));
    globals["bos_token"] = bos;
  }
  if (info.eos_token_ids_size() > 0) {
    KESTREL_TRY_ASSIGN(std::string eos, token_bytes(c, {info.eos_token_ids(0)}));
    globals["eos_token"] = eos;
  }
  if (o.no_think) globals["enable_thinking"] = false;
  return TemplateSetup{std::move(*tmpl), std::move(globals)};
}

int run_chat(const ChatOptions& o) {
  auto client = connect_client(o.connect);
  if (!client) {
    print_error("", client.error().message);
    return 1;
  }
  client::Client& c = **client;
  auto setup = load_template(c, o);
  if (!setup) {
    print_error("chat", setup.error().message);
    return 1;
  }
  ChatConversation conversation(std::move(setup->tmpl), std::move(setup->globals), o.system);

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
  const std::string history = o.no_history ? std::string() : (o.history.empty() ? default_history_path() : o.history);
  std::unique_ptr<LineReader> reader = LineReader::create(tty, history);
  if (tty) {
    std::fprintf(stderr, "kestrel chat: session %llu, /reset forgets, /quit or Ctrl-D leaves\n",
                 (unsigned long long)sid);
  }
  auto reset_session = [&]() -> bool {
    v1::ResetSessionRequest reset;
    reset.set_session_id(sid);
    if (auto r = c.reset_session(reset); !r) {
      print_error("", r.error().message);
      return false;
    }
    return true;
  };
  int rc = 0;
  for (;;) {
    std::optional<std::string> line = reader->read("> ");
    if (!line) break;
    if (*line == "/quit" || *line == "/exit") break;
    if (*line == "/reset") {
      if (!reset_session()) {
        rc = 1;
        break;
      }
      conversation.reset();
      std::fputs("(conversation reset)\n", stderr);
      continue;
    }
    if (line->empty()) continue;
    if ((*line)[0] == '/') {
      std::fprintf(stderr, "unknown command %s (commands: /reset, /quit)\n", line->c_str());
      continue;
    }
    auto turn = conversation.user_turn(*line);
    if (!turn) {
      print_error("chat template", turn.error().message);
      continue;
    }
    if (turn->reset && !reset_session()) {
      rc = 1;
      break;
    }

    v1::GenerateRequest req;
    req.set_session_id(sid);
    req.set_text(turn->text);
    req.set_parse_special(true);
    req.set_max_tokens(o.max_tokens);
    if (have_im_end) req.add_stop_tokens(im_end->tokens(0));
    std::string answer;
    std::vector<int32_t> generated;
    Expected<v1::GenerateChunk> last = make_error(ErrorCode::kInternal, "no answer");
    {
      AbortWatcher watcher(&c, sid);
      last = c.generate(req, [&](const v1::GenerateChunk& chunk) {
        if (!chunk.text().empty()) {
          std::fwrite(chunk.text().data(), 1, chunk.text().size(), stdout);
          std::fflush(stdout);
          answer += chunk.text();
        }
        generated.insert(generated.end(), chunk.tokens().begin(), chunk.tokens().end());
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
    auto bytes = token_bytes(c, generated);
    if (!bytes) {
      print_error("", bytes.error().message);
      rc = 1;
      break;
    }
    conversation.answer(std::move(answer), *bytes);
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
  CLI::App* cmd = app.add_subcommand(
      "chat", "interactive streaming chat with a running kestreld, rendered with the model's chat template");
  cmd->add_option("--system", opts->system, "system message at the start of the conversation");
  cmd->add_option("--chat-template", opts->chat_template,
                  "Jinja chat template file to render with instead of the model's tokenizer.chat_template")
      ->option_text("FILE");
  cmd->add_flag("--no-think", opts->no_think, "render with enable_thinking = false (the model's thinking switch)");
  cmd->add_option("--history", opts->history,
                  "history file for line editing (default: $XDG_STATE_HOME/kestrel/chat_history)")
      ->option_text("FILE");
  cmd->add_flag("--no-history", opts->no_history, "keep no history file");
  cmd->add_option("-n,--max-tokens", opts->max_tokens, "tokens per answer at most")->capture_default_str();
  cmd->add_option("-c,--ctx-size", opts->n_ctx, "session context in tokens (0: the daemon's default)")
      ->capture_default_str();
  add_connect_flags(cmd, &opts->connect);
  add_sampling_flags(cmd, &opts->sampling);
  cmd->callback([opts, exit_code] { *exit_code = run_chat(*opts); });
}

}  // namespace kestrel::cli
