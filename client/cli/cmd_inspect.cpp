// `kestrel inspect FILE.gguf [--tensors] [--metadata] [--plan ...]`: describe a GGUF model file.
//
// Opens the file (GgufFile), reads and validates the hyper-parameters (ModelHparams) and checks every weight
// (WeightCatalog); only when all of that succeeds does it print: the file (path, size, GGUF version, alignment),
// architecture and hparams, layer kinds, skipped MTP blocks, a tokenizer summary from the metadata, bytes per type
// and per placement class, then a compact per-layer summary (default) or the full tensor table (--tensors), and all
// metadata (--metadata), and with --plan the placement the planner makes for a GPU memory budget (--gpu-memory;
// none: no GPU) with the predicted decode tokens/s of its cost model. On any failure it prints one line "kestrel:
// error: <path>: <message>" on stderr, nothing on stdout, and exits with 1.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/cli11.h"
#include "client/cli/cli_format.h"
#include "client/cli/commands.h"
#include "core/base/byte_size.h"
#include "core/engine/placement_planner.h"
#include "core/gguf/gguf_reader.h"
#include "core/model/model_hparams.h"
#include "core/model/weight_catalog.h"
#include "cpu/read_bandwidth.h"
#include "cpu/worker_pool.h"

namespace kestrel::cli {

namespace {

struct InspectOptions {
  std::string path;
  bool tensors = false;
  bool metadata = false;
  bool plan = false;
  std::string gpu_memory;  // empty: plan without a GPU
  int32_t n_cpu_moe = 0;
  std::vector<std::string> overrides;
  double gpu_gbps = 4500;  // the lent H200's measured plain read (docs/benchmarks.md)
  double host_gbps = 0;    // 0: measured here
};

std::string_view layer_kind_name(LayerKind k) {
  return k == LayerKind::kGatedDeltaNet ? "gated-deltanet" : "full-attention";
}

std::string join_indices(const std::vector<uint32_t>& v, size_t max_shown) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_shown; ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  if (v.size() > max_shown) s += ", ...";
  return s;
}

std::string format_float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// "40 layers: 30 gated-deltanet, 10 full-attention (3, 7, 11, ...)"
std::string layer_kinds_line(const ModelHparams& hp) {
  std::vector<uint32_t> gdn, attn;
  for (uint32_t i = 0; i < hp.layer_kinds.size(); ++i) {
    (hp.layer_kinds[i] == LayerKind::kGatedDeltaNet ? gdn : attn).push_back(i);
  }
  std::string s = std::to_string(hp.n_layer) + " layers: " + std::to_string(gdn.size()) + " gated-deltanet, " +
                  std::to_string(attn.size()) + " full-attention";
  if (!attn.empty()) s += " (" + join_indices(attn, 16) + ")";
  return s;
}

void print_hparams(const ModelHparams& hp) {
  std::printf("architecture: %s\n", std::string(arch_name(hp.arch)).c_str());
  std::printf("hparams:\n");
  std::printf("  model:          n_embd %u, n_vocab %u, context_length %u, block_count %u\n", hp.n_embd, hp.n_vocab,
              hp.n_ctx_train, hp.n_block);
  std::string sections;
  if (!hp.rope_sections.empty()) {
    sections = ", sections [";
    for (size_t i = 0; i < hp.rope_sections.size(); ++i) {
      sections += (i ? ", " : "") + std::to_string(hp.rope_sections[i]);
    }
    sections += "]";
  }
  std::printf("  attention:      %u heads, %u kv heads, head_dim %u, rope %u dims, freq_base %s%s, rms_eps %s\n",
              hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot, format_float(hp.rope_freq_base).c_str(), sections.c_str(),
              format_float(hp.rms_eps).c_str());
  std::printf(
      "  gated-deltanet: conv_kernel %u, k_heads %u, v_heads %u, dk = dv %u, key_dim %u, value_dim %u, conv_dim %u, "
      "k-head of v-head: %s\n",
      hp.ssm_conv_kernel, hp.ssm_n_k_heads, hp.ssm_n_v_heads, hp.ssm_d_state, hp.ssm_key_dim(), hp.ssm_inner,
      hp.ssm_conv_dim(), hp.head_mapping() == HeadMapping::kGrouped ? "grouped (h / r)" : "tiled (h % Kh)");
  if (hp.is_moe()) {
    std::printf("  ffn:            moe, %u experts, %u used, expert_ff %u, shared_expert_ff %u\n", hp.n_expert,
                hp.n_expert_used, hp.n_ff_expert, hp.n_ff_shared);
  } else {
    std::printf("  ffn:            dense, feed_forward %u\n", hp.n_ff_dense);
  }
  std::printf("layer kinds:  %s\n", layer_kinds_line(hp).c_str());
}

void print_layout(const WeightCatalog& cat) {
  const bool legacy = cat.layout().gdn_input == GdnInputLayout::kLegacySsmIn;
  const char* gdn = legacy                                   ? "legacy ssm_in + ssm_ba"
                    : cat.hparams().arch == Arch::kQwen3Next ? "split attn_qkv + attn_gate + ssm_ba"
                                                             : "split attn_qkv + attn_gate + ssm_beta + ssm_alpha";
  std::printf("layout:       gdn inputs %s; output %s\n", gdn,
              cat.globals().tied_output ? "tied to token_embd.weight" : "output.weight");
}

void print_mtp(const WeightCatalog& cat) {
  const ModelHparams& hp = cat.hparams();
  if (hp.n_nextn == 0 && cat.n_skipped() == 0) {
    std::printf("mtp:          none\n");
    return;
  }
  std::vector<uint32_t> blocks;
  for (uint32_t b = hp.n_layer; b < hp.n_block; ++b) blocks.push_back(b);
  std::printf("mtp:          %u block%s skipped (blk.%s): %" PRIu64 " tensors, %s\n", hp.n_nextn,
              hp.n_nextn == 1 ? "" : "s", join_indices(blocks, 8).c_str(), cat.n_skipped(),
              format_bytes(cat.skipped_bytes()).c_str());
}

void print_tokenizer(const GgufFile& file, const ModelHparams& hp) {
  auto str = [&](const char* key) -> std::string {
    const GgufValue* v = file.find(key);
    return v != nullptr && v->is_string() ? v->raw_string() : std::string("?");
  };
  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  if (file.find("tokenizer.ggml.model") == nullptr && tokens == nullptr) {
    std::printf("tokenizer:    none in metadata\n");
    return;
  }
  const bool tokens_ok = tokens != nullptr && tokens->is_array() && tokens->array_type() == GgufValueType::kString;
  const size_t n_tokens = tokens_ok ? tokens->items().size() : 0;
  std::string line = "model " + str("tokenizer.ggml.model") + ", pre " + str("tokenizer.ggml.pre") + ", " +
                     std::to_string(n_tokens) + " tokens";
  if (n_tokens != hp.n_vocab) line += " (token_embd has " + std::to_string(hp.n_vocab) + " rows)";
  const GgufValue* eos = file.find("tokenizer.ggml.eos_token_id");
  if (eos != nullptr && eos->is_integer()) {
    auto id = eos->to_u64();
    if (id) {
      line += ", eos " + std::to_string(*id);
      if (*id < n_tokens) line += " " + tokens->items()[*id].describe();
    }
  } else {
    line += ", no eos";
  }
  if (file.find("tokenizer.chat_template") != nullptr) line += ", chat template";
  std::printf("tokenizer:    %s\n", line.c_str());
}

void print_bytes(const WeightCatalog& cat) {
  const uint64_t total = cat.total_bytes();
  std::printf("weights:      %" PRIu64 " tensors, %s (%s bytes)\n", cat.n_used_tensors(), format_bytes(total).c_str(),
              format_count(total).c_str());
  std::printf("  by type:\n");
  for (const TypeBytes& t : cat.bytes_by_type()) {
    std::printf("    %-8s %5" PRIu64 " tensors  %11s  %6s\n", std::string(ggml_type_name(t.type)).c_str(), t.n_tensors,
                format_bytes(t.bytes).c_str(), format_percent(t.bytes, total).c_str());
  }
  std::printf("  by placement:\n");
  for (PlacementClass c : {PlacementClass::kEmbedding, PlacementClass::kDense, PlacementClass::kRoutedExperts,
                           PlacementClass::kSharedExpert}) {
    std::printf("    %-16s %11s  %6s\n", std::string(placement_class_name(c)).c_str(),
                format_bytes(cat.bytes_in(c)).c_str(), format_percent(cat.bytes_in(c), total).c_str());
  }
}

// One line per layer: kind, tensor count, bytes, and the types it uses.
void print_layer_summary(const WeightCatalog& cat) {
  const ModelHparams& hp = cat.hparams();
  struct LayerSum {
    uint64_t n = 0;
    uint64_t bytes = 0;
    std::vector<std::pair<GgmlType, uint32_t>> types;
  };
  std::vector<LayerSum> sums(hp.n_layer);
  LayerSum globals;
  for (const CatalogEntry& e : cat.entries()) {
    if (e.skipped) continue;
    LayerSum& s = e.layer < 0 ? globals : sums[static_cast<size_t>(e.layer)];
    ++s.n;
    s.bytes += e.info->n_bytes;
    auto it = std::find_if(s.types.begin(), s.types.end(), [&](const auto& p) { return p.first == e.info->type; });
    if (it == s.types.end()) {
      s.types.emplace_back(e.info->type, 1);
    } else {
      ++it->second;
    }
  }
  auto types_string = [](const LayerSum& s) {
    std::string out;
    for (const auto& [type, n] : s.types) {
      if (!out.empty()) out += " ";
      out += std::string(ggml_type_name(type)) + "x" + std::to_string(n);
    }
    return out;
  };
  std::printf("tensors (per layer; --tensors for the full table):\n");
  std::printf("  %-8s %-15s %7s %11s  %s\n", "block", "kind", "tensors", "bytes", "types");
  const GlobalWeights& g = cat.globals();
  std::string global_kind = g.tied_output ? "global (tied)" : "global";
  std::printf("  %-8s %-15s %7" PRIu64 " %11s  %s\n", "-", global_kind.c_str(), globals.n,
              format_bytes(globals.bytes).c_str(), types_string(globals).c_str());
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    std::string kind(layer_kind_name(hp.layer_kinds[i]));
    std::printf("  %-8s %-15s %7" PRIu64 " %11s  %s\n", ("blk." + std::to_string(i)).c_str(), kind.c_str(), sums[i].n,
                format_bytes(sums[i].bytes).c_str(), types_string(sums[i]).c_str());
  }
}

