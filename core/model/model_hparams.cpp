// ModelHparams::from_gguf and validate(): reading the `<arch>.*` keys of model-spec §6.1 with their types checked,
// deriving layer kinds, n_layer and n_vocab, and refusing inconsistent values with a message that names the key.
//
// Type policy: integer keys accept any GGUF integer type whose value fits uint32 (llama.cpp writes uint32); float keys
// accept float32/float64 only; arrays must hold integers (or bools for attention.recurrent_layers). A key of the
// wrong type is kInvalidArgument naming the key and both types; a missing required key is kNotFound naming it.
#include "core/model/model_hparams.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_value.h"

namespace kestrel {

namespace {

constexpr uint32_t kDefaultFullAttentionInterval = 4;

std::string supported_arch_list() { return "qwen35moe, qwen35, qwen3next"; }

// Reads `<arch>.<name>` keys with type checks; every error names the full key.
class KeyReader {
 public:
  KeyReader(const GgufFile& file, std::string_view arch) : file_(file), prefix_(std::string(arch) + ".") {}

  std::string key(std::string_view name) const { return prefix_ + std::string(name); }

  Expected<std::optional<uint32_t>> opt_u32(std::string_view name) const {
    const std::string k = key(name);
    const GgufValue* v = file_.find(k);
    if (v == nullptr) return std::optional<uint32_t>{};
    if (!v->is_integer()) {
      return make_error(ErrorCode::kInvalidArgument,
                        k + " has type " + std::string(gguf_value_type_name(v->type())) + ", expected an integer");
    }
    auto u = v->to_u64();
    if (!u || *u > std::numeric_limits<uint32_t>::max()) {
      return make_error(ErrorCode::kInvalidArgument, k + " = " + v->describe() + " is out of range (expected 0.." +
                                                         std::to_string(std::numeric_limits<uint32_t>::max()) + ")");
    }
    return std::optional<uint32_t>(static_cast<uint32_t>(*u));
  }

  Expected<uint32_t> req_u32(std::string_view name) const {
    KESTREL_TRY_ASSIGN(std::optional<uint32_t> v, opt_u32(name));
    if (!v) return missing(name);
    return *v;
  }

  Expected<std::optional<float>> opt_f32(std::string_view name) const {
    const std::string k = key(name);
    const GgufValue* v = file_.find(k);
    if (v == nullptr) return std::optional<float>{};
    if (!v->is_float()) {
      return make_error(ErrorCode::kInvalidArgument,
                        k + " has type " + std::string(gguf_value_type_name(v->type())) + ", expected a float");
    }
    KESTREL_TRY_ASSIGN(double d, v->to_f64());
    return std::optional<float>(static_cast<float>(d));
  }

  Expected<float> req_f32(std::string_view name) const {
    KESTREL_TRY_ASSIGN(std::optional<float> v, opt_f32(name));
    if (!v) return missing(name);
    return *v;
  }

  // An array of integers (bools too when allow_bool); nullopt when absent.
  Expected<std::optional<std::vector<int64_t>>> opt_int_array(std::string_view name, bool allow_bool) const {
    const std::string k = key(name);
    const GgufValue* v = file_.find(k);
    if (v == nullptr) return std::optional<std::vector<int64_t>>{};
    const bool elem_ok =
        v->is_array() && (is_integer_type(v->array_type()) || (allow_bool && v->array_type() == GgufValueType::kBool));
    if (!elem_ok) {
      std::string got = v->is_array() ? "array of " + std::string(gguf_value_type_name(v->array_type()))
                                      : std::string(gguf_value_type_name(v->type()));
      return make_error(ErrorCode::kInvalidArgument,
                        k + " has type " + got + ", expected an array of integers" + (allow_bool ? " or bools" : ""));
    }
    std::vector<int64_t> out;
    out.reserve(v->items().size());
    for (const GgufValue& item : v->items()) {
      if (item.type() == GgufValueType::kBool) {
        KESTREL_TRY_ASSIGN(bool b, item.to_bool());
        out.push_back(b ? 1 : 0);
      } else {
        auto i = item.to_i64();
        if (!i) return make_error(ErrorCode::kInvalidArgument, k + ": " + i.error().message);
        out.push_back(*i);
      }
    }
    return std::optional<std::vector<int64_t>>(std::move(out));
  }

  Error missing(std::string_view name) const {
    return make_error(ErrorCode::kNotFound, "missing required metadata key " + key(name));
  }

