// DeviceModel: every weight of a catalogued model resident in one WeightPool, and per layer the device views the
// forward pass reads (design.md §3 "Weights"; the executor is forward_pass.h).
//
// Layout per tensor, decided once here from its type and shape:
//   - projection matrices (GDN, attention, dense FFN, lm_head) re-tiled for GEMV v4 (gemv_imma) where it takes them
//     (Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 at supported shapes), else kept as raw GGUF blocks for gpu::gemv;
//   - an MoE layer's routed and shared experts tiled for moe_imma when moe_imma_check_raw accepts the layer's types
//     and shapes (gate/up of one type, down of one type, shared ff == expert ff), else all raw for moe_forward;
//   - token_embd (read by get_rows), the router, norms and the GDN's small f32 tensors raw.
//   - a GDN layer's input projections stacked into one tiled matrix where they share a GEMV v4 type (DeviceGdnLayer);
// Nothing is widened: the pool holds exactly the file's bytes, some reordered. Routed experts keep one pool entry per
// stack (expert e at e · its bytes, or at its slot in a hybrid layer's compact stack), so an expert is addressable by
// (layer, e).
//
// Ownership: owns the pool and the hybrid layers' resident maps; borrows the catalog's file mapping only while
// create() runs. Immutable afterwards; the views point into the pool and stay valid for its lifetime. Not thread-safe
// to create; const use is.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model.h"
#include "core/reference/gdn_layer.h"
#include "core/reference/gdn_state.h"
#include "gpu/kernels/gdn_decode.h"
#include "gpu/kernels/get_rows.h"
#include "gpu/kernels/moe_experts.h"
#include "gpu/kernels/moe_imma.h"
#include "gpu/memory/pinned_experts.h"
#include "gpu/memory/tiled_matrix.h"
#include "gpu/memory/weight_pool.h"