void print_tensor_table(const WeightCatalog& cat) {
  size_t name_w = 4;
  size_t shape_w = 5;
  for (const CatalogEntry& e : cat.entries()) {
    name_w = std::max(name_w, e.info->name.size());
    shape_w = std::max(shape_w, format_shape(e.info->ne).size());
  }
  const int nw = static_cast<int>(name_w);
  const int sw = static_cast<int>(shape_w);
  std::printf("tensors (%zu):\n", cat.entries().size());
  std::printf("  %-*s %-8s %-*s %11s  %s\n", nw, "name", "type", sw, "shape", "bytes", "placement");
  for (const CatalogEntry& e : cat.entries()) {
    std::string placement = e.skipped ? "skipped (mtp)" : std::string(placement_class_name(e.placement));
    std::printf("  %-*s %-8s %-*s %11s  %s\n", nw, e.info->name.c_str(),
                std::string(ggml_type_name(e.info->type)).c_str(), sw, format_shape(e.info->ne).c_str(),
                format_bytes(e.info->n_bytes).c_str(), placement.c_str());
  }
  if (cat.globals().tied_output) std::printf("  (no output.weight: the output projection is token_embd.weight)\n");
}

void print_metadata(const GgufFile& file) {
  std::printf("metadata (%zu keys):\n", file.metadata().size());
  for (const auto& [key, value] : file.metadata()) {
    if (value.is_array()) {
      std::printf("  %s = %s\n", key.c_str(), value.describe().c_str());  // "[string x 151936] ['!', ...]"
    } else {
      std::printf("  %s (%s) = %s\n", key.c_str(), std::string(gguf_value_type_name(value.type())).c_str(),
                  value.describe().c_str());
    }
  }
}