 private:
  static bool is_integer_type(GgufValueType t) {
    switch (t) {
      case GgufValueType::kUint8:
      case GgufValueType::kInt8:
      case GgufValueType::kUint16:
      case GgufValueType::kInt16:
      case GgufValueType::kUint32:
      case GgufValueType::kInt32:
      case GgufValueType::kUint64:
      case GgufValueType::kInt64: return true;
      default: return false;
    }
  }

  const GgufFile& file_;
  std::string prefix_;
};

Error invalid(std::string message) { return make_error(ErrorCode::kInvalidArgument, std::move(message)); }

std::string num(uint64_t v) { return std::to_string(v); }

}  // namespace

std::string_view arch_name(Arch arch) {
  switch (arch) {
    case Arch::kQwen35Moe: return "qwen35moe";
    case Arch::kQwen35: return "qwen35";
    case Arch::kQwen3Next: return "qwen3next";
  }
  return "unknown";
}

Expected<Arch> arch_from_name(std::string_view name) {
  for (Arch a : {Arch::kQwen35Moe, Arch::kQwen35, Arch::kQwen3Next}) {
    if (arch_name(a) == name) return a;
  }
  return make_error(ErrorCode::kUnsupported, "general.architecture '" + std::string(name) +
                                                 "' is not supported (supported: " + supported_arch_list() + ")");
}

uint32_t ModelHparams::n_gdn_layers() const {
  uint32_t n = 0;
  for (LayerKind k : layer_kinds) n += k == LayerKind::kGatedDeltaNet ? 1 : 0;
  return n;
}

uint32_t ModelHparams::n_attn_layers() const { return static_cast<uint32_t>(layer_kinds.size()) - n_gdn_layers(); }

Expected<ModelHparams> ModelHparams::from_gguf(const GgufFile& file) {
  const GgufValue* arch_value = file.find("general.architecture");
  if (arch_value == nullptr) {
    return make_error(ErrorCode::kNotFound, "missing required metadata key general.architecture");
  }
  if (!arch_value->is_string()) {
    return invalid("general.architecture has type " + std::string(gguf_value_type_name(arch_value->type())) +
                   ", expected a string");
  }
  ModelHparams hp;
  KESTREL_TRY_ASSIGN(hp.arch, arch_from_name(arch_value->raw_string()));
  const KeyReader r(file, arch_name(hp.arch));

  KESTREL_TRY_ASSIGN(hp.n_block, r.req_u32("block_count"));
  KESTREL_TRY_ASSIGN(std::optional<uint32_t> nextn, r.opt_u32("nextn_predict_layers"));
  hp.n_nextn = nextn.value_or(0);
  if (hp.n_nextn >= hp.n_block) {
    return invalid(r.key("nextn_predict_layers") + " (" + num(hp.n_nextn) + ") must be less than " +
                   r.key("block_count") + " (" + num(hp.n_block) + ")");
  }
  hp.n_layer = hp.n_block - hp.n_nextn;
  KESTREL_TRY_ASSIGN(hp.n_ctx_train, r.req_u32("context_length"));
  KESTREL_TRY_ASSIGN(hp.n_embd, r.req_u32("embedding_length"));

  // Attention.
  KESTREL_TRY_ASSIGN(hp.n_head, r.req_u32("attention.head_count"));
  KESTREL_TRY_ASSIGN(hp.n_head_kv, r.req_u32("attention.head_count_kv"));
  KESTREL_TRY_ASSIGN(uint32_t key_length, r.req_u32("attention.key_length"));
  KESTREL_TRY_ASSIGN(uint32_t value_length, r.req_u32("attention.value_length"));
  if (key_length != value_length) {
    return invalid(r.key("attention.key_length") + " (" + num(key_length) + ") must equal " +
                   r.key("attention.value_length") + " (" + num(value_length) + ")");
  }
  hp.head_dim = key_length;
  KESTREL_TRY_ASSIGN(hp.rms_eps, r.req_f32("attention.layer_norm_rms_epsilon"));
  KESTREL_TRY_ASSIGN(hp.n_rot, r.req_u32("rope.dimension_count"));
  KESTREL_TRY_ASSIGN(hp.rope_freq_base, r.req_f32("rope.freq_base"));
  KESTREL_TRY_ASSIGN(auto sections, r.opt_int_array("rope.dimension_sections", /*allow_bool=*/false));
  if (sections) {
    for (int64_t s : *sections) {
      if (s < 0 || s > std::numeric_limits<int32_t>::max()) {
        return invalid(r.key("rope.dimension_sections") + " has an entry " + std::to_string(s) + " outside 0.." +
                       std::to_string(std::numeric_limits<int32_t>::max()));
      }
      hp.rope_sections.push_back(static_cast<int32_t>(s));
    }
  } else if (hp.arch != Arch::kQwen3Next) {
    return r.missing("rope.dimension_sections");
  }

  // Gated DeltaNet.
  KESTREL_TRY_ASSIGN(hp.ssm_conv_kernel, r.req_u32("ssm.conv_kernel"));
  KESTREL_TRY_ASSIGN(hp.ssm_d_state, r.req_u32("ssm.state_size"));
  KESTREL_TRY_ASSIGN(hp.ssm_n_k_heads, r.req_u32("ssm.group_count"));
  KESTREL_TRY_ASSIGN(hp.ssm_n_v_heads, r.req_u32("ssm.time_step_rank"));
  KESTREL_TRY_ASSIGN(hp.ssm_inner, r.req_u32("ssm.inner_size"));

  // FFN. Dense qwen35 reads no expert keys (llama.cpp does not either); MoE archs require them.
  KESTREL_TRY_ASSIGN(std::optional<uint32_t> n_ff, r.opt_u32("feed_forward_length"));
  hp.n_ff_dense = n_ff.value_or(0);
  if (hp.arch == Arch::kQwen35) {
    if (!n_ff) return r.missing("feed_forward_length");
  } else {
    KESTREL_TRY_ASSIGN(hp.n_expert, r.req_u32("expert_count"));
    KESTREL_TRY_ASSIGN(hp.n_expert_used, r.req_u32("expert_used_count"));
    KESTREL_TRY_ASSIGN(hp.n_ff_expert, r.req_u32("expert_feed_forward_length"));
    KESTREL_TRY_ASSIGN(std::optional<uint32_t> n_ff_sh, r.opt_u32("expert_shared_feed_forward_length"));
    hp.n_ff_shared = n_ff_sh.value_or(0);
    // An MoE model's dense feed_forward_length (qwen3next stores 5120) is unused: every layer is MoE.
    hp.n_ff_dense = 0;
  }

  // Vocabulary: rows of token_embd, cross-checked with <arch>.vocab_size when present.
  const GgufTensorInfo* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr) {
    return make_error(ErrorCode::kNotFound, "missing tensor token_embd.weight (needed for the vocabulary size)");
  }
  if (embd->ne.size() < 2 || embd->ne[1] == 0 || embd->ne[1] > std::numeric_limits<uint32_t>::max()) {
    return invalid("token_embd.weight has shape " + embd->shape_string() + ", expected {n_embd, n_vocab}");
  }
  hp.n_vocab = static_cast<uint32_t>(embd->ne[1]);
  KESTREL_TRY_ASSIGN(std::optional<uint32_t> vocab_size, r.opt_u32("vocab_size"));
  if (vocab_size && *vocab_size != hp.n_vocab) {
    return invalid(r.key("vocab_size") + " (" + num(*vocab_size) + ") does not match the " + num(hp.n_vocab) +
                   " rows of token_embd.weight " + embd->shape_string());
  }

