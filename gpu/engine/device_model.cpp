// DeviceModel (device_model.h): the layout choice per tensor, the pool's registration in per-layer batches, and the
// per-layer device views.
#include "gpu/engine/device_model.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "gpu/cuda_check.h"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/gemv_imma.h"

namespace kestrel::gpu {
namespace {

uint64_t align_up(uint64_t n) { return (n + kPoolAlignment - 1) / kPoolAlignment * kPoolAlignment; }

std::string gb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

// A raw view of a tensor of the file (host memory), for the shape and type checks of moe_imma_check_raw.
DeviceExpertsView host_experts(const TensorRef& t) {
  return {t.type(), t.data.data(), static_cast<int64_t>(t.ne_at(0)), static_cast<int64_t>(t.ne_at(1)),
          static_cast<int64_t>(t.ne_at(2))};
}
DeviceMatrixView host_matrix(const TensorRef& t) {
  if (!t.present()) return {};
  return {t.type(), t.data.data(), static_cast<int64_t>(t.ne_at(0)), static_cast<int64_t>(t.rows())};
}

MoeDeviceWeights host_moe(const FfnWeights& f, uint32_t n_expert_used) {
  MoeDeviceWeights w;
  w.n_expert_used = static_cast<int>(n_expert_used);
  w.router = host_matrix(f.router);
  w.gate_exps = host_experts(f.gate_exps);
  w.up_exps = host_experts(f.up_exps);
  w.down_exps = host_experts(f.down_exps);
  if (f.has_shared_expert()) {
    w.shared_gate_inp = host_matrix(f.shared_gate_inp);
    w.gate_shexp = host_matrix(f.gate_shexp);
    w.up_shexp = host_matrix(f.up_shexp);
    w.down_shexp = host_matrix(f.down_shexp);
  }
  return w;
}

bool is_projection(const std::string& name) {
  for (const char* role :
       {".attn_qkv.weight", ".attn_gate.weight", ".ssm_in.weight", ".ssm_ba.weight", ".ssm_beta.weight",
        ".ssm_alpha.weight", ".ssm_out.weight", ".attn_q.weight", ".attn_k.weight", ".attn_v.weight",
        ".attn_output.weight", ".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight"}) {
    if (name.ends_with(role)) return true;
  }
  return name == "output.weight";
}

bool is_expert_matrix(const std::string& name) {
  for (const char* role : {".ffn_gate_exps.weight", ".ffn_up_exps.weight", ".ffn_down_exps.weight",
                           ".ffn_gate_shexp.weight", ".ffn_up_shexp.weight", ".ffn_down_shexp.weight"}) {
    if (name.ends_with(role)) return true;
  }
  return false;
}

// The pool key of a layer's stacked input projections.
std::string stacked_key(uint32_t layer) { return "blk." + std::to_string(layer) + ".in_stacked"; }

// A layer's input projections in stacking order — GDN: qkv, gate, beta, alpha / qkv, gate, ba / ssm_in, ba;
// attention: q (with its gate), k, v — when they all share one type GEMV v4 takes at the stacked shape; else empty.
std::vector<const TensorRef*> stackable_inputs(const LayerWeights& lw, uint64_t n_embd) {
  std::vector<const TensorRef*> parts;
  if (lw.kind == LayerKind::kGatedDeltaNet) {
    const GdnWeights& g = lw.gdn;
    if (g.ssm_in.present()) {
      parts = {&g.ssm_in, &g.ba};
    } else if (g.ba.present()) {
      parts = {&g.qkv, &g.gate, &g.ba};
    } else {
      parts = {&g.qkv, &g.gate, &g.beta, &g.alpha};
    }
  } else {
    parts = {&lw.attn.q, &lw.attn.k, &lw.attn.v};
  }
  uint64_t rows = 0;
  for (const TensorRef* t : parts) {
    if (!t->present() || t->type() != parts[0]->type() || t->ne_at(0) != n_embd) return {};
    rows += t->rows();
  }
  if (!gemv_imma_supports(parts[0]->type(), static_cast<int64_t>(n_embd), static_cast<int64_t>(rows))) return {};
  return parts;
}

// The resident experts of each layer in ascending id ([n_layer]; empty rows: every expert, or no MoE), and whether
// the layer keeps all of them. kInvalidArgument when expert_on_gpu's rows do not fit the model's MoE layers.
struct Residency {
  std::vector<std::vector<int32_t>> ids;
  std::vector<bool> all;
};

Expected<Residency> residency_of(const WeightCatalog& catalog, const std::vector<std::vector<uint8_t>>& on_gpu) {
  const ModelHparams& hp = catalog.hparams();
  Residency r;
  r.ids.resize(hp.n_layer);
  r.all.assign(hp.n_layer, true);
  if (on_gpu.empty()) return r;
  if (on_gpu.size() != hp.n_layer) {
    return make_error(ErrorCode::kInvalidArgument, "expert placement: " + std::to_string(on_gpu.size()) + " rows for " +
                                                       std::to_string(hp.n_layer) + " layers");
  }
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    const bool moe = catalog.layer(l).ffn.is_moe();
    const std::vector<uint8_t>& row = on_gpu[l];
    if (!moe) {
      if (!row.empty()) {
        return make_error(ErrorCode::kInvalidArgument,
                          "expert placement: layer " + std::to_string(l) + " has no routed experts to place");
      }
      continue;
    }
    if (row.size() != hp.n_expert) {
      return make_error(ErrorCode::kInvalidArgument, "expert placement: layer " + std::to_string(l) + " has " +
                                                         std::to_string(row.size()) + " entries for " +
                                                         std::to_string(hp.n_expert) + " experts");
    }
    for (uint32_t e = 0; e < hp.n_expert; ++e) {
      if (row[e] != 0) r.ids[l].push_back(static_cast<int32_t>(e));
    }
    r.all[l] = r.ids[l].size() == hp.n_expert;
    if (r.all[l]) r.ids[l].clear();
  }
  return r;
}

bool is_routed_stack(const std::string& name) {
  return name.ends_with(".ffn_gate_exps.weight") || name.ends_with(".ffn_up_exps.weight") ||
         name.ends_with(".ffn_down_exps.weight");
}

}  // namespace

