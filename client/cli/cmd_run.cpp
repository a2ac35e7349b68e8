// `kestrel run`: in-process generation with the scalar reference forward pass, for debugging and benchmarking.
//
// Loads the model (all checks of Model::open; without -m the embedded default model kestreld serves, created in its
// cache folder when missing), tokenizes the prompt, runs it as one prefill, then samples and decodes up to -n tokens
// one at a time, streaming each token's bytes to stdout as it is produced. Sampling starts from kestreld's defaults
// (kestrel_default_sampling(); a random seed unless --seed, printed so that a run can be repeated). Timing goes to
// stderr: prefill and decode tokens per second. Stops early at an end-of-generation token (eos or <|im_end|>)
// unless --ignore-eos. Single-threaded; the reference is the oracle, not the fast path.
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/cli/cli11.h"
#include "client/cli/cli_format.h"
#include "client/cli/commands.h"
#include "core/model/model.h"
#include "core/reference/forward.h"
#include "core/sampler/sampler.h"
#include "tools/mkmodel/default_model.h"

namespace kestrel::cli {
namespace {

struct RunOptions {
  std::string model;  // "": the embedded default model
  std::string prompt;
  int n_predict = 64;
  int n_ctx = 4096;
  bool parse_special = false;
  bool ignore_eos = false;
  SamplingParams sampling = kestrel_default_sampling();
  bool seed_given = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_generation(RunOptions o) {
  if (o.model.empty()) {
    auto dm = mkmodel::ensure_default_model(mkmodel::default_model_cache_dir_from_process(), [](std::string_view line) {
      std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
    });
    if (!dm) {
      print_error("", dm.error().message);
      return 1;
    }
    o.model = dm->path;
  }
  if (!o.seed_given) o.sampling.seed = std::random_device{}();
  auto model = Model::open(o.model);
  if (!model) {
    print_error("", model.error().message);
    return 1;
  }
  const Model& m = **model;
  if (Status st = o.sampling.validate(); !st) {
    print_error("", st.error().message);
    return 1;
  }
  auto weights = ref::RefModelWeights::from_catalog(m.catalog());
  if (!weights) {
    print_error(o.model, weights.error().message);
    return 1;
  }
  std::vector<int32_t> prompt = m.tokenizer().encode(o.prompt, o.parse_special);
  if (prompt.empty()) {
    print_error("", "the prompt is empty: give --prompt some text");
    return 1;
  }
  const int n_ctx = std::min<int>(o.n_ctx, static_cast<int>(prompt.size()) + o.n_predict);
  auto session = ref::SessionState::create(m.hparams(), n_ctx);
  if (!session) {
    print_error("", session.error().message);
    return 1;
  }
  auto sampler = Sampler::create(o.sampling, static_cast<int32_t>(m.hparams().n_vocab));
  if (!sampler) {
    print_error("", sampler.error().message);
    return 1;
  }
  const int32_t eos = m.tokenizer().vocab().eos_id;
  const std::vector<int32_t> im_end = m.tokenizer().encode("<|im_end|>", /*parse_special=*/true);

  std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  std::fflush(stdout);

  ref::ForwardOutput out;
  auto t0 = std::chrono::steady_clock::now();
  if (Status st = ref::forward(*weights, *session, prompt, {}, &out); !st) {
    print_error("", st.error().message);
    return 1;
  }
  const double t_prefill = seconds_since(t0);
  std::vector<int32_t> history(prompt.begin(), prompt.end());  // the session's tokens, for the sampler's penalties

  int n_decoded = 0;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.n_predict; ++i) {
    auto next = sampler->sample_checked(out.logits, history, nullptr);
    if (!next) {
      print_error("", next.error().message);
      return 1;
    }
    const int32_t tok = *next;
    const bool stop = !o.ignore_eos && (tok == eos || (im_end.size() == 1 && tok == im_end[0]));
    if (stop) break;
    auto bytes = m.tokenizer().token_bytes(tok);
    if (bytes) {
      std::fwrite(bytes->data(), 1, bytes->size(), stdout);
      std::fflush(stdout);
    }
    ++n_decoded;
    if (i + 1 == o.n_predict || session->n_past() >= session->n_ctx()) break;
    const int32_t one[1] = {tok};
    if (Status st = ref::forward(*weights, *session, one, {}, &out); !st) {
      print_error("", st.error().message);
      return 1;
    }
    history.push_back(tok);
  }
  const double t_decode = seconds_since(t0);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(), t_prefill,
               static_cast<double>(prompt.size()) / t_prefill);
  std::fprintf(stderr, "decode:  %d tokens in %.3f s (%.1f tokens/s)\n", n_decoded, t_decode,
               n_decoded > 0 ? n_decoded / t_decode : 0.0);
  std::fprintf(stderr, "seed:    %llu (--seed repeats this run)\n", static_cast<unsigned long long>(o.sampling.seed));
  return 0;
}

}  // namespace

void add_run(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "generate in-process with the reference forward pass (debugging, timing)");
  cmd->add_option("-m,--model", opts->model,
                  "GGUF model file (default: the embedded default model kestreld serves, made in its cache folder)");
  cmd->add_option("-p,--prompt", opts->prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", opts->n_predict, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-c,--ctx-size", opts->n_ctx, "context size in tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_flag("--special", opts->parse_special, "match special tokens such as <|im_start|> in the prompt");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "keep generating past end-of-generation tokens");
  // Defaults are kestreld's (kestrel_default_sampling()).
  SamplingParams& s = opts->sampling;
  CLI::Option* seed = cmd->add_option("--seed", s.seed, "sampling seed (default: a random one, printed at the end)");
  cmd->add_option("--temp", s.temperature, "temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "keep the k most likely tokens (0: off)")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "nucleus sampling mass (1: off)")->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "drop tokens below min-p times the best (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", s.repetition_penalty, "repetition penalty (1: off)")->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "presence penalty (0: off)")->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "frequency penalty (0: off)")->capture_default_str();
  cmd->add_option("--repeat-last-n", s.penalty_last_n, "tokens the penalties look back (-1: all, 0: off)")
      ->capture_default_str();
  cmd->callback([opts, exit_code, seed] {
    opts->seed_given = seed->count() > 0;
    *exit_code = run_generation(*opts);
  });
}

}  // namespace kestrel::cli