// The host's plain read bandwidth with one thread per physical core, in bytes/s.
Expected<double> measure_host_read() {
  const int cores = static_cast<int>(cpu::physical_core_cpus().size());
  KESTREL_TRY_ASSIGN(std::unique_ptr<cpu::WorkerPool> pool, cpu::WorkerPool::create(std::max(cores - 1, 0), true));
  return cpu::measure_read_bandwidth(*pool, uint64_t{1} << 30, 3);
}

// A plan made before anything is printed, so a refused budget is one error line.
struct PlanView {
  PlacementRequest request;
  PlannerModel model;
  PlacementDecision decision;
  std::string host_source;
};

Expected<PlanView> make_plan(const WeightCatalog& cat, const InspectOptions& opt) {
  PlanView v;
  PlacementRequest& req = v.request;
  req.has_gpu = !opt.gpu_memory.empty();
  if (req.has_gpu) {
    KESTREL_TRY_ASSIGN(req.gpu_budget, parse_byte_size(opt.gpu_memory));
    req.gpu_read_bytes_per_s = opt.gpu_gbps * 1e9;
  }
  req.n_cpu_moe = opt.n_cpu_moe;
  for (const std::string& text : opt.overrides) {
    KESTREL_TRY_ASSIGN(TensorOverride o, parse_tensor_override(text));
    req.overrides.push_back(std::move(o));
  }
  v.host_source = "given";
  if (opt.host_gbps > 0) {
    req.host_read_bytes_per_s = opt.host_gbps * 1e9;
  } else {
    KESTREL_TRY_ASSIGN(req.host_read_bytes_per_s, measure_host_read());
    v.host_source = "measured here";
  }
  v.model = planner_model(cat);
  KESTREL_TRY_ASSIGN(v.decision, plan_placement(v.model, req));
  return v;
}

