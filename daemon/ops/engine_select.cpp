// Engine selection (engine_select.h).
#include "daemon/ops/engine_select.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/engine/placement_planner.h"
#include "core/engine/reference_engine.h"
#include "cpu/cpu_engine.h"
#ifdef KESTREL_WITH_CUDA
#include "gpu/engine/cuda_engine.h"
#include "hybrid/placed_cuda_engine.h"
#endif

namespace kestrel::daemon::ops {

bool cuda_engine_built() {
#ifdef KESTREL_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string resolve_engine_name(const std::string& configured, std::string* why_not_cuda) {
  if (configured != "auto") return configured;
#ifdef KESTREL_WITH_CUDA
  std::string why = gpu::cuda_unavailable_reason();
  if (why.empty()) return "cuda";
  if (why_not_cuda != nullptr) *why_not_cuda = why;
#else
  if (why_not_cuda != nullptr) *why_not_cuda = "this kestreld was built without CUDA";
#endif
  return "cpu";
}

Expected<std::unique_ptr<Engine>> make_engine(const DaemonConfig& config, const Model& model, ServiceLimits* limits,
                                              const std::function<void(int percent)>& progress) {
  std::string why;
  const std::string name = resolve_engine_name(config.engine, &why);
  if (config.engine == "auto") {
    spdlog::info("engine auto: {}{}", name, why.empty() ? "" : " (" + why + ")");
  }
  if (name == "reference") {
    return make_reference_engine(model, static_cast<int32_t>(limits->max_sessions));
  }
  if (name == "cpu") {
    cpu::CpuEngineOptions o;
    o.max_slots = static_cast<int32_t>(limits->max_sessions);
    o.threads = static_cast<int32_t>(config.cpu.threads);
    const ModelHparams& hp = model.hparams();
    o.max_ctx = limits->max_session_ctx;
    if (hp.n_ctx_train > 0) o.max_ctx = std::min<int32_t>(o.max_ctx, static_cast<int32_t>(hp.n_ctx_train));
    KESTREL_TRY_ASSIGN(std::unique_ptr<cpu::CpuEngine> e, cpu::make_cpu_engine(model, o));
    limits->max_session_ctx = std::min(limits->max_session_ctx, o.max_ctx);
    if (progress) progress(100);
    spdlog::info("cpu: {}; {} slots in host memory, up to {} tokens each", e->summary(), o.max_slots, o.max_ctx);
    return std::unique_ptr<Engine>(std::move(e));
  }
#ifdef KESTREL_WITH_CUDA
  hybrid::PlacedEngineOptions po;
  po.placement.gpu_memory = config.cuda.gpu_memory;
  po.placement.n_cpu_moe = static_cast<int32_t>(config.cuda.n_cpu_moe);
  po.placement.overrides = split_tensor_overrides(config.cuda.override_tensor);
  po.cpu_threads = static_cast<int32_t>(config.cpu.threads);
  po.routing_calibration = config.cuda.routing_calibration;
  po.routing_counts_dir = config.cache_dir;
  gpu::CudaEngineOptions& o = po.cuda;
  const ModelHparams& hp = model.hparams();
  int32_t ctx = limits->max_session_ctx;
  if (hp.n_ctx_train > 0) ctx = std::min<int32_t>(ctx, static_cast<int32_t>(hp.n_ctx_train));
  o.n_ctx = ctx;
  o.max_slots = static_cast<int32_t>(std::min<uint32_t>(config.cuda.slots, limits->max_sessions));
  o.kv_cache_bytes = config.cuda.kv_cache_bytes;
  o.device = static_cast<int>(config.cuda.device);
  o.tuning.gemv_imma.prompt_digits = static_cast<gpu::GemmDigits>(config.cuda.prompt_digits);
  o.tuning.moe_imma.grouped_gemv.prompt_digits = o.tuning.gemv_imma.prompt_digits;
  o.tuning.expert_upload_min_tokens = config.cuda.expert_upload_min_tokens;
  o.tuning.expert_side_read = config.cuda.side_read_percent < 0
                                  ? gpu::kSideReadAuto
                                  : static_cast<float>(config.cuda.side_read_percent) / 100.0f;
  int last = -1;
  o.progress = [&](uint64_t done, uint64_t total) {
    const int percent = total > 0 ? static_cast<int>(done * 100 / total) : 100;
    if (percent / 10 != last / 10 && progress) progress(percent);
    last = percent;
  };
  KESTREL_TRY_ASSIGN(hybrid::PlacedEngine placed, hybrid::make_placed_cuda_engine(model, po));
  for (const std::string& line : placed.plan) spdlog::info("{}", line);
  std::unique_ptr<gpu::CudaEngine> e = std::move(placed.engine);
  if (limits->max_sessions > static_cast<uint32_t>(o.max_slots)) {
    spdlog::info("cuda: max_sessions lowered from {} to the engine's {} slots (cuda.slots)", limits->max_sessions,
                 o.max_slots);
    limits->max_sessions = static_cast<uint32_t>(o.max_slots);
  }
  limits->max_session_ctx = std::min(limits->max_session_ctx, o.n_ctx);
  const gpu::CudaKvCacheInfo kv = e->kv_cache();
  spdlog::info(
      "cuda: {:.2f} GB weights, {:.2f} GB state ({} slots of up to {} tokens; KV cache {:.2f} GB{}: {} pages of {} "
      "tokens = {} tokens shared by the sessions), {:.2f} GB scratch; {}",
      static_cast<double>(e->weight_bytes()) / 1e9, static_cast<double>(e->state_bytes()) / 1e9, o.max_slots, o.n_ctx,
      static_cast<double>(kv.page_bytes) * static_cast<double>(kv.n_pages) / 1e9,
      o.kv_cache_bytes == 0 ? " (automatic)" : "", kv.n_pages, kv.page_tokens,
      static_cast<int64_t>(kv.n_pages) * kv.page_tokens, static_cast<double>(e->scratch_bytes()) / 1e9,
      e->layout_summary());
  return std::unique_ptr<Engine>(std::move(e));
#else
  (void)progress;
  return make_error(ErrorCode::kFailedPrecondition,
                    "engine = cuda, but this kestreld was built without CUDA (configure with nvcc present, or "
                    "KESTREL_CUDA=ON)");
#endif
}

}  // namespace kestrel::daemon::ops
