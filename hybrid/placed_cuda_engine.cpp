// make_placed_cuda_engine (placed_cuda_engine.h).
#include "hybrid/placed_cuda_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "core/base/byte_size.h"
#include "core/engine/expert_backend.h"
#include "core/engine/routing_counts.h"
#include "cpu/expert_backend.h"
#include "cpu/read_bandwidth.h"
#include "cpu/routing_calibration.h"
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

// The upload's cost model (kExpertUploadAuto): a prompt pass that uploads moves every host expert of the hybrid
// layers at the measured page-locked copy rate; one that does not has the host compute each prompt token's choices
// that land on its experts (n_expert_used × the layer's share of host experts, uniform routing assumed), at the rate
// one batch of kCostTokens tokens on the fullest host layer measures. Uploads pay from where the two cross.
struct UploadCost {
  uint64_t bytes = 0;           // a pass's upload
  double upload_s = 0;          // at the measured copy rate
  double host_s_per_token = 0;  // the host's time per prompt token over all hybrid layers
  int min_tokens = 0;           // where they cross
};

constexpr int kCostTokens = 128;

Expected<UploadCost> upload_cost(const Model& model, const ExpertSet& host, ExpertBackend& backend,
                                 double copy_bytes_per_s) {
  const ModelHparams& hp = model.hparams();
  UploadCost c;
  double pairs_per_token = 0;
  int32_t fullest = -1;
  std::vector<int32_t> ids;  // the fullest layer's host experts
  for (size_t l = 0; l < host.held.size(); ++l) {
    const std::vector<uint8_t>& row = host.held[l];
    std::vector<int32_t> held;
    for (size_t e = 0; e < row.size(); ++e) {
      if (row[e] != 0) held.push_back(static_cast<int32_t>(e));
    }
    if (held.empty()) continue;
    const FfnWeights& f = model.catalog().layer(static_cast<uint32_t>(l)).ffn;
    const uint64_t per_expert = (f.gate_exps.n_bytes() + f.up_exps.n_bytes() + f.down_exps.n_bytes()) / row.size();
    c.bytes += per_expert * held.size();
    pairs_per_token +=
        static_cast<double>(hp.n_expert_used) * static_cast<double>(held.size()) / static_cast<double>(row.size());
    if (held.size() > ids.size()) {
      ids = std::move(held);
      fullest = static_cast<int32_t>(l);
    }
  }
  if (fullest < 0) return make_error(ErrorCode::kFailedPrecondition, "upload cost: no expert on the host");
  const int k = static_cast<int>(std::min<size_t>(hp.n_expert_used, ids.size()));
  const int hidden = backend.hidden();
  std::vector<float> x(static_cast<size_t>(kCostTokens) * static_cast<size_t>(hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 17) - 8) * 0.01f;
  std::vector<float> y(x.size());
  std::vector<ExpertChoice> choices(static_cast<size_t>(kCostTokens * k));
  for (size_t i = 0; i < choices.size(); ++i) choices[i] = {ids[i % ids.size()], 1.0f / static_cast<float>(k)};
  const ExpertBatch batch{fullest, kCostTokens, hidden, k, x.data(), choices.data(), y.data()};
  double best = 0;
  for (int r = 0; r < 3; ++r) {  // the first run warms up
    const auto t0 = std::chrono::steady_clock::now();
    KESTREL_TRY(backend.run(batch));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0 && (best == 0 || s < best)) best = s;
  }
  c.host_s_per_token = best / static_cast<double>(kCostTokens * k) * pairs_per_token;
  c.upload_s = static_cast<double>(c.bytes) / copy_bytes_per_s;
  const double cross = c.host_s_per_token > 0 ? std::ceil(c.upload_s / c.host_s_per_token) : 1e6;
  c.min_tokens = static_cast<int>(std::clamp(cross, 1.0, 1e6));
  return c;
}

// Whether routing counts can change the plan: the flags leave the routed experts to the budget (no --n-cpu-moe, no
// override) and the budget splits them between the devices.
bool counts_matter(const PlacementChoice& choice, const PlacementDecision& decision) {
  return choice.n_cpu_moe == 0 && choice.overrides.empty() &&
         ExpertSet::on_device(decision, WeightDevice::kHost).count() > 0 &&
         ExpertSet::on_device(decision, WeightDevice::kGpu).count() > 0;
}

