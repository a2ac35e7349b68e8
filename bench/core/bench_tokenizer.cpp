// Tokenizer encode throughput on a few MB of mixed text, next to a plain byte scan of the same text.
//
// The text (~4 MB) is generated deterministically: English prose, C++-like code with indentation and operators,
// Chinese (CJK ideographs and full-width punctuation), and llama.cpp's qwen2 test-vector inputs. The vocabulary is
// the real Qwen3 one (tests/data/tokenizer/qwen3/tokenizer.json, "qwen2" pre-tokenizer).
//
//   BM_TokenizerEncode/0     Tokenizer::encode(text, parse_special = false): the full path, MB/s of input
//   BM_TokenizerEncodeSpecial/0  the same with parse_special = true (control-token partition first)
//   BM_TokenizerEncode/kind:1..3  prose only, code only, Chinese only
//   BM_PreTokenizerSplit     the regex split alone (where the time goes)
//   BM_ByteScan              memchr over the same bytes for a byte that is not there (a strlen-style read)
//
// Build and run (Release, your own build directory):
//   cmake -S . -B build/<dir> -G Ninja -DCMAKE_BUILD_TYPE=Release -DKESTREL_BENCH=ON -DKESTREL_CUDA=OFF
//   cmake --build build/<dir> --target bench_tokenizer && build/<dir>/bin/bench_tokenizer
#include <benchmark/benchmark.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/tokenizer/hf_tokenizer_json.h"
#include "core/tokenizer/pretokenizer.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/utf8.h"

namespace kestrel {
namespace {

constexpr size_t kTextBytes = 4 << 20;

std::string prose(std::mt19937& rng) {
  static const char* const kWords[] = {
      "the",       "of",     "and",    "to",        "in",        "a",         "is",         "that",    "for",
      "it",        "as",     "was",    "with",      "be",        "by",        "on",         "not",     "he",
      "this",      "are",    "or",     "his",       "from",      "at",        "which",      "but",     "have",
      "an",        "had",    "they",   "you",       "were",      "their",     "one",        "all",     "we",
      "can",       "her",    "has",    "there",     "been",      "if",        "more",       "when",    "will",
      "would",     "who",    "so",     "no",        "model",     "inference", "tokenizer",  "daemon",  "memory",
      "bandwidth", "expert", "layer",  "attention", "recurrent", "state",     "throughput", "latency", "kernel",
      "Kestrel",   "Qwen",   "GPU",    "however",   "although",  "therefore", "meanwhile",  "don't",   "it's",
      "they're",   "we've",  "I'll",   "1984",      "3.14159",   "2026",      "e.g.",       "i.e.",    "naïve",
      "café",      "résumé", "Zürich", "São",       "Paulo"};
  std::string s;
  const int n = 40 + static_cast<int>(rng() % 80);
  for (int i = 0; i < n; ++i) {
    std::string w = kWords[rng() % std::size(kWords)];
    if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
    s += w;
    const unsigned r = rng() % 20;
    s += r == 0 ? ", " : r == 1 ? ". " : r == 2 ? "; " : r == 3 ? " (" : " ";
  }
  s += ".\n\n";
  return s;
}

std::string code(std::mt19937& rng) {
  static const char* const kLines[] = {
      "for (size_t i = 0; i < n; ++i) {",
      "  out.push_back(static_cast<int32_t>(ids[i]));",
      "if (!status) return status.error();",
      "const auto* p = reinterpret_cast<const uint8_t*>(data);",
      "std::vector<float> logits(n_vocab, 0.0f);  // f32 [n_vocab]",
      "x = (a + b) * c - d / 2;",
      "return make_error(ErrorCode::kInvalidArgument, \"bad id \" + std::to_string(id));",
      "def forward(self, hidden_states, attention_mask=None):",
      "    return self.proj(torch.nn.functional.silu(x)) @ w.T",
      "}",
      "#include <unordered_map>",
      "while (pos < text.size() && text[pos] != '\\n') ++pos;"};
  std::string s;
  const int n = 5 + static_cast<int>(rng() % 30);
  for (int i = 0; i < n; ++i) {
    s.append(static_cast<size_t>(2 * (rng() % 4)), ' ');
    s += kLines[rng() % std::size(kLines)];
    s += '\n';
  }
  s += '\n';
  return s;
}

std::string cjk(std::mt19937& rng) {
  static const char* const kPunct[] = {"，", "。", "、", "：", "“", "”", "（", "）"};
  std::string s;
  const int n = 30 + static_cast<int>(rng() % 120);
  for (int i = 0; i < n; ++i) {
    // Mostly frequent ideographs (the first few thousand of the block), sometimes rarer ones.
    const uint32_t cp = 0x4E00 + (rng() % 8 == 0 ? rng() % 20000 : rng() % 3000);
    utf8_append(cp, s);
    if (rng() % 12 == 0) s += kPunct[rng() % std::size(kPunct)];
  }
  s += "。\n";
  return s;
}

std::string vector_inputs() {
  std::ifstream in(KESTREL_SOURCE_DIR "/tests/data/tokenizer/vectors/qwen2.inp", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  for (size_t pos; (pos = s.find("__ggml_vocab_test__")) != std::string::npos;) s.erase(pos, 19);
  return s;
}

// Text kinds: 0 mixed (the figure in docs/benchmarks.md), 1 prose, 2 code, 3 Chinese.
const std::string& bench_text(int kind = 0) {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> all;
    const std::string vectors = vector_inputs();
    for (int k = 0; k < 4; ++k) {
      std::mt19937 rng(20260101);
      std::string t;
      t.reserve(kTextBytes + 4096);
      while (t.size() < kTextBytes) {
        const unsigned pick = k == 0 ? rng() % 10 : k == 1 ? 0 : k == 2 ? 5 : 8;
        t += pick < 5 ? prose(rng) : pick < 8 ? code(rng) : pick < 9 ? cjk(rng) : vectors;
      }
      all.push_back(std::move(t));
    }
    return all;
  }();
  return texts[static_cast<size_t>(kind)];
}

const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    auto vocab =
        load_hf_tokenizer_json(KESTREL_SOURCE_DIR "/tests/data/tokenizer/qwen3/tokenizer.json", "qwen2", 151936);
    if (!vocab) {
      std::fprintf(stderr, "bench_tokenizer: %s\n", vocab.error().to_string().c_str());
      std::abort();
    }
    auto t = Tokenizer::from_vocab(std::move(*vocab));
    if (!t) {
      std::fprintf(stderr, "bench_tokenizer: %s\n", t.error().to_string().c_str());
      std::abort();
    }
    return std::move(*t);
  }();
  return tok;
}

