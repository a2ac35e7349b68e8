// Tokenizer: byte-level BPE as llama.cpp's "gpt2" model with the "qwen2" / "qwen35" pre-tokenizers (model-spec §10).
//
// Built from a vocabulary (tokens, token types, merges, pre-tokenizer name, special ids) that comes from GGUF
// metadata (from_gguf) or from a caller (from_vocab, used by tests and kestrel-mkmodel). Immutable once built:
// encode/decode are const and thread-safe.
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
  std::string model = "gpt2";          // tokenizer.ggml.model
  std::string pre = "qwen2";           // tokenizer.ggml.pre: "qwen2" or "qwen35"
  std::vector<std::string> tokens;     // id → token text (byte-level encoded, as GGUF stores it)
  std::vector<TokenType> types;        // id → type
  std::vector<std::string> merges;     // "a b", highest priority first
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  int32_t bos_id = -1;                 // -1: none (Qwen adds no BOS)
};

class Tokenizer {
 public:
  static Expected<Tokenizer> from_vocab(TokenizerVocab vocab);
  static Expected<Tokenizer> from_gguf(const GgufFile& file);

  // Token ids of `text`. parse_special: match control/user-defined tokens ("<|im_start|>") before splitting.
  // Invalid UTF-8 is encoded byte-for-byte (byte-level BPE covers every byte).
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
  // Bytes of the token sequence; kInvalidArgument for an id outside the vocabulary.
  Expected<std::string> decode(std::span<const int32_t> ids) const;
  // Bytes of one token (may be a partial UTF-8 sequence); kInvalidArgument for an unknown id.
  Expected<std::string> token_bytes(int32_t id) const;

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
