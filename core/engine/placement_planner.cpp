// The placement planner (placement_planner.h): mandatory GPU weights, pinned experts, then the budget filled by a
// deterministic order; the cost model over the result.
#include "core/engine/placement_planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <regex>
#include <string>
#include <utility>

#include "core/model/weight_catalog.h"

namespace kestrel {
namespace {

// "12.00 GiB", or "0.8 MiB" below a GiB.
std::string gib(uint64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  }
  return buf;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A layer's routed-expert tensors (indices into PlannerModel::tensors).
struct ExpertTensors {
  std::vector<size_t> tensors;
  uint64_t bytes = 0;  // all experts of the layer
};

}  // namespace

std::string_view weight_device_name(WeightDevice d) { return d == WeightDevice::kGpu ? "gpu" : "host"; }

PlannerModel planner_model(const WeightCatalog& catalog) {
  PlannerModel m;
  m.hparams = catalog.hparams();
  for (const CatalogEntry& e : catalog.entries()) {
    if (e.skipped || e.info == nullptr) continue;
    m.tensors.push_back(PlannerTensor{e.info->name, e.layer, e.placement, e.info->n_bytes});
  }
  return m;
}

Expected<TensorOverride> parse_tensor_override(const std::string& text) {
  const size_t eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "tensor override '" + text + "': expected PATTERN=cpu or PATTERN=gpu (e.g. 'blk\\.1[0-9]\\.=cpu')");
  }
  TensorOverride o;
  o.pattern = text.substr(0, eq);
  const std::string dev = lower(text.substr(eq + 1));
  if (dev == "cpu" || dev == "host") {
    o.device = WeightDevice::kHost;
  } else if (dev == "gpu" || dev == "cuda") {
    o.device = WeightDevice::kGpu;
  } else {
    return make_error(ErrorCode::kInvalidArgument,
                      "tensor override '" + text + "': device '" + text.substr(eq + 1) + "' is not cpu or gpu");
  }
  try {
    (void)std::regex(o.pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return make_error(ErrorCode::kInvalidArgument, "tensor override '" + text + "': '" + o.pattern +
                                                       "' is not a regular expression (" + e.what() + ")");
  }
  return o;
}

