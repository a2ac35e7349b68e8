// add_model_metadata(): general.*, `<arch>.*` and kestrel.mkmodel.* keys of a kestrel-mkmodel file.
#include "tools/mkmodel/model_metadata.h"

#include <string>

namespace kestrel::mkmodel {

namespace {

class ArchKeys {
 public:
  ArchKeys(GgufWriter& w, std::string_view arch) : w_(w), prefix_(std::string(arch) + ".") {}
  Status u32(std::string_view name, uint32_t v) {
    return w_.add_metadata(prefix_ + std::string(name), GgufValue::u32(v));
  }
  Status f32(std::string_view name, float v) { return w_.add_metadata(prefix_ + std::string(name), GgufValue::f32(v)); }
  Status i32_array(std::string_view name, const std::vector<int32_t>& v) {
    return w_.add_metadata(prefix_ + std::string(name), GgufValue::i32_array(v));
  }

 private:
  GgufWriter& w_;
  std::string prefix_;
};

}  // namespace

Status add_model_metadata(GgufWriter& writer, const ModelPlan& plan) {
  const ModelHparams& hp = plan.preset.hparams;
  const std::string arch(arch_name(hp.arch));
  KESTREL_TRY(writer.add_metadata("general.architecture", GgufValue::string(arch)));
  KESTREL_TRY(writer.add_metadata("general.name", GgufValue::string("kestrel-mkmodel " + plan.preset.name)));
  KESTREL_TRY(writer.add_metadata("general.file_type", GgufValue::u32(plan.file_type)));
  KESTREL_TRY(writer.add_metadata("general.quantization_version", GgufValue::u32(2)));

  ArchKeys k(writer, arch);
  KESTREL_TRY(k.u32("block_count", hp.n_block));
  KESTREL_TRY(k.u32("context_length", hp.n_ctx_train));
  KESTREL_TRY(k.u32("embedding_length", hp.n_embd));
  if (!hp.is_moe()) {
    KESTREL_TRY(k.u32("feed_forward_length", hp.n_ff_dense));
  } else if (plan.preset.moe_unused_feed_forward_length > 0) {
    KESTREL_TRY(k.u32("feed_forward_length", plan.preset.moe_unused_feed_forward_length));
  }
  KESTREL_TRY(k.u32("vocab_size", hp.n_vocab));
  KESTREL_TRY(k.u32("attention.head_count", hp.n_head));
  KESTREL_TRY(k.u32("attention.head_count_kv", hp.n_head_kv));
  KESTREL_TRY(k.u32("attention.key_length", hp.head_dim));
  KESTREL_TRY(k.u32("attention.value_length", hp.head_dim));
  KESTREL_TRY(k.f32("attention.layer_norm_rms_epsilon", hp.rms_eps));
  KESTREL_TRY(k.f32("rope.freq_base", hp.rope_freq_base));
  KESTREL_TRY(k.u32("rope.dimension_count", hp.n_rot));
  if (!hp.rope_sections.empty()) KESTREL_TRY(k.i32_array("rope.dimension_sections", hp.rope_sections));
  if (hp.is_moe()) {
    KESTREL_TRY(k.u32("expert_count", hp.n_expert));
    KESTREL_TRY(k.u32("expert_used_count", hp.n_expert_used));
    KESTREL_TRY(k.u32("expert_feed_forward_length", hp.n_ff_expert));
    if (hp.n_ff_shared > 0) KESTREL_TRY(k.u32("expert_shared_feed_forward_length", hp.n_ff_shared));
  }
  KESTREL_TRY(k.u32("ssm.conv_kernel", hp.ssm_conv_kernel));
  KESTREL_TRY(k.u32("ssm.state_size", hp.ssm_d_state));
  KESTREL_TRY(k.u32("ssm.group_count", hp.ssm_n_k_heads));
  KESTREL_TRY(k.u32("ssm.time_step_rank", hp.ssm_n_v_heads));
  KESTREL_TRY(k.u32("ssm.inner_size", hp.ssm_inner));
  KESTREL_TRY(k.u32("full_attention_interval", plan.preset.full_attention_interval));

  KESTREL_TRY(writer.add_metadata("kestrel.mkmodel.preset", GgufValue::string(plan.preset.name)));
  KESTREL_TRY(writer.add_metadata("kestrel.mkmodel.seed", GgufValue::u64(plan.options.seed)));
  const std::string types =
      plan.options.uniform_type ? std::string(ggml_type_name(*plan.options.uniform_type)) : std::string("q4_k_m");
  KESTREL_TRY(writer.add_metadata("kestrel.mkmodel.types", GgufValue::string(types)));
  return ok_status();
}

}  // namespace kestrel::mkmodel