namespace kestrel::gpu {

// A projection matrix y = W x on the device, in whichever layout it was registered.
struct DeviceMatrix {
  bool tiled = false;
  TiledView tiled_view;       // when tiled (gemv_imma)
  DeviceMatrixView raw_view;  // when raw (gemv)
  int64_t n_in = 0;           // ggml ne0
  int64_t n_out = 0;          // ggml ne1
  bool present() const { return n_out > 0; }
};

struct DeviceGdnLayer {
  ref::GdnProjection projection = ref::GdnProjection::kQkvGateBetaAlpha;
  // The input projections stacked row-wise into one tiled matrix — [qkv | gate | beta | alpha], [qkv | gate | ba] or
  // [ssm_in | ba] — where they share a type GEMV v4 takes (one launch instead of four; the separate matrices are then
  // not registered). Its output rows hold the projections side by side (GdnDecodeInputs::row_stride).
  DeviceMatrix in_stacked;
  DeviceMatrix qkv, gate, ssm_in, ba, beta, alpha, out;
  GdnDecodeWeights small;  // conv1d, dt_bias, ssm_a, ssm_norm (f32)
};

struct DeviceAttnLayer {
  // q (with its gate), k and v stacked row-wise into one tiled matrix where they share a type GEMV v4 takes (one
  // launch instead of three; the separate matrices are then not registered): its output rows hold q|gate (q_rows), k
  // (k_rows) and v side by side (AttnDecodeArgs' strides).
  DeviceMatrix in_stacked;
  int64_t q_rows = 0, k_rows = 0;
  DeviceMatrix q, k, v, o;
  const float* q_norm = nullptr;  // f32 [hd]
  const float* k_norm = nullptr;  // f32 [hd]
};

struct DeviceFfnLayer {
  bool moe = false;
  bool moe_tiled = false;  // moe_imma (else moe_forward on raw blocks)
  MoeImmaWeights moe_imma;
  MoeDeviceWeights moe_raw;
  DeviceMatrix gate, up, down;  // dense SwiGLU (qwen35)
  // The routed experts on the device: n_resident of n_expert. Fewer (a hybrid layer, gpu/kernels/moe_hybrid.h): the
  // stacks of moe_imma / moe_raw hold only those, in ascending expert id, and `resident` maps an id to its slot.
  int32_t n_expert = 0;
  int32_t n_resident = 0;
  const int32_t* resident = nullptr;   // device int32 [n_expert]: slot or kExpertNotHere; null unless hybrid()
  std::vector<int32_t> resident_host;  // the same map on the host (empty unless hybrid())
  // A hybrid layer's three raw expert stacks as the file holds them (host memory, every expert: the file mapping the
  // DeviceModel was created from, or a page-locked copy of it when host_pinned), for the prompt passes that copy them
  // to the GPU (gpu/engine/expert_upload.h).
  DeviceExpertsView host_gate_exps, host_up_exps, host_down_exps;
  bool host_pinned = false;
  // When host_pinned: the same stacks at their mapped device addresses, for the side read (moe_hybrid.h step 3b).
  MoeBusStacks bus;
  bool hybrid() const { return moe && n_resident < n_expert; }
};

struct DeviceLayer {
  LayerKind kind = LayerKind::kGatedDeltaNet;
  const float* attn_norm = nullptr;       // f32 [H]
  const float* post_attn_norm = nullptr;  // f32 [H]
  DeviceGdnLayer gdn;
  DeviceAttnLayer attn;
  DeviceFfnLayer ffn;
};

// Called after each registered batch: bytes copied so far and the total.
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

class DeviceModel {
 public:
  // Registers every used tensor of `model` (kResourceExhausted naming the bytes needed and the device's free memory
  // when it does not fit alongside `scratch_bytes` still to be allocated; `state_bytes`, already allocated, is named
  // in the error too). Synchronous.
  //
  // expert_on_gpu ([n_layer][n_expert], 1: resident; PlacementDecision::expert_on_gpu) chooses the routed experts to
  // load; empty: every expert. A MoE layer with all of its experts resident is registered as without it; with some,
  // each of its three expert stacks is registered compact — the resident experts' slices in ascending id, {ne0, ne1,
  // n_resident}, tiled per expert as the full stack would be — and the layer gets a resident map; with none, its
  // routed experts are not registered at all. So the pool holds exactly the plan's GPU bytes (plus alignment).
  // kInvalidArgument when the rows do not match the model's MoE layers. A hybrid layer's host stacks
  // (DeviceFfnLayer::host_*_exps) are `pinned`'s copy where it holds the layer (borrowed: it must outlive the
  // DeviceModel), else the file mapping's.
  static Expected<std::unique_ptr<DeviceModel>> create(const Model& model, uint64_t scratch_bytes, uint64_t state_bytes,
                                                       const LoadProgress& progress, cudaStream_t stream,
                                                       const std::vector<std::vector<uint8_t>>& expert_on_gpu = {},
                                                       const PinnedExperts* pinned = nullptr);
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  const ModelHparams& hparams() const { return hp_; }
  const ref::GdnDims& gdn_dims() const { return gdn_dims_; }
  const std::vector<DeviceLayer>& layers() const { return layers_; }
  const DeviceMatrixView& token_embd() const { return token_embd_; }
  const float* output_norm() const { return output_norm_; }
  const DeviceMatrix& output() const { return output_; }
  const WeightPool& pool() const { return pool_; }
  // The pool's bytes (weights plus alignment padding).
  uint64_t device_bytes() const { return pool_.used_bytes(); }
  // Largest n_in of any tiled matrix (the prepared-activation buffer's width), 0 when none is tiled.
  int64_t max_tiled_in() const { return max_tiled_in_; }
  // How many layers run their experts on moe_imma, and how many matrices are tiled / raw.
  int n_moe_tiled_layers() const { return n_moe_tiled_; }
  int n_stacked_layers() const { return n_stacked_; }
  int n_tiled_matrices() const { return n_tiled_; }
  int n_raw_matrices() const { return n_raw_; }
  // MoE layers with some routed experts off the device (hybrid()), and with none on it.
  int n_hybrid_layers() const { return n_hybrid_; }
  int n_host_expert_layers() const { return n_host_only_; }
  // Bytes of routed experts on the device (without padding).
  uint64_t routed_expert_bytes() const { return pool_.bytes_in(PlacementClass::kRoutedExperts); }

 private:
  explicit DeviceModel(WeightPool pool) : pool_(std::move(pool)) {}
  Status build_views(const WeightCatalog& catalog, const std::vector<std::vector<uint8_t>>& expert_on_gpu,
                     const PinnedExperts* pinned);
  Expected<DeviceMatrix> matrix(const TensorRef& t);
  // Layer `layer`'s stacked input projections (registered tiled under its stacked key).
  Expected<DeviceMatrix> stacked(uint32_t layer);

  WeightPool pool_;
  ModelHparams hp_;
  ref::GdnDims gdn_dims_;
  std::vector<DeviceLayer> layers_;
  DeviceMatrixView token_embd_;
  const float* output_norm_ = nullptr;
  DeviceMatrix output_;
  int64_t max_tiled_in_ = 0;
  int n_moe_tiled_ = 0, n_tiled_ = 0, n_raw_ = 0, n_stacked_ = 0, n_hybrid_ = 0, n_host_only_ = 0;
  void* resident_maps_ = nullptr;  // device: the hybrid layers' resident maps, one allocation
};

}  // namespace kestrel::gpu
