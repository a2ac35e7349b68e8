// The CUDA engine placed by the placement planner (issue 32): what kestreld (daemon/ops/engine_select.h),
// kestrel-engine-run and bench_engine build when they compute with CUDA. The one library that knows both gpu/ and
// cpu/ (neither includes the other): it plans where the weights live and hands the CUDA engine the CPU ExpertBackend
// (cpu/expert_backend.h) for the routed experts the plan leaves on the host.
//
//   1. the flags (PlacementFlags: --gpu-memory BYTES|auto, --n-cpu-moe, --override-tensor REGEX=cpu|gpu);
//   2. the GPU budget: the given bytes, or auto — the device's free memory less the sessions' state, the pass
//      scratch and a headroom (gpu::cuda_auto_weight_budget);
//   3. the bandwidths of the cost model, measured here: the GPU's plain read (gpu::cuda_read_bandwidth) and the
//      host's with the backend's thread count (cpu::measure_read_bandwidth);
//   4. plan_placement (kResourceExhausted naming the bytes when the budget cannot hold the GDN, attention and other
//      dense weights);
//   5. with experts on the host: the CPU ExpertBackend over exactly those (its pages mapped before the first step);
//   6. the CUDA engine with the decision and the backend.
// A model that fits the budget gets every expert on the GPU: the engine of a plain make_cuda_engine.
//
// Ownership: the engine borrows `model` (as make_cuda_engine); the backend is owned by the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/placement_planner.h"
#include "core/model/model.h"
#include "cpu/cpu_engine.h"
#include "gpu/engine/cuda_engine.h"

namespace kestrel::hybrid {

struct PlacedEngineOptions {
  gpu::CudaEngineOptions cuda;  // slots, context, device, tuning, progress (placement and expert_backend are set here)
  PlacementFlags placement;
  // The expert backend's compute threads (0: one per physical core but two, which the GPU's driving threads need
  // free: placed_cuda_engine.cpp).
  int32_t cpu_threads = 0;
  cpu::CpuActivations activations = cpu::CpuActivations::kInt8;
  // Routing counts for a budget the flags leave to the planner and that splits the routed experts between the
  // devices (the planner then fills the GPU hottest expert first): read from routing_counts_dir when it holds this
  // model's (routing-<key>.txt, core/engine/routing_counts.h), else counted over a calibration prompt of
  // routing_calibration tokens through the CPU engine (cpu/routing_calibration.h) and written there. Empty dir: not
  // kept; 0 tokens: no calibration (every expert equally likely unless the directory has counts).
  int32_t routing_calibration = 256;
  std::string routing_counts_dir;
};

struct PlacedEngine {
  std::unique_ptr<gpu::CudaEngine> engine;
  PlacementDecision decision;
  // The plan as printed at start-up: a header with the budget and the measured bandwidths, describe_placement's
  // lines, and the expert backend's summary when there is one.
  std::vector<std::string> plan;
};

Expected<PlacedEngine> make_placed_cuda_engine(const Model& model, const PlacedEngineOptions& options);

}  // namespace kestrel::hybrid