  // Layer kinds: the per-layer array overrides the interval rule.
  KESTREL_TRY_ASSIGN(auto recurrent, r.opt_int_array("attention.recurrent_layers", /*allow_bool=*/true));
  if (recurrent) {
    if (recurrent->size() != hp.n_layer && recurrent->size() != hp.n_block) {
      return invalid(r.key("attention.recurrent_layers") + " has " + num(recurrent->size()) +
                     " entries, expected one per layer (" + num(hp.n_layer) +
                     (hp.n_block != hp.n_layer ? " or " + num(hp.n_block) : std::string()) + ")");
    }
    for (uint32_t i = 0; i < hp.n_layer; ++i) {
      hp.layer_kinds.push_back((*recurrent)[i] != 0 ? LayerKind::kGatedDeltaNet : LayerKind::kFullAttention);
    }
  } else {
    KESTREL_TRY_ASSIGN(std::optional<uint32_t> interval, r.opt_u32("full_attention_interval"));
    const uint32_t every = interval.value_or(kDefaultFullAttentionInterval);
    if (every == 0) return invalid(r.key("full_attention_interval") + " must be at least 1");
    for (uint32_t i = 0; i < hp.n_layer; ++i) {
      hp.layer_kinds.push_back((i + 1) % every != 0 ? LayerKind::kGatedDeltaNet : LayerKind::kFullAttention);
    }
  }

  KESTREL_TRY(hp.validate());
  return hp;
}

