// RefModelWeights: the reference ops' views (QuantMatrix, f32 pointers) of every weight of a catalogued model.
//
// Built once from a WeightCatalog: per layer the GdnWeights or AttnWeights of its kind and its MoeWeights or
// DenseFfnWeights, plus the globals (token_embd, output_norm, output — the token_embd tensor itself when tied).
// Views point into the GGUF mapping the catalog points into; that file must outlive them. Immutable; thread-safe.
#pragma once

#include <vector>

#include "core/base/expected.h"
#include "core/model/weight_catalog.h"
#include "core/reference/attention.h"
#include "core/reference/ffn.h"
#include "core/reference/gdn_layer.h"
#include "core/reference/moe.h"

namespace kestrel::ref {

struct RefLayerWeights {
  LayerKind kind = LayerKind::kGatedDeltaNet;
  const float* attn_norm = nullptr;            // f32 [H]
  const float* post_attention_norm = nullptr;  // f32 [H]
  GdnWeights gdn;                              // kind == kGatedDeltaNet
  AttnWeights attn;                            // kind == kFullAttention
  bool is_moe = false;
  MoeWeights moe;         // is_moe
  DenseFfnWeights dense;  // !is_moe
};

struct RefModelWeights {
  ModelHparams hp;
  QuantMatrix token_embd;              // {H, vocab}: row t is token t's embedding
  const float* output_norm = nullptr;  // f32 [H]
  QuantMatrix output;                  // {H, vocab} (token_embd when tied)
  std::vector<RefLayerWeights> layers;

  // Checks every layer's views with the ops' own checks (shapes, types, pointers); kInvalidArgument on a mismatch.
  static Expected<RefModelWeights> from_catalog(const WeightCatalog& catalog);
};

// The view of a catalogued 2-D tensor (ne {n_in, n_out}; a 1-D tensor is viewed as {n, 1}).
QuantMatrix quant_matrix(const TensorRef& t);

}  // namespace kestrel::ref
