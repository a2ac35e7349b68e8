// The tokenizer's GGUF metadata: writing a TokenizerVocab as tokenizer.ggml.* keys and reading it back.
//
// Keys (llama.cpp's names and value types, model-spec §10):
//   tokenizer.ggml.model             string       "gpt2"
//   tokenizer.ggml.pre               string       "qwen2" | "qwen35"
//   tokenizer.ggml.tokens            [string]     one per id
//   tokenizer.ggml.token_type        [int32]      TokenType, one per id
//   tokenizer.ggml.merges            [string]     "a b", priority order
//   tokenizer.ggml.eos_token_id      uint32
//   tokenizer.ggml.padding_token_id  uint32       only when the vocab has one
//   tokenizer.ggml.bos_token_id      uint32       only when the vocab has one
//   tokenizer.ggml.add_bos_token     bool         false (Qwen adds no BOS)
//   tokenizer.chat_template          string       only when the vocab has one
// Reading requires model, pre, tokens, token_type, merges and eos_token_id; padding/bos/chat_template are
// optional; add_bos_token is not read (Kestrel never adds a BOS). Thread-safety: as GgufWriter / GgufFile.
#pragma once

#include "core/base/expected.h"
#include "core/tokenizer/tokenizer.h"

namespace kestrel {

class GgufWriter;

// Adds the keys above to `writer` (before its write_header()). kInvalidArgument when the vocab is inconsistent
// (types/tokens lengths differ, eos missing or out of range) or a key is already present.
Status write_tokenizer_metadata(GgufWriter& writer, const TokenizerVocab& vocab);

// Reads the keys above. kNotFound names a missing key; kInvalidArgument a key of the wrong type, arrays of different
// lengths or an unknown token type; kOutOfRange a special id outside the vocabulary; kUnsupported a model other than
// "gpt2" or a pre-tokenizer other than "qwen2"/"qwen35".
Expected<TokenizerVocab> read_tokenizer_vocab(const GgufFile& file);

}  // namespace kestrel