Expected<PlacementDecision> plan_placement(const PlannerModel& model, const PlacementRequest& request) {
  const ModelHparams& hp = model.hparams;
  const uint32_t L = hp.n_layer;
  const uint32_t E = hp.n_expert;
  if (request.n_cpu_moe < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "n_cpu_moe must be >= 0 (got " + std::to_string(request.n_cpu_moe) + ")");
  }
  if (!request.has_gpu && (request.n_cpu_moe > 0 || !request.overrides.empty())) {
    return make_error(ErrorCode::kInvalidArgument,
                      "expert placement (n_cpu_moe, tensor overrides) needs a GPU; without one every weight is on the "
                      "host");
  }
  if (!request.expert_counts.empty() && request.expert_counts.size() != static_cast<size_t>(L) * E) {
    return make_error(ErrorCode::kInvalidArgument,
                      "expert routing counts: " + std::to_string(request.expert_counts.size()) + " values for " +
                          std::to_string(L) + " layers of " + std::to_string(E) + " experts");
  }
  if (!(request.host_read_bytes_per_s > 0) || (request.has_gpu && !(request.gpu_read_bytes_per_s > 0))) {
    return make_error(ErrorCode::kInvalidArgument, "placement needs the measured read bandwidths (bytes/s)");
  }
  std::vector<std::regex> patterns;
  for (const TensorOverride& o : request.overrides) {
    try {
      patterns.emplace_back(o.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return make_error(ErrorCode::kInvalidArgument,
                        "tensor override '" + o.pattern + "' is not a regular expression (" + e.what() + ")");
    }
  }

  PlacementDecision d;
  d.gpu_read_bytes_per_s = request.gpu_read_bytes_per_s;
  d.host_read_bytes_per_s = request.host_read_bytes_per_s;
  d.tensor_device.assign(model.tensors.size(), WeightDevice::kHost);
  d.layer_cost.resize(L);
  std::vector<ExpertTensors> experts(L);
  const WeightDevice dense_device = request.has_gpu ? WeightDevice::kGpu : WeightDevice::kHost;
  uint64_t mandatory = 0;  // bytes that must sit on the dense device
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    const PlannerTensor& t = model.tensors[i];
    const bool routed =
        t.placement == PlacementClass::kRoutedExperts && t.layer >= 0 && static_cast<uint32_t>(t.layer) < L && E > 0;
    if (routed) {
      experts[static_cast<size_t>(t.layer)].tensors.push_back(i);
      experts[static_cast<size_t>(t.layer)].bytes += t.bytes;
      continue;
    }
    d.tensor_device[i] = dense_device;
    mandatory += t.bytes;
    if (t.layer >= 0 && static_cast<uint32_t>(t.layer) < L) {
      d.layer_cost[static_cast<size_t>(t.layer)].dense_gpu_bytes += static_cast<double>(t.bytes);
    } else if (t.name == "token_embd.weight") {
      d.global_gpu_bytes_per_token += static_cast<double>(t.bytes) / std::max<uint32_t>(hp.n_vocab, 1);
    } else {
      d.global_gpu_bytes_per_token += static_cast<double>(t.bytes);  // output norm, lm_head
    }
  }
  if (request.has_gpu && mandatory > request.gpu_budget) {
    return make_error(ErrorCode::kResourceExhausted,
                      "the GPU budget of " + gib(request.gpu_budget) + " (" + std::to_string(request.gpu_budget) +
                          " bytes) cannot hold the weights that must live on the GPU (embeddings, lm_head, every GDN "
                          "and attention layer, norms, routers, shared experts): " +
                          gib(mandatory) + " (" + std::to_string(mandatory) + " bytes)");
  }

  // Routing probabilities per expert (per token) and each layer's expert size.
  d.expert_on_gpu.assign(L, {});
  std::vector<uint32_t> moe_layers;
  for (uint32_t l = 0; l < L; ++l) {
    if (experts[l].tensors.empty()) continue;
    moe_layers.push_back(l);
    PlacementDecision::LayerCost& c = d.layer_cost[l];
    c.expert_bytes = static_cast<double>(experts[l].bytes) / E;
    c.expert_p.assign(E, static_cast<double>(hp.n_expert_used) / E);
    if (!request.expert_counts.empty()) {
      const uint64_t* counts = request.expert_counts.data() + static_cast<size_t>(l) * E;
      const uint64_t total = std::accumulate(counts, counts + E, uint64_t{0});
      if (total > 0) {
        for (uint32_t e = 0; e < E; ++e) {
          c.expert_p[e] = static_cast<double>(hp.n_expert_used) * static_cast<double>(counts[e]) / total;
        }
      }
    }
    d.expert_on_gpu[l].assign(E, 0);
  }

  // Pinned layers: overrides (the last matching one wins), then n_cpu_moe for layers no override names.
  enum class Pin { kFree, kHost, kGpu };
  std::vector<Pin> pin(L, Pin::kFree);
  for (size_t m = 0; m < moe_layers.size(); ++m) {
    const uint32_t l = moe_layers[m];
    for (size_t o = 0; o < patterns.size(); ++o) {
      for (size_t ti : experts[l].tensors) {
        if (std::regex_search(model.tensors[ti].name, patterns[o])) {
          pin[l] = request.overrides[o].device == WeightDevice::kGpu ? Pin::kGpu : Pin::kHost;
          break;
        }
      }
    }
    if (pin[l] == Pin::kFree && static_cast<int32_t>(m) < request.n_cpu_moe) pin[l] = Pin::kHost;
  }

  uint64_t gpu_used = request.has_gpu ? mandatory : 0;
  if (request.has_gpu) {
    for (uint32_t l : moe_layers) {
      if (pin[l] != Pin::kGpu) continue;
      gpu_used += experts[l].bytes;
      std::fill(d.expert_on_gpu[l].begin(), d.expert_on_gpu[l].end(), 1);
    }
    if (gpu_used > request.gpu_budget) {
      return make_error(ErrorCode::kResourceExhausted, "the GPU budget of " + gib(request.gpu_budget) +
                                                           " cannot hold the required weights and the "
                                                           "experts the overrides put on the GPU: " +
                                                           gib(gpu_used) + " (" + std::to_string(gpu_used) + " bytes)");
    }
    // The free experts, in the order they are taken.
    struct Candidate {
      uint32_t layer;
      uint32_t expert;
      double p;
    };
    std::vector<Candidate> order;
    for (uint32_t l : moe_layers) {
      if (pin[l] != Pin::kFree) continue;
      for (uint32_t e = 0; e < E; ++e) order.push_back(Candidate{l, e, d.layer_cost[l].expert_p[e]});
    }
    if (request.expert_counts.empty()) {
      // Whole layers from the last MoE layer down: few mixed layers.
      std::stable_sort(order.begin(), order.end(),
                       [](const Candidate& a, const Candidate& b) { return a.layer > b.layer; });
    } else {
      std::stable_sort(order.begin(), order.end(), [](const Candidate& a, const Candidate& b) {
        return a.p != b.p ? a.p > b.p : (a.layer != b.layer ? a.layer < b.layer : a.expert < b.expert);
      });
    }
    for (const Candidate& c : order) {
      const uint64_t slice = experts[c.layer].bytes / E;
      if (gpu_used + slice > request.gpu_budget) continue;  // a later, smaller layer's expert may still fit
      gpu_used += slice;
      d.expert_on_gpu[c.layer][c.expert] = 1;
    }
  }

  // Totals, per-tensor devices of the routed tensors (where most of their experts are) and the mixed-layer count.
  uint64_t total = 0;
  for (const PlannerTensor& t : model.tensors) total += t.bytes;
  for (uint32_t l : moe_layers) {
    const uint32_t on_gpu = static_cast<uint32_t>(
        std::count(d.expert_on_gpu[l].begin(), d.expert_on_gpu[l].end(), static_cast<uint8_t>(1)));
    if (on_gpu < E) ++d.host_expert_layers;
    if (on_gpu > 0 && on_gpu < E) ++d.mixed_layers;
    for (size_t ti : experts[l].tensors) {
      d.tensor_device[ti] = 2 * on_gpu > E ? WeightDevice::kGpu : WeightDevice::kHost;
    }
  }
  d.gpu_bytes = request.has_gpu ? gpu_used : 0;
  d.host_bytes = total - d.gpu_bytes;
  return d;
}