void print_plan(const WeightCatalog& cat, const InspectOptions& opt, const PlanView& v) {
  const PlacementRequest& req = v.request;
  const PlacementDecision& d = v.decision;
  const std::string& host_source = v.host_source;
  const PlannerModel& model = v.model;
  const PlacementPlan plan = summarize_placement(model, d, "gpu");
  if (req.has_gpu) {
    std::printf("placement plan (GPU budget %s; GPU read %.0f GB/s, %s; host read %.1f GB/s, %s):\n",
                format_bytes(req.gpu_budget).c_str(), opt.gpu_gbps,
                opt.gpu_gbps == InspectOptions{}.gpu_gbps ? "an H200's, assumed (--gpu-bandwidth)" : "given",
                req.host_read_bytes_per_s / 1e9, host_source.c_str());
  } else {
    std::printf("placement plan (no GPU; host read %.1f GB/s, %s):\n", req.host_read_bytes_per_s / 1e9,
                host_source.c_str());
  }
  for (const PlacementEntry& e : plan.entries) {
    std::printf("  %-18s %-5s %11s\n", e.component.c_str(), e.device.c_str(), format_bytes(e.bytes).c_str());
  }
  std::printf("  total: %s on the GPU, %s on the host\n", format_bytes(d.gpu_bytes).c_str(),
              format_bytes(d.host_bytes).c_str());
  if (cat.hparams().is_moe() && req.has_gpu) {
    const ModelHparams& hp = cat.hparams();
    std::vector<uint32_t> mixed;
    uint32_t moe_layers = 0, all_gpu = 0;
    for (uint32_t l = 0; l < hp.n_layer; ++l) {
      const std::vector<uint8_t>& on = d.expert_on_gpu[l];
      if (on.empty()) continue;
      ++moe_layers;
      const auto n = static_cast<uint32_t>(std::count(on.begin(), on.end(), static_cast<uint8_t>(1)));
      if (n == hp.n_expert) ++all_gpu;
      if (n > 0 && n < hp.n_expert) mixed.push_back(l);
    }
    std::printf("  routed experts: %u of %u MoE layers wholly on the GPU, %zu split (%s), %u wholly on the host\n",
                all_gpu, moe_layers, mixed.size(), mixed.empty() ? "none" : join_indices(mixed, 16).c_str(),
                moe_layers - all_gpu - static_cast<uint32_t>(mixed.size()));
  }
  std::printf("  predicted decode (roofline of the cost model): %.0f tokens/s at 1 session, %.0f aggregate at 32\n",
              d.predicted_tokens_per_s(1), d.predicted_tokens_per_s(32));
}

