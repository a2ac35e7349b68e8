// The CPU ExpertBackend (expert_backend.h): checks, then ExpertBlock on a MatmulRunner over the backend's pool.
#include "cpu/expert_backend.h"

#include <algorithm>
#include <span>
#include <utility>

#include "core/reference/model_weights.h"
#include "cpu/expert_block.h"
#include "cpu/matmul.h"
#include "cpu/populate.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {
namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

std::string shape(const ref::QuantExperts& e) {
  return "{" + std::to_string(e.n_in) + ", " + std::to_string(e.n_out) + ", " + std::to_string(e.n_expert) + "}";
}

// The checks of one layer's expert tensors: shapes {H, I, E} / {H, I, E} / {I, H, E}, kernels, gate and up alike.
Status check_layer(const ref::MoeWeights& w, size_t l, uint64_t H) {
  const std::string at = "cpu expert backend: layer " + std::to_string(l) + " ";
  const ref::QuantExperts& g = w.gate_exps;
  const uint64_t I = g.n_out, E = g.n_expert;
  auto expect = [&](const ref::QuantExperts& e, const char* name, uint64_t n_in, uint64_t n_out) -> Status {
    if (e.data == nullptr || e.n_in != n_in || e.n_out != n_out || e.n_expert != E) {
      return make_error(ErrorCode::kInvalidArgument, at + name + " has shape " + shape(e) +
                                                         (e.data == nullptr ? " and no data" : "") + ", expected {" +
                                                         std::to_string(n_in) + ", " + std::to_string(n_out) + ", " +
                                                         std::to_string(E) + "}");
    }
    if (!gemv_supports(e.type)) {
      return make_error(ErrorCode::kUnsupported,
                        at + name + ": no CPU kernel for type " + std::string(ggml_type_name(e.type)));
    }
    if (!ggml_row_bytes(e.type, e.n_in)) {
      return make_error(ErrorCode::kInvalidArgument, at + name + ": rows of " + std::to_string(e.n_in) +
                                                         " elements are not whole blocks of " +
                                                         std::string(ggml_type_name(e.type)));
    }
    return ok_status();
  };
  if (E == 0 || I == 0) return make_error(ErrorCode::kInvalidArgument, at + "ffn_gate_exps has shape " + shape(g));
  KESTREL_TRY(expect(g, "ffn_gate_exps", H, I));
  KESTREL_TRY(expect(w.up_exps, "ffn_up_exps", H, I));
  KESTREL_TRY(expect(w.down_exps, "ffn_down_exps", I, H));
  if (w.up_exps.type != g.type) {  // a SwiGLU pair is one task of one type (matmul.h)
    return make_error(ErrorCode::kUnsupported, at + "gate (" + std::string(ggml_type_name(g.type)) + ") and up (" +
                                                   std::string(ggml_type_name(w.up_exps.type)) +
                                                   ") experts of different types");
  }
  return ok_status();
}

// Expert e's slice of a 3-D expert tensor.
std::span<const uint8_t> expert_bytes(const ref::QuantExperts& w, size_t e) {
  const uint64_t bytes = w.n_out * *ggml_row_bytes(w.type, w.n_in);
  return {w.data + e * bytes, sz(static_cast<int64_t>(bytes))};
}

class CpuExpertBackendImpl final : public CpuExpertBackend {
 public:
  CpuExpertBackendImpl(std::vector<ref::MoeWeights> layers, ExpertSet experts, int32_t hidden,
                       std::unique_ptr<WorkerPool> pool, Isa isa, GemvInput act)
      : layers_(std::move(layers)),
        experts_(std::move(experts)),
        hidden_(hidden),
        pool_(std::move(pool)),
        mm_(*pool_, isa, act) {}

  const ExpertSet& experts() const override { return experts_; }
  int32_t hidden() const override { return hidden_; }

  std::string summary() const override {
    const bool int8 = mm_.activations() == GemvInput::kQ8 &&
                      gemv_kernel(mm_.isa(), GgmlType::kQ4_0, GemvInput::kQ8).input == GemvInput::kQ8;
    return std::string(isa_name(mm_.isa())) + (int8 ? ", int8" : ", f32") + ", " +
           std::to_string(pool_->n_threads() + 1) + " threads, " + std::to_string(experts_.count()) + " experts held";
  }

  Status check(const ExpertBatch& batch) const override { return check_expert_batch(batch, experts_, hidden_); }

