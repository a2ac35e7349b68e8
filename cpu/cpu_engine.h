// The CPU Engine (engine.h) — the public header of kestrel_cpu, free of intrinsic types.
//
// The whole model runs from the GGUF mapping the Model holds (weights are read in their raw blocks, never copied
// or widened) on a WorkerPool of pinned threads with the GEMV kernels of the instruction-set level chosen at start
// (isa.h; KESTREL_CPU_ISA lowers it). Slots are ref::SessionState in host memory, so snapshots are the reference
// engine's format byte for byte and clone/restore behave as there. By default the block-quantized weights multiply
// activations quantized to int8 per 32-element block where the level has int8 kernels (CpuActivations::kInt8:
// avx512), as llama.cpp's CPU backend does; CpuActivations::kF32 keeps the reference's f32 activations.
//
// step() advances every item in passes: each pass takes up to 128 tokens of every item still holding tokens,
// stacks them into one batch, and runs embedding → layers → (for items whose last token is in the pass) output norm,
// lm_head, argmax over it — every weight matrix read once per pass for all sessions. GDN layers run the chunked
// delta rule over whole 64-position chunks of a prompt and the recurrent step otherwise (cpu/gdn_block.h), and each
// matrix row is computed by one thread in a fixed order, so a session's logits are bit-identical whatever the
// batch, the thread count, and the cut of its prompt into ticks and passes as long as the cuts fall on multiples of
// 64 positions (the Service's prefill ticks of max_tokens_per_item = 128 from position 0 do); other cuts agree to
// f32 rounding. With kF32 they differ from the reference engine's by summation order and the chunked form's
// rounding only; with kInt8 by the activations' rounding too (≤ 1/254 of each block's largest value per element).
//
// Ownership: borrows `model` for the engine's lifetime. Threading: engine.h (calls never overlap); the engine's
// own workers run inside step().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/base/expected.h"
#include "core/engine/engine.h"
#include "core/model/model.h"
#include "cpu/isa.h"

namespace kestrel::cpu {

// The form of the activations the block-quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) multiply.
enum class CpuActivations {
  kInt8,  // quantized to int8 (cpu/act_q8.h) where the level has int8 kernels (avx512, avxvnni, avx2): the fast path
  kF32,   // f32 as the reference: the reference's numerics up to summation order
};

struct CpuEngineOptions {
  int32_t max_slots = 8;
  int32_t threads = 0;  // compute threads including the caller's; 0: one per physical core
  bool pin = true;      // bind worker threads to cores
  int32_t max_ctx = 0;  // the largest n_ctx slot_alloc accepts (0: the model's training context)
  CpuActivations activations = CpuActivations::kInt8;
  bool populate = true;        // map every weight page at start (cpu/populate.h): no page faults inside steps
  bool profile = false;        // time each step's sections (cpu/step_profile.h; a clock read around each)
  bool count_routing = false;  // count each MoE layer's chosen experts over every row computed (routing_counts)
  std::optional<Isa> isa;      // the instruction-set level (lowered to what the CPU has); default isa_selected()
};

class CpuEngine : public Engine {
 public:
  // The instruction-set level, activations and thread count the engine computes with, and after populating the share
  // of the weights mapped in 2 MiB pages (cpu/populate.h): "avx512, int8, 2 threads, weights 98% in 2 MiB pages".
  virtual std::string summary() const = 0;
  // With CpuEngineOptions::profile: where the steps since the last reset spent their time (a Markdown table);
  // empty otherwise.
  virtual std::string profile_report() const = 0;
  // With CpuEngineOptions::count_routing: how many rows chose each expert of each layer since the engine was made,
  // [n_layer][n_expert] flattened (zero rows for layers without routed experts; PlacementRequest::expert_counts'
  // layout); empty otherwise. Call between steps.
  virtual std::vector<uint64_t> routing_counts() const = 0;
  virtual void profile_reset() = 0;
};

// kInvalidArgument for max_slots < 1 or threads < 0, or weights that do not fit the reference's shapes;
// kUnsupported for a weight type without a CPU kernel (gemv.h lists them), naming the tensor.
Expected<std::unique_ptr<CpuEngine>> make_cpu_engine(const Model& model, const CpuEngineOptions& options);

}  // namespace kestrel::cpu