int run_inspect(const InspectOptions& opt) {
  auto file = GgufFile::open(opt.path);
  if (!file) {
    print_error(opt.path, file.error().message);
    return 1;
  }
  auto hp = ModelHparams::from_gguf(*file);
  if (!hp) {
    print_error(opt.path, hp.error().message);
    return 1;
  }
  auto cat = WeightCatalog::build(*file, *hp);
  if (!cat) {
    print_error(opt.path, cat.error().message);
    return 1;
  }

  std::optional<PlanView> plan;
  if (opt.plan) {
    auto made = make_plan(*cat, opt);
    if (!made) {
      print_error(opt.path, made.error().message);
      return 1;
    }
    plan = std::move(*made);
  }

  std::printf("file:         %s\n", opt.path.c_str());
  std::printf("  size:       %s (%s bytes)\n", format_bytes(file->file_size()).c_str(),
              format_count(file->file_size()).c_str());
  std::printf("  gguf:       version %u, alignment %" PRIu64 ", %zu tensors, %zu metadata keys\n", file->version(),
              file->alignment(), file->tensors().size(), file->metadata().size());
  const GgufValue* name = file->find("general.name");
  if (name != nullptr && name->is_string()) std::printf("  name:       %s\n", name->raw_string().c_str());
  print_hparams(*hp);
  print_layout(*cat);
  print_mtp(*cat);
  print_tokenizer(*file, *hp);
  print_bytes(*cat);
  if (opt.tensors) {
    print_tensor_table(*cat);
  } else {
    print_layer_summary(*cat);
  }
  if (opt.metadata) print_metadata(*file);
  if (plan) print_plan(*cat, opt, *plan);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

void add_inspect(CLI::App& app, int* exit_code) {
  auto opt = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Describe a GGUF model: hparams, layers, tokenizer, weights by type");
  sub->add_option("file", opt->path, "GGUF model file")->required();
  sub->add_flag("--tensors", opt->tensors, "Print the full tensor table (default: a per-layer summary)");
  sub->add_flag("--metadata", opt->metadata, "Print every metadata key and value");
  sub->add_flag("--plan", opt->plan, "Print where each weight would live and the predicted decode tokens/s");
  sub->add_option("--gpu-memory", opt->gpu_memory,
                  "With --plan: GPU memory for weights (12G, 512MiB, bytes); none: no GPU");
  sub->add_option("--n-cpu-moe", opt->n_cpu_moe,
                  "With --plan: keep the routed experts of the first N MoE layers on the host")
      ->check(CLI::NonNegativeNumber);
  sub->add_option(
      "--override-tensor,-o", opt->overrides,
      "With --plan: REGEX=cpu|gpu puts the routed experts of layers whose expert tensors match (repeatable)");
  sub->add_option("--gpu-bandwidth", opt->gpu_gbps,
                  "With --plan: the GPU's read bandwidth in GB/s (default: an H200's)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--host-bandwidth", opt->host_gbps, "With --plan: host read bandwidth in GB/s (default: measured)")
      ->check(CLI::PositiveNumber);
  sub->callback([opt, exit_code] { *exit_code = run_inspect(*opt); });
}

}  // namespace kestrel::cli
