// The tensors a model of given hparams has in a GGUF file, by name, shape and role (model-spec §6.2).
//
// expected_tensors() is the single source of truth used by the weight catalog (to check a file) and by
// kestrel-mkmodel (to write one): every global tensor, and per layer the norm, GDN or attention, and MoE or dense
// FFN tensors. Shapes are in ggml ne order ({n_in, n_out[, n_expert]}).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/model_hparams.h"

namespace kestrel {

// Where a tensor belongs for placement accounting (design.md §3 "Placement").
enum class PlacementClass {
  kEmbedding,      // token_embd, output (lm_head), output_norm
  kDense,          // per-layer norms, GDN, attention, dense FFN, router: resident on the GPU when it exists
  kRoutedExperts,  // ffn_{gate,up,down}_exps
  kSharedExpert,   // ffn_*_shexp
};
std::string_view placement_class_name(PlacementClass c);

struct TensorSpec {
  std::string name;          // "blk.3.attn_q.weight"
  std::vector<uint64_t> ne;  // ggml order
  int32_t layer = -1;        // -1 for globals
  PlacementClass placement = PlacementClass::kDense;
  bool optional = false;    // e.g. output.weight (absent: tied to token_embd)
  bool quantizable = true;  // false: stays F32 in real files (norms, ssm_a, dt bias, conv1d, router)
};

enum class GdnInputLayout {
  kSplit,       // attn_qkv + attn_gate (+ ssm_ba for qwen3next, ssm_beta + ssm_alpha for qwen35*)
  kLegacySsmIn  // qwen3next only: ssm_in (HF in_proj_qkvz unchanged) + ssm_ba
};

struct LayoutOptions {
  GdnInputLayout gdn_input = GdnInputLayout::kSplit;
  bool tied_output = false;  // omit output.weight
};

std::vector<TensorSpec> expected_tensors(const ModelHparams& hp, const LayoutOptions& options = {});

}  // namespace kestrel
