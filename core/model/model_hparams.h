// ModelHparams: the hyper-parameters of a qwen35moe / qwen35 / qwen3next model, read and validated from GGUF
// metadata (model-spec.md §1, §6.1).
//
// from_gguf() reads `general.architecture` and the `<arch>.*` keys, derives what the spec derives (layer kinds from
// full_attention_interval or attention.recurrent_layers, n_layer = block_count - nextn_predict_layers, head dims),
// and refuses inconsistent values with a message naming the key (e.g. ssm.inner_size not divisible by
// ssm.time_step_rank, head_count not a multiple of head_count_kv, Vh not a multiple of Kh, dk != dv).
// Plain value type; thread-safe to share const.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"

namespace kestrel {

class GgufFile;

enum class Arch { kQwen35Moe, kQwen35, kQwen3Next };

std::string_view arch_name(Arch arch);  // "qwen35moe", "qwen35", "qwen3next"
Expected<Arch> arch_from_name(std::string_view name);

enum class LayerKind { kGatedDeltaNet, kFullAttention };

// Which K-head feeds V-head h: grouped (h / r; qwen3next GGUF, HF) or tiled (h % Kh; qwen35* GGUF), model-spec §6.3.
enum class HeadMapping { kGrouped, kTiled };

struct ModelHparams {
  Arch arch = Arch::kQwen35Moe;
  uint32_t n_layer = 0;      // main layers (block_count minus MTP layers)
  uint32_t n_block = 0;      // block_count as stored (includes MTP blocks)
  uint32_t n_nextn = 0;      // nextn_predict_layers (MTP blocks, skipped)
  uint32_t n_embd = 0;       // H
  uint32_t n_vocab = 0;      // rows of token_embd
  uint32_t n_ctx_train = 0;  // context_length
  // Full attention
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;  // key_length == value_length
  uint32_t n_rot = 0;     // rope.dimension_count
  float rope_freq_base = 0.0f;
  std::vector<int32_t> rope_sections;  // qwen35*: [11, 11, 10, 0]; empty for qwen3next
  float rms_eps = 1e-6f;
  // Gated DeltaNet
  uint32_t ssm_conv_kernel = 0;  // 4
  uint32_t ssm_d_state = 0;      // dk (== dv)
  uint32_t ssm_n_k_heads = 0;    // Kh (ssm.group_count)
  uint32_t ssm_n_v_heads = 0;    // Vh (ssm.time_step_rank)
  uint32_t ssm_inner = 0;        // Vh * dv (ssm.inner_size)
  // FFN
  uint32_t n_expert = 0;  // 0 for dense
  uint32_t n_expert_used = 0;
  uint32_t n_ff_expert = 0;            // expert_feed_forward_length
  uint32_t n_ff_shared = 0;            // expert_shared_feed_forward_length (0: no shared expert)
  uint32_t n_ff_dense = 0;             // feed_forward_length (dense qwen35)
  bool norm_topk_prob = true;          // always true for these archs (llama.cpp hard-codes it)
  std::vector<LayerKind> layer_kinds;  // [n_layer]

  bool is_moe() const { return n_expert > 0; }
  uint32_t ssm_head_v_dim() const { return ssm_n_v_heads ? ssm_inner / ssm_n_v_heads : 0; }
  uint32_t ssm_key_dim() const { return ssm_n_k_heads * ssm_d_state; }     // Kh * dk
  uint32_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_inner; }  // channels of the conv
  HeadMapping head_mapping() const { return arch == Arch::kQwen3Next ? HeadMapping::kGrouped : HeadMapping::kTiled; }
  uint32_t n_gdn_layers() const;
  uint32_t n_attn_layers() const;

  static Expected<ModelHparams> from_gguf(const GgufFile& file);
  // Checks internal consistency (every from_gguf result passed it); used by mkmodel before writing.
  Status validate() const;
};

}  // namespace kestrel