void encode_bench(benchmark::State& state, bool parse_special) {
  const Tokenizer& tok = tokenizer();
  const std::string& text = bench_text(static_cast<int>(state.range(0)));
  size_t n_tokens = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = tok.encode(text, parse_special);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(n_tokens) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_TokenizerEncode(benchmark::State& state) { encode_bench(state, false); }
void BM_TokenizerEncodeSpecial(benchmark::State& state) { encode_bench(state, true); }

void BM_PreTokenizerSplit(benchmark::State& state) {
  auto pre = PreTokenizer::create("qwen2");
  if (!pre) {
    state.SkipWithError(pre.error().to_string().c_str());
    return;
  }
  const std::string& text = bench_text();
  std::vector<TextSpan> pieces;
  for (auto _ : state) {
    pieces.clear();
    pre->split(text, pieces);
    benchmark::DoNotOptimize(pieces.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["pieces"] = static_cast<double>(pieces.size());
}

void BM_ByteScan(benchmark::State& state) {
  const std::string& text = bench_text();
  for (auto _ : state) {
    // The text holds no NUL byte: memchr reads all of it, as strlen would.
    const void* hit = std::memchr(text.data(), '\0', text.size());
    benchmark::DoNotOptimize(hit);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

BENCHMARK(BM_TokenizerEncode)->Unit(benchmark::kMillisecond)->MinTime(2.0)->Arg(0);
BENCHMARK(BM_TokenizerEncodeSpecial)->Unit(benchmark::kMillisecond)->MinTime(2.0)->Arg(0);
BENCHMARK(BM_TokenizerEncode)->Unit(benchmark::kMillisecond)->MinTime(1.0)->ArgName("kind")->Arg(1)->Arg(2)->Arg(3);
BENCHMARK(BM_PreTokenizerSplit)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_ByteScan)->Unit(benchmark::kMicrosecond)->MinTime(1.0);

}  // namespace
}  // namespace kestrel

BENCHMARK_MAIN();