  Status run(const ExpertBatch& batch) override {
    KESTREL_TRY(check(batch));
    compute(batch);
    return ok_status();
  }

 private:
  void compute(const ExpertBatch& b) {
    if (b.n_tokens == 0) return;
    block_.run(mm_, layers_[sz(b.layer)], b.x, b.n_tokens, b.choices, b.k, /*shared_logit=*/nullptr, b.y,
               /*profile=*/nullptr);
  }

  std::vector<ref::MoeWeights> layers_;
  ExpertSet experts_;
  int32_t hidden_;
  std::unique_ptr<WorkerPool> pool_;
  MatmulRunner mm_;
  ExpertBlock block_;
};

}  // namespace

Expected<std::unique_ptr<CpuExpertBackend>> make_cpu_expert_backend(std::vector<ref::MoeWeights> layers,
                                                                    ExpertSet experts,
                                                                    const CpuExpertBackendOptions& options) {
  if (options.threads < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "cpu expert backend: thread count must be >= 0 (got " + std::to_string(options.threads) + ")");
  }
  if (experts.held.size() != layers.size()) {
    return make_error(ErrorCode::kInvalidArgument, "cpu expert backend: an expert set of " +
                                                       std::to_string(experts.held.size()) + " layers for a model of " +
                                                       std::to_string(layers.size()));
  }
  uint64_t H = 0;
  for (const ref::MoeWeights& w : layers) {
    if (w.gate_exps.data != nullptr) {
      H = w.gate_exps.n_in;
      break;
    }
  }
  if (H == 0 || H > static_cast<uint64_t>(INT32_MAX)) {
    return make_error(ErrorCode::kInvalidArgument, "cpu expert backend: no layer has routed experts");
  }
  std::vector<std::span<const uint8_t>> held_bytes;  // the slices to populate
  for (size_t l = 0; l < layers.size(); ++l) {
    const ref::MoeWeights& w = layers[l];
    const std::vector<uint8_t>& row = experts.held[l];
    if (w.gate_exps.data == nullptr) {
      if (!row.empty()) {
        return make_error(ErrorCode::kInvalidArgument, "cpu expert backend: the expert set holds experts of layer " +
                                                           std::to_string(l) + ", which has no routed experts");
      }
      continue;
    }
    KESTREL_TRY(check_layer(w, l, H));
    if (!row.empty() && row.size() != w.gate_exps.n_expert) {
      return make_error(ErrorCode::kInvalidArgument, "cpu expert backend: the expert set's row of layer " +
                                                         std::to_string(l) + " has " + std::to_string(row.size()) +
                                                         " entries for " + std::to_string(w.gate_exps.n_expert) +
                                                         " experts");
    }
    for (size_t e = 0; e < row.size(); ++e) {
      if (row[e] == 0) continue;
      for (const ref::QuantExperts* t : {&w.gate_exps, &w.up_exps, &w.down_exps}) {
        held_bytes.push_back(expert_bytes(*t, e));
      }
    }
  }
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(physical_core_cpus().size());
  KESTREL_TRY_ASSIGN(std::unique_ptr<WorkerPool> pool, WorkerPool::create(std::max(threads, 1) - 1, options.pin));
  if (options.populate) populate_ranges(held_bytes, *pool);
  const Isa isa = options.isa ? isa_choose(isa_name(*options.isa)) : isa_selected();
  const GemvInput act = options.activations == CpuActivations::kInt8 ? GemvInput::kQ8 : GemvInput::kF32;
  return std::unique_ptr<CpuExpertBackend>(std::make_unique<CpuExpertBackendImpl>(
      std::move(layers), std::move(experts), static_cast<int32_t>(H), std::move(pool), isa, act));
}

Expected<std::vector<ref::MoeWeights>> expert_weight_views(const Model& model) {
  KESTREL_TRY_ASSIGN(const ref::RefModelWeights weights, ref::RefModelWeights::from_catalog(model.catalog()));
  std::vector<ref::MoeWeights> layers(weights.layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    if (weights.layers[l].is_moe) layers[l] = weights.layers[l].moe;
  }
  return layers;
}

Expected<std::unique_ptr<CpuExpertBackend>> make_cpu_expert_backend(const Model& model, ExpertSet experts,
                                                                    const CpuExpertBackendOptions& options) {
  KESTREL_TRY_ASSIGN(std::vector<ref::MoeWeights> layers, expert_weight_views(model));
  return make_cpu_expert_backend(std::move(layers), std::move(experts), options);
}

}  // namespace kestrel::cpu
