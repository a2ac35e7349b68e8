// The engine kestreld computes with, from the configuration: `engine = auto | cuda | cpu | reference`
// (docs/operations.md).
//
//   auto       the CUDA engine when this build has it and a usable device exists, else the CPU engine
//   cuda       the CUDA engine (gpu/engine/cuda_engine.h); an error when the build or the machine lacks it
//   cpu        the CPU engine (cpu/cpu_engine.h) on cpu.threads pinned workers
//   reference  the scalar f32 oracle (core/engine/reference_engine.h)
//
// The CUDA engine holds cuda.slots sessions of up to max_session_ctx tokens each, their KV cache in a pool of
// cuda.kv_cache_bytes shared a page at a time, with the weights placed by the placement planner under
// cuda.gpu_memory, cuda.n_cpu_moe and cuda.override_tensor (hybrid/placed_cuda_engine.h: routed experts that do not
// fit run on cpu.threads CPU workers; the plan is logged); the CPU engine holds max_sessions slots in host memory (the
// limits in `limits` are lowered to what the engine holds, and the log says so). Loading reports progress through
// `progress` (percent).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/base/expected.h"
#include "core/engine/engine.h"
#include "core/model/model.h"
#include "daemon/ops/config.h"

namespace kestrel::daemon::ops {

// Whether this build of kestreld contains the CUDA engine.
bool cuda_engine_built();

// The name `auto` resolves to on this machine ("cuda" or "cpu"), with the reason when it is not cuda.
std::string resolve_engine_name(const std::string& configured, std::string* why_not_cuda);

// Builds the engine; `limits` is the Service's, lowered to the engine's slots and context where needed.
Expected<std::unique_ptr<Engine>> make_engine(const DaemonConfig& config, const Model& model, ServiceLimits* limits,
                                              const std::function<void(int percent)>& progress);

}  // namespace kestrel::daemon::ops