double PlacementDecision::predicted_step_seconds(int32_t batch) const {
  const double b = static_cast<double>(std::max(batch, 1));
  const double gpu_bw = gpu_read_bytes_per_s > 0 ? gpu_read_bytes_per_s : host_read_bytes_per_s;
  double t = b * global_gpu_bytes_per_token / gpu_bw;
  for (size_t l = 0; l < layer_cost.size(); ++l) {
    const LayerCost& c = layer_cost[l];
    double gpu_experts = 0, host_experts = 0;
    bool any_host = false;
    for (size_t e = 0; e < c.expert_p.size(); ++e) {
      const double p = std::min(c.expert_p[e], 1.0);
      const double read = c.expert_bytes * (1.0 - std::pow(1.0 - p, b));
      const bool gpu = l < expert_on_gpu.size() && e < expert_on_gpu[l].size() && expert_on_gpu[l][e] != 0;
      if (gpu) {
        gpu_experts += read / gpu_bw;
      } else {
        host_experts += read / host_read_bytes_per_s;
        any_host = true;
      }
    }
    // Without a GPU everything is one device: the host reads the dense weights too, and nothing is handed off.
    const bool has_gpu = gpu_read_bytes_per_s > 0;
    const double dense = c.dense_gpu_bytes / gpu_bw;
    t +=
        has_gpu ? dense + std::max(gpu_experts, any_host ? host_experts + kHandoffSeconds : 0.0) : dense + host_experts;
  }
  return t;
}

double PlacementDecision::predicted_tokens_per_s(int32_t batch) const {
  const double t = predicted_step_seconds(batch);
  return t > 0 ? static_cast<double>(std::max(batch, 1)) / t : 0.0;
}

PlacementPlan summarize_placement(const PlannerModel& model, const PlacementDecision& decision,
                                  const std::string& gpu_label) {
  PlacementPlan plan;
  const bool has_gpu = decision.gpu_read_bytes_per_s > 0;
  plan.device = has_gpu ? gpu_label + " + cpu" : "cpu";
  const std::string dense_dev = has_gpu ? gpu_label : "cpu";
  uint64_t embeddings = 0, gdn = 0, attn = 0, shared = 0, lm_head = 0, routed_gpu = 0, routed_host = 0;
  const ModelHparams& hp = model.hparams;
  for (const PlannerTensor& t : model.tensors) {
    const bool in_layer = t.layer >= 0 && static_cast<uint32_t>(t.layer) < hp.n_layer;
    if (t.placement == PlacementClass::kRoutedExperts && in_layer && hp.n_expert > 0) {
      const std::vector<uint8_t>& on = decision.expert_on_gpu[static_cast<size_t>(t.layer)];
      const uint64_t n_gpu = static_cast<uint64_t>(std::count(on.begin(), on.end(), static_cast<uint8_t>(1)));
      const uint64_t gpu_part = t.bytes / hp.n_expert * n_gpu;
      routed_gpu += gpu_part;
      routed_host += t.bytes - gpu_part;
    } else if (t.placement == PlacementClass::kSharedExpert) {
      shared += t.bytes;
    } else if (!in_layer) {
      (t.name == "token_embd.weight" ? embeddings : lm_head) += t.bytes;
    } else if (hp.layer_kinds[static_cast<size_t>(t.layer)] == LayerKind::kFullAttention) {
      attn += t.bytes;
    } else {
      gdn += t.bytes;
    }
  }
  auto add = [&](const char* component, const std::string& device, uint64_t bytes) {
    if (bytes > 0) plan.entries.push_back(PlacementEntry{component, device, bytes});
  };
  add("embeddings", dense_dev, embeddings);
  add("gdn layers", dense_dev, gdn);
  add("attention layers", dense_dev, attn);
  add("routed experts", gpu_label, routed_gpu);
  add("routed experts", "cpu", routed_host);
  add("shared experts", dense_dev, shared);
  add("lm_head", dense_dev, lm_head);
  return plan;
}

}  // namespace kestrel