DeviceModel::~DeviceModel() {
  if (resident_maps_ != nullptr) (void)cudaFree(resident_maps_);
}

Expected<std::unique_ptr<DeviceModel>> DeviceModel::create(const Model& model, uint64_t scratch_bytes,
                                                           uint64_t state_bytes, const LoadProgress& progress,
                                                           cudaStream_t stream,
                                                           const std::vector<std::vector<uint8_t>>& expert_on_gpu,
                                                           const PinnedExperts* pinned) {
  const WeightCatalog& catalog = model.catalog();
  const ModelHparams& hp = catalog.hparams();
  KESTREL_TRY_ASSIGN(const Residency res, residency_of(catalog, expert_on_gpu));

  // Which MoE layers run on moe_imma: their expert matrices are tiled, the other layers' stay raw.
  std::vector<bool> moe_tiled(hp.n_layer, false);
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    const FfnWeights& f = catalog.layer(l).ffn;
    if (f.is_moe()) moe_tiled[l] = static_cast<bool>(moe_imma_check_raw(host_moe(f, hp.n_expert_used)));
  }

  // The registration plan: one batch per layer (globals first), each tensor with its layout; a GDN layer's stackable
  // input projections as one stacked tensor (rows back to back in a host buffer kept until registration).
  std::vector<std::vector<PoolTensorDesc>> batches(hp.n_layer + 1);
  std::vector<std::vector<uint8_t>> stacked_rows(hp.n_layer);
  // A hybrid layer's compact stacks: gathered from the file right before their batch is registered (a whole model's
  // would not fit in host memory), kept only for that batch.
  struct Compact {
    size_t desc;                      // index in its batch
    std::span<const uint8_t> source;  // the full stack in the file
    uint64_t slice;                   // one expert's bytes
  };
  std::vector<std::vector<Compact>> compact(hp.n_layer + 1);
  std::unordered_map<std::string, bool> in_stack;
  uint64_t budget = 0;
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    const std::vector<const TensorRef*> parts = stackable_inputs(catalog.layer(l), hp.n_embd);
    if (parts.empty()) continue;
    PoolTensorDesc d;
    d.key = stacked_key(l);
    d.type = parts[0]->type();
    uint64_t rows = 0;
    for (const TensorRef* t : parts) {
      stacked_rows[l].insert(stacked_rows[l].end(), t->data.begin(), t->data.end());
      rows += t->rows();
      in_stack[t->name()] = true;
    }
    d.ne = {hp.n_embd, rows};
    d.data = stacked_rows[l];
    d.layout = PoolLayout::kTiled;
    budget += align_up(d.data.size());
    batches[l + 1].push_back(std::move(d));
  }
  for (const CatalogEntry& ce : catalog.entries()) {
    if (ce.skipped || ce.info == nullptr || in_stack.count(ce.info->name) > 0) continue;
    PoolTensorDesc d;
    d.key = ce.info->name;
    d.type = ce.info->type;
    d.ne = ce.info->ne;
    d.placement = ce.placement;
    d.data = model.file().tensor_data(*ce.info);
    const int64_t ne0 = static_cast<int64_t>(ce.info->ne[0]);
    const int64_t ne1 = ce.info->ne.size() > 1 ? static_cast<int64_t>(ce.info->ne[1]) : 1;
    if (is_projection(d.key)) {
      if (gemv_imma_supports(d.type, ne0, ne1)) d.layout = PoolLayout::kTiled;
    } else if (is_expert_matrix(d.key) && ce.layer >= 0 && moe_tiled[static_cast<size_t>(ce.layer)]) {
      d.layout = PoolLayout::kTiled;
    }
    const size_t b = static_cast<size_t>(ce.layer + 1);
    if (ce.layer >= 0 && is_routed_stack(d.key) && !res.all[static_cast<size_t>(ce.layer)]) {
      const std::vector<int32_t>& ids = res.ids[static_cast<size_t>(ce.layer)];
      if (ids.empty()) continue;  // every expert of the layer on the host: nothing of the stack here
      const uint64_t slice = ce.info->n_bytes / hp.n_expert;
      d.ne = {ce.info->ne[0], ce.info->ne[1], ids.size()};
      compact[b].push_back(Compact{batches[b].size(), d.data, slice});
      d.data = {};
      budget += align_up(slice * ids.size());
      batches[b].push_back(std::move(d));
      continue;
    }
    budget += align_up(ce.info->n_bytes);
    batches[b].push_back(std::move(d));
  }

  size_t free_bytes = 0, total_bytes = 0;
  KESTREL_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (budget + scratch_bytes > free_bytes) {
    return make_error(ErrorCode::kResourceExhausted,
                      "the model does not fit on the GPU: its weights need " + gb(budget) + " and the pass scratch " +
                          gb(scratch_bytes) + ", but after the sessions' state (" + gb(state_bytes) +
                          ") the device has " + gb(free_bytes) + " free of " + gb(total_bytes) +
                          " (fewer sessions or a shorter context lowers the state)");
  }
  KESTREL_TRY_ASSIGN(WeightPool pool, WeightPool::create(budget));
  std::unique_ptr<DeviceModel> dm(new DeviceModel(std::move(pool)));
  dm->hp_ = hp;
  dm->gdn_dims_ = ref::GdnDims::from_hparams(hp);

  uint64_t done = 0, total = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    for (const PoolTensorDesc& d : batches[b]) total += d.data.size();  // compact stacks: empty until gathered
    for (const Compact& c : compact[b]) total += c.slice * res.ids[b - 1].size();
  }
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<PoolTensorDesc>& batch = batches[b];
    if (batch.empty()) continue;
    std::vector<std::vector<uint8_t>> gathered;
    for (const Compact& c : compact[b]) {
      const std::vector<int32_t>& ids = res.ids[b - 1];
      std::vector<uint8_t>& g = gathered.emplace_back(c.slice * ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        std::copy_n(c.source.begin() + static_cast<ptrdiff_t>(c.slice * static_cast<uint64_t>(ids[i])), c.slice,
                    g.begin() + static_cast<ptrdiff_t>(c.slice * i));
      }
      batch[c.desc].data = g;
    }
    KESTREL_TRY(dm->pool_.register_tensors(batch, stream));
    for (const PoolTensorDesc& d : batch) done += d.data.size();
    if (progress) progress(done, total);
  }
  KESTREL_TRY(dm->build_views(catalog, expert_on_gpu, pinned));
  return dm;
}

