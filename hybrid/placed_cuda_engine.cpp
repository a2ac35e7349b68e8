// make_placed_cuda_engine (placed_cuda_engine.h).
#include "hybrid/placed_cuda_engine.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "core/base/byte_size.h"
#include "core/engine/expert_backend.h"
#include "core/reference/model_weights.h"
#include "cpu/expert_backend.h"
#include "cpu/read_bandwidth.h"
#include "cpu/worker_pool.h"

namespace kestrel::hybrid {
namespace {

// Cores the expert backend leaves to the threads that drive the GPU: the engine thread that launches each step's
// graph and waits for it, and the hand-off thread (gpu/engine/host_expert_link.h) that spins on the mailbox and
// takes part in each host layer's jobs. With every core pinned to a busy worker those two wait for scheduler ticks
// at every layer: on a 16-core H100 host, every expert on the CPU decoded 66 tokens/s with 16 threads, 70 with 14
// and 71 with 12 (bench_engine --n-cpu-moe 40, one run).
constexpr int kCoresForGpuThreads = 2;

// The backend's thread count: `threads`, or (0) one per physical core but kCoresForGpuThreads.
int32_t backend_threads(int32_t threads) {
  if (threads > 0) return threads;
  const int cores = static_cast<int>(cpu::physical_core_cpus().size());
  return std::max(cores - kCoresForGpuThreads, 1);
}

// The host read for the cost model: 512 MiB twice, on as many threads as the backend will use.
Expected<double> host_read(int32_t threads) {
  KESTREL_TRY_ASSIGN(std::unique_ptr<cpu::WorkerPool> pool, cpu::WorkerPool::create(threads - 1, true));
  return cpu::measure_read_bandwidth(*pool, uint64_t{512} << 20, 2);
}

}  // namespace

Expected<PlacedEngine> make_placed_cuda_engine(const Model& model, const PlacedEngineOptions& options) {
  KESTREL_TRY_ASSIGN(const PlacementChoice choice, parse_placement_flags(options.placement));
  if (std::string why = gpu::cuda_unavailable_reason(); !why.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "the CUDA engine cannot start: " + why);
  }
  PlacementRequest req;
  req.has_gpu = true;
  req.n_cpu_moe = choice.n_cpu_moe;
  req.overrides = choice.overrides;
  const PlannerModel planner = planner_model(model.catalog());
  std::string budget_text;
  if (choice.auto_budget) {
    KESTREL_TRY_ASSIGN(req.gpu_budget, gpu::cuda_auto_weight_budget(model, planner, options.cuda));
    budget_text = format_byte_size(req.gpu_budget) + " (auto: free GPU memory less the sessions' state, the scratch " +
                  "and " + format_byte_size(gpu::kCudaHeadroomBytes) + " of headroom)";
  } else {
    req.gpu_budget = choice.gpu_budget;
    budget_text = format_byte_size(req.gpu_budget);
  }
  KESTREL_TRY_ASSIGN(req.gpu_read_bytes_per_s, gpu::cuda_read_bandwidth(options.cuda.device));
  const int32_t threads = backend_threads(options.cpu_threads);
  KESTREL_TRY_ASSIGN(req.host_read_bytes_per_s, host_read(threads));
  PlacedEngine out;
  KESTREL_TRY_ASSIGN(out.decision, plan_placement(planner, req));

  gpu::CudaEngineOptions cuda = options.cuda;
  cuda.placement = out.decision;
  const ExpertSet host = ExpertSet::on_device(out.decision, WeightDevice::kHost);
  std::string backend_text;
  std::string pinned_text;
  if (host.count() > 0) {
    // Prompt passes that upload the host's experts read them at the link's rate only from page-locked memory: the
    // hybrid layers' stacks are then copied there once, and the backend reads that copy too. Without the room for it
    // the backend reads the file mapping and uploads bounce through pinned buffers.
    KESTREL_TRY_ASSIGN(ref::RefModelWeights weights, ref::RefModelWeights::from_catalog(model.catalog()));
    std::vector<ref::MoeWeights> layers(weights.layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      if (weights.layers[l].is_moe) layers[l] = weights.layers[l].moe;
    }
    if (options.cuda.tuning.expert_upload_min_tokens > 0) {
      std::vector<bool> hybrid(layers.size(), false);
      for (size_t l = 0; l < hybrid.size() && l < host.held.size(); ++l) {
        hybrid[l] = std::any_of(host.held[l].begin(), host.held[l].end(), [](uint8_t h) { return h != 0; });
      }
      Expected<std::unique_ptr<gpu::PinnedExperts>> pinned = gpu::PinnedExperts::create(model, hybrid, threads);
      if (pinned) {
        for (size_t l = 0; l < layers.size(); ++l) {
          const gpu::PinnedExperts::Layer& p = (*pinned)->layer(l);
          if (p.gate == nullptr) continue;
          layers[l].gate_exps.data = p.gate;
          layers[l].up_exps.data = p.up;
          layers[l].down_exps.data = p.down;
        }
        char line[160];
        std::snprintf(line, sizeof line, "  host experts page-locked for prompt uploads: %s in %.1f s",
                      format_byte_size((*pinned)->bytes()).c_str(), (*pinned)->seconds());
        pinned_text = line;
        cuda.pinned_experts = std::move(*pinned);
      } else {
        pinned_text =
            "  host experts not page-locked (prompt uploads bounce through pinned buffers): " + pinned.error().message;
      }
    }
    cpu::CpuExpertBackendOptions bo;
    bo.threads = threads;
    bo.activations = options.activations;
    KESTREL_TRY_ASSIGN(std::unique_ptr<cpu::CpuExpertBackend> backend,
                       cpu::make_cpu_expert_backend(std::move(layers), host, bo));
    backend_text = "  expert backend (the host's routed experts): cpu, " + backend->summary();
    cuda.expert_backend = std::move(backend);
  }
  KESTREL_TRY_ASSIGN(out.engine, gpu::make_cuda_engine(model, cuda));

  char head[256];
  std::snprintf(head, sizeof head, "placement plan (GPU budget %s; GPU read %.0f GB/s, host read %.1f GB/s, measured):",
                budget_text.c_str(), req.gpu_read_bytes_per_s / 1e9, req.host_read_bytes_per_s / 1e9);
  out.plan.emplace_back(head);
  for (std::string& line : describe_placement(planner, out.decision, true)) out.plan.push_back(std::move(line));
  if (!backend_text.empty()) out.plan.push_back(backend_text);
  if (!pinned_text.empty()) out.plan.push_back(pinned_text);
  return out;
}

}  // namespace kestrel::hybrid
