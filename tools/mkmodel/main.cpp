// kestrel-mkmodel: writes a synthetic qwen35moe / qwen35 / qwen3next GGUF in the exact tensor layout, types and
// metadata of a real one, with deterministic zero-mean weights and the real Qwen3 vocabulary (docs/mkmodel.md).
//
//   kestrel-mkmodel --preset tiny -o tiny.gguf
//   kestrel-mkmodel --preset qwen35moe-35b-a3b -o big.gguf --seed 7
//   kestrel-mkmodel --preset tiny --arch qwen3next --types q4_0 -o next.gguf
//   kestrel-mkmodel --preset qwen3next-80b-a3b --dry-run
//
// Exit status: 0 success, 1 error (message on stderr), 2 bad command line.
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#pragma GCC diagnostic push
// GCC 12 -O2 reports a false -Wnull-dereference inside libstdc++ when inlining CLI11's string splitting.
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "tools/mkmodel/model_plan.h"
#include "tools/mkmodel/model_writer.h"
#include "tools/mkmodel/presets.h"
#include "tools/mkmodel/vocab_source.h"

namespace {

using namespace kestrel;
using namespace kestrel::mkmodel;

constexpr uint64_t kProgressThresholdBytes = uint64_t{256} << 20;

struct Args {
  std::string preset;
  std::string out;
  uint64_t seed = kDefaultSeed;
  std::string types;
  std::string arch;
  std::string vocab;
  std::string chat_template;
  std::string gdn_layout = "split";
  unsigned threads = 0;
  bool dry_run = false;
  bool list_presets = false;
  bool quiet = false;
};

int fail(const Error& e) {
  std::fprintf(stderr, "kestrel-mkmodel: %s\n", e.to_string().c_str());
  return 1;
}

Expected<PlanOptions> plan_options(const Args& a) {
  PlanOptions o;
  o.seed = a.seed;
  if (!a.types.empty()) {
    KESTREL_TRY_ASSIGN(GgmlType t, ggml_type_from_name(a.types));
    o.uniform_type = t;
  }
  if (a.gdn_layout == "legacy") {
    o.gdn_input = GdnInputLayout::kLegacySsmIn;
  } else if (a.gdn_layout != "split") {
    return make_error(ErrorCode::kInvalidArgument, "--gdn-layout must be split or legacy, got '" + a.gdn_layout + "'");
  }
  return o;
}

int run(const Args& a) {
  if (a.list_presets) {
    for (const std::string& name : preset_names()) {
      auto p = find_preset(name);
      if (!p) return fail(p.error());
      std::printf("%-20s %s\n", p->name.c_str(), p->description.c_str());
    }
    return 0;
  }
  if (a.preset.empty()) return fail(make_error(ErrorCode::kInvalidArgument, "--preset is required (--list-presets)"));

  std::string preset_name = a.preset;
  if (!a.arch.empty()) {
    auto arch = arch_from_name(a.arch);
    if (!arch) return fail(arch.error());
    auto name = preset_for_arch(a.preset, *arch);
    if (!name) return fail(name.error());
    preset_name = *name;
  }
  auto preset = find_preset(preset_name);
  if (!preset) return fail(preset.error());
  auto options = plan_options(a);
  if (!options) return fail(options.error());
  auto plan = make_model_plan(*preset, *options);
  if (!plan) return fail(plan.error());

  if (a.dry_run) {
    std::fputs(format_plan(*plan).c_str(), stdout);
    return 0;
  }
  if (a.out.empty()) return fail(make_error(ErrorCode::kInvalidArgument, "-o FILE is required (or --dry-run)"));

  auto vocab_path = find_vocab_file(a.vocab);
  if (!vocab_path) return fail(vocab_path.error());
  auto vocab = load_vocab(*vocab_path, preset->hparams.n_vocab);
  if (!vocab) return fail(make_error(vocab.error().code, *vocab_path + ": " + vocab.error().message));
  if (!a.chat_template.empty()) {
    auto text = read_chat_template_file(a.chat_template);
    if (!text) return fail(text.error());
    vocab->chat_template = std::move(*text);
  }

  WriteOptions wo;
  wo.threads = a.threads;
  const bool big = preset->full_size || plan->tensor_bytes() >= kProgressThresholdBytes;
  wo.progress = (!a.quiet && big) ? stderr : nullptr;
  if (!a.quiet) {
    std::fprintf(stderr, "kestrel-mkmodel: vocabulary %s\n", vocab_path->c_str());
    std::fprintf(stderr, "kestrel-mkmodel: %s -> %s (%zu tensors, %.1f MB of tensor data, seed %llu)\n",
                 preset->name.c_str(), a.out.c_str(), plan->tensors.size(),
                 static_cast<double>(plan->tensor_bytes()) / 1e6, static_cast<unsigned long long>(a.seed));
  }
  auto stats = write_model(
      *plan, a.out, [&](GgufWriter& w) { return add_vocab_metadata(w, *vocab); }, wo);
  if (!stats) return fail(stats.error());
  if (!a.quiet) {
    std::fprintf(stderr, "kestrel-mkmodel: wrote %s: %llu bytes in %.1f s (%.0f MB/s)\n", a.out.c_str(),
                 static_cast<unsigned long long>(stats->file_bytes), stats->seconds,
                 stats->seconds > 0 ? static_cast<double>(stats->file_bytes) / 1e6 / stats->seconds : 0.0);
  }
  return 0;
}

int parse_and_run(int argc, char** argv) {
  Args a;
  CLI::App app{"kestrel-mkmodel: write a synthetic GGUF model in the exact layout of a real one"};
  app.add_option("--preset", a.preset,
                 "model shape: tiny, tiny-qwen3next, tiny-qwen35, qwen35moe-35b-a3b, "
                 "qwen3next-80b-a3b, qwen35-27b (--list-presets)");
  app.add_option("-o,--output", a.out, "output GGUF file");
  app.add_option("--seed", a.seed, "weight seed (same seed, same bytes)")->capture_default_str();
  app.add_option("--types", a.types,
                 "write every quantizable weight in this type (f32, f16, bf16, q8_0, q4_0, q4_K, "
                 "q5_K, q6_K) instead of the Q4_K_M mix");
  app.add_option("--arch", a.arch, "qwen35moe, qwen35 or qwen3next: picks the tiny preset of that architecture");
  app.add_option("--vocab", a.vocab, "Qwen3 tokenizer.json to embed (default: installed or source-tree copy)");
  app.add_option("--chat-template", a.chat_template,
                 "Jinja file stored as tokenizer.chat_template (default: the vocabulary's tokenizer_config.json)");
  app.add_option("--gdn-layout", a.gdn_layout,
                 "qwen3next GDN input tensors: split (attn_qkv + attn_gate) or legacy "
                 "(ssm_in)")
      ->capture_default_str();
  app.add_option("--threads", a.threads, "generator threads (0: all cores, at least 2)")->capture_default_str();
  app.add_flag("--dry-run", a.dry_run, "print the tensor plan and total bytes; write nothing");
  app.add_flag("--list-presets", a.list_presets, "list the presets");
  app.add_flag("-q,--quiet", a.quiet, "no progress or summary on stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the message or the help text
    return rc == 0 ? 0 : 2;      // --help is a success; every command-line error is status 2
  }
  return run(a);
}

}  // namespace

int main(int argc, char** argv) {
  // CLI11 reports command-line errors as exceptions (handled by CLI11_PARSE); anything else that escapes (e.g.
  // std::bad_alloc) becomes a one-line error instead of std::terminate.
  try {
    return parse_and_run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kestrel-mkmodel: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kestrel-mkmodel: unknown exception\n");
  }
  return 1;
}
