// Fuzz target for the tokenizer (core/tokenizer/tokenizer.h) on the real Qwen3 vocabulary
// (tests/data/tokenizer/qwen3/tokenizer.json, 151 936 ids, both pre-tokenizers): any bytes → ids → bytes must give
// the bytes back, with and without special-token parsing (tokenizer.h promises decode(encode(x)) == x for every x).
//
// Input: [flags u8: bit 0 parse_special, bit 1 the "qwen35" pre-tokenizer instead of "qwen2"][text...]. Invariants:
// every id is inside the vocabulary, token_bytes() of the ids concatenate to decode()'s bytes, decode gives the text
// back, no id decodes to nothing (each consumed at least one byte), and encoding is deterministic (a second encode
// of the same text gives the same ids). The two tokenizers are built once per process. Built as fuzz_tokenizer
// (libFuzzer) and fuzz_tokenizer_smoke.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/tokenizer/hf_tokenizer_json.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace kestrel;
using kestrel::fuzz::fuzz_check;

void check(bool ok, const char* what) { fuzz_check(ok, "fuzz_tokenizer", what); }

Tokenizer load(const char* pre) {
  auto vocab = load_hf_tokenizer_json(KESTREL_FUZZ_TOKENIZER_JSON, pre, 151936);
  if (!vocab) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", vocab.error().message.c_str());
    std::abort();
  }
  auto tok = Tokenizer::from_vocab(std::move(vocab).value());
  if (!tok) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", tok.error().message.c_str());
    std::abort();
  }
  return std::move(tok).value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  static const Tokenizer qwen2 = load("qwen2");
  static const Tokenizer qwen35 = load("qwen35");
  fuzz::FuzzInput in(bytes, size);
  const uint8_t flags = in.u8();
  const bool parse_special = (flags & 1) != 0;
  const Tokenizer& tok = (flags & 2) != 0 ? qwen35 : qwen2;
  const std::string_view text = in.rest();

  const std::vector<int32_t> ids = tok.encode(text, parse_special);
  std::string joined;
  for (const int32_t id : ids) {
    check(id >= 0 && id < tok.n_vocab(), "ids are inside the vocabulary");
    auto piece = tok.token_bytes(id);
    check(piece.has_value(), "every id has bytes");
    check(!piece->empty(), "every id consumed at least one byte");
    joined.append(*piece);
  }
  auto decoded = tok.decode(ids);
  check(decoded.has_value(), "the ids decode");
  check(*decoded == joined, "decode is the concatenation of token_bytes");
  check(*decoded == text, "decode(encode(text)) == text");
  check(ids.size() <= text.size(), "at most one id per byte");
  check(tok.encode(text, parse_special) == ids, "encoding is deterministic");
  return 0;
}