// The routing counts for the plan (PlacedEngineOptions::routing_calibration, routing_counts_dir) and the plan's line
// saying where they came from.
Expected<RoutingCounts> routing_counts_for(const Model& model, const PlacedEngineOptions& options, std::string* text) {
  const ModelHparams& hp = model.hparams();
  const uint64_t key = routing_key(model);
  std::string path, earlier;
  if (!options.routing_counts_dir.empty()) {
    path = routing_counts_path(options.routing_counts_dir, key);
    Expected<RoutingCounts> kept = load_routing_counts(path, key, hp.n_layer, hp.n_expert);
    if (kept) {
      *text = "  routing counts: kept from an earlier run, " + std::to_string(kept->tokens) + " tokens (" + path + ")";
      return kept;
    }
    if (kept.error().code != ErrorCode::kNotFound) earlier = "; the kept file was not used: " + kept.error().message;
  }
  if (options.routing_calibration <= 0) {
    return make_error(ErrorCode::kFailedPrecondition, "no kept counts and calibration off" + earlier);
  }
  const auto t0 = std::chrono::steady_clock::now();
  KESTREL_TRY_ASSIGN(const std::vector<int32_t> tokens, cpu::calibration_tokens(model, options.routing_calibration));
  KESTREL_TRY_ASSIGN(RoutingCounts counts, cpu::calibrate_routing(model, tokens, 0));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string kept_text = "not kept";
  if (!path.empty()) {
    const Status saved = save_routing_counts(path, key, hp.n_layer, hp.n_expert, counts);
    kept_text = saved ? "kept in " + path : "not kept: " + saved.error().message;
  }
  char line[160];
  std::snprintf(line, sizeof line,
                "  routing counts: a calibration prompt of %lld tokens through the CPU engine in %.1f s",
                static_cast<long long>(counts.tokens), s);
  *text = line + (" (" + kept_text + ")") + earlier;
  return counts;
}

