// The CPU ExpertBackend (core/engine/expert_backend.h): routed experts held in host RAM, computed by CPU workers —
// the host half of hybrid MoE placement (issue 32). A public header of kestrel_cpu beside cpu_engine.h, free of
// intrinsic types: the engine that hands experts over (the CUDA engine, the daemon that builds it) includes this and
// nothing else of cpu/.
//
// The weights are read in place from their raw GGUF blocks (the Model's file mapping, or any views that outlive the
// backend), never copied or widened. A batch runs through ExpertBlock (expert_block.h), the code the CPU engine's
// own MoE runs: every token routed to one of the backend's experts is computed with one read of that expert's
// weights for the whole batch (the batch's choices grouped by expert), in two pool jobs of (expert, ~16 KiB row
// block) items, so all threads stream whatever the routing; the f32 or int8 activation forms of the CPU engine
// (CpuActivations), at the instruction-set level chosen at start. Results are bit-identical across thread counts,
// batch compositions and calling threads. With CpuActivations::kF32 they are the reference's (ref::moe_forward's
// routed part) up to the GEMVs' summation order (bit-identical at the scalar level); with kInt8 each GEMV's input is
// rounded per 32-element block as in the CPU engine (cpu/act_q8.h).
//
// Threads: `threads` compute threads — a WorkerPool of threads − 1 workers, which spin briefly after each job and
// then sleep on a futex, plus run()'s caller, which drives the batch through its jobs and takes items too.
//
// Ownership: the backend borrows the weights (Model or views) for its lifetime. Threading: ExpertBackend's contract.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/expert_backend.h"
#include "core/model/model.h"
#include "core/reference/moe.h"
#include "cpu/cpu_engine.h"
#include "cpu/isa.h"

namespace kestrel::cpu {

struct CpuExpertBackendOptions {
  int32_t threads = 0;  // compute threads including the driving one; 0: one per physical core
  bool pin = true;      // bind the pool's workers to cores, leaving the first to run()'s caller (WorkerPool)
  CpuActivations activations = CpuActivations::kInt8;
  bool populate = true;    // map the held experts' pages at start (cpu/populate.h): no page faults inside batches
  std::optional<Isa> isa;  // the instruction-set level (lowered to what the CPU has); default isa_selected()
};

class CpuExpertBackend : public ExpertBackend {
 public:
  // "avx512, int8, 2 threads, 1280 experts held".
  virtual std::string summary() const = 0;
};

// A backend over the routed experts of `layers` ([n_layer]: layer l's ref::MoeWeights, of which only the three expert
// tensors are read; a layer without routed experts has null gate_exps.data), holding `experts`.
// kInvalidArgument: experts.held not [n_layer] rows, a held layer without experts or whose row is not n_expert long,
// expert tensors not shaped {H, I, E}, {H, I, E}, {I, H, E} with one H over all layers, threads < 0;
// kUnsupported: an expert type without a CPU kernel (gemv.h), gate and up of different types.
Expected<std::unique_ptr<CpuExpertBackend>> make_cpu_expert_backend(std::vector<ref::MoeWeights> layers,
                                                                    ExpertSet experts,
                                                                    const CpuExpertBackendOptions& options);

// The views make_cpu_expert_backend takes, over a Model's file mapping: layer l's ref::MoeWeights for a MoE layer,
// empty otherwise. A caller may point the expert tensors' data at a copy of the same bytes
// (gpu/memory/pinned_experts.h).
Expected<std::vector<ref::MoeWeights>> expert_weight_views(const Model& model);

// The same over a Model's file mapping (borrowed for the backend's lifetime).
Expected<std::unique_ptr<CpuExpertBackend>> make_cpu_expert_backend(const Model& model, ExpertSet experts,
                                                                    const CpuExpertBackendOptions& options);

}  // namespace kestrel::cpu
