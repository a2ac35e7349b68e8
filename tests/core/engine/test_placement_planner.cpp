// The placement planner (core/engine/placement_planner.h) on the 35B-A3B shape with Q4_0 weights (the bytes of
// kestrel-mkmodel's `--preset qwen35moe-35b-a3b --types q4_0` file, computed from the tensor list, no file written).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/engine/placement_planner.h"
#include "core/gguf/ggml_type.h"
#include "tools/mkmodel/presets.h"

namespace kestrel {
namespace {

constexpr double kGpuBw = 4.5e12;
constexpr double kHostBw = 90e9;

PlannerModel model_35b_q4_0() {
  auto preset = mkmodel::find_preset("qwen35moe-35b-a3b");
  EXPECT_TRUE(preset.has_value());
  PlannerModel m;
  m.hparams = preset->hparams;
  for (const TensorSpec& spec : expected_tensors(m.hparams, preset->layout)) {
    const GgmlType type = spec.quantizable ? GgmlType::kQ4_0 : GgmlType::kF32;
    const uint64_t rows = std::accumulate(spec.ne.begin() + 1, spec.ne.end(), uint64_t{1}, std::multiplies<>());
    auto row = ggml_row_bytes(type, spec.ne[0]);
    EXPECT_TRUE(row.has_value()) << spec.name;
    m.tensors.push_back(PlannerTensor{spec.name, spec.layer, spec.placement, *row * rows});
  }
  return m;
}

uint64_t bytes_where(const PlannerModel& m, bool routed) {
  uint64_t b = 0;
  for (const PlannerTensor& t : m.tensors) {
    if ((t.placement == PlacementClass::kRoutedExperts) == routed) b += t.bytes;
  }
  return b;
}

uint64_t layer_expert_bytes(const PlannerModel& m, int32_t layer) {
  uint64_t b = 0;
  for (const PlannerTensor& t : m.tensors) {
    if (t.layer == layer && t.placement == PlacementClass::kRoutedExperts) b += t.bytes;
  }
  return b;
}

// Bytes one decode token reads under uniform routing: the dense weights (one row of the embedding table) and k/E of
// every layer's experts.
double one_token_bytes(const PlannerModel& m) {
  const double k_over_e = static_cast<double>(m.hparams.n_expert_used) / m.hparams.n_expert;
  uint64_t embd = 0;
  for (const PlannerTensor& t : m.tensors) {
    if (t.name == "token_embd.weight") embd = t.bytes;
  }
  return static_cast<double>(bytes_where(m, false) - embd) + static_cast<double>(embd) / m.hparams.n_vocab +
         k_over_e * static_cast<double>(bytes_where(m, true));
}

PlacementRequest gpu_request(uint64_t budget) {
  PlacementRequest r;
  r.has_gpu = true;
  r.gpu_budget = budget;
  r.gpu_read_bytes_per_s = kGpuBw;
  r.host_read_bytes_per_s = kHostBw;
  return r;
}

int experts_on_gpu(const PlacementDecision& d, uint32_t layer) {
  return static_cast<int>(std::count(d.expert_on_gpu[layer].begin(), d.expert_on_gpu[layer].end(), 1));
}

TEST(PlacementPlanner, WithoutAGpuEverythingIsOnTheHost) {
  const PlannerModel m = model_35b_q4_0();
  PlacementRequest r;
  r.host_read_bytes_per_s = kHostBw;
  auto d = plan_placement(m, r);
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  EXPECT_EQ(d->gpu_bytes, 0u);
  EXPECT_EQ(d->host_bytes, bytes_where(m, true) + bytes_where(m, false));
  for (WeightDevice dev : d->tensor_device) EXPECT_EQ(dev, WeightDevice::kHost);
  const PlacementPlan plan = summarize_placement(m, *d, "cuda:0");
  EXPECT_EQ(plan.device, "cpu");
  uint64_t sum = 0;
  for (const PlacementEntry& e : plan.entries) {
    EXPECT_EQ(e.device, "cpu") << e.component;
    sum += e.bytes;
  }
  EXPECT_EQ(sum, d->host_bytes);
  // Host-only roofline at one token: the dense weights (one embedding row) and k/E of the experts, at host bandwidth.
  EXPECT_NEAR(d->predicted_step_seconds(1), one_token_bytes(m) / kHostBw, 1e-9);
  // Expert placement without a GPU is refused.
  r.n_cpu_moe = 4;
  EXPECT_EQ(plan_placement(m, r).error().code, ErrorCode::kInvalidArgument);
}

TEST(PlacementPlanner, ABudgetBelowTheDenseWeightsIsRefusedWithTheBytes) {
  const PlannerModel m = model_35b_q4_0();
  const uint64_t dense = bytes_where(m, false);
  auto d = plan_placement(m, gpu_request(dense - 1));
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(d.error().message.find(std::to_string(dense) + " bytes"), std::string::npos) << d.error().message;
  EXPECT_NE(d.error().message.find(std::to_string(dense - 1) + " bytes"), std::string::npos) << d.error().message;
  // Exactly the dense weights: every routed expert on the host.
  auto exact = plan_placement(m, gpu_request(dense));
  ASSERT_TRUE(exact.has_value()) << exact.error().to_string();
  EXPECT_EQ(exact->gpu_bytes, dense);
  EXPECT_EQ(exact->host_expert_layers, m.hparams.n_layer);
  EXPECT_EQ(exact->mixed_layers, 0u);
}

TEST(PlacementPlanner, AmpleBudgetPutsEverythingOnTheGpu) {
  const PlannerModel m = model_35b_q4_0();
  const uint64_t total = bytes_where(m, false) + bytes_where(m, true);
  auto d = plan_placement(m, gpu_request(total));
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  EXPECT_EQ(d->gpu_bytes, total);
  EXPECT_EQ(d->host_bytes, 0u);
  EXPECT_EQ(d->host_expert_layers, 0u);
  for (WeightDevice dev : d->tensor_device) EXPECT_EQ(dev, WeightDevice::kGpu);
  // All-GPU roofline at one token, at GPU bandwidth.
  EXPECT_NEAR(d->predicted_step_seconds(1), one_token_bytes(m) / kGpuBw, 1e-9);
  const PlacementPlan plan = summarize_placement(m, *d, "cuda:0");
  for (const PlacementEntry& e : plan.entries) EXPECT_EQ(e.device, "cuda:0") << e.component;
}

TEST(PlacementPlanner, UniformRoutingFillsWholeLayersFromTheLast) {
  const PlannerModel m = model_35b_q4_0();
  const uint32_t L = m.hparams.n_layer;
  const uint64_t per_layer = layer_expert_bytes(m, 0);
  const uint64_t budget = bytes_where(m, false) + 10 * per_layer + per_layer / 2;
  auto d = plan_placement(m, gpu_request(budget));
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  for (uint32_t l = L - 10; l < L; ++l) EXPECT_EQ(experts_on_gpu(*d, l), static_cast<int>(m.hparams.n_expert)) << l;
  EXPECT_EQ(experts_on_gpu(*d, L - 11), static_cast<int>(m.hparams.n_expert) / 2);
  for (uint32_t l = 0; l + 11 < L; ++l) EXPECT_EQ(experts_on_gpu(*d, l), 0) << l;
  EXPECT_EQ(d->mixed_layers, 1u);
  EXPECT_EQ(d->host_expert_layers, L - 10);
  EXPECT_LE(d->gpu_bytes, budget);
  // The summary splits the routed experts between the devices and sums to the model.
  const PlacementPlan plan = summarize_placement(m, *d, "cuda:0");
  uint64_t routed_gpu = 0, routed_cpu = 0, sum = 0;
  for (const PlacementEntry& e : plan.entries) {
    sum += e.bytes;
    if (e.component == "routed experts") (e.device == "cpu" ? routed_cpu : routed_gpu) += e.bytes;
  }
  EXPECT_EQ(sum, d->gpu_bytes + d->host_bytes);
  EXPECT_EQ(routed_gpu, d->gpu_bytes - bytes_where(m, false));
  EXPECT_GT(routed_cpu, 0u);
}

TEST(PlacementPlanner, MoreBudgetIsNeverPredictedSlower) {
  const PlannerModel m = model_35b_q4_0();
  const uint64_t dense = bytes_where(m, false);
  const uint64_t routed = bytes_where(m, true);
  double last = 0;
  for (int eighths = 0; eighths <= 8; ++eighths) {
    auto d = plan_placement(m, gpu_request(dense + routed / 8 * static_cast<uint64_t>(eighths)));
    ASSERT_TRUE(d.has_value());
    const double tps = d->predicted_tokens_per_s(1);
    EXPECT_GE(tps, last) << eighths << "/8 of the experts";
    last = tps;
  }
}

TEST(PlacementPlanner, NCpuMoeKeepsTheFirstLayersOnTheHost) {
  const PlannerModel m = model_35b_q4_0();
  PlacementRequest r = gpu_request(bytes_where(m, false) + bytes_where(m, true));
  r.n_cpu_moe = 20;
  auto d = plan_placement(m, r);
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  for (uint32_t l = 0; l < m.hparams.n_layer; ++l) {
    EXPECT_EQ(experts_on_gpu(*d, l), l < 20 ? 0 : static_cast<int>(m.hparams.n_expert)) << l;
  }
  EXPECT_EQ(d->host_expert_layers, 20u);
  EXPECT_EQ(d->mixed_layers, 0u);
  r.n_cpu_moe = -1;
  EXPECT_EQ(plan_placement(m, r).error().code, ErrorCode::kInvalidArgument);
}

TEST(PlacementPlanner, OverridesPinLayersAndTheLastMatchWins) {
  const PlannerModel m = model_35b_q4_0();
  const uint64_t dense = bytes_where(m, false);
  PlacementRequest r = gpu_request(dense + bytes_where(m, true));
  r.overrides.push_back(*parse_tensor_override("blk\\.(3|5|7)\\.ffn_.*_exps=cpu"));
  r.overrides.push_back(*parse_tensor_override("blk\\.7\\.=gpu"));
  auto d = plan_placement(m, r);
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  EXPECT_EQ(experts_on_gpu(*d, 3), 0);
  EXPECT_EQ(experts_on_gpu(*d, 5), 0);
  EXPECT_EQ(experts_on_gpu(*d, 7), static_cast<int>(m.hparams.n_expert));
  EXPECT_EQ(d->host_expert_layers, 2u);

  // Experts pinned to the GPU beyond the budget are refused.
  PlacementRequest tight = gpu_request(dense + layer_expert_bytes(m, 0));
  tight.overrides.push_back(*parse_tensor_override("blk\\.(0|1)\\.=gpu"));
  auto refused = plan_placement(m, tight);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
}

TEST(PlacementPlanner, RoutingCountsPlaceTheHottestExpertsFirst) {
  const PlannerModel m = model_35b_q4_0();
  const uint32_t L = m.hparams.n_layer, E = m.hparams.n_expert;
  PlacementRequest r = gpu_request(0);
  r.expert_counts.resize(static_cast<size_t>(L) * E);
  for (uint32_t l = 0; l < L; ++l) {
    for (uint32_t e = 0; e < E; ++e) r.expert_counts[static_cast<size_t>(l) * E + e] = (e * 7 + l * 13) % 97 + 1;
  }
  const uint64_t expert = layer_expert_bytes(m, 0) / E;
  constexpr uint64_t kFit = 300;
  r.gpu_budget = bytes_where(m, false) + kFit * expert;
  auto d = plan_placement(m, r);
  ASSERT_TRUE(d.has_value()) << d.error().to_string();
  // Exactly kFit experts fit, and every one on the GPU is at least as likely to be routed to (its share of its
  // layer's counts) as every one on the host.
  double coldest_gpu = 2, hottest_host = 0;
  uint64_t n_gpu = 0;
  for (uint32_t l = 0; l < L; ++l) {
    const uint64_t* counts = r.expert_counts.data() + static_cast<size_t>(l) * E;
    const double total = static_cast<double>(std::accumulate(counts, counts + E, uint64_t{0}));
    for (uint32_t e = 0; e < E; ++e) {
      const double p = static_cast<double>(counts[e]) / total;
      if (d->expert_on_gpu[l][e]) {
        ++n_gpu;
        coldest_gpu = std::min(coldest_gpu, p);
      } else {
        hottest_host = std::max(hottest_host, p);
      }
    }
  }
  EXPECT_EQ(n_gpu, kFit);
  EXPECT_GE(coldest_gpu, hottest_host);
  // The same request plans the same placement.
  auto again = plan_placement(m, r);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->expert_on_gpu, d->expert_on_gpu);
  // Counts of the wrong size are refused.
  r.expert_counts.pop_back();
  EXPECT_EQ(plan_placement(m, r).error().code, ErrorCode::kInvalidArgument);
}

TEST(PlacementPlanner, HostExpertsCostHostTimeAndAHandoff) {
  const PlannerModel m = model_35b_q4_0();
  const uint64_t dense = bytes_where(m, false), routed = bytes_where(m, true);
  auto all_gpu = plan_placement(m, gpu_request(dense + routed));
  auto all_host = plan_placement(m, gpu_request(dense));
  ASSERT_TRUE(all_gpu && all_host);
  const double k_over_e = static_cast<double>(m.hparams.n_expert_used) / m.hparams.n_expert;
  const double expected_gap =
      k_over_e * static_cast<double>(routed) * (1.0 / kHostBw - 1.0 / kGpuBw) + m.hparams.n_layer * kHandoffSeconds;
  EXPECT_NEAR(all_host->predicted_step_seconds(1) - all_gpu->predicted_step_seconds(1), expected_gap, 1e-9);
  // A batch reads each expert at most once: 32 tokens cost less than 32 single steps.
  EXPECT_LT(all_host->predicted_step_seconds(32), 32 * all_host->predicted_step_seconds(1));
  EXPECT_GT(all_host->predicted_tokens_per_s(32), all_host->predicted_tokens_per_s(1));
}

// The side read takes a share s of each token's host choices to the GPU over the bus: at one token the host reads
// (1 − s) of the host experts' bytes and the GPU s of them at the bus's rate, each side's time beside the other's.
TEST(PlacementPlanner, TheSideReadSplitsTheHostExpertsBytes) {
  const PlannerModel m = model_35b_q4_0();
  const uint64_t dense = bytes_where(m, false), routed = bytes_where(m, true);
  auto d = plan_placement(m, gpu_request(dense));
  ASSERT_TRUE(d.has_value());
  const double without = d->predicted_step_seconds(1);
  constexpr double kBusBw = 50e9;
  const double s = 0.25;
  d->side_read_share = s;
  d->bus_read_bytes_per_s = kBusBw;
  const double k_over_e = static_cast<double>(m.hparams.n_expert_used) / m.hparams.n_expert;
  const double host_bytes = k_over_e * static_cast<double>(routed);  // read by one token, over all layers
  // Each layer pays the longer side: here the host's (0.75 of its bytes at 90 GB/s + the hand-off) against the bus's
  // (0.25 at 50 GB/s; the GPU holds no routed expert).
  ASSERT_GT((1 - s) * host_bytes / kHostBw, s * host_bytes / kBusBw);
  EXPECT_NEAR(without - d->predicted_step_seconds(1), s * host_bytes / kHostBw, 1e-9);
  // A bus share past the balance makes the GPU's side the longer one.
  d->side_read_share = 0.9;
  EXPECT_NEAR(d->predicted_step_seconds(1) - (without - host_bytes / kHostBw - m.hparams.n_layer * kHandoffSeconds),
              0.9 * host_bytes / kBusBw, 1e-9);
  bool named = false;
  for (const std::string& line : describe_placement(m, *d, true)) {
    named = named || line.find("(with the side read)") != std::string::npos;
  }
  EXPECT_TRUE(named) << "the plan's prediction does not say it counts the side read";
}

TEST(PlacementPlanner, ParsesTensorOverrides) {
  auto cpu = parse_tensor_override("blk\\.1[0-9]\\.=CPU");
  ASSERT_TRUE(cpu.has_value());
  EXPECT_EQ(cpu->pattern, "blk\\.1[0-9]\\.");
  EXPECT_EQ(cpu->device, WeightDevice::kHost);
  auto gpu = parse_tensor_override("exps=cuda");
  ASSERT_TRUE(gpu.has_value());
  EXPECT_EQ(gpu->device, WeightDevice::kGpu);
  for (const char* bad : {"", "=cpu", "blk", "blk=", "blk=tpu", "blk[=cpu"}) {
    auto r = parse_tensor_override(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(PlacementPlanner, ParsesPlacementFlags) {
  auto defaults = parse_placement_flags(PlacementFlags{});
  ASSERT_TRUE(defaults.has_value());
  EXPECT_TRUE(defaults->auto_budget);
  EXPECT_EQ(defaults->n_cpu_moe, 0);
  EXPECT_TRUE(defaults->overrides.empty());
  PlacementFlags f;
  f.gpu_memory = "12G";
  f.n_cpu_moe = 20;
  f.overrides = {"blk\\.1[0-9]\\.=cpu", "blk\\.3\\.=gpu"};
  auto c = parse_placement_flags(f);
  ASSERT_TRUE(c.has_value()) << c.error().to_string();
  EXPECT_FALSE(c->auto_budget);
  EXPECT_EQ(c->gpu_budget, uint64_t{12} << 30);
  EXPECT_EQ(c->n_cpu_moe, 20);
  ASSERT_EQ(c->overrides.size(), 2u);
  EXPECT_EQ(c->overrides[1].device, WeightDevice::kGpu);
  f.gpu_memory = "AUTO";
  EXPECT_TRUE(parse_placement_flags(f)->auto_budget);
  for (const char* bad : {"twelve", "12X", ""}) {
    PlacementFlags b;
    b.gpu_memory = bad;
    EXPECT_EQ(parse_placement_flags(b).error().code, ErrorCode::kInvalidArgument) << bad;
  }
  PlacementFlags neg;
  neg.n_cpu_moe = -1;
  EXPECT_EQ(parse_placement_flags(neg).error().code, ErrorCode::kInvalidArgument);
  PlacementFlags bad_override;
  bad_override.overrides = {"blk=tpu"};
  EXPECT_EQ(parse_placement_flags(bad_override).error().code, ErrorCode::kInvalidArgument);
}

TEST(PlacementPlanner, SplitsOverrideLists) {
  EXPECT_EQ(split_tensor_overrides("a=cpu;b{1,2}=gpu"), (std::vector<std::string>{"a=cpu", "b{1,2}=gpu"}));
  EXPECT_EQ(split_tensor_overrides(";a=cpu;;"), (std::vector<std::string>{"a=cpu"}));
  EXPECT_TRUE(split_tensor_overrides("").empty());
}

TEST(PlacementPlanner, DescribesThePlan) {
  const PlannerModel m = model_35b_q4_0();
  PlacementRequest r = gpu_request(uint64_t{1} << 40);
  r.n_cpu_moe = 20;
  auto d = plan_placement(m, r);
  ASSERT_TRUE(d.has_value());
  const std::string summary = placement_summary(m, *d);
  EXPECT_EQ(summary.rfind("routed experts: 20 of 40 MoE layers wholly on the GPU, 0 split (none), 20 wholly on the "
                          "host; predicted decode ",
                          0),
            0u)
      << summary;
  EXPECT_EQ(summarize_placement(m, *d, "cuda:0").summary, summary);
  const std::vector<std::string> lines = describe_placement(m, *d, true);
  ASSERT_GE(lines.size(), 4u);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "  " + summary.substr(0, summary.find(';'))), lines.end());
  EXPECT_EQ(lines.back().rfind("  predicted decode (roofline of the cost model): ", 0), 0u) << lines.back();
  bool host_experts = false;
  for (const std::string& l : lines) host_experts = host_experts || l.rfind("  routed experts     cpu", 0) == 0;
  EXPECT_TRUE(host_experts) << "no host line for the routed experts";
}

}  // namespace
}  // namespace kestrel
