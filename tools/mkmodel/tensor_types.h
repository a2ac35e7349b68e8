// Tensor types of a kestrel-mkmodel file: llama-quantize's Q4_K_M mix (model-spec §6.4), or one type for every
// quantizable weight (--types).
//
// Q4_K_M (as llama.cpp's llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q4_K_M):
//   not quantizable (norms, ssm_a, ssm_dt, conv1d, routers, 1-D tensors)  F32
//   output.weight, and token_embd.weight when the output is tied          Q6_K (Q8_0 when ne0 % 256 != 0)
//   attn_qkv                                                               Q5_K
//   attn_v      Q6_K when use_more_bits(i, n): i = its index among attn_v tensors, n = number of attn_v + attn_qkv
//   ffn_down, ffn_down_exps, ffn_down_shexp   Q6_K when use_more_bits(layer, n_layer)
//   everything else (incl. the untied token_embd)                          Q4_K
//   use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2
// K-quant rows need ne0 % 256 == 0; for smaller rows (the tiny presets) Kestrel falls back to a type it computes with:
// Q4_K -> Q4_0, Q5_K -> Q8_0, Q6_K -> Q8_0 (llama.cpp uses Q5_0/Q5_1/Q8_0), and F16 if ne0 % 32 != 0.
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/model/model_hparams.h"
#include "core/model/tensor_layout.h"

namespace kestrel::mkmodel {

inline constexpr uint32_t kFileTypeQ4KM = 15;  // llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M

bool use_more_bits(int32_t i, int32_t n);

// One type per spec (same order). uniform: every quantizable tensor gets that type; kInvalidArgument naming the first
// tensor whose row length is not a multiple of the type's block size; kUnsupported for a type mkmodel cannot write.
Expected<std::vector<GgmlType>> choose_tensor_types(const ModelHparams& hp, const std::vector<TensorSpec>& specs,
                                                    std::optional<GgmlType> uniform);

// general.file_type (llama_ftype) for the mix or a uniform type: f32 0, f16 1, q4_0 2, q8_0 7, q4_K 14 (Q4_K_S),
// q5_K 16 (Q5_K_S), q6_K 18, bf16 32; the mix is 15 (Q4_K_M).
uint32_t file_type_for(std::optional<GgmlType> uniform);

}  // namespace kestrel::mkmodel
