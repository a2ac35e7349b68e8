// The placement planner: which device holds each weight of a model, from a GPU memory budget, the bandwidths of the
// machine and the user's overrides (design.md §3 "Placement", §6). A pure function: no devices are touched, so the
// daemon plans at start-up from what it measured and `kestrel inspect --plan` shows what a budget would give.
//
// What goes where:
//   - without a GPU, everything is on the host;
//   - with one, every weight but the routed experts is on the GPU (embeddings, lm_head, every GDN and attention
//     layer, norms, routers, shared experts, dense FFNs); when they alone exceed the budget the plan is refused with
//     the bytes they need;
//   - routed experts are placed one by one (expert e of a layer is the e-th slice of its ffn_{gate,up,down}_exps
//     tensors, the three together on one device): those the overrides pin go where they say, the routed experts of
//     the first n_cpu_moe MoE layers stay on the host (llama.cpp's --n-cpu-moe), and the rest fill what the budget
//     has left.
//
// Filling the budget: with routing counts, experts are taken hottest first (by expected bytes read per token, i.e.
// routing probability, since every expert of a model has the same size); without counts every expert is equally
// likely, and whole layers are taken from the last MoE layer down, so as few layers as possible mix devices (each
// mixed layer costs a CPU/GPU hand-off per step). Ties fall to the lower layer, then the lower expert id, so a plan
// is deterministic.
//
// The cost model (predicted decode step time for B tokens, one session each): per layer, the GPU reads its resident
// dense weights, and the experts the B tokens route to are read once each, on their device; a layer with host
// experts runs them beside the GPU's experts and joins after both, paying kHandoffSeconds:
//   t_layer = dense_gpu + max(experts_gpu + experts_bus, experts_host + handoff)   (dense_gpu includes the shared
//             expert)
//   t_step  = Σ t_layer + (embedding row + lm_head) / gpu_read
// An expert with routing probability p (per token, out of k picks) is read in a step of B tokens with probability
// 1 − (1 − p)^B. With the side read (PlacementDecision::side_read_share s, gpu/kernels/moe_hybrid.h step 3b) a share
// s of each token's host choices goes over the bus: a host expert is read by the GPU over the bus with probability
// 1 − (1 − p·s)^B (experts_bus, at bus_read) and by the host with 1 − (1 − p·(1 − s))^B. Bandwidths are plain read
// rates (bytes/s); they make a roofline, not a promise.
//
// Thread-safety: pure functions over their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/engine.h"
#include "core/model/model_hparams.h"
#include "core/model/tensor_layout.h"

namespace kestrel {

class WeightCatalog;

enum class WeightDevice : uint8_t { kHost, kGpu };
std::string_view weight_device_name(WeightDevice d);  // "host", "gpu"

// One tensor the planner places: its name, block (-1 for globals), class and bytes in the file.
struct PlannerTensor {
  std::string name;
  int32_t layer = -1;
  PlacementClass placement = PlacementClass::kDense;
  uint64_t bytes = 0;
};

// The model as the planner sees it (the used tensors of a catalog; tests build one from expected_tensors()).
struct PlannerModel {
  ModelHparams hparams;
  std::vector<PlannerTensor> tensors;
};
PlannerModel planner_model(const WeightCatalog& catalog);

// An override: the routed experts of every layer whose ffn_{gate,up,down}_exps tensor names match `pattern`
// (an ECMAScript regular expression searched in the name, e.g. "blk\.(1[0-9])\.") go to `device`.
struct TensorOverride {
  std::string pattern;
  WeightDevice device = WeightDevice::kHost;
};

// "PATTERN=cpu" / "PATTERN=gpu" (also "host", "cuda"); kInvalidArgument naming what is wrong.
Expected<TensorOverride> parse_tensor_override(const std::string& text);

struct PlacementRequest {
  bool has_gpu = false;
  uint64_t gpu_budget = 0;  // bytes the weights may take on the GPU
  int32_t n_cpu_moe = 0;    // the routed experts of the first n_cpu_moe MoE layers stay on the host
  std::vector<TensorOverride> overrides;
  // Routing counts, [n_layer][n_expert] flattened (calibration or earlier runs); empty: every expert equally likely.
  std::vector<uint64_t> expert_counts;
  double gpu_read_bytes_per_s = 0;   // plain read bandwidth of the GPU's memory
  double host_read_bytes_per_s = 0;  // plain read bandwidth of host memory with every worker thread
};

// The time a layer with host experts pays to hand its tokens to the CPU workers and join their results.
inline constexpr double kHandoffSeconds = 20e-6;

struct PlacementDecision {
  std::vector<WeightDevice> tensor_device;          // per PlannerModel::tensors entry (routed: where most experts are)
  std::vector<std::vector<uint8_t>> expert_on_gpu;  // [n_layer][n_expert], 1: resident on the GPU; empty rows: no MoE
  uint64_t gpu_bytes = 0;
  uint64_t host_bytes = 0;
  uint32_t mixed_layers = 0;        // MoE layers with experts on both devices
  uint32_t host_expert_layers = 0;  // MoE layers with any expert on the host

