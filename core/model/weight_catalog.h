// WeightCatalog: every weight of a model, found in a GGUF file, checked against expected_tensors() and exposed as
// typed per-layer references (model-spec §6.2, §6.4).
//
// build() detects the layout (legacy qwen3next `ssm_in`, tied output when `output.weight` is absent), finds every
// expected tensor, checks its shape (trailing 1-sized dims compare equal: {H} == {H, 1}) and its type, and reports
// ALL problems at once in one Error ("3 problems: missing blk.4.ssm_a; blk.7.attn_q.weight has shape ...; ...").
// Tensors of MTP/nextn blocks (blk.N with n_layer <= N < block_count) are not used; they are counted as skipped.
// Any other tensor the model does not have is a problem (llama.cpp refuses such files too).
//
// Type policy (what the reference forward pass can compute with, core/quant/quant.h):
//   - big weights (TensorSpec::quantizable): any type quant_can_dequantize() accepts
//     (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K);
//   - the router ffn_gate_inp and the shared-expert gate ffn_gate_inp_shexp: F32, F16 or BF16 (llama.cpp runs them
//     as matrix products, so a converter's F16/BF16 output works there; llama-quantize never quantizes them);
//   - every other non-quantizable tensor (norms, ssm_a, ssm_dt.bias, ssm_conv1d): F32 only (llama.cpp's element-wise
//     and ssm_conv kernels require F32 and every converter writes F32).
//
// Ownership: the catalog points into the GgufFile it was built from (tensor infos and mapped data); that file must
// outlive it (moving the GgufFile is fine: neither the info table nor the mapping moves). Immutable after build();
// const methods are thread-safe.
#pragma once

#include <array>
#include <cassert>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/gguf/gguf_reader.h"
#include "core/model/model_hparams.h"
#include "core/model/tensor_layout.h"

namespace kestrel {

// One tensor of the file: its info (name, ne, type) and its raw bytes (ggml block layout, never expanded).
// An empty TensorRef (info == nullptr) marks a role this layer/layout does not have.
struct TensorRef {
  const GgufTensorInfo* info = nullptr;
  std::span<const uint8_t> data;  // raw blocks, info->n_bytes bytes inside the file mapping

  bool present() const { return info != nullptr; }
  explicit operator bool() const { return present(); }
  const std::string& name() const { return checked().name; }
  const std::vector<uint64_t>& ne() const { return checked().ne; }
  uint64_t ne_at(size_t i) const { return i < checked().ne.size() ? checked().ne[i] : 1; }  // 1 past the last dim
  GgmlType type() const { return checked().type; }
  uint64_t n_elements() const { return checked().n_elements; }
  uint64_t n_bytes() const { return checked().n_bytes; }
  uint64_t rows() const { return checked().rows(); }  // n_elements / ne[0]

 private:
  const GgufTensorInfo& checked() const {
    assert(info != nullptr && "TensorRef: role not present in this layer/layout");
    return *info;
  }
};

// Gated DeltaNet weights (model-spec §3, §6.2). Exactly one input layout is present:
//   split (qkv + gate, and ba for qwen3next or beta + alpha for qwen35*), or legacy qwen3next (ssm_in + ba).
struct GdnWeights {
  TensorRef qkv;      // attn_qkv.weight  {H, 2·key_dim + value_dim}   rows [Q | K | V]
  TensorRef gate;     // attn_gate.weight {H, value_dim}               z projection
  TensorRef ssm_in;   // ssm_in.weight    {H, 2·key_dim + 2·value_dim} legacy qwen3next (per-K-group [q,k,v,z])
  TensorRef ba;       // ssm_ba.weight    {H, 2·Vh}                    qwen3next, per-K-group [b(r), a(r)]
  TensorRef beta;     // ssm_beta.weight  {H, Vh}                      qwen35*
  TensorRef alpha;    // ssm_alpha.weight {H, Vh}                      qwen35*
  TensorRef conv1d;   // ssm_conv1d.weight {K, conv_dim}               f32, w[c][i] at c·K + i
  TensorRef dt_bias;  // ssm_dt.bias      {Vh}                         f32
  TensorRef a;        // ssm_a            {Vh}                         f32, −exp(A_log)
  TensorRef norm;     // ssm_norm.weight  {dv}                         f32, gated-norm weight (no +1)
  TensorRef out;      // ssm_out.weight   {value_dim, H}
};

// Gated full-attention weights (model-spec §4).
struct AttentionWeights {
  TensorRef q;       // attn_q.weight      {H, n_head·2·hd}  per-head [q | gate]
  TensorRef k;       // attn_k.weight      {H, n_kv·hd}
  TensorRef v;       // attn_v.weight      {H, n_kv·hd}
  TensorRef o;       // attn_output.weight {n_head·hd, H}
  TensorRef q_norm;  // attn_q_norm.weight {hd}  f32
  TensorRef k_norm;  // attn_k_norm.weight {hd}  f32
};

// FFN weights (model-spec §5): MoE (router, routed experts, optional shared expert) or dense SwiGLU.
struct FfnWeights {
  // MoE
  TensorRef router;           // ffn_gate_inp.weight       {H, E}
  TensorRef gate_exps;        // ffn_gate_exps.weight      {H, I_e, E}
  TensorRef up_exps;          // ffn_up_exps.weight        {H, I_e, E}
  TensorRef down_exps;        // ffn_down_exps.weight      {I_e, H, E}
  TensorRef shared_gate_inp;  // ffn_gate_inp_shexp.weight {H} or {H, 1}: scalar sigmoid gate of the shared expert
  TensorRef gate_shexp;       // ffn_gate_shexp.weight     {H, I_s}
  TensorRef up_shexp;         // ffn_up_shexp.weight       {H, I_s}
  TensorRef down_shexp;       // ffn_down_shexp.weight     {I_s, H}
  // Dense (qwen35)
  TensorRef gate;  // ffn_gate.weight {H, I}
  TensorRef up;    // ffn_up.weight   {H, I}
  TensorRef down;  // ffn_down.weight {I, H}

