// WeightCatalog::build: match a GGUF file's tensors against expected_tensors(), collect every problem, and fill
// the typed per-layer references and the byte accounting (see weight_catalog.h for the type policy).
#include "core/model/weight_catalog.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/quant/quant.h"

namespace kestrel {

namespace {

// Problems listed in full up to this many; the rest are counted ("... and 412 more").
constexpr size_t kMaxListedProblems = 100;

// What a non-quantizable tensor may be stored as (quantizable ones: anything quant_can_dequantize() accepts).
enum class FloatRule { kF32Only, kAnyFloat };

using LayerSlot = TensorRef& (*)(LayerWeights&);

struct LayerRole {
  std::string_view suffix;  // name after "blk.N."
  LayerSlot slot;
  FloatRule float_rule;
};

// Every per-layer tensor name of model-spec §6.2 and where it goes.
constexpr LayerRole kLayerRoles[] = {
    {"attn_norm.weight", [](LayerWeights& l) -> TensorRef& { return l.attn_norm; }, FloatRule::kF32Only},
    {"post_attention_norm.weight", [](LayerWeights& l) -> TensorRef& { return l.post_attention_norm; },
     FloatRule::kF32Only},
    // Gated DeltaNet
    {"attn_qkv.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.qkv; }, FloatRule::kF32Only},
    {"attn_gate.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.gate; }, FloatRule::kF32Only},
    {"ssm_in.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.ssm_in; }, FloatRule::kF32Only},
    {"ssm_ba.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.ba; }, FloatRule::kF32Only},
    {"ssm_beta.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.beta; }, FloatRule::kF32Only},
    {"ssm_alpha.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.alpha; }, FloatRule::kF32Only},
    {"ssm_conv1d.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.conv1d; }, FloatRule::kF32Only},
    {"ssm_dt.bias", [](LayerWeights& l) -> TensorRef& { return l.gdn.dt_bias; }, FloatRule::kF32Only},
    {"ssm_a", [](LayerWeights& l) -> TensorRef& { return l.gdn.a; }, FloatRule::kF32Only},
    {"ssm_norm.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.norm; }, FloatRule::kF32Only},
    {"ssm_out.weight", [](LayerWeights& l) -> TensorRef& { return l.gdn.out; }, FloatRule::kF32Only},
    // Attention
    {"attn_q.weight", [](LayerWeights& l) -> TensorRef& { return l.attn.q; }, FloatRule::kF32Only},
    {"attn_k.weight", [](LayerWeights& l) -> TensorRef& { return l.attn.k; }, FloatRule::kF32Only},
    {"attn_v.weight", [](LayerWeights& l) -> TensorRef& { return l.attn.v; }, FloatRule::kF32Only},
    {"attn_output.weight", [](LayerWeights& l) -> TensorRef& { return l.attn.o; }, FloatRule::kF32Only},
    {"attn_q_norm.weight", [](LayerWeights& l) -> TensorRef& { return l.attn.q_norm; }, FloatRule::kF32Only},
    {"attn_k_norm.weight", [](LayerWeights& l) -> TensorRef& { return l.attn.k_norm; }, FloatRule::kF32Only},
    // MoE
    {"ffn_gate_inp.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.router; }, FloatRule::kAnyFloat},
    {"ffn_gate_exps.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.gate_exps; }, FloatRule::kF32Only},
    {"ffn_up_exps.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.up_exps; }, FloatRule::kF32Only},
    {"ffn_down_exps.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.down_exps; }, FloatRule::kF32Only},
    {"ffn_gate_inp_shexp.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.shared_gate_inp; },
     FloatRule::kAnyFloat},
    {"ffn_gate_shexp.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.gate_shexp; }, FloatRule::kF32Only},
    {"ffn_up_shexp.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.up_shexp; }, FloatRule::kF32Only},
    {"ffn_down_shexp.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.down_shexp; }, FloatRule::kF32Only},
    // Dense FFN
    {"ffn_gate.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.gate; }, FloatRule::kF32Only},
    {"ffn_up.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.up; }, FloatRule::kF32Only},
    {"ffn_down.weight", [](LayerWeights& l) -> TensorRef& { return l.ffn.down; }, FloatRule::kF32Only},
};

const LayerRole* find_layer_role(std::string_view suffix) {
  for (const LayerRole& r : kLayerRoles) {
    if (r.suffix == suffix) return &r;
  }
  return nullptr;
}

// "blk.12.attn_q.weight" → {12, "attn_q.weight"}; nullopt for names outside a block.
std::optional<std::pair<uint64_t, std::string_view>> split_block_name(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const char* begin = name.data() + kPrefix.size();
  const char* end = name.data() + name.size();
  uint64_t index = 0;
  auto [ptr, ec] = std::from_chars(begin, end, index);
  if (ec != std::errc() || ptr == begin || ptr == end || *ptr != '.') return std::nullopt;
  return std::make_pair(index, std::string_view(ptr + 1, static_cast<size_t>(end - ptr - 1)));
}

std::string shape_string(std::span<const uint64_t> ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "}";
}

bool is_float_type(GgmlType t) { return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16; }

std::string dequantizable_type_list() {
  std::string s;
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                     GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                     GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kMXFP4}) {
    if (!quant_can_dequantize(t)) continue;
    if (!s.empty()) s += ", ";
    s += ggml_type_name(t);
  }
  return s;
}

// Empty when `type` is allowed for `spec`, else the "expected ..." clause.
std::string type_problem(const TensorSpec& spec, FloatRule rule, GgmlType type) {
  if (spec.quantizable) {
    if (quant_can_dequantize(type)) return {};
    return "a type Kestrel can dequantize (" + dequantizable_type_list() + ")";
  }
  if (rule == FloatRule::kAnyFloat) return is_float_type(type) ? std::string() : "f32, f16 or bf16";
  return type == GgmlType::kF32 ? std::string() : "f32";
}

struct Problems {
  std::vector<std::string> list;
  bool any_non_type = false;
  bool any_internal = false;

  void add(std::string p, bool is_type = false) {
    any_non_type |= !is_type;
    list.push_back(std::move(p));
  }

  Error to_error() const {
    std::string msg;
    if (list.size() == 1) {
      msg = list[0];
    } else {
      msg = std::to_string(list.size()) + " problems: ";
      for (size_t i = 0; i < list.size() && i < kMaxListedProblems; ++i) {
        if (i) msg += "; ";
        msg += list[i];
      }
      if (list.size() > kMaxListedProblems) {
        msg += "; ... and " + std::to_string(list.size() - kMaxListedProblems) + " more";
      }
    }
    const ErrorCode code = any_internal   ? ErrorCode::kInternal
                           : any_non_type ? ErrorCode::kInvalidArgument
                                          : ErrorCode::kUnsupported;
    return make_error(code, std::move(msg));
  }
};

// Internal consistency of expected_tensors(): each layer has every role its kind needs.
void check_layer_complete(const LayerWeights& l, bool moe, bool shared, Problems& problems) {
  std::vector<std::string_view> missing;
  auto need = [&](const TensorRef& t, std::string_view role) {
    if (!t.present()) missing.push_back(role);
  };
  need(l.attn_norm, "attn_norm");
  need(l.post_attention_norm, "post_attention_norm");
  if (l.kind == LayerKind::kGatedDeltaNet) {
    if (!l.gdn.ssm_in.present()) {
      need(l.gdn.qkv, "attn_qkv");
      need(l.gdn.gate, "attn_gate");
    }
    if (!l.gdn.ba.present()) {
      need(l.gdn.beta, "ssm_beta");
      need(l.gdn.alpha, "ssm_alpha");
    }
    need(l.gdn.conv1d, "ssm_conv1d");
    need(l.gdn.dt_bias, "ssm_dt");
    need(l.gdn.a, "ssm_a");
    need(l.gdn.norm, "ssm_norm");
    need(l.gdn.out, "ssm_out");
  } else {
    need(l.attn.q, "attn_q");
    need(l.attn.k, "attn_k");
    need(l.attn.v, "attn_v");
    need(l.attn.o, "attn_output");
    need(l.attn.q_norm, "attn_q_norm");
    need(l.attn.k_norm, "attn_k_norm");
  }
  if (moe) {
    need(l.ffn.router, "ffn_gate_inp");
    need(l.ffn.gate_exps, "ffn_gate_exps");
    need(l.ffn.up_exps, "ffn_up_exps");
    need(l.ffn.down_exps, "ffn_down_exps");
    if (shared) {
      need(l.ffn.shared_gate_inp, "ffn_gate_inp_shexp");
      need(l.ffn.gate_shexp, "ffn_gate_shexp");
      need(l.ffn.up_shexp, "ffn_up_shexp");
      need(l.ffn.down_shexp, "ffn_down_shexp");
    }
  } else {
    need(l.ffn.gate, "ffn_gate");
    need(l.ffn.up, "ffn_up");
    need(l.ffn.down, "ffn_down");
  }
  for (std::string_view role : missing) {
    problems.add("internal: expected_tensors() lists no " + std::string(role) + " for layer " +
                 std::to_string(l.index));
    problems.any_internal = true;
  }
}

}  // namespace

bool shapes_equivalent(std::span<const uint64_t> a, std::span<const uint64_t> b) {
  auto trimmed = [](std::span<const uint64_t> s) {
    size_t n = s.size();
    while (n > 0 && s[n - 1] == 1) --n;
    return s.first(n);
  };
  auto ta = trimmed(a);
  auto tb = trimmed(b);
  return std::equal(ta.begin(), ta.end(), tb.begin(), tb.end());
}

Expected<WeightCatalog> WeightCatalog::build(const GgufFile& file, const ModelHparams& hp) {
  KESTREL_TRY(hp.validate());
  WeightCatalog cat;
  cat.hp_ = hp;

  const std::vector<GgufTensorInfo>& tensors = file.tensors();
  std::unordered_map<std::string_view, size_t> by_name;
  by_name.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) by_name.emplace(tensors[i].name, i);
  auto find = [&](std::string_view name) -> std::optional<size_t> {
    auto it = by_name.find(name);
    if (it == by_name.end()) return std::nullopt;
    return it->second;
  };

  // Layout detection.
  cat.layout_.tied_output = !find("output.weight").has_value();
  if (hp.arch == Arch::kQwen3Next) {
    for (uint32_t i = 0; i < hp.n_layer; ++i) {
      if (find("blk." + std::to_string(i) + ".ssm_in.weight")) {
        cat.layout_.gdn_input = GdnInputLayout::kLegacySsmIn;
        break;
      }
    }
  }

  cat.layers_.resize(hp.n_layer);
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    cat.layers_[i].index = i;
    cat.layers_[i].kind = hp.layer_kinds[i];
  }

  Problems problems;
  // Per file tensor: index into `specs` when expected (-1 otherwise).
  const std::vector<TensorSpec> specs = expected_tensors(hp, cat.layout_);
  std::vector<int64_t> spec_of(tensors.size(), -1);

  for (size_t s = 0; s < specs.size(); ++s) {
    const TensorSpec& spec = specs[s];
    // Where the reference goes.
    TensorRef* slot = nullptr;
    FloatRule rule = FloatRule::kF32Only;
    if (spec.layer < 0) {
      if (spec.name == "token_embd.weight") slot = &cat.globals_.token_embd;
      if (spec.name == "output_norm.weight") slot = &cat.globals_.output_norm;
      if (spec.name == "output.weight") slot = &cat.globals_.output;
    } else if (static_cast<uint32_t>(spec.layer) < hp.n_layer) {
      auto split = split_block_name(spec.name);
      const LayerRole* role =
          split && split->first == static_cast<uint64_t>(spec.layer) ? find_layer_role(split->second) : nullptr;
      if (role != nullptr) {
        slot = &role->slot(cat.layers_[static_cast<size_t>(spec.layer)]);
        rule = role->float_rule;
      }
    }
    if (slot == nullptr) {
      problems.add("internal: expected tensor " + spec.name + " has no role in the weight catalog");
      problems.any_internal = true;
      continue;
    }

    const std::optional<size_t> idx = find(spec.name);
    if (!idx) {
      if (!spec.optional) problems.add("missing " + spec.name);
      continue;
    }
    const GgufTensorInfo& info = tensors[*idx];
    spec_of[*idx] = static_cast<int64_t>(s);
    if (!shapes_equivalent(info.ne, spec.ne)) {
      problems.add(spec.name + " has shape " + shape_string(info.ne) + ", expected " + shape_string(spec.ne));
    }
    if (std::string expected = type_problem(spec, rule, info.type); !expected.empty()) {
      problems.add(spec.name + " has type " + std::string(ggml_type_name(info.type)) + ", expected " + expected,
                   /*is_type=*/true);
    }
    slot->info = &info;
    slot->data = file.tensor_data(info);
  }

  // Tensors the model does not use: MTP/nextn blocks are skipped, anything else is a problem.
  cat.entries_.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo& info = tensors[i];
    CatalogEntry e;
    e.info = &info;
    if (spec_of[i] >= 0) {
      const TensorSpec& spec = specs[static_cast<size_t>(spec_of[i])];
      e.layer = spec.layer;
      e.placement = spec.placement;
    } else {
      auto split = split_block_name(info.name);
      if (split && split->first >= hp.n_layer && split->first < hp.n_block) {
        e.layer = static_cast<int32_t>(split->first);
        e.skipped = true;
      } else {
        std::string why = split && split->first >= hp.n_block
                              ? " (block " + std::to_string(split->first) + " is past " +
                                    std::string(arch_name(hp.arch)) + ".block_count " + std::to_string(hp.n_block) + ")"
                              : " (not part of a " + std::string(arch_name(hp.arch)) + " model with these hparams)";
        problems.add("unexpected tensor " + info.name + why);
        continue;
      }
    }
    cat.entries_.push_back(e);
  }

  if (problems.list.empty()) {
    for (const LayerWeights& l : cat.layers_) check_layer_complete(l, hp.is_moe(), hp.n_ff_shared > 0, problems);
  }
  if (!problems.list.empty()) return problems.to_error();

  if (cat.layout_.tied_output) {
    cat.globals_.output = cat.globals_.token_embd;
    cat.globals_.tied_output = true;
  }

  // Byte accounting.
  for (const CatalogEntry& e : cat.entries_) {
    if (e.skipped) {
      ++cat.n_skipped_;
      cat.skipped_bytes_ += e.info->n_bytes;
      continue;
    }
    ++cat.n_used_;
    cat.total_bytes_ += e.info->n_bytes;
    cat.placement_bytes_[static_cast<size_t>(e.placement)] += e.info->n_bytes;
    auto it = std::find_if(cat.type_bytes_.begin(), cat.type_bytes_.end(),
                           [&](const TypeBytes& t) { return t.type == e.info->type; });
    if (it == cat.type_bytes_.end()) {
      cat.type_bytes_.push_back({e.info->type, 0, 0});
      it = cat.type_bytes_.end() - 1;
    }
    ++it->n_tensors;
    it->bytes += e.info->n_bytes;
  }
  std::stable_sort(cat.type_bytes_.begin(), cat.type_bytes_.end(),
                   [](const TypeBytes& a, const TypeBytes& b) { return a.bytes > b.bytes; });
  return cat;
}

}  // namespace kestrel