// Fixes cuda.tuning.expert_side_read, and the decision's side-read fields for its cost model, and returns the plan's
// line about it: 0 without a page-locked copy (the GPU reads only registered host memory); from kSideReadAuto the
// share at which both sides would finish together, bus ÷ (bus + host) of the two rates measured alone (the lent H100
// box: 51 and 93–110 GB/s, 0.32–0.36; beside the bus the host's 14 threads kept ~90% of their rate,
// dev/experiments/pcie_side_read.cu); a set share as it is.
std::string resolve_side_read(gpu::CudaEngineOptions& cuda, PlacementDecision& decision) {
  float& share = cuda.tuning.expert_side_read;
  if (share == 0.0f) return "  side read off: the host's workers read every host expert (set)";
  if (cuda.pinned_experts == nullptr) {
    share = 0.0f;
    return "  side read off: the host experts are not page-locked";
  }
  const double host = decision.host_read_bytes_per_s;
  Expected<double> bus = gpu::cuda_mapped_read_bandwidth(cuda.device);
  if (!bus || !(host > 0.0)) {
    share = 0.0f;
    return "  side read off: the bus's rate could not be measured" + (bus ? std::string() : ": " + bus.error().message);
  }
  const bool set = share != gpu::kSideReadAuto;
  if (!set) share = static_cast<float>(*bus / (*bus + host));
  decision.side_read_share = share;
  decision.bus_read_bytes_per_s = *bus;
  if (cuda.placement) {
    cuda.placement->side_read_share = share;
    cuda.placement->bus_read_bytes_per_s = *bus;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "  side read: the GPU reads %.0f%% of each token's host experts over the bus (%s: %.1f GB/s over the "
                "bus against %.1f GB/s host read, measured)",
                100.0 * share, set ? "set" : "cost model", *bus * 1e-9, host * 1e-9);
  return line;
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
  std::string routing_text;
  if (counts_matter(choice, out.decision)) {
    Expected<RoutingCounts> counts = routing_counts_for(model, options, &routing_text);
    if (counts) {
      req.expert_counts = std::move(counts->counts);
      KESTREL_TRY_ASSIGN(out.decision, plan_placement(planner, req));
    } else {
      routing_text = "  routing counts: none (" + counts.error().message + "): every expert equally likely";
    }
  }

  gpu::CudaEngineOptions cuda = options.cuda;
  cuda.placement = out.decision;
  const ExpertSet host = ExpertSet::on_device(out.decision, WeightDevice::kHost);
  std::string backend_text;
  std::string pinned_text, upload_text, side_read_text;
  if (host.count() > 0) {
    // Prompt passes that upload the host's experts read them at the link's rate only from page-locked memory: the
    // hybrid layers' stacks are then copied there once, and the backend reads that copy too. Without the room for it
    // the backend reads the file mapping and uploads bounce through pinned buffers.
    KESTREL_TRY_ASSIGN(std::vector<ref::MoeWeights> layers, cpu::expert_weight_views(model));
    const gpu::GpuTuning& tuning = options.cuda.tuning;
    if (tuning.expert_upload_min_tokens != 0 || tuning.expert_side_read != 0.0f) {
      Expected<std::unique_ptr<gpu::PinnedExperts>> pinned = gpu::PinnedExperts::create(model, host.layers(), threads);
      if (pinned) {
        for (size_t l = 0; l < layers.size(); ++l) {
          const gpu::PinnedExperts::Layer& p = (*pinned)->layer(l);
          if (p.gate == nullptr) continue;
          layers[l].gate_exps.data = p.gate;
          layers[l].up_exps.data = p.up;
          layers[l].down_exps.data = p.down;
        }
        char line[160];
        std::snprintf(line, sizeof line, "  host experts page-locked (prompt uploads, side read): %s in %.1f s",
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
    int& min_tokens = cuda.tuning.expert_upload_min_tokens;
    if (min_tokens == gpu::kExpertUploadAuto) {
      Expected<double> copy = gpu::cuda_pinned_copy_bandwidth(options.cuda.device);
      Expected<UploadCost> c = copy ? upload_cost(model, host, *backend, *copy) : Expected<UploadCost>(copy.error());
      char line[320];
      if (c) {
        min_tokens = c->min_tokens;
        std::snprintf(
            line, sizeof line,
            "  prompt passes upload the host's experts from %d tokens (cost model: %.2f GB a pass at %.1f GB/s "
            "page-locked copy, %.0f ms, against %.2f ms a prompt token on the host, measured)",
            min_tokens, static_cast<double>(c->bytes) * 1e-9, *copy * 1e-9, c->upload_s * 1e3,
            c->host_s_per_token * 1e3);
      } else {
        min_tokens = gpu::kExpertUploadMeasuredTokens;
        std::snprintf(line, sizeof line,
                      "  prompt passes upload the host's experts from %d tokens (the H100 box's measured crossover: "
                      "the cost model could not measure: %s)",
                      min_tokens, c.error().message.c_str());
      }
      upload_text = line;
    } else {
      upload_text = min_tokens > 0 ? "  prompt passes upload the host's experts from " + std::to_string(min_tokens) +
                                         " tokens (set)"
                                   : "  prompt passes leave the host's experts on the host (uploads off)";
    }
    cuda.expert_backend = std::move(backend);
    side_read_text = resolve_side_read(cuda, out.decision);
  }
  KESTREL_TRY_ASSIGN(out.engine, gpu::make_cuda_engine(model, cuda));

  char head[256];
  std::snprintf(head, sizeof head, "placement plan (GPU budget %s; GPU read %.0f GB/s, host read %.1f GB/s, measured):",
                budget_text.c_str(), req.gpu_read_bytes_per_s / 1e9, req.host_read_bytes_per_s / 1e9);
  out.plan.emplace_back(head);
  for (std::string& line : describe_placement(planner, out.decision, true)) out.plan.push_back(std::move(line));
  if (!routing_text.empty()) out.plan.push_back(routing_text);
  if (!backend_text.empty()) out.plan.push_back(backend_text);
  if (!pinned_text.empty()) out.plan.push_back(pinned_text);
  if (!upload_text.empty()) out.plan.push_back(upload_text);
  if (!side_read_text.empty()) out.plan.push_back(side_read_text);
  return out;
}

}  // namespace kestrel::hybrid
