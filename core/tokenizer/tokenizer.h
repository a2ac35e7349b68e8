// Tokenizer: byte-level BPE as llama.cpp's "gpt2" model with the "qwen2" / "qwen35" pre-tokenizers (model-spec §10).
//
// Built from a vocabulary (tokens, token types, merges, pre-tokenizer name, special ids) that comes from GGUF
// metadata (from_gguf, core/tokenizer/tokenizer_gguf.h), from a Hugging Face tokenizer.json
// (core/tokenizer/hf_tokenizer_json.h) or from a caller (from_vocab, used by tests and kestrel-mkmodel).
//
// encode() reproduces llama_tokenize(text, add_special = false, parse_special) token for token:
//   1. special tokens are cut out first (core/tokenizer/special_tokens.h: user-defined tokens always, control tokens
//      when parse_special);
//   2. each remaining fragment is split by the pre-tokenizer regex (core/tokenizer/pretokenizer.h);
//   3. each piece's bytes are merged by rank (core/tokenizer/bpe.h) into token ids.
// No BOS/EOS is added (Qwen adds none) and no Unicode normalization is applied (llama.cpp applies none either; the
// Hugging Face tokenizer NFC-normalizes, so the two differ only on non-NFC input). Any byte string is accepted:
// invalid UTF-8 is split as llama.cpp would split U+FFFD but keeps its bytes, so decode(encode(x)) == x for every x.
//
// decode() concatenates token_bytes(): normal tokens map back through the GPT-2 byte table; control, user-defined
// and unknown tokens give their text; unused/undefined tokens ("[PAD151700]") give nothing, as in llama.cpp.
//
// Ownership and threads: a Tokenizer owns its vocabulary and tables; it is immutable once built, so every const
// method may be called from any number of threads at once. Move-only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"

namespace kestrel {

class GgufFile;

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct TokenizerVocab {
  std::string model = "gpt2";       // tokenizer.ggml.model
  std::string pre = "qwen2";        // tokenizer.ggml.pre: "qwen2" or "qwen35"
  std::vector<std::string> tokens;  // id → token text (byte-level encoded for normal tokens, as GGUF stores it)
  std::vector<TokenType> types;     // id → type; same length as tokens
  std::vector<std::string> merges;  // "a b", highest priority first
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  int32_t bos_id = -1;        // -1: none (Qwen adds no BOS)
  std::string chat_template;  // tokenizer.chat_template (Jinja); empty: none
};

class Tokenizer {
 public:
  // Validates and indexes `vocab`: model must be "gpt2" (kUnsupported otherwise), pre "qwen2" or "qwen35"
  // (kUnsupported), types as many as tokens with known values, eos/pad/bos -1 or a valid id, merges well formed
  // (kInvalidArgument naming the offending entry).
  static Expected<Tokenizer> from_vocab(TokenizerVocab vocab);
  // Reads the tokenizer.ggml.* keys (tokenizer_gguf.h) and calls from_vocab.
  static Expected<Tokenizer> from_gguf(const GgufFile& file);

  // Token ids of `text` (any bytes). parse_special: match control tokens ("<|im_start|>") before splitting;
  // user-defined tokens ("<think>") are matched either way.
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
  // Bytes of the token sequence; kInvalidArgument for an id outside the vocabulary.
  Expected<std::string> decode(std::span<const int32_t> ids) const;
  // Bytes of one token (may be a partial UTF-8 sequence); kInvalidArgument for an unknown id. The view lives as
  // long as the Tokenizer.
  Expected<std::string_view> token_bytes(int32_t id) const;

  // The id whose token text is exactly `text` (byte-level form for normal tokens, e.g. "Ġthe"), or -1.
  int32_t find_token(std::string_view text) const;
  // Type of a valid id (kUndefined for an id outside the vocabulary).
  TokenType token_type(int32_t id) const;

  int32_t n_vocab() const;
  const TokenizerVocab& vocab() const;
  bool is_control(int32_t id) const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel
