// The CUDA engine: core/engine/engine.h's Engine with every weight resident on one GPU (DeviceModel), every
// session's state in a device slot (StateSlots: GDN state per slot, the KV cache in pages of a pool all sessions
// share) and each tick run as decode passes of up to 32 sessions (ForwardPass). This header is the engine's whole
// public face: no CUDA types, so the daemon and tools include it without the CUDA headers.
//
// A tick's items advance together: pass t runs token t of every item that has one (a prompt of T tokens takes T
// passes, sharing each with the other sessions' decode tokens), and an item's logits come from the pass of its last
// token. Items of more than 32 sessions run in groups of 32. Prompts therefore run through the decode kernels a
// token per pass until the prefill kernels exist (issue: GPU prefill); capabilities() asks the Service for at most
// 16 tokens of an item per tick, so a long prompt holds the other sessions' next token for 16 passes at most.
//
// KV pages: a session holds the pages its tokens need (ceil(n_past / kv_page_tokens)), taken from the pool before a
// tick runs and returned when the slot is freed or reset. A tick item the pool cannot serve fails alone with
// kResourceExhausted (naming the tokens and bytes asked for and free), its slot untouched; the other items run. Clone
// and restore take the pages they fill the same way (refused: the destination is unchanged). A session may still
// grow to the engine's n_ctx; the pool bounds how many tokens all sessions hold together.
//
// Numerics: every kernel has a fixed summation order and no atomics, and each row's bits do not depend on the other
// rows of a pass: the same slot contents and tokens give bit-identical logits whatever else is in the tick. The
// results agree with the reference engine to f32 rounding differences (summation orders, device expf; tests state
// the tolerance).
//
// Placement: by default every weight is on the GPU. With CudaEngineOptions::placement (a plan_placement decision) the
// GPU loads only the routed experts the plan puts on it (DeviceModel's compact stacks) and the rest run on
// expert_backend (an ExpertBackend over host memory, e.g. cpu/expert_backend.h, built by the caller: gpu/ includes
// no cpu/), inside the same graphed pass (forward_pass.h, "hybrid MoE layer"); placement() then reports the split.
//
// Ownership: borrows `model` (its file mapping is read while the weights are registered) for the engine's lifetime;
// shares the expert backend (the hybrid hand-off's host thread calls it until the engine is destroyed).
// Threading: as engine.h (calls never overlap); each call makes the engine's device current on its thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/engine.h"
#include "core/engine/expert_backend.h"
#include "core/engine/placement_planner.h"
#include "core/model/model.h"
#include "gpu/kernels/tuning.h"
#include "gpu/memory/pinned_experts.h"