Expected<DeviceMatrix> DeviceModel::matrix(const TensorRef& t) {
  DeviceMatrix m;
  if (!t.present()) return m;
  KESTREL_TRY_ASSIGN(PoolRef ref, pool_.find(t.name()));
  KESTREL_TRY_ASSIGN(const PoolEntry* e, pool_.entry(ref));
  m.n_in = static_cast<int64_t>(t.ne_at(0));
  m.n_out = static_cast<int64_t>(t.rows());
  if (e->layout == PoolLayout::kTiled) {
    m.tiled = true;
    KESTREL_TRY_ASSIGN(m.tiled_view, pool_.tiled_view(ref));
    max_tiled_in_ = std::max(max_tiled_in_, m.n_in);
    ++n_tiled_;
  } else {
    if (!gemv_supports(e->type)) {
      return make_error(ErrorCode::kUnsupported, "the CUDA engine has no GEMV for " + t.name() + "'s type " +
                                                     std::string(ggml_type_name(e->type)));
    }
    KESTREL_TRY_ASSIGN(m.raw_view, pool_.view(ref));
    ++n_raw_;
  }
  return m;
}

Expected<DeviceMatrix> DeviceModel::stacked(uint32_t layer) {
  DeviceMatrix m;
  KESTREL_TRY_ASSIGN(PoolRef ref, pool_.find(stacked_key(layer)));
  KESTREL_TRY_ASSIGN(const PoolEntry* e, pool_.entry(ref));
  m.tiled = true;
  m.n_in = static_cast<int64_t>(e->ne[0]);
  m.n_out = static_cast<int64_t>(e->ne[1]);
  KESTREL_TRY_ASSIGN(m.tiled_view, pool_.tiled_view(ref));
  max_tiled_in_ = std::max(max_tiled_in_, m.n_in);
  ++n_tiled_;
  return m;
}

