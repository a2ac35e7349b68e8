// Gated DeltaNet geometry and per-sequence state (model-spec.md §3, §3.3, §3.5, §6.3).
//
// GdnDims holds the sizes of one GDN layer and which K-head feeds each V-head:
//   grouped (kh = h / r, r = Vh/Kh): HF weights and qwen3next GGUFs;
//   tiled   (kh = h % Kh):           qwen35/qwen35moe GGUFs, whose converter permuted the V heads (§6.3 item 4).
// GdnState is what a sequence carries from one step to the next for one GDN layer:
//   s    f32 [Vh][dk][dv]  recurrent state S_h, element S_h[i][j] at (h·dk + i)·dv + j (HF layout, dv contiguous)
//   conv f32 [C][K−1]      the last K−1 raw (pre-conv, pre-SiLU) mixed_qkv inputs per channel, oldest first,
//                          element (c, i) at c·(K−1) + i
// A fresh sequence starts from zeros (zeros()). GdnState is a plain value: copy it to fork a sequence. Not
// thread-safe to mutate from two threads; const use is.
#pragma once

#include <vector>

#include "core/base/expected.h"
#include "core/model/model_hparams.h"

namespace kestrel::ref {

struct GdnDims {
  int n_embd = 0;       // H
  int n_k_heads = 0;    // Kh (ssm.group_count)
  int n_v_heads = 0;    // Vh (ssm.time_step_rank), a multiple of Kh
  int d_k = 0;          // ssm.state_size
  int d_v = 0;          // ssm.inner_size / Vh
  int conv_kernel = 4;  // K (ssm.conv_kernel)
  float eps = 1e-6f;    // rms_norm_eps, for the gated output norm (§3.7)
  HeadMapping mapping = HeadMapping::kGrouped;

  int key_dim() const { return n_k_heads * d_k; }               // Kh·dk
  int value_dim() const { return n_v_heads * d_v; }             // Vh·dv
  int conv_dim() const { return 2 * key_dim() + value_dim(); }  // C: channels of mixed_qkv = [Q | K | V]
  int v_per_k() const { return n_v_heads / n_k_heads; }         // r

  // kInvalidArgument naming the first bad size (non-positive, Vh not a multiple of Kh).
  Status validate() const;

  // The GDN sizes of a model (ssm.* keys, rms_norm_eps, and the head mapping of its architecture).
  static GdnDims from_hparams(const ModelHparams& hp);
};

// The K-head (of q̂ and k̂) that V-head h reads, per dims.mapping.
int gdn_k_head(const GdnDims& dims, int v_head);

struct GdnState {
  std::vector<float> s;     // f32 [Vh][dk][dv]
  std::vector<float> conv;  // f32 [C][K−1]

  static GdnState zeros(const GdnDims& dims);
  float* head(const GdnDims& dims, int v_head) { return s.data() + static_cast<size_t>(v_head) * dims.d_k * dims.d_v; }
  // kInvalidArgument when the buffers do not have the sizes dims implies.
  Status check(const GdnDims& dims) const;
};

}  // namespace kestrel::ref
