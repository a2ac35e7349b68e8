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
// Ownership: borrows `model` (its file mapping is read while the weights are registered) for the engine's lifetime.
// Threading: as engine.h (calls never overlap); each call makes the engine's device current on its thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/engine.h"
#include "core/model/model.h"
#include "gpu/kernels/tuning.h"

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
  // Bytes on the device: weights (with alignment padding), state (GDN state of every slot, the KV page pool and the
  // slot tables), pass scratch.
  virtual uint64_t weight_bytes() const = 0;
  virtual uint64_t state_bytes() const = 0;
  virtual uint64_t scratch_bytes() const = 0;
  virtual CudaKvCacheInfo kv_cache() const = 0;
  // A line describing the layout choices (tiled / raw matrices, MoE layers on moe_imma).
  virtual std::string layout_summary() const = 0;
  // Profiling of the passes (CUDA events between the sections of each pass): while on, each section's time is
  // summed; profile() returns (section name, milliseconds) pairs and the number of passes since clear_profile().
  virtual Status set_profiling(bool on) = 0;
  virtual std::vector<std::pair<std::string, double>> profile(int* passes) const = 0;
  virtual void clear_profile() = 0;
};

// Empty when a CUDA device can be used, else why not (no driver, no device).
std::string cuda_unavailable_reason();

// Loads the model onto the device. kResourceExhausted naming the bytes needed and free when it does not fit;
// kUnsupported for a tensor type the kernels lack; kFailedPrecondition when there is no usable device.
Expected<std::unique_ptr<CudaEngine>> make_cuda_engine(const Model& model, const CudaEngineOptions& options);

}  // namespace kestrel::gpu