namespace kestrel::gpu {

struct CudaEngineOptions {
  int32_t max_slots = 16;  // sessions resident at once
  int32_t n_ctx = 4096;    // the most tokens one session holds (slot_alloc accepts n_ctx up to this)
  // Bytes of the KV page pool shared by all sessions (whole pages; less than one page is refused). 0: automatic, the
  // smaller of every slot at n_ctx (max_slots · n_ctx tokens) and 90% of the device memory left after the weights,
  // the pass scratch, the GDN state and 1 GiB of headroom, but at least one session at n_ctx.
  uint64_t kv_cache_bytes = 0;
  int32_t kv_page_tokens = 256;  // positions per KV page, a power of two (1..65536)
  int device = 0;                // CUDA device ordinal
  GpuTuning tuning;  // kernel choices, fixed for the engine's life (gpu/kernels/tuning.h; the defaults are the
                     // measured path, tests and benchmarks force others)
  // Called while the weights load: bytes copied so far and the total.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Where the routed experts live: the GPU loads the experts decision.expert_on_gpu marks (plan_placement over this
  // model) and expert_backend computes the others. None: every weight on the GPU.
  std::optional<PlacementDecision> placement;
  // Required when the placement leaves experts on the host; its experts() must be exactly those (kInvalidArgument
  // otherwise) and its hidden() the model's n_embd.
  std::shared_ptr<ExpertBackend> expert_backend;
  // A page-locked copy of the hybrid layers' expert stacks (gpu/memory/pinned_experts.h), which prompt passes then
  // upload directly (the expert backend should read the same copy); none: the file mapping's, uploaded through a
  // pinned bounce buffer. Kept for the engine's life.
  std::shared_ptr<const PinnedExperts> pinned_experts;
};

// The KV page pool: its geometry and how much of it the sessions hold now.
struct CudaKvCacheInfo {
  int32_t page_tokens = 0;  // positions per page
  uint64_t page_bytes = 0;  // bytes of one page (K and V of every attention layer)
  int64_t n_pages = 0;      // pages in the pool
  int64_t free_pages = 0;   // pages no session holds
};

// The CUDA engine with extras for tests and benchmarks.
class CudaEngine : public Engine {
 public:
  // Runs one tick like step() and also copies the residual stream after every layer of every item's last token into
  // hidden (f32 [items][n_layer][H], resized), for per-layer comparisons with the reference.
  virtual void step_with_hidden(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out,
                                std::vector<float>* hidden) = 0;
  // Bytes on the device: weights (with alignment padding; without it, the file's bytes of the weights loaded — a
  // placement's PlacementDecision::gpu_bytes), state (GDN state of every slot, the KV page pool and the slot
  // tables), pass scratch.
  virtual uint64_t weight_bytes() const = 0;
  virtual uint64_t weight_bytes_unpadded() const = 0;
  virtual uint64_t state_bytes() const = 0;
  virtual uint64_t scratch_bytes() const = 0;
  virtual CudaKvCacheInfo kv_cache() const = 0;
  // A line describing the layout choices (tiled / raw matrices, MoE layers on moe_imma, hybrid MoE layers).
  virtual std::string layout_summary() const = 0;
  // Bytes of routed experts on the device, and MoE layers with some / all of their experts on the host.
  virtual uint64_t routed_expert_bytes() const = 0;
  virtual int hybrid_layers() const = 0;
  virtual int host_expert_layers() const = 0;
  // Profiling of the passes (CUDA events between the sections of each pass): while on, each section's time is
  // summed; profile() returns (section name, milliseconds) pairs and the number of passes since clear_profile().
  virtual Status set_profiling(bool on) = 0;
  virtual std::vector<std::pair<std::string, double>> profile(int* passes) const = 0;
  // With routed experts on the host, over the same profiled passes: the host batches, the host's milliseconds
  // computing them, and the milliseconds the device waited for them (the rest of the host's time overlapped the
  // device's own work).
  struct HostExpertProfile {
    int64_t batches = 0;
    double host_ms = 0;
    double device_wait_ms = 0;
  };
  virtual HostExpertProfile host_expert_profile() const = 0;
  virtual void clear_profile() = 0;
  // Kernel launches of a pass of `rows` rows (the last captured graph's kernel nodes; 0 before such a pass ran, -1
  // when the runtime could not list them).
  virtual int kernels_per_pass(int rows) const = 0;
};

// Empty when a CUDA device can be used, else why not (no driver, no device).
std::string cuda_unavailable_reason();

// Bytes the device has free and in all (cudaMemGetInfo); kFailedPrecondition without a usable device.
struct CudaMemory {
  uint64_t free = 0;
  uint64_t total = 0;
};
Expected<CudaMemory> cuda_memory(int device);

// Device memory kept out of an automatic weight budget beyond the engine's own state and scratch: CUDA graphs, the
// context's growth, the allocator's rounding.
inline constexpr uint64_t kCudaHeadroomBytes = uint64_t{768} << 20;

// What `--gpu-memory auto` gives the weights of `model` (`planner`: its planner_model) under `options` (max_slots,
// n_ctx, device): the device's free bytes less the sessions' state slots, the pass scratch and kCudaHeadroomBytes,
// and — when the weights do not all fit and prompt passes upload host experts (GpuTuning::expert_upload_min_tokens) —
// the upload's staging (three of the largest MoE layer's expert stacks). kResourceExhausted naming those bytes when
// they alone exceed what is free.
Expected<uint64_t> cuda_auto_weight_budget(const Model& model, const PlannerModel& planner,
                                           const CudaEngineOptions& options);

// The device's plain read bandwidth in bytes/s (a streaming read of a 512 MiB buffer, best of three; for the
// placement planner's cost model). Allocates and frees the buffer.
Expected<double> cuda_read_bandwidth(int device);
// The host-to-device copy rate from page-locked memory in bytes/s (a 256 MiB copy, best of three; the expert
// upload's cost model). Allocates and frees both buffers.
Expected<double> cuda_pinned_copy_bandwidth(int device);

// The rate in bytes/s at which a kernel reads mapped page-locked host memory over the bus (a streaming read of
// 256 MiB, best of three): the hybrid layers' side read (gpu/kernels/moe_hybrid.h step 3b).
Expected<double> cuda_mapped_read_bandwidth(int device);

// Loads the model onto the device. kResourceExhausted naming the bytes needed and free when it does not fit;
// kUnsupported for a tensor type the kernels lack; kFailedPrecondition when there is no usable device.
Expected<std::unique_ptr<CudaEngine>> make_cuda_engine(const Model& model, const CudaEngineOptions& options);

}  // namespace kestrel::gpu