Status ModelHparams::validate() const {
  const std::string p = std::string(arch_name(arch)) + ".";
  auto positive = [&](uint64_t v, std::string_view key) -> Status {
    if (v == 0) return invalid(p + std::string(key) + " must be positive");
    return ok_status();
  };

  if (n_block != n_layer + n_nextn) {
    return invalid(p + "block_count (" + num(n_block) + ") must equal the main layers (" + num(n_layer) + ") plus " +
                   p + "nextn_predict_layers (" + num(n_nextn) + ")");
  }
  KESTREL_TRY(positive(n_layer, "block_count"));
  KESTREL_TRY(positive(n_ctx_train, "context_length"));
  KESTREL_TRY(positive(n_embd, "embedding_length"));
  if (n_vocab == 0) return invalid("token_embd.weight has no rows (n_vocab must be positive)");
  if (layer_kinds.size() != n_layer) {
    return invalid(p + "attention.recurrent_layers / full_attention_interval: " + num(layer_kinds.size()) +
                   " layer kinds for " + num(n_layer) + " layers");
  }

  // Attention.
  KESTREL_TRY(positive(n_head, "attention.head_count"));
  KESTREL_TRY(positive(n_head_kv, "attention.head_count_kv"));
  KESTREL_TRY(positive(head_dim, "attention.key_length"));
  if (n_head % n_head_kv != 0) {
    return invalid(p + "attention.head_count (" + num(n_head) + ") is not a multiple of " + p +
                   "attention.head_count_kv (" + num(n_head_kv) + ")");
  }
  if (n_rot == 0 || n_rot > head_dim || n_rot % 2 != 0) {
    return invalid(p + "rope.dimension_count (" + num(n_rot) + ") must be even, positive and at most " + p +
                   "attention.key_length (" + num(head_dim) + ")");
  }
  if (!(rope_freq_base > 0.0f) || !std::isfinite(rope_freq_base)) {
    return invalid(p + "rope.freq_base (" + std::to_string(rope_freq_base) + ") must be positive and finite");
  }
  if (!(rms_eps > 0.0f) || !std::isfinite(rms_eps)) {
    return invalid(p + "attention.layer_norm_rms_epsilon (" + std::to_string(rms_eps) +
                   ") must be positive and finite");
  }
  if (arch != Arch::kQwen3Next) {
    int64_t sum = 0;
    for (int32_t s : rope_sections) {
      if (s < 0) return invalid(p + "rope.dimension_sections has a negative entry");
      sum += s;
    }
    if (rope_sections.empty() || rope_sections.size() > 4 || sum == 0) {
      return invalid(p + "rope.dimension_sections must have 1 to 4 entries with a positive sum (got " +
                     num(rope_sections.size()) + " entries, sum " + std::to_string(sum) + ")");
    }
  }

  // Gated DeltaNet.
  KESTREL_TRY(positive(ssm_conv_kernel, "ssm.conv_kernel"));
  KESTREL_TRY(positive(ssm_d_state, "ssm.state_size"));
  KESTREL_TRY(positive(ssm_n_k_heads, "ssm.group_count"));
  KESTREL_TRY(positive(ssm_n_v_heads, "ssm.time_step_rank"));
  KESTREL_TRY(positive(ssm_inner, "ssm.inner_size"));
  if (ssm_inner % ssm_n_v_heads != 0) {
    return invalid(p + "ssm.inner_size (" + num(ssm_inner) + ") is not a multiple of " + p + "ssm.time_step_rank (" +
                   num(ssm_n_v_heads) + ")");
  }
  if (ssm_inner / ssm_n_v_heads != ssm_d_state) {
    return invalid(p + "ssm.state_size (dk = " + num(ssm_d_state) + ") must equal " + p + "ssm.inner_size / " + p +
                   "ssm.time_step_rank (dv = " + num(ssm_inner) + " / " + num(ssm_n_v_heads) + " = " +
                   num(ssm_inner / ssm_n_v_heads) + ")");
  }
  if (ssm_n_v_heads % ssm_n_k_heads != 0) {
    return invalid(p + "ssm.time_step_rank (Vh = " + num(ssm_n_v_heads) + ") is not a multiple of " + p +
                   "ssm.group_count (Kh = " + num(ssm_n_k_heads) + ")");
  }

  // FFN.
  if (arch == Arch::kQwen35) {
    KESTREL_TRY(positive(n_ff_dense, "feed_forward_length"));
    if (n_expert != 0) {
      return invalid(p + "expert_count (" + num(n_expert) + ") must be 0: qwen35 is the dense architecture");
    }
  } else {
    KESTREL_TRY(positive(n_expert, "expert_count"));
    if (n_expert_used == 0 || n_expert_used > n_expert) {
      return invalid(p + "expert_used_count (" + num(n_expert_used) + ") must be in 1.." + num(n_expert) + " (" + p +
                     "expert_count)");
    }
    KESTREL_TRY(positive(n_ff_expert, "expert_feed_forward_length"));
  }
  return ok_status();
}

}  // namespace kestrel