  bool is_moe() const { return router.present(); }
  bool has_shared_expert() const { return gate_shexp.present(); }
};

struct LayerWeights {
  uint32_t index = 0;
  LayerKind kind = LayerKind::kGatedDeltaNet;
  TensorRef attn_norm;            // attn_norm.weight {H} f32 (+1 baked)
  TensorRef post_attention_norm;  // post_attention_norm.weight {H} f32 (+1 baked)
  GdnWeights gdn;                 // filled when kind == kGatedDeltaNet
  AttentionWeights attn;          // filled when kind == kFullAttention
  FfnWeights ffn;
};

struct GlobalWeights {
  TensorRef token_embd;   // token_embd.weight {H, vocab}
  TensorRef output_norm;  // output_norm.weight {H} f32
  TensorRef output;       // output.weight {H, vocab}; the token_embd tensor itself when tied
  bool tied_output = false;
};

// One tensor of the file as the catalog classified it (file order).
struct CatalogEntry {
  const GgufTensorInfo* info = nullptr;
  int32_t layer = -1;  // block index, -1 for globals
  PlacementClass placement = PlacementClass::kDense;
  bool skipped = false;  // MTP/nextn block: present in the file, not used
};

struct TypeBytes {
  GgmlType type = GgmlType::kF32;
  uint64_t n_tensors = 0;
  uint64_t bytes = 0;
};

inline constexpr size_t kNumPlacementClasses = 4;

class WeightCatalog {
 public:
  // Checks `file` against expected_tensors(hp, detected layout); the error lists every problem found.
  // kUnsupported when the only problems are tensor types, kInvalidArgument otherwise.
  static Expected<WeightCatalog> build(const GgufFile& file, const ModelHparams& hp);

  const ModelHparams& hparams() const { return hp_; }
  const LayoutOptions& layout() const { return layout_; }
  const GlobalWeights& globals() const { return globals_; }
  const LayerWeights& layer(uint32_t i) const {
    assert(i < layers_.size());
    return layers_[i];
  }
  const std::vector<LayerWeights>& layers() const { return layers_; }

  // Every tensor of the file in file order, used or skipped.
  const std::vector<CatalogEntry>& entries() const { return entries_; }

  // Byte accounting over the used tensors (skipped ones excluded; the tied output is counted once).
  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t n_used_tensors() const { return n_used_; }
  uint64_t bytes_in(PlacementClass c) const { return placement_bytes_[static_cast<size_t>(c)]; }
  const std::vector<TypeBytes>& bytes_by_type() const { return type_bytes_; }  // largest first
  // Skipped (MTP/nextn) tensors.
  uint64_t n_skipped() const { return n_skipped_; }
  uint64_t skipped_bytes() const { return skipped_bytes_; }

 private:
  WeightCatalog() = default;

  ModelHparams hp_;
  LayoutOptions layout_;
  GlobalWeights globals_;
  std::vector<LayerWeights> layers_;
  std::vector<CatalogEntry> entries_;
  uint64_t total_bytes_ = 0;
  uint64_t n_used_ = 0;
  std::array<uint64_t, kNumPlacementClasses> placement_bytes_{};
  std::vector<TypeBytes> type_bytes_;
  uint64_t n_skipped_ = 0;
  uint64_t skipped_bytes_ = 0;
};

// "{2048, 1}" == "{2048}": shapes equal after dropping trailing 1-sized dims.
bool shapes_equivalent(std::span<const uint64_t> a, std::span<const uint64_t> b);

}  // namespace kestrel
