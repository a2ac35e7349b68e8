// Preset definitions. Tiny presets keep every structural feature of the real models at small dimensions (both layer
// kinds, Kh < Vh, GQA, head_dim > n_rot, >= 16 experts with a shared expert); full-size presets use the hparams of
// model-spec.md §1.
#include "tools/mkmodel/presets.h"

#include <utility>

namespace kestrel::mkmodel {

namespace {

constexpr uint32_t kQwen3Vocab = 151936;   // Qwen2/Qwen3/Qwen3-Next: 151643 BPE + 26 added, padded
constexpr uint32_t kQwen35Vocab = 248320;  // Qwen3.5

void set_layer_kinds(ModelHparams& hp, uint32_t interval) {
  hp.layer_kinds.clear();
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    hp.layer_kinds.push_back((i + 1) % interval != 0 ? LayerKind::kGatedDeltaNet : LayerKind::kFullAttention);
  }
}

// Shared by the tiny presets: H=64; attention 8 (or 6) heads of 32 over 2 KV heads, 8 rotary dims; GDN Kh=4 with
// dk=dv=32; 8 layers with interval 4 (6 GDN + 2 attention).
ModelHparams tiny_base(Arch arch) {
  ModelHparams hp;
  hp.arch = arch;
  hp.n_layer = 8;
  hp.n_block = 8;
  hp.n_embd = 64;
  hp.n_vocab = kQwen3Vocab;
  hp.n_ctx_train = 32768;
  hp.n_head = 8;
  hp.n_head_kv = 2;
  hp.head_dim = 32;
  hp.n_rot = 8;
  hp.rope_freq_base = 1e7f;
  if (arch != Arch::kQwen3Next) hp.rope_sections = {11, 11, 10, 0};
  hp.rms_eps = 1e-6f;
  hp.ssm_conv_kernel = 4;
  hp.ssm_d_state = 32;
  hp.ssm_n_k_heads = 4;
  hp.ssm_n_v_heads = 8;  // r = 2
  hp.ssm_inner = 8 * 32;
  return hp;
}

void set_tiny_moe(ModelHparams& hp) {
  hp.n_expert = 16;
  hp.n_expert_used = 4;
  hp.n_ff_expert = 64;
  hp.n_ff_shared = 256;
}

Preset tiny_qwen35moe() {
  Preset p;
  p.name = "tiny";
  p.description =
      "qwen35moe, H=64, 8 layers (6 GDN + 2 attention), 16 experts top-4 + shared, tied output, "
      "Qwen3 vocabulary (the embedded default model)";
  p.hparams = tiny_base(Arch::kQwen35Moe);
  set_tiny_moe(p.hparams);
  p.layout.tied_output = true;
  return p;
}

Preset tiny_qwen3next() {
  Preset p;
  p.name = "tiny-qwen3next";
  p.description = "qwen3next, H=64, 8 layers (6 GDN + 2 attention), 16 experts top-4 + shared, separate output";
  p.hparams = tiny_base(Arch::kQwen3Next);
  set_tiny_moe(p.hparams);
  return p;
}

Preset tiny_qwen35() {
  Preset p;
  p.name = "tiny-qwen35";
  p.description = "qwen35 (dense), H=64, 8 layers (6 GDN + 2 attention), Vh/Kh = 3, FFN 256, separate output";
  ModelHparams hp = tiny_base(Arch::kQwen35);
  hp.n_head = 6;
  hp.n_head_kv = 2;
  hp.ssm_n_v_heads = 12;  // r = 3 like Qwen3.5-27B
  hp.ssm_inner = 12 * 32;
  hp.n_ff_dense = 256;
  p.hparams = std::move(hp);
  return p;
}

// Golden presets: a tiny preset with a 1024-row truncated vocabulary, so the golden fixtures (full logits at every
// position, tests/golden) and the committed GGUF stay small (vocab_source.h truncate_vocab).
constexpr uint32_t kGoldenVocab = 1024;

Preset golden(Preset p, const char* name) {
  p.name = name;
  p.description = "golden fixture model: " + p.description + "; vocabulary truncated to 1024 rows";
  p.hparams.n_vocab = kGoldenVocab;
  return p;
}

// Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B share everything but the layer count, experts and vocabulary.
ModelHparams a3b_base(Arch arch) {
  ModelHparams hp;
  hp.arch = arch;
  hp.n_embd = 2048;
  hp.n_ctx_train = 262144;
  hp.n_head = 16;
  hp.n_head_kv = 2;
  hp.head_dim = 256;
  hp.n_rot = 64;
  hp.rope_freq_base = 1e7f;
  if (arch != Arch::kQwen3Next) hp.rope_sections = {11, 11, 10, 0};
  hp.rms_eps = 1e-6f;
  hp.ssm_conv_kernel = 4;
  hp.ssm_d_state = 128;
  hp.ssm_n_k_heads = 16;
  hp.ssm_n_v_heads = 32;
  hp.ssm_inner = 32 * 128;
  hp.n_ff_expert = 512;
  hp.n_ff_shared = 512;
  return hp;
}

Preset qwen35moe_35b() {
  Preset p;
  p.name = "qwen35moe-35b-a3b";
  p.description = "Qwen3.5-35B-A3B shapes: 40 layers, 256 experts top-8, vocab 248320, Q4_K_M types (~20 GB)";
  ModelHparams hp = a3b_base(Arch::kQwen35Moe);
  hp.n_layer = hp.n_block = 40;
  hp.n_vocab = kQwen35Vocab;
  hp.n_expert = 256;
  hp.n_expert_used = 8;
  p.hparams = std::move(hp);
  p.full_size = true;
  return p;
}

// The 35B-A3B shapes with 64 routed experts per layer instead of 256: a decoded token reads the same matrices (8
// routed experts of the same shape, the shared expert, every dense weight; the router is 64 × 2048 f32, 1.5 MB a
// layer less), from a 6.5 GB file (Q4_K_M; 5.9 GB in Q4_0) that fits the page cache of a machine whose RAM cannot hold
// the 20 GB one.
Preset qwen35moe_35b_e64() {
  Preset p = qwen35moe_35b();
  p.name = "qwen35moe-35b-a3b-e64";
  p.description = "Qwen3.5-35B-A3B shapes with 64 experts per layer (top-8): a token reads the same bytes (~6.5 GB)";
  p.hparams.n_expert = 64;
  return p;
}

Preset qwen3next_80b() {
  Preset p;
  p.name = "qwen3next-80b-a3b";
  p.description = "Qwen3-Next-80B-A3B shapes: 48 layers, 512 experts top-10, vocab 151936, Q4_K_M types (~45 GB)";
  ModelHparams hp = a3b_base(Arch::kQwen3Next);
  hp.n_layer = hp.n_block = 48;
  hp.n_vocab = kQwen3Vocab;
  hp.n_expert = 512;
  hp.n_expert_used = 10;
  p.hparams = std::move(hp);
  p.moe_unused_feed_forward_length = 5120;
  p.full_size = true;
  return p;
}

Preset qwen35_27b() {
  Preset p;
  p.name = "qwen35-27b";
  p.description = "Qwen3.5-27B shapes (dense): 64 layers, H=5120, FFN 17408, Vh/Kh = 3, Q4_K_M types (~16 GB)";
  ModelHparams hp;
  hp.arch = Arch::kQwen35;
  hp.n_layer = hp.n_block = 64;
  hp.n_embd = 5120;
  hp.n_vocab = kQwen35Vocab;
  hp.n_ctx_train = 262144;
  hp.n_head = 24;
  hp.n_head_kv = 4;
  hp.head_dim = 256;
  hp.n_rot = 64;
  hp.rope_freq_base = 1e7f;
  hp.rope_sections = {11, 11, 10, 0};
  hp.rms_eps = 1e-6f;
  hp.ssm_conv_kernel = 4;
  hp.ssm_d_state = 128;
  hp.ssm_n_k_heads = 16;
  hp.ssm_n_v_heads = 48;
  hp.ssm_inner = 48 * 128;
  hp.n_ff_dense = 17408;
  p.hparams = std::move(hp);
  p.full_size = true;
  return p;
}

std::vector<Preset> all_presets() {
  std::vector<Preset> out = {tiny_qwen35moe(),
                             tiny_qwen3next(),
                             tiny_qwen35(),
                             golden(tiny_qwen35moe(), "golden-qwen35moe"),
                             golden(tiny_qwen3next(), "golden-qwen3next"),
                             golden(tiny_qwen35(), "golden-qwen35"),
                             qwen35moe_35b(),
                             qwen35moe_35b_e64(),
                             qwen3next_80b(),
                             qwen35_27b()};
  for (Preset& p : out) set_layer_kinds(p.hparams, p.full_attention_interval);
  return out;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : all_presets()) names.push_back(p.name);
  return names;
}

Expected<Preset> find_preset(std::string_view name) {
  std::string known;
  for (Preset& p : all_presets()) {
    if (p.name == name) return std::move(p);
    known += (known.empty() ? "" : ", ") + p.name;
  }
  return make_error(ErrorCode::kNotFound, "unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

Expected<std::string> preset_for_arch(std::string_view preset, Arch arch) {
  if (preset == "tiny" || preset.substr(0, 5) == "tiny-") {
    return arch == Arch::kQwen35Moe ? std::string("tiny") : "tiny-" + std::string(arch_name(arch));
  }
  KESTREL_TRY_ASSIGN(Preset p, find_preset(preset));
  if (p.hparams.arch != arch) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "preset " + p.name + " is " + std::string(arch_name(p.hparams.arch)) + ", not " + std::string(arch_name(arch)));
  }
  return p.name;
}

}  // namespace kestrel::mkmodel