Status DeviceModel::build_views(const WeightCatalog& catalog, const std::vector<std::vector<uint8_t>>& expert_on_gpu,
                                const PinnedExperts* pinned) {
  KESTREL_TRY_ASSIGN(const Residency res, residency_of(catalog, expert_on_gpu));
  auto f32 = [&](const TensorRef& t) -> Expected<const float*> {
    if (!t.present()) return static_cast<const float*>(nullptr);
    KESTREL_TRY_ASSIGN(DeviceMatrixView v, pool_.matrix(t.name()));
    if (v.type != GgmlType::kF32) {
      return make_error(ErrorCode::kUnsupported, t.name() + " must be F32 on the CUDA engine");
    }
    return static_cast<const float*>(v.data);
  };
  // A tiled expert stack's base (expert e at e · tiled_bytes) or a raw stack's view.
  auto tiled_base = [&](const TensorRef& t) -> Expected<const void*> {
    KESTREL_TRY_ASSIGN(PoolRef ref, pool_.find(t.name()));
    const bool stack = t.ne().size() >= 3 && t.ne_at(2) > 1;
    KESTREL_TRY_ASSIGN(TiledView v, stack ? pool_.tiled_slice(ref, 0) : pool_.tiled_view(ref));
    return v.data;
  };
  auto raw_experts = [&](const TensorRef& t) -> Expected<DeviceExpertsView> {
    KESTREL_TRY_ASSIGN(DeviceMatrixView v, pool_.matrix(t.name()));
    return DeviceExpertsView{v.type, v.data, static_cast<int64_t>(t.ne_at(0)), static_cast<int64_t>(t.ne_at(1)),
                             static_cast<int64_t>(t.ne_at(2))};
  };
  // A hybrid layer's stacks: n resident experts (compact; none registered when n is 0).
  auto compact_base = [&](const TensorRef& t, size_t n) -> Expected<const void*> {
    if (n == 0) return static_cast<const void*>(nullptr);
    KESTREL_TRY_ASSIGN(PoolRef ref, pool_.find(t.name()));
    KESTREL_TRY_ASSIGN(TiledView v, pool_.tiled_slice(ref, 0));
    return v.data;
  };
  auto compact_raw = [&](const TensorRef& t, size_t n) -> Expected<DeviceExpertsView> {
    DeviceExpertsView v{t.type(), nullptr, static_cast<int64_t>(t.ne_at(0)), static_cast<int64_t>(t.ne_at(1)),
                        static_cast<int64_t>(n)};
    if (n == 0) return v;
    KESTREL_TRY_ASSIGN(DeviceMatrixView m, pool_.matrix(t.name()));
    v.data = m.data;
    return v;
  };

  // The hybrid layers' resident maps, one device allocation.
  std::vector<int32_t> maps;
  for (uint32_t l = 0; l < hp_.n_layer; ++l) {
    if (res.all[l]) continue;
    std::vector<int32_t> map(hp_.n_expert, kExpertNotHere);
    for (size_t i = 0; i < res.ids[l].size(); ++i) map[static_cast<size_t>(res.ids[l][i])] = static_cast<int32_t>(i);
    maps.insert(maps.end(), map.begin(), map.end());
  }
  if (!maps.empty()) {
    KESTREL_CUDA_TRY(cudaMalloc(&resident_maps_, maps.size() * sizeof(int32_t)));
    KESTREL_CUDA_TRY(memcpy_synced(resident_maps_, maps.data(), maps.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  size_t map_at = 0;

  const GlobalWeights& g = catalog.globals();
  KESTREL_TRY_ASSIGN(token_embd_, pool_.matrix(g.token_embd.name()));
  if (!get_rows_supports(token_embd_.type)) {
    return make_error(ErrorCode::kUnsupported, "token_embd.weight's type " +
                                                   std::string(ggml_type_name(token_embd_.type)) +
                                                   " has no embedding lookup on the CUDA engine");
  }
  KESTREL_TRY_ASSIGN(output_norm_, f32(g.output_norm));
  KESTREL_TRY_ASSIGN(output_, matrix(g.output));

  layers_.resize(hp_.n_layer);
  for (uint32_t l = 0; l < hp_.n_layer; ++l) {
    const LayerWeights& lw = catalog.layer(l);
    DeviceLayer& d = layers_[l];
    d.kind = lw.kind;
    KESTREL_TRY_ASSIGN(d.attn_norm, f32(lw.attn_norm));
    KESTREL_TRY_ASSIGN(d.post_attn_norm, f32(lw.post_attention_norm));
    if (lw.kind == LayerKind::kGatedDeltaNet) {
      const GdnWeights& w = lw.gdn;
      DeviceGdnLayer& o = d.gdn;
      o.projection = ref::gdn_projection_for(hp_.arch, catalog.layout().gdn_input);
      if (!stackable_inputs(lw, hp_.n_embd).empty()) {
        KESTREL_TRY_ASSIGN(o.in_stacked, stacked(l));
        ++n_stacked_;
      } else {
        KESTREL_TRY_ASSIGN(o.qkv, matrix(w.qkv));
        KESTREL_TRY_ASSIGN(o.gate, matrix(w.gate));
        KESTREL_TRY_ASSIGN(o.ssm_in, matrix(w.ssm_in));
        KESTREL_TRY_ASSIGN(o.ba, matrix(w.ba));
        KESTREL_TRY_ASSIGN(o.beta, matrix(w.beta));
        KESTREL_TRY_ASSIGN(o.alpha, matrix(w.alpha));
      }
      KESTREL_TRY_ASSIGN(o.out, matrix(w.out));
      KESTREL_TRY_ASSIGN(o.small.conv1d, f32(w.conv1d));
      KESTREL_TRY_ASSIGN(o.small.dt_bias, f32(w.dt_bias));
      KESTREL_TRY_ASSIGN(o.small.ssm_a, f32(w.a));
      KESTREL_TRY_ASSIGN(o.small.ssm_norm, f32(w.norm));
    } else {
      const AttentionWeights& w = lw.attn;
      DeviceAttnLayer& o = d.attn;
      if (!stackable_inputs(lw, hp_.n_embd).empty()) {
        KESTREL_TRY_ASSIGN(o.in_stacked, stacked(l));
        o.q_rows = static_cast<int64_t>(w.q.rows());
        o.k_rows = static_cast<int64_t>(w.k.rows());
        ++n_stacked_;
      } else {
        KESTREL_TRY_ASSIGN(o.q, matrix(w.q));
        KESTREL_TRY_ASSIGN(o.k, matrix(w.k));
        KESTREL_TRY_ASSIGN(o.v, matrix(w.v));
      }
      KESTREL_TRY_ASSIGN(o.o, matrix(w.o));
      KESTREL_TRY_ASSIGN(o.q_norm, f32(w.q_norm));
      KESTREL_TRY_ASSIGN(o.k_norm, f32(w.k_norm));
    }
    const FfnWeights& f = lw.ffn;
    DeviceFfnLayer& o = d.ffn;
    if (!f.is_moe()) {
      KESTREL_TRY_ASSIGN(o.gate, matrix(f.gate));
      KESTREL_TRY_ASSIGN(o.up, matrix(f.up));
      KESTREL_TRY_ASSIGN(o.down, matrix(f.down));
      continue;
    }
    o.moe = true;
    o.n_expert = static_cast<int32_t>(hp_.n_expert);
    o.n_resident = o.n_expert;
    const bool hybrid = !res.all[l];
    const size_t n_res = res.ids[l].size();
    if (hybrid) {
      o.n_resident = static_cast<int32_t>(n_res);
      o.resident = static_cast<const int32_t*>(resident_maps_) + map_at;
      o.resident_host.assign(maps.begin() + static_cast<ptrdiff_t>(map_at),
                             maps.begin() + static_cast<ptrdiff_t>(map_at + hp_.n_expert));
      map_at += hp_.n_expert;
      o.host_gate_exps = host_experts(f.gate_exps);
      o.host_up_exps = host_experts(f.up_exps);
      o.host_down_exps = host_experts(f.down_exps);
      if (pinned != nullptr && l < pinned->n_layer() && pinned->layer(l).gate != nullptr) {
        o.host_gate_exps.data = pinned->layer(l).gate;
        o.host_up_exps.data = pinned->layer(l).up;
        o.host_down_exps.data = pinned->layer(l).down;
        o.host_pinned = true;
        const PinnedExperts::Layer& dev = pinned->device_layer(l);
        o.bus.gate = o.host_gate_exps;
        o.bus.up = o.host_up_exps;
        o.bus.down = o.host_down_exps;
        o.bus.gate.data = dev.gate;
        o.bus.up.data = dev.up;
        o.bus.down.data = dev.down;
      }
      ++n_hybrid_;
      if (n_res == 0) ++n_host_only_;
    }
    KESTREL_TRY_ASSIGN(DeviceMatrixView router, pool_.matrix(f.router.name()));
    DeviceMatrixView shared_gate;
    if (f.has_shared_expert()) {
      KESTREL_TRY_ASSIGN(shared_gate, pool_.matrix(f.shared_gate_inp.name()));
      shared_gate.n_rows = 1;  // {H} or {H, 1}
    }
    // The layout follows the layer's types and shapes (create()'s choice), also when no stack is registered.
    o.moe_tiled = static_cast<bool>(moe_imma_check_raw(host_moe(f, hp_.n_expert_used)));
    if (o.moe_tiled) {
      MoeImmaWeights& w = o.moe_imma;
      w.gate_up_type = f.gate_exps.type();
      w.down_type = f.down_exps.type();
      w.n_expert_used = static_cast<int>(hp_.n_expert_used);
      w.n_embd = hp_.n_embd;
      w.n_ff = static_cast<int64_t>(f.gate_exps.ne_at(1));
      w.n_expert = static_cast<int64_t>(f.gate_exps.ne_at(2));
      w.router = router;
      if (hybrid) {
        KESTREL_TRY_ASSIGN(w.gate_exps, compact_base(f.gate_exps, n_res));
        KESTREL_TRY_ASSIGN(w.up_exps, compact_base(f.up_exps, n_res));
        KESTREL_TRY_ASSIGN(w.down_exps, compact_base(f.down_exps, n_res));
      } else {
        KESTREL_TRY_ASSIGN(w.gate_exps, tiled_base(f.gate_exps));
        KESTREL_TRY_ASSIGN(w.up_exps, tiled_base(f.up_exps));
        KESTREL_TRY_ASSIGN(w.down_exps, tiled_base(f.down_exps));
      }
      if (f.has_shared_expert()) {
        w.shared_gate_inp = shared_gate;
        KESTREL_TRY_ASSIGN(w.gate_shexp, tiled_base(f.gate_shexp));
        KESTREL_TRY_ASSIGN(w.up_shexp, tiled_base(f.up_shexp));
        KESTREL_TRY_ASSIGN(w.down_shexp, tiled_base(f.down_shexp));
      }
      if (n_res > 0 || !hybrid) KESTREL_TRY(moe_imma_check_weights(w));  // none resident: checked when it runs
      ++n_moe_tiled_;
    } else {
      MoeDeviceWeights& w = o.moe_raw;
      w.n_expert_used = static_cast<int>(hp_.n_expert_used);
      w.router = router;
      if (hybrid) {
        KESTREL_TRY_ASSIGN(w.gate_exps, compact_raw(f.gate_exps, n_res));
        KESTREL_TRY_ASSIGN(w.up_exps, compact_raw(f.up_exps, n_res));
        KESTREL_TRY_ASSIGN(w.down_exps, compact_raw(f.down_exps, n_res));
      } else {
        KESTREL_TRY_ASSIGN(w.gate_exps, raw_experts(f.gate_exps));
        KESTREL_TRY_ASSIGN(w.up_exps, raw_experts(f.up_exps));
        KESTREL_TRY_ASSIGN(w.down_exps, raw_experts(f.down_exps));
      }
      if (f.has_shared_expert()) {
        w.shared_gate_inp = shared_gate;
        KESTREL_TRY_ASSIGN(w.gate_shexp, pool_.matrix(f.gate_shexp.name()));
        KESTREL_TRY_ASSIGN(w.up_shexp, pool_.matrix(f.up_shexp.name()));
        KESTREL_TRY_ASSIGN(w.down_shexp, pool_.matrix(f.down_shexp.name()));
      }
      if (!hybrid) KESTREL_TRY(moe_check_weights(w));  // a hybrid layer's compact stacks: checked when it runs
    }
  }
  return ok_status();
}

}  // namespace kestrel::gpu
