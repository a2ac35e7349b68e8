// Test helpers for core/model and the CLI: small hparams per architecture, the GGUF metadata that describes them,
// and a writer for hand-built GGUF files (any metadata, any tensor list) with deterministic tensor bytes.
//
// Files are written under testing::TempDir(); each helper is single-threaded test code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/gguf/gguf_value.h"
#include "core/model/model_hparams.h"
#include "core/model/tensor_layout.h"

namespace kestrel::test {

using Metadata = std::vector<std::pair<std::string, GgufValue>>;

struct TensorDef {
  std::string name;
  std::vector<uint64_t> ne;
  GgmlType type = GgmlType::kF32;
};

// Small but complete hparams: 4 layers (3 GDN + 1 attention at index 3), H = 64, vocab 96.
// qwen35moe / qwen3next: 4 experts (2 used) with a shared expert; qwen35: dense FFN, Vh = 3·Kh.
ModelHparams tiny_hparams(Arch arch);

// EXPECT_EQ on every field of two ModelHparams (one failure line per differing field).
void expect_same_hparams(const ModelHparams& a, const ModelHparams& b);

// The metadata a converter would write for `hp` (general.architecture and every `<arch>.*` key of model-spec §6.1).
Metadata hparams_metadata(const ModelHparams& hp);

// Removes `key` (true if it was there) / sets it, replacing an existing value in place or appending.
bool erase_key(Metadata& md, std::string_view key);
void set_key(Metadata& md, std::string key, GgufValue value);

// expected_tensors(hp, options) as F32 TensorDefs (every type the catalog accepts for every tensor).
std::vector<TensorDef> model_tensors(const ModelHparams& hp, const LayoutOptions& options = {});
TensorDef* find_def(std::vector<TensorDef>& defs, std::string_view name);  // nullptr when absent
bool erase_def(std::vector<TensorDef>& defs, std::string_view name);

// Writes a GGUF v3 file at TempDir()/file_name; tensor i's bytes are all (i % 251) + 1. Returns the path.
// Fails the current test (ADD_FAILURE) and returns "" when the writer refuses.
std::string write_gguf(std::string_view file_name, const Metadata& md, const std::vector<TensorDef>& tensors);

// The byte tensor i of write_gguf's file is filled with.
inline uint8_t fill_byte(size_t tensor_index) { return static_cast<uint8_t>(tensor_index % 251 + 1); }

}  // namespace kestrel::test
