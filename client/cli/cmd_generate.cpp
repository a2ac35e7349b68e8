// `kestrel generate`: one streaming generation on a running kestreld (Client::generate).
//
// The prompt is text (--prompt, "-" reads stdin; tokenized by the daemon, --special matches <|im_start|> and the
// like) or token ids (--tokens 1,2,3). Text streams to stdout as chunks arrive; when the stream ends, one line on
// stderr gives the finish reason, the token counts, the time to the first token and the rate. With --json nothing
// streams: one JSON object with the text, the token ids, the finish reason, the counts, the timing and (with
// --logprobs K) every token's log-probability and top-K alternatives goes to stdout. Without --session the daemon
// uses a temporary session closed at the end; with --session ID the tokens are appended to that session.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/cli/cli11.h"
#include "client/cli/cli_format.h"
#include "client/cli/client_flags.h"
#include "client/cli/commands.h"

namespace kestrel::cli {
namespace {

struct GenerateOptions {
  ConnectFlags connect;
  SamplingFlags sampling;
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  int32_t max_tokens = 128;
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_tokens;
  uint64_t session = 0;
  int32_t n_ctx = 0;
  int32_t top_logprobs = 0;
  bool parse_special = false;
  bool ignore_eos = false;
  bool json = false;
  CLI::Option* o_prompt = nullptr;
  CLI::Option* o_tokens = nullptr;
};

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The text of one token for the logprob listing (exact bytes; not valid UTF-8 on its own for some tokens).
std::string token_text(client::Client& c, int32_t token) {
  v1::DetokenizeRequest req;
  req.add_tokens(token);
  auto r = c.detokenize(req);
  return r ? r->text() : std::string("?");
}

int run_generate(GenerateOptions& o) {
  if ((o.o_prompt->count() > 0) == (o.o_tokens->count() > 0)) {
    print_error("", "give exactly one of --prompt TEXT and --tokens ID,...");
    return kExitUsage;
  }
  if (o.o_prompt->count() > 0 && o.prompt == "-") {
    o.prompt.clear();
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, stdin)) > 0;) o.prompt.append(buf, n);
  }
  auto client = connect_client(o.connect);
  if (!client) {
    print_error("", client.error().message);
    return 1;
  }
  client::Client& c = **client;

  v1::GenerateRequest req;
  req.set_session_id(o.session);
  if (o.o_tokens->count() > 0) {
    for (int32_t t : o.prompt_tokens) req.mutable_tokens()->add_ids(t);
  } else {
    req.set_text(o.prompt);
  }
  req.set_parse_special(o.parse_special);
  req.set_max_tokens(o.max_tokens);
  *req.mutable_sampling() = to_proto(o.sampling);
  for (int32_t t : o.stop_tokens) req.add_stop_tokens(t);
  for (const auto& s : o.stop_strings) req.add_stop_strings(s);
  req.set_ignore_eos(o.ignore_eos);
  req.set_top_logprobs(o.top_logprobs);
  req.set_n_ctx(o.n_ctx);

  std::string text;
  std::vector<int32_t> tokens;
  std::vector<v1::StepLogprobs> logprobs;
  const auto t0 = std::chrono::steady_clock::now();
  auto t_first = t0;
  bool have_first = false;
  auto last = c.generate(req, [&](const v1::GenerateChunk& chunk) {
    if (!have_first && chunk.tokens_size() > 0) {
      t_first = std::chrono::steady_clock::now();
      have_first = true;
    }
    tokens.insert(tokens.end(), chunk.tokens().begin(), chunk.tokens().end());
    logprobs.insert(logprobs.end(), chunk.logprobs().begin(), chunk.logprobs().end());
    if (o.json) {
      text += chunk.text();
    } else if (!chunk.text().empty()) {
      std::fwrite(chunk.text().data(), 1, chunk.text().size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  const auto t_end = std::chrono::steady_clock::now();
  if (!o.json && !tokens.empty()) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  if (!last) {
    print_error("", last.error().message);
    return 1;
  }
  const double total_s = seconds_between(t0, t_end);
  const double first_ms = have_first ? 1000.0 * seconds_between(t0, t_first) : 0.0;
  const uint32_t n_out = last->completion_tokens();
  const double rate = total_s > 0.0 ? n_out / total_s : 0.0;

  if (o.json) {
    nlohmann::ordered_json j;
    j["text"] = text;
    j["tokens"] = tokens;
    j["finish_reason"] = finish_reason_text(last->finish_reason());
    j["prompt_tokens"] = last->prompt_tokens();
    j["completion_tokens"] = n_out;
    j["session_id"] = last->session_id();
    j["n_past"] = last->n_past();
    j["seconds"] = total_s;
    j["first_token_ms"] = first_ms;
    j["tokens_per_second"] = rate;
    if (o.top_logprobs > 0) {
      nlohmann::ordered_json lp = nlohmann::ordered_json::array();
      for (size_t i = 0; i < logprobs.size(); ++i) {
        nlohmann::ordered_json e;
        e["token"] = i < tokens.size() ? tokens[i] : -1;
        e["logprob"] = logprobs[i].logprob();
        nlohmann::ordered_json top = nlohmann::ordered_json::array();
        for (const auto& t : logprobs[i].top()) top.push_back({{"token", t.token()}, {"logprob", t.logprob()}});
        e["top"] = std::move(top);
        lp.push_back(std::move(e));
      }
      j["logprobs"] = std::move(lp);
    }
    // Replace invalid UTF-8 (a token list cut inside a character) instead of throwing.
    std::puts(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    return 0;
  }
  if (o.top_logprobs > 0) {
    for (size_t i = 0; i < logprobs.size() && i < tokens.size(); ++i) {
      std::string line = "  " + std::to_string(tokens[i]) + " '" + token_text(c, tokens[i]) + "' " +
                         std::to_string(logprobs[i].logprob()) + "  top:";
      for (const auto& t : logprobs[i].top()) {
        line += " " + std::to_string(t.token()) + " '" + token_text(c, t.token()) + "' " + std::to_string(t.logprob());
      }
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  std::fprintf(stderr, "finish: %s; prompt %u tokens; %u tokens in %.3f s (%.1f tokens/s); first token after %.1f ms",
               finish_reason_text(last->finish_reason()).c_str(), last->prompt_tokens(), n_out, total_s, rate,
               first_ms);
  if (o.session != 0)
    std::fprintf(stderr, "; session %llu at %lld tokens", (unsigned long long)last->session_id(),
                 static_cast<long long>(last->n_past()));
  std::fputc('\n', stderr);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "stream a generation from a running kestreld");
  opts->o_prompt = cmd->add_option("-p,--prompt", opts->prompt, "prompt text ('-': read stdin)");
  opts->o_tokens = cmd->add_option("--tokens", opts->prompt_tokens, "prompt as token ids (1,2,3)")->delimiter(',');
  cmd->add_option("-n,--max-tokens", opts->max_tokens, "tokens to generate at most")->capture_default_str();
  cmd->add_option("--stop", opts->stop_strings, "stop before this string (repeatable)");
  cmd->add_option("--stop-token", opts->stop_tokens, "stop at this token id (repeatable)");
  cmd->add_option("--session", opts->session, "append to this session (default: a temporary one)");
  cmd->add_option("-c,--ctx-size", opts->n_ctx, "context of the temporary session (0: the daemon's default)")
      ->capture_default_str();
  cmd->add_option("--logprobs", opts->top_logprobs, "report each token's log-probability and the top K (0..20)")
      ->capture_default_str();
  cmd->add_flag("--special", opts->parse_special, "match special tokens such as <|im_start|> in the prompt");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "keep generating past end-of-generation tokens");
  cmd->add_flag("--json", opts->json, "print one JSON object (text, tokens, finish, counts, timing) instead");
  add_connect_flags(cmd, &opts->connect);
  add_sampling_flags(cmd, &opts->sampling);
  cmd->callback([opts, exit_code] { *exit_code = run_generate(*opts); });
}

}  // namespace kestrel::cli
