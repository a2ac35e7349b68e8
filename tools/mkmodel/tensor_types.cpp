// choose_tensor_types(): the Q4_K_M mix of llama-quantize, or one uniform type (see tensor_types.h for the rules).
#include "tools/mkmodel/tensor_types.h"

#include <string>
#include <string_view>

#include "tools/mkmodel/block_generator.h"
#include "tools/mkmodel/weight_init.h"

namespace kestrel::mkmodel {

namespace {

bool is_k_quant(GgmlType t) { return t == GgmlType::kQ4_K || t == GgmlType::kQ5_K || t == GgmlType::kQ6_K; }

// A type Kestrel computes with whose block fits a row of ne0 elements.
GgmlType fit_row(GgmlType wanted, uint64_t ne0) {
  const uint64_t block = ggml_type_traits(wanted).block_elems;
  if (ne0 % block == 0) return wanted;
  GgmlType fallback = GgmlType::kF16;
  if (is_k_quant(wanted)) fallback = wanted == GgmlType::kQ4_K ? GgmlType::kQ4_0 : GgmlType::kQ8_0;
  if (ne0 % ggml_type_traits(fallback).block_elems != 0) fallback = GgmlType::kF16;
  return fallback;
}

}  // namespace

bool use_more_bits(int32_t i, int32_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

Expected<std::vector<GgmlType>> choose_tensor_types(const ModelHparams& hp, const std::vector<TensorSpec>& specs,
                                                    std::optional<GgmlType> uniform) {
  std::vector<GgmlType> types;
  types.reserve(specs.size());

  if (uniform) {
    if (!block_generator_supports(*uniform)) {
      return make_error(ErrorCode::kUnsupported, "--types " + std::string(ggml_type_name(*uniform)) +
                                                     ": kestrel-mkmodel writes f32, f16, bf16, q8_0, q4_0, q4_K, "
                                                     "q5_K or q6_K");
    }
    const uint64_t block = ggml_type_traits(*uniform).block_elems;
    for (const TensorSpec& s : specs) {
      if (!s.quantizable) {
        types.push_back(GgmlType::kF32);
        continue;
      }
      if (s.ne.empty() || s.ne[0] % block != 0) {
        return make_error(ErrorCode::kInvalidArgument,
                          "--types " + std::string(ggml_type_name(*uniform)) + ": tensor " + s.name + " has rows of " +
                              std::to_string(s.ne.empty() ? 0 : s.ne[0]) + " elements, not a multiple of the " +
                              std::to_string(block) + "-element block");
      }
      types.push_back(*uniform);
    }
    return types;
  }

  bool tied = true;
  int32_t n_attention_wv = 0;
  for (const TensorSpec& s : specs) {
    const std::string_view base = tensor_base_name(s.name);
    if (s.name == "output.weight") tied = false;
    if (base == "attn_v.weight" || base == "attn_qkv.weight") ++n_attention_wv;
  }
  const int32_t n_layer = static_cast<int32_t>(hp.n_layer);

  int32_t i_attention_wv = 0;
  for (const TensorSpec& s : specs) {
    const std::string_view base = tensor_base_name(s.name);
    if (!s.quantizable) {
      types.push_back(GgmlType::kF32);
      continue;
    }
    GgmlType t = GgmlType::kQ4_K;
    if (s.name == "output.weight" || (tied && s.name == "token_embd.weight")) {
      t = s.ne[0] % 256 == 0 ? GgmlType::kQ6_K : GgmlType::kQ8_0;
    } else if (base == "attn_qkv.weight") {
      t = GgmlType::kQ5_K;
    } else if (base == "attn_v.weight") {
      if (use_more_bits(i_attention_wv, n_attention_wv)) t = GgmlType::kQ6_K;
      ++i_attention_wv;
    } else if (base.substr(0, 8) == "ffn_down") {
      if (use_more_bits(s.layer, n_layer)) t = GgmlType::kQ6_K;
    }
    types.push_back(fit_row(t, s.ne.empty() ? 0 : s.ne[0]));
  }
  return types;
}

uint32_t file_type_for(std::optional<GgmlType> uniform) {
  if (!uniform) return kFileTypeQ4KM;
  switch (*uniform) {
    case GgmlType::kF32: return 0;
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    case GgmlType::kQ8_0: return 7;
    case GgmlType::kQ4_K: return 14;
    case GgmlType::kQ5_K: return 16;
    case GgmlType::kQ6_K: return 18;
    case GgmlType::kBF16: return 32;
    default: return kFileTypeQ4KM;
  }
}

}  // namespace kestrel::mkmodel