  // Predicted decode step time for `batch` tokens (the cost model above) and tokens/s from it.
  double predicted_step_seconds(int32_t batch) const;
  double predicted_tokens_per_s(int32_t batch) const;

  // What the cost model needs, kept from planning.
  struct LayerCost {
    double dense_gpu_bytes = 0;    // non-expert weights of the layer (on the GPU)
    std::vector<double> expert_p;  // per expert: routing probability per token
    double expert_bytes = 0;       // bytes of one expert (gate + up + down slices)
  };
  std::vector<LayerCost> layer_cost;      // [n_layer]
  double global_gpu_bytes_per_token = 0;  // embedding row + output norm + lm_head
  double gpu_read_bytes_per_s = 0;
  double host_read_bytes_per_s = 0;
  // The side read, when the engine takes it (set after planning: hybrid/placed_cuda_engine.h); 0: none.
  double side_read_share = 0;
  double bus_read_bytes_per_s = 0;  // the GPU's read of page-locked host memory
};

// Plans `model` for `request`. kResourceExhausted when the GPU cannot hold the weights that must live there (the
// message names the bytes needed and the budget); kInvalidArgument for a bad override pattern, an override or
// n_cpu_moe without a GPU, negative n_cpu_moe, counts of the wrong size, or missing bandwidths.
Expected<PlacementDecision> plan_placement(const PlannerModel& model, const PlacementRequest& request);

// The per-component summary engines report (engine.h): routed experts split into a GPU and a host entry when both
// hold some; PlacementPlan::summary is placement_summary's line.
PlacementPlan summarize_placement(const PlannerModel& model, const PlacementDecision& decision,
                                  const std::string& gpu_label);

// The plan as people read it (kestrel inspect --plan, kestreld's start-up log, kestrel-engine-run, bench_engine): a
// line per component ("  gdn layers   gpu   1.23 GiB"), the totals, with a GPU where the MoE layers' routed
// experts are (wholly on the GPU, split, wholly on the host), and the cost model's predicted decode tokens/s.
std::vector<std::string> describe_placement(const PlannerModel& model, const PlacementDecision& decision, bool has_gpu);

// One line: "routed experts: 20 of 40 MoE layers wholly on the GPU, 0 split (none), 20 wholly on the host; predicted
// decode 183 tokens/s at 1 session, 520 aggregate at 32" (without routed experts only the prediction).
std::string placement_summary(const PlannerModel& model, const PlacementDecision& decision);

// The placement flags as users give them: kestreld's --gpu-memory, --n-cpu-moe and --override-tensor (and the
// config file's keys of the same names), kestrel-engine-run's and bench_engine's; `kestrel inspect --plan` takes the
// same names.
struct PlacementFlags {
  std::string gpu_memory = "auto";     // BYTES (12G, 512MiB, 8000000000) or "auto": what the device has free, less
                                       // the engine's state, scratch and headroom
  int32_t n_cpu_moe = 0;               // the routed experts of the first N MoE layers stay on the host
  std::vector<std::string> overrides;  // REGEX=cpu|gpu (parse_tensor_override), the last matching one wins
};

// "A=cpu;B=gpu" → {"A=cpu", "B=gpu"}: several overrides in one value (kestreld's --override-tensor and its config
// key hold one string; a regular expression rarely needs a ';'). Empty pieces are dropped.
std::vector<std::string> split_tensor_overrides(std::string_view list);

// The flags parsed. kInvalidArgument naming the bad flag.
struct PlacementChoice {
  bool auto_budget = true;
  uint64_t gpu_budget = 0;  // when !auto_budget
  int32_t n_cpu_moe = 0;
  std::vector<TensorOverride> overrides;
};
Expected<PlacementChoice> parse_placement_flags(const PlacementFlags& flags);

}  // namespace kestrel
