// GgmlType: the tensor element types a GGUF file can name, with their block geometry.
//
// Numeric values are ggml's `enum ggml_type` (they are what GGUF stores on disk). Kestrel knows the block size and
// byte size of every type so it can validate and describe any GGUF file, including types it cannot compute with;
// which types it can (de)quantize is core/quant/quant.h's business.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/base/expected.h"

namespace kestrel {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  std::string_view name;  // ggml's name, e.g. "q4_K"
  uint32_t block_elems;   // elements per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block
};

// Traits of a known type; nullopt for a value that is not a ggml type (e.g. read from a corrupt file).
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type);
GgmlTypeTraits ggml_type_traits(GgmlType type);  // type must be a known enumerator

std::string_view ggml_type_name(GgmlType type);
// Case-insensitive lookup by name ("q4_k", "Q4_K", "bf16"); error names the known types.
Expected<GgmlType> ggml_type_from_name(std::string_view name);

// Bytes of a row of `n_elems` elements; error (kInvalidArgument) if n_elems is not a multiple of the block size.
Expected<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n_elems);

}  // namespace kestrel
