// The vocabulary step of kestrel-mkmodel: find the Qwen3 tokenizer.json, load it padded to the model's n_vocab rows,
// and add it to a GGUF as tokenizer.ggml.* metadata.
//
// Every preset embeds the real Qwen3 vocabulary (151643 BPE tokens + 26 added, tokenizer.ggml.pre "qwen2"), padded
// with "[PAD<id>]" unused tokens to the preset's rows (151936, or 248320 for Qwen3.5 shapes, whose own vocabulary
// is not available here). Lookup order for tokenizer.json: --vocab PATH; <binary dir>/<bin-to-data>/kestrel/
// tokenizer/qwen3/tokenizer.json (the install tree); the source tree's tests/data/tokenizer/qwen3/tokenizer.json.
// tokenizer_config.json next to it supplies eos/pad and the chat template; --chat-template FILE replaces the template
// (or gives one to the golden presets' truncated vocabulary, which has none).
//
// Pure functions apart from file reads; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/tokenizer.h"

namespace kestrel::mkmodel {

inline constexpr const char* kVocabPre = "qwen2";  // the Qwen3 vocabulary's pre-tokenizer

// The candidate paths, in lookup order (explicit first when non-empty).
std::vector<std::string> vocab_candidates(const std::string& explicit_path);
// The first candidate that exists; an explicit path must exist (kNotFound naming it); otherwise kNotFound listing
// every path tried.
Expected<std::string> find_vocab_file(const std::string& explicit_path);

// Rows of the full Qwen3 vocabulary (151643 BPE + 26 added); smaller n_vocab gives a truncated vocabulary.
inline constexpr uint32_t kQwen3FullVocabRows = 151669;

// The Qwen3 vocabulary padded to n_vocab rows, or, when n_vocab is below the full vocabulary (the golden presets,
// whose fixtures must stay small), truncate_vocab() of it.
Expected<TokenizerVocab> load_vocab(const std::string& tokenizer_json, uint32_t n_vocab);
// The first n_vocab − 3 tokens of `full` (the 256 byte tokens first, then the earliest merges), the merges among
// them, and <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos) as control tokens at the end. A complete byte-level
// BPE vocabulary: every byte string still encodes. kInvalidArgument for n_vocab < 259 or above the full size.
Expected<TokenizerVocab> truncate_vocab(const TokenizerVocab& full, uint32_t n_vocab);

// The whole text of a chat template file (Jinja source, stored as tokenizer.chat_template): kNotFound / kIo when it
// cannot be read, kInvalidArgument when it is empty.
Expected<std::string> read_chat_template_file(const std::string& path);

Status add_vocab_metadata(GgufWriter& writer, const TokenizerVocab& vocab);

}  // namespace kestrel::mkmodel
