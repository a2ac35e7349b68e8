// The vocabulary step of kestrel-mkmodel: find the Qwen3 tokenizer.json, load it padded to the model's n_vocab rows,
// and add it to a GGUF as tokenizer.ggml.* metadata.
//
// Every preset embeds the real Qwen3 vocabulary (151643 BPE tokens + 26 added, tokenizer.ggml.pre "qwen2"), padded
// with "[PAD<id>]" unused tokens to the preset's rows (151936, or 248320 for Qwen3.5 shapes, whose own vocabulary
// is not available here). Lookup order for tokenizer.json: --vocab PATH; <binary dir>/<bin-to-data>/kestrel/
// tokenizer/qwen3/tokenizer.json (the install tree); the source tree's tests/data/tokenizer/qwen3/tokenizer.json.
// tokenizer_config.json next to it supplies eos/pad and the chat template.
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

Expected<TokenizerVocab> load_vocab(const std::string& tokenizer_json, uint32_t n_vocab);

Status add_vocab_metadata(GgufWriter& writer, const TokenizerVocab& vocab);

}  // namespace kestrel::mkmodel
