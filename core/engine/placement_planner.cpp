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

#include "core/base/byte_size.h"
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
    const bool bus = side_read_share > 0 && bus_read_bytes_per_s > 0;
    const double s = bus ? std::min(side_read_share, 1.0) : 0.0;
    auto read = [&](double p) { return c.expert_bytes * (1.0 - std::pow(1.0 - p, b)); };
    for (size_t e = 0; e < c.expert_p.size(); ++e) {
      const double p = std::min(c.expert_p[e], 1.0);
      const bool gpu = l < expert_on_gpu.size() && e < expert_on_gpu[l].size() && expert_on_gpu[l][e] != 0;
      if (gpu) {
        gpu_experts += read(p) / gpu_bw;
      } else {
        host_experts += read(p * (1.0 - s)) / host_read_bytes_per_s;
        if (bus) gpu_experts += read(p * s) / bus_read_bytes_per_s;
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
  plan.summary = placement_summary(model, decision);
  return plan;
}

namespace {

// "0, 1, 2, ..." of at most max_shown indices.
std::string join_indices(const std::vector<uint32_t>& v, size_t max_shown) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_shown; ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  if (v.size() > max_shown) s += ", ...";
  return s;
}

// "routed experts: ..." for a model with MoE layers and a GPU; empty otherwise.
std::string routed_line(const PlannerModel& model, const PlacementDecision& d) {
  const ModelHparams& hp = model.hparams;
  if (!hp.is_moe() || !(d.gpu_read_bytes_per_s > 0)) return "";
  std::vector<uint32_t> mixed;
  uint32_t moe_layers = 0, all_gpu = 0;
  for (uint32_t l = 0; l < hp.n_layer && l < d.expert_on_gpu.size(); ++l) {
    const std::vector<uint8_t>& on = d.expert_on_gpu[l];
    if (on.empty()) continue;
    ++moe_layers;
    const auto n = static_cast<uint32_t>(std::count(on.begin(), on.end(), static_cast<uint8_t>(1)));
    if (n == hp.n_expert) ++all_gpu;
    if (n > 0 && n < hp.n_expert) mixed.push_back(l);
  }
  return "routed experts: " + std::to_string(all_gpu) + " of " + std::to_string(moe_layers) +
         " MoE layers wholly on the GPU, " + std::to_string(mixed.size()) + " split (" +
         (mixed.empty() ? std::string("none") : join_indices(mixed, 16)) + "), " +
         std::to_string(moe_layers - all_gpu - static_cast<uint32_t>(mixed.size())) + " wholly on the host";
}

std::string predicted_line(const PlacementDecision& d) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.0f tokens/s at 1 session, %.0f aggregate at 32%s", d.predicted_tokens_per_s(1),
                d.predicted_tokens_per_s(32),
                d.side_read_share > 0 && d.bus_read_bytes_per_s > 0 ? " (with the side read)" : "");
  return buf;
}

}  // namespace

std::vector<std::string> describe_placement(const PlannerModel& model, const PlacementDecision& d, bool has_gpu) {
  std::vector<std::string> lines;
  const PlacementPlan plan = summarize_placement(model, d, "gpu");
  char buf[160];
  for (const PlacementEntry& e : plan.entries) {
    std::snprintf(buf, sizeof buf, "  %-18s %-5s %11s", e.component.c_str(), e.device.c_str(),
                  format_byte_size(e.bytes).c_str());
    lines.emplace_back(buf);
  }
  lines.push_back("  total: " + format_byte_size(d.gpu_bytes) + " on the GPU, " + format_byte_size(d.host_bytes) +
                  " on the host");
  if (has_gpu) {
    const std::string routed = routed_line(model, d);
    if (!routed.empty()) lines.push_back("  " + routed);
  }
  lines.push_back("  predicted decode (roofline of the cost model): " + predicted_line(d));
  return lines;
}

std::string placement_summary(const PlannerModel& model, const PlacementDecision& d) {
  const std::string routed = routed_line(model, d);
  return (routed.empty() ? std::string() : routed + "; ") + "predicted decode " + predicted_line(d);
}

std::vector<std::string> split_tensor_overrides(std::string_view list) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t end = std::min(list.find(';', at), list.size());
    if (end > at) out.emplace_back(list.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

Expected<PlacementChoice> parse_placement_flags(const PlacementFlags& flags) {
  PlacementChoice c;
  if (lower(flags.gpu_memory) != "auto") {
    auto bytes = parse_byte_size(flags.gpu_memory);
    if (!bytes) {
      return make_error(ErrorCode::kInvalidArgument, "gpu memory: " + bytes.error().message + " (or auto)");
    }
    c.auto_budget = false;
    c.gpu_budget = *bytes;
  }
  if (flags.n_cpu_moe < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "n_cpu_moe must be >= 0 (got " + std::to_string(flags.n_cpu_moe) + ")");
  }
  c.n_cpu_moe = flags.n_cpu_moe;
  for (const std::string& text : flags.overrides) {
    KESTREL_TRY_ASSIGN(TensorOverride o, parse_tensor_override(text));
    c.overrides.push_back(std::move(o));
  }
  return c;
}

}  // namespace kestrel
