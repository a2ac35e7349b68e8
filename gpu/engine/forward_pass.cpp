// ForwardPass (forward_pass.h): scratch layout and the layer loop of one decode pass.
#include "gpu/engine/forward_pass.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "core/reference/rope.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/argmax.h"
#include "gpu/kernels/attention_decode.h"
#include "gpu/kernels/attention_prompt.h"
#include "gpu/kernels/expert_handoff.h"
#include "gpu/kernels/gdn_chunked.h"
#include "gpu/kernels/gdn_decode.h"
#include "gpu/kernels/gdn_runs.h"
#include "gpu/kernels/gemm_imma.h"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/get_rows.h"
#include "gpu/kernels/moe_experts.h"
#include "gpu/kernels/moe_hybrid.h"
#include "gpu/kernels/moe_imma.h"
#include "gpu/kernels/moe_imma_prompt.h"
#include "gpu/kernels/rms_norm.h"
#include "gpu/kernels/swiglu.h"

namespace kestrel::gpu {
namespace {

constexpr int P = kPassMaxTokens;        // rows of a graphed pass, of one kernel call, and of logits
constexpr int R = kPromptPassMaxTokens;  // rows the row buffers hold (a prompt pass's)
constexpr uint64_t kAlign = 256;

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The widths of the pass's f32 buffers for a model.
struct Widths {
  int64_t h, proj_a, proj_b, proj_c, proj_d, mixed, vocab;
};

Widths widths_of(const ModelHparams& hp) {
  const int64_t H = hp.n_embd, C = hp.ssm_conv_dim(), Vd = hp.ssm_inner, Vh = hp.ssm_n_v_heads;
  const int64_t qg = int64_t{hp.n_head} * 2 * hp.head_dim, kv = int64_t{hp.n_head_kv} * hp.head_dim;
  const int64_t I = hp.n_ff_dense, att = int64_t{hp.n_head} * hp.head_dim;
  Widths w;
  w.h = H;
  // C + Vd + 2·Vh: the stacked GDN projections; qg + 2·kv: the stacked attention projections.
  w.proj_a = std::max({C + Vd + 2 * Vh, qg + 2 * kv, I, int64_t{1}});
  w.proj_b = std::max({Vd, kv, I, int64_t{1}});
  w.proj_c = std::max({2 * Vh, kv, int64_t{1}});
  w.proj_d = std::max(Vh, int64_t{1});
  w.mixed = std::max({Vd, att, I, int64_t{1}});
  w.vocab = hp.n_vocab;
  return w;
}

AttnDecodeDims attn_dims_of(const ModelHparams& hp) {
  AttnDecodeDims d;
  d.n_head = static_cast<int>(hp.n_head);
  d.n_head_kv = static_cast<int>(hp.n_head_kv);
  d.head_dim = static_cast<int>(hp.head_dim);
  d.n_rot = static_cast<int>(hp.n_rot);
  d.eps = hp.rms_eps;
  return d;
}

// An upper bound of an MoE workspace for `tokens` tokens before the weights are on the device: routing tables,
// per-entry activations (gate, up, prepared) and outputs for the tokens × k experts plus the shared expert, the
// logits and the segment tables, with room to spare.
uint64_t moe_workspace_estimate(const ModelHparams& hp, int tokens) {
  if (!hp.is_moe()) return 0;
  const uint64_t entries = uint64_t(tokens) * (hp.n_expert_used + 1);
  const uint64_t ff = std::max(hp.n_ff_expert, hp.n_ff_shared);
  return entries * ((4 * ff + 2 * hp.n_embd) * sizeof(float) + 3 * sizeof(ImmaSegment)) +
         uint64_t(tokens) * hp.n_expert * 8 + (8u << 20);
}

// The hybrid layers' device buffers (host choices, host partial sums), carved for every MoE model.
uint64_t hybrid_choices_bytes(const ModelHparams& hp) {
  return hp.is_moe() ? uint64_t{R} * hp.n_expert_used * sizeof(ExpertChoice) : 0;
}
uint64_t hybrid_rows_bytes(const ModelHparams& hp) { return hp.is_moe() ? uint64_t{R} * hp.n_embd * sizeof(float) : 0; }

bool any_hybrid(const DeviceModel& m) {
  for (const DeviceLayer& d : m.layers()) {
    if (d.ffn.hybrid()) return true;
  }
  return false;
}

// The kernel nodes of a captured graph (-1 when the runtime cannot list them: a count for the benchmarks, never a
// reason to fail the capture).
int count_kernel_nodes(cudaGraph_t graph) {
  size_t n = 0;
  if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) return -1;
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0 && cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) return -1;
  int kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) return -1;
    kernels += type == cudaGraphNodeTypeKernel ? 1 : 0;
  }
  return kernels;
}

// The GDN run table of a pass (gdn_runs.h) into start / len / order (P entries each): one run per slot, its rows in
// position order, entries past the runs of length 0. *several: some slot has more than one row. kInvalidArgument
// when a slot's positions are not consecutive.
Status build_runs(std::span<const PassRow> rows, int32_t* start, int32_t* len, int32_t* order, bool* several) {
  const int n = static_cast<int>(rows.size());
  std::array<int32_t, P> by_slot{};
  for (int i = 0; i < n; ++i) by_slot[size_t(i)] = i;
  // Rows grouped by slot (in the order slots first appear), then by position.
  std::array<int32_t, P> first_seen{};
  for (int i = 0; i < n; ++i) {
    first_seen[size_t(i)] = i;
    for (int j = 0; j < i; ++j) {
      if (rows[size_t(j)].slot == rows[size_t(i)].slot) {
        first_seen[size_t(i)] = first_seen[size_t(j)];
        break;
      }
    }
  }
  std::sort(by_slot.begin(), by_slot.begin() + n, [&](int32_t a, int32_t b) {
    if (first_seen[size_t(a)] != first_seen[size_t(b)]) return first_seen[size_t(a)] < first_seen[size_t(b)];
    return rows[size_t(a)].position < rows[size_t(b)].position;
  });
  int runs = 0;
  *several = false;
  for (int i = 0; i < n; ++i) {
    const PassRow& r = rows[size_t(by_slot[size_t(i)])];
    order[i] = by_slot[size_t(i)];
    if (i > 0 && rows[size_t(by_slot[size_t(i - 1)])].slot == r.slot) {
      if (rows[size_t(by_slot[size_t(i - 1)])].position + 1 != r.position) {
        return make_error(ErrorCode::kInvalidArgument, "forward pass: the rows of slot " + std::to_string(r.slot) +
                                                           " are not at consecutive positions");
      }
      ++len[runs - 1];
      *several = true;
      continue;
    }
    start[runs] = i;
    len[runs] = 1;
    ++runs;
  }
  for (int i = runs; i < P; ++i) start[i] = 0, len[i] = 0;
  for (int i = n; i < P; ++i) order[i] = 0;
  return ok_status();
}

}  // namespace

const char* pass_section_name(PassSection s) {
  switch (s) {
    case PassSection::kRest: return "rest (embedding, norms, uploads)";
    case PassSection::kGdnIn: return "gdn input projections";
    case PassSection::kGdn: return "gdn step + ssm_out";
    case PassSection::kAttention: return "attention layers";
    case PassSection::kMoeRouter: return "moe router";
    case PassSection::kMoeRoute: return "moe routing";
    case PassSection::kMoeExperts: return "moe experts";
    case PassSection::kMoe: return "moe combine + norm";
    case PassSection::kExpertUpload: return "expert upload (wait, tile)";
    case PassSection::kDenseFfn: return "dense ffn";
    case PassSection::kLmHead: return "lm_head + logits copy";
    case PassSection::kCount: break;
  }
  return "?";
}

Status ForwardPass::set_profiling(bool on) {
  if (on && events_.empty()) {
    events_.resize(8 * model_.layers().size() + 8);
    for (cudaEvent_t& e : events_) KESTREL_CUDA_TRY(cudaEventCreate(&e));
    sections_.resize(events_.size());
  }
  // The hand-off's counters from here on: what unprofiled passes left is dropped.
  if (on && !profiling_ && link_ != nullptr) KESTREL_TRY(link_->take_times());
  profiling_ = on;
  return ok_status();
}

Status ForwardPass::mark(PassSection section) {
  if (!profiling_ || n_marks_ >= events_.size()) return ok_status();
  // Captured into the profiled graphs as event-record nodes (cudaEventRecordExternal); recorded plainly in passes
  // launched one by one.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  KESTREL_CUDA_TRY(cudaStreamIsCapturing(stream_, &capturing));
  KESTREL_CUDA_TRY(cudaEventRecordWithFlags(
      events_[n_marks_], stream_,
      capturing == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault));
  sections_[n_marks_] = section;
  ++n_marks_;
  return ok_status();
}

uint64_t ForwardPass::scratch_bytes(const ModelHparams& hp, int n_ctx) {
  const Widths w = widths_of(hp);
  uint64_t b = 7 * align_up(R * sizeof(int32_t)) + align_up(uint64_t{hp.n_layer} * R * sizeof(GdnSlot));
  for (int64_t width : {w.h, w.h, w.h, w.proj_a, w.proj_b, w.proj_c, w.proj_d, w.mixed}) {
    b += align_up(static_cast<uint64_t>(width) * R * sizeof(float));
  }
  b += align_up(static_cast<uint64_t>(w.vocab) * P * sizeof(float));
  b += align_up(imma_x_bytes(8192, R));
  if (hp.n_gdn_layers() > 0) {
    const ref::GdnDims dims = ref::GdnDims::from_hparams(hp);
    b += align_up(gdn_decode_workspace_bytes(dims, P)) + align_up(gdn_chunked_workspace_bytes(dims, R));
  }
  if (hp.n_attn_layers() > 0) b += align_up(attention_decode_workspace_bytes(attn_dims_of(hp), P, n_ctx));
  return b + align_up(moe_workspace_estimate(hp, P)) + align_up(moe_workspace_estimate(hp, R)) +
         align_up(hp.n_rot * sizeof(float)) + align_up(hybrid_choices_bytes(hp)) + align_up(hybrid_rows_bytes(hp));
}

Expected<std::unique_ptr<ForwardPass>> ForwardPass::create(const DeviceModel& model, const StateSlots& slots,
                                                           const GpuTuning& tuning, cudaStream_t stream,
                                                           ExpertBackend* backend) {
  if (any_hybrid(model)) {
    if (backend == nullptr) {
      return make_error(ErrorCode::kInvalidArgument,
                        "the placement leaves routed experts on the host, but no expert backend computes them");
    }
    const ModelHparams& hp = model.hparams();
    if (backend->hidden() != static_cast<int32_t>(hp.n_embd)) {
      return make_error(ErrorCode::kInvalidArgument, "the expert backend's rows are " +
                                                         std::to_string(backend->hidden()) + " elements, the model's " +
                                                         std::to_string(hp.n_embd));
    }
    // The backend must hold exactly the experts the device does not.
    const ExpertSet& held = backend->experts();
    for (size_t l = 0; l < model.layers().size(); ++l) {
      const DeviceFfnLayer& f = model.layers()[l].ffn;
      if (!f.moe) continue;
      for (int32_t e = 0; e < f.n_expert; ++e) {
        const bool on_device = !f.hybrid() || f.resident_host[static_cast<size_t>(e)] != kExpertNotHere;
        if (held.holds(static_cast<int32_t>(l), e) == on_device) {
          return make_error(ErrorCode::kInvalidArgument,
                            "expert " + std::to_string(e) + " of layer " + std::to_string(l) + " is " +
                                (on_device ? "on the GPU and also held by the expert backend"
                                           : "on neither the GPU nor the expert backend"));
        }
      }
    }
  }
  if (tuning.moe_imma.prompt_segment_vectors < 1 || tuning.moe_imma.prompt_segment_vectors > kImmaSegmentVectors) {
    return make_error(ErrorCode::kInvalidArgument, "tuning: prompt_segment_vectors " +
                                                       std::to_string(tuning.moe_imma.prompt_segment_vectors) +
                                                       " is outside 1.." + std::to_string(kImmaSegmentVectors));
  }
  std::unique_ptr<ForwardPass> p(new ForwardPass(model, slots, tuning, stream, any_hybrid(model) ? backend : nullptr));
  KESTREL_TRY(p->allocate());
  return p;
}

ForwardPass::~ForwardPass() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (base_ != nullptr) cudaFree(base_);
  if (host_upload_ != nullptr) cudaFreeHost(host_upload_);
  if (host_logits_ != nullptr) cudaFreeHost(host_logits_);
  if (host_argmax_ != nullptr) cudaFreeHost(host_argmax_);
}

Status ForwardPass::allocate() {
  const ModelHparams& hp = model_.hparams();
  const Widths w = widths_of(hp);
  const std::vector<DeviceLayer>& layers = model_.layers();
  gdn_index_.assign(layers.size(), -1);
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].kind == LayerKind::kGatedDeltaNet) gdn_index_[l] = n_gdn_++;
  }

  // The MoE workspace: the largest any layer needs at P tokens.
  uint64_t moe_ws = 0;
  const MoeImmaWeights* first_tiled = nullptr;
  for (const DeviceLayer& d : layers) {
    if (!d.ffn.moe) continue;
    if (d.ffn.moe_tiled) {
      moe_ws = std::max<uint64_t>(moe_ws, moe_imma_workspace_bytes(d.ffn.moe_imma, P));
      if (first_tiled == nullptr) first_tiled = &d.ffn.moe_imma;
    } else {
      moe_ws = std::max<uint64_t>(moe_ws, moe_workspace_bytes(d.ffn.moe_raw, P));
    }
  }
  const ref::GdnDims& dims = model_.gdn_dims();
  uint64_t moe_prompt_ws = 0;
  for (const DeviceLayer& d : layers) {
    if (d.ffn.moe && d.ffn.moe_tiled) {
      moe_prompt_ws = std::max<uint64_t>(moe_prompt_ws, moe_imma_prompt_workspace_bytes(d.ffn.moe_imma, R));
    }
  }
  const uint64_t gdn_ws = n_gdn_ > 0 ? gdn_decode_workspace_bytes(dims, P) : 0;
  const uint64_t gdn_chunk_ws = n_gdn_ > 0 && tuning_.gdn_decode.prompt_chunked && gdn_chunked_supported(dims)
                                    ? gdn_chunked_workspace_bytes(dims, R)
                                    : 0;
  attn_ws_bytes_ = hp.n_attn_layers() > 0 ? attention_decode_workspace_bytes(attn_dims_of(hp), P, slots_.n_ctx()) : 0;
  const int64_t prep_cols = std::max<int64_t>(model_.max_tiled_in(), 64);

  // Carve one allocation.
  uint64_t off = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t at = off;
    off += align_up(std::max<uint64_t>(bytes, 1));
    return at;
  };
  const uint64_t o_ids = take(7 * R * sizeof(int32_t) + uint64_t(n_gdn_) * R * sizeof(GdnSlot));
  const uint64_t o_h = take(w.h * R * sizeof(float)), o_x = take(w.h * R * sizeof(float));
  const uint64_t o_y = take(w.h * R * sizeof(float));
  const uint64_t o_prep = take(imma_x_bytes(prep_cols, R));
  const uint64_t o_a = take(w.proj_a * R * sizeof(float)), o_b = take(w.proj_b * R * sizeof(float));
  const uint64_t o_c = take(w.proj_c * R * sizeof(float)), o_d = take(w.proj_d * R * sizeof(float));
  const uint64_t o_m = take(w.mixed * R * sizeof(float)), o_l = take(w.vocab * P * sizeof(float));
  const uint64_t o_am = take(P * sizeof(int32_t));
  const uint64_t o_gws = take(gdn_ws), o_aws = take(attn_ws_bytes_), o_mws = take(moe_ws);
  const uint64_t o_mpws = take(moe_prompt_ws);
  const uint64_t o_gcws = take(gdn_chunk_ws);
  const uint64_t o_rope = take(std::max<uint64_t>(hp.n_rot / 2, 1) * sizeof(float));
  const uint64_t o_hch = take(hybrid_choices_bytes(hp)), o_hy = take(hybrid_rows_bytes(hp));
  KESTREL_CUDA_TRY(cudaMalloc(&base_, off));
  auto at = [&](uint64_t o) { return static_cast<uint8_t*>(base_) + o; };
  ids_ = reinterpret_cast<int32_t*>(at(o_ids));
  slot_ids_ = ids_ + R;
  positions_ = ids_ + 2 * R;
  row_pages_ = ids_ + 3 * R;
  run_start_ = ids_ + 4 * R;
  run_len_ = ids_ + 5 * R;
  run_order_ = ids_ + 6 * R;
  gdn_slots_ = reinterpret_cast<GdnSlot*>(ids_ + 7 * R);
  h_ = reinterpret_cast<float*>(at(o_h));
  x_ = reinterpret_cast<float*>(at(o_x));
  y_ = reinterpret_cast<float*>(at(o_y));
  xprep_ = at(o_prep);
  proj_a_ = reinterpret_cast<float*>(at(o_a));
  proj_b_ = reinterpret_cast<float*>(at(o_b));
  proj_c_ = reinterpret_cast<float*>(at(o_c));
  proj_d_ = reinterpret_cast<float*>(at(o_d));
  mixed_ = reinterpret_cast<float*>(at(o_m));
  logits_ = reinterpret_cast<float*>(at(o_l));
  argmax_ = reinterpret_cast<int32_t*>(at(o_am));
  gdn_ws_ = at(o_gws);
  attn_ws_ = at(o_aws);
  moe_ws_ = at(o_mws);
  moe_prompt_ws_ = at(o_mpws);
  gdn_chunk_ws_ = gdn_chunk_ws > 0 ? at(o_gcws) : nullptr;
  rope_inv_freq_ = reinterpret_cast<float*>(at(o_rope));
  host_choices_dev_ = reinterpret_cast<ExpertChoice*>(at(o_hch));
  host_y_dev_ = reinterpret_cast<float*>(at(o_hy));

  upload_bytes_ = 7 * R * sizeof(int32_t) + size_t(n_gdn_) * R * sizeof(GdnSlot);
  supports_runs_ = n_gdn_ == 0 || gdn_runs_supported(dims, tuning_.gdn_decode);
  KESTREL_CUDA_TRY(cudaMallocHost(&host_upload_, upload_bytes_));
  KESTREL_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&host_logits_), w.vocab * P * sizeof(float)));
  KESTREL_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&host_argmax_), P * sizeof(int32_t)));
  if (backend_ != nullptr) {
    KESTREL_TRY_ASSIGN(
        link_, HostExpertLink::create(*backend_, R, static_cast<int>(hp.n_embd), static_cast<int>(hp.n_expert_used)));
    // Without the upload (no memory to stage in) prompt passes hand the host its experts' tokens like decode steps
    // do: slower, the same results up to the host's rounding. Its memcpy threads: half the host's, at most 8 (a few
    // saturate the host's read; the pass's CPU experts are idle while it uploads).
    if (tuning_.expert_upload_min_tokens > 0) {
      const int copy_threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
      Expected<std::unique_ptr<ExpertUpload>> u = ExpertUpload::create(model_, copy_threads);
      if (u) {
        upload_ = std::move(*u);
      } else {
        upload_note_ = u.error().message;
      }
    }
  }

  // Zeroed once: the GDN readers' counters and the MoE counters (every call leaves them zero).
  if (gdn_ws > 0) KESTREL_CUDA_TRY(cudaMemsetAsync(gdn_ws_, 0, gdn_ws, stream_));
  if (first_tiled != nullptr) KESTREL_TRY(moe_imma_workspace_init(*first_tiled, moe_ws_, stream_));
  if (hp.n_rot > 0) {
    std::vector<float> inv(hp.n_rot / 2);
    ref::rope_inv_freq(static_cast<int>(hp.n_rot), hp.rope_freq_base, inv.data());
    KESTREL_CUDA_TRY(
        cudaMemcpyAsync(rope_inv_freq_, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  }

  // Each slot's GDN state pointers, looked up once.
  slot_states_.resize(size_t(slots_.n_slots()) * n_gdn_);
  for (int s = 0; s < slots_.n_slots(); ++s) {
    for (size_t l = 0; l < layers.size(); ++l) {
      if (gdn_index_[l] < 0) continue;
      GdnSlot& g = slot_states_[size_t(s) * n_gdn_ + gdn_index_[l]];
      KESTREL_TRY_ASSIGN(g.s, slots_.gdn_s(s, static_cast<uint32_t>(l)));
      KESTREL_TRY_ASSIGN(g.conv, slots_.gdn_conv(s, static_cast<uint32_t>(l)));
    }
  }
  KESTREL_CUDA_TRY(cudaStreamSynchronize(stream_));
  return ok_status();
}

Status ForwardPass::prepare(const float* x, int64_t n_cols, int n) {
  return gemv_imma_prepare_x(x, n_cols, n, xprep_, stream_);
}

Status ForwardPass::gemv_prepared(const DeviceMatrix& m, int n, float* y, int row0) {
  // gemv_imma takes up to P vectors a call; the prepared form of n vectors is n back-to-back vectors.
  const uint64_t vec = imma_x_bytes(m.n_in, 1);
  if (n > P && tuning_.gemv_imma.prompt_gemm && gemm_imma_supports(m.tiled_view.type, m.n_in, m.n_out)) {
    return gemm_imma(m.tiled_view, static_cast<const uint8_t*>(xprep_) + uint64_t(row0) * vec, n, y, stream_,
                     tuning_.gemv_imma.prompt_digits);
  }
  for (int c0 = 0; c0 < n; c0 += P) {
    const auto* x = static_cast<const uint8_t*>(xprep_) + (uint64_t(row0) + uint64_t(c0)) * vec;
    KESTREL_TRY(gemv_imma(m.tiled_view, x, std::min(P, n - c0), y + int64_t{c0} * m.n_out, stream_,
                          tuning_.programmatic, tuning_.gemv_imma));
  }
  return ok_status();
}

Status ForwardPass::matmul(const DeviceMatrix& m, const float* x, bool x_prepared, int n, float* y, int row0) {
  if (m.tiled) {
    if (x_prepared) return gemv_prepared(m, n, y, row0);
    KESTREL_TRY(prepare(x + int64_t{row0} * m.n_in, m.n_in, n));
    return gemv_prepared(m, n, y, 0);
  }
  for (int c0 = 0; c0 < n; c0 += P) {
    KESTREL_TRY(
        gemv(m.raw_view, x + (int64_t{row0} + c0) * m.n_in, std::min(P, n - c0), y + int64_t{c0} * m.n_out, stream_));
  }
  return ok_status();
}

Status ForwardPass::norm(const float* delta, const float* w, int n, bool prepare_for) {
  const ModelHparams& hp = model_.hparams();
  const int64_t H = hp.n_embd;
  x_prepared_ = prepare_for;
  return rms_norm_prepare(h_, delta, w, n, H, hp.rms_eps, x_, prepare_for ? xprep_ : nullptr, stream_,
                          tuning_.programmatic);
}

bool ForwardPass::mixer_input_tiled(size_t l) const {
  const DeviceLayer& layer = model_.layers()[l];
  if (layer.kind == LayerKind::kGatedDeltaNet) {
    const DeviceGdnLayer& g = layer.gdn;
    if (g.in_stacked.present()) return g.in_stacked.tiled;
    return g.qkv.tiled || g.gate.tiled || g.ssm_in.tiled || g.ba.tiled || g.beta.tiled || g.alpha.tiled;
  }
  const DeviceAttnLayer& a = layer.attn;
  return a.in_stacked.present() || a.q.tiled || a.k.tiled || a.v.tiled;
}

bool ForwardPass::ffn_input_tiled(size_t l) const {
  const DeviceFfnLayer& f = model_.layers()[l].ffn;
  return !f.moe && (f.gate.tiled || f.up.tiled);
}

Status ForwardPass::gdn_layer(size_t l, int gdn_index, int n) {
  const DeviceGdnLayer& g = model_.layers()[l].gdn;
  if (g.in_stacked.present()) {
    // One GEMV over the stacked projections; each output row holds them side by side.
    KESTREL_TRY(matmul(g.in_stacked, x_, take_x_prepared(), n, proj_a_));
    const ref::GdnDims& d = model_.gdn_dims();
    const int64_t C = d.conv_dim(), Vd = d.value_dim(), Vh = d.n_v_heads;
    GdnDecodeInputs in;
    in.qkv = proj_a_;
    in.row_stride = static_cast<int>(g.in_stacked.n_out);
    switch (g.projection) {
      case ref::GdnProjection::kQkvGateBetaAlpha:
        in.z = proj_a_ + C, in.b = proj_a_ + C + Vd, in.a = proj_a_ + C + Vd + Vh;
        break;
      case ref::GdnProjection::kQkvGateBa: in.z = proj_a_ + C, in.ba = proj_a_ + C + Vd; break;
      case ref::GdnProjection::kSsmInBa: in.ba = proj_a_ + C + Vd; break;
    }
    return gdn_step_and_out(g, in, gdn_index, n);
  }
  const bool tiled = g.qkv.tiled || g.gate.tiled || g.ssm_in.tiled || g.ba.tiled || g.beta.tiled || g.alpha.tiled;
  if (tiled && !take_x_prepared()) KESTREL_TRY(prepare(x_, model_.hparams().n_embd, n));
  GdnDecodeInputs in;
  switch (g.projection) {
    case ref::GdnProjection::kQkvGateBetaAlpha:
      KESTREL_TRY(matmul(g.qkv, x_, tiled, n, proj_a_));
      KESTREL_TRY(matmul(g.gate, x_, tiled, n, proj_b_));
      KESTREL_TRY(matmul(g.beta, x_, tiled, n, proj_c_));
      KESTREL_TRY(matmul(g.alpha, x_, tiled, n, proj_d_));
      in.qkv = proj_a_, in.z = proj_b_, in.b = proj_c_, in.a = proj_d_;
      break;
    case ref::GdnProjection::kQkvGateBa:
      KESTREL_TRY(matmul(g.qkv, x_, tiled, n, proj_a_));
      KESTREL_TRY(matmul(g.gate, x_, tiled, n, proj_b_));
      KESTREL_TRY(matmul(g.ba, x_, tiled, n, proj_c_));
      in.qkv = proj_a_, in.z = proj_b_, in.ba = proj_c_;
      break;
    case ref::GdnProjection::kSsmInBa:
      KESTREL_TRY(matmul(g.ssm_in, x_, tiled, n, proj_a_));
      KESTREL_TRY(matmul(g.ba, x_, tiled, n, proj_c_));
      in.qkv = proj_a_, in.ba = proj_c_;
      break;
  }
  return gdn_step_and_out(g, in, gdn_index, n);
}

Status ForwardPass::gdn_step_and_out(const DeviceGdnLayer& g, const GdnDecodeInputs& in, int gdn_index, int n) {
  KESTREL_TRY(mark(PassSection::kGdnIn));
  if (prompt_slot_ >= 0 && n > P && gdn_chunk_ws_ != nullptr) {
    // A prompt pass: one session's tokens as chunks of the delta rule.
    const GdnSlot& slot = slot_states_[size_t(prompt_slot_) * n_gdn_ + size_t(gdn_index)];
    KESTREL_TRY(gdn_chunked(model_.gdn_dims(), g.projection, g.small, in, slot, n, mixed_, gdn_chunk_ws_, stream_));
    return matmul(g.out, mixed_, false, n, y_);
  }
  GdnSlot* slots = gdn_slots_ + size_t(gdn_index) * R;
  if (runs_) {
    KESTREL_TRY(gdn_runs(model_.gdn_dims(), g.projection, g.small, in, slots,
                         GdnRunTable{run_start_, run_len_, run_order_}, run_entries_, mixed_, gdn_ws_, stream_,
                         tuning_.gdn_decode));
    return matmul(g.out, mixed_, false, n, y_);
  }
  // A tiled ssm_out reads the step's output prepared by the step itself.
  const bool prepared = g.out.tiled;
  KESTREL_TRY(gdn_decode(model_.gdn_dims(), g.projection, g.small, in, slots, n, mixed_, gdn_ws_, stream_,
                         tuning_.programmatic, tuning_.gdn_decode, prepared ? xprep_ : nullptr));
  return matmul(g.out, mixed_, prepared, n, y_);
}

Status ForwardPass::attn_layer(size_t l, int n) {
  const DeviceAttnLayer& a = model_.layers()[l].attn;
  AttnDecodeArgs args;
  if (a.in_stacked.present()) {
    // One GEMV over the stacked projections; each output row holds q|gate, k and v side by side.
    KESTREL_TRY(matmul(a.in_stacked, x_, take_x_prepared(), n, proj_a_));
    args.qg = proj_a_;
    args.k = proj_a_ + a.q_rows;
    args.v = proj_a_ + a.q_rows + a.k_rows;
    args.qg_stride = args.kv_stride = a.in_stacked.n_out;
  } else {
    const bool tiled = a.q.tiled || a.k.tiled || a.v.tiled;
    if (tiled && !take_x_prepared()) KESTREL_TRY(prepare(x_, model_.hparams().n_embd, n));
    KESTREL_TRY(matmul(a.q, x_, tiled, n, proj_a_));
    KESTREL_TRY(matmul(a.k, x_, tiled, n, proj_b_));
    KESTREL_TRY(matmul(a.v, x_, tiled, n, proj_c_));
    args.qg = proj_a_;
    args.k = proj_b_;
    args.v = proj_c_;
  }
  KESTREL_TRY_ASSIGN(KvPageTable table, slots_.kv_table(static_cast<uint32_t>(l)));
  args.q_norm = a.q_norm;
  args.k_norm = a.k_norm;
  args.rope_inv_freq = rope_inv_freq_;
  args.slot_ids = slot_ids_;
  args.positions = positions_;
  args.out = mixed_;
  args.workspace = static_cast<float*>(attn_ws_);
  args.workspace_bytes = attn_ws_bytes_;
  // Slot ids and positions come from the device copy (the engine checked them): the same launches replay in a graph.
  // The grid covers positions below the pass's bound (run() picks it from the rows).
  // A tiled attn_output reads the attention's output prepared by its merge kernel, where the head size allows.
  const AttnDecodeDims dims = attn_dims_of(model_.hparams());
  const bool prepared = a.o.tiled && attention_prepares_out(dims);
  if (prompt_slot_ >= 0 && n > 1 && attention_prompt_supports(dims)) {
    // A prompt pass: every row's K/V into the cache, then the rows attend in tiles that share each K/V row.
    args.slot_ids = slot_ids_;
    args.positions = positions_;
    args.out_prepared = prepared ? xprep_ : nullptr;
    KESTREL_TRY(attention_kv_append_device(dims, table, args, n, stream_));
    KESTREL_TRY(attention_prompt(dims, table, args, n, prompt_slot_, prompt_pos0_, stream_));
    return matmul(a.o, mixed_, prepared, n, y_);
  }
  // Up to P rows a call. A prompt pass's rows are one slot's tokens in position order, so the calls before a row's
  // have appended the K/V of every position before it.
  const int64_t qg_stride = args.qg_stride > 0 ? args.qg_stride : int64_t{dims.n_head} * 2 * dims.head_dim;
  const int64_t kv_stride = args.kv_stride > 0 ? args.kv_stride : int64_t{dims.n_head_kv} * dims.head_dim;
  const int64_t out_w = int64_t{dims.n_head} * dims.head_dim;
  const uint64_t prep_vec = imma_x_bytes(out_w, 1);
  for (int c0 = 0; c0 < n; c0 += P) {
    AttnDecodeArgs c = args;
    c.qg = args.qg + c0 * qg_stride;
    c.k = args.k + c0 * kv_stride;
    c.v = args.v + c0 * kv_stride;
    c.slot_ids = slot_ids_ + c0;
    c.positions = positions_ + c0;
    c.out = mixed_ + c0 * out_w;
    c.out_prepared = prepared ? static_cast<uint8_t*>(xprep_) + uint64_t(c0) * prep_vec : nullptr;
    KESTREL_TRY(attention_decode_device(dims, table, c, std::min(P, n - c0), position_bound_ - 1, stream_));
  }
  return matmul(a.o, mixed_, prepared, n, y_);
}

Status ForwardPass::hybrid_ffn_layer(size_t l, int n) {
  const DeviceFfnLayer& f = model_.layers()[l].ffn;
  const ModelHparams& hp = model_.hparams();
  const int H = static_cast<int>(hp.n_embd);
  MoeHybrid h;
  h.resident = f.resident;
  h.n_resident = f.n_resident;
  h.host_choices = host_choices_dev_;
  h.host_y = host_y_dev_;
  if (f.moe_tiled && n > P) {  // a prompt pass: the host gets every row in one hand-off
    MoePhaseHooks hooks;
    hooks.after_route = [&]() -> Status {
      return expert_handoff_publish(link_->handoff(), static_cast<int32_t>(l), x_, host_choices_dev_, n, H,
                                    static_cast<int>(hp.n_expert_used), stream_);
    };
    hooks.before_combine = [&]() -> Status {
      return expert_handoff_join(link_->handoff(), n, H, host_y_dev_, HostExpertLink::kJoinTimeoutNs, stream_);
    };
    return moe_imma_forward_prompt_hybrid(f.moe_imma, h, x_, n, y_, moe_prompt_ws_, stream_, hooks,
                                          tuning_.moe_imma.prompt_segment_vectors, tuning_.moe_imma.grouped_gemv);
  }
  // Otherwise P rows a call; the tiled layers' decode calls read their share of the host experts over the bus.
  if (f.moe_tiled && tuning_.expert_side_read > 0.0f) {
    h.bus = f.bus;
    h.bus_share = tuning_.expert_side_read;
  }
  for (int c0 = 0; c0 < n; c0 += P) {
    const int cn = std::min(P, n - c0);
    const float* x = x_ + int64_t{c0} * H;
    MoePhaseHooks hooks;
    hooks.after_route = [&]() -> Status {
      return expert_handoff_publish(link_->handoff(), static_cast<int32_t>(l), x, host_choices_dev_, cn, H,
                                    static_cast<int>(hp.n_expert_used), stream_);
    };
    hooks.before_combine = [&]() -> Status {
      return expert_handoff_join(link_->handoff(), cn, H, host_y_dev_, HostExpertLink::kJoinTimeoutNs, stream_);
    };
    float* y = y_ + int64_t{c0} * H;
    if (f.moe_tiled) {
      KESTREL_TRY(moe_imma_forward_hybrid(f.moe_imma, h, x, cn, y, moe_ws_, stream_, hooks, tuning_.moe_imma));
    } else {
      KESTREL_TRY(moe_forward_hybrid(f.moe_raw, h, x, cn, y, moe_ws_, stream_, hooks));
    }
  }
  return ok_status();
}

Status ForwardPass::ffn_layer(size_t l, int n, const float* next_w, bool prepare_next) {
  KESTREL_TRY(ffn_sublayer(l, n));
  return norm(y_, next_w, n, prepare_next);
}

Status ForwardPass::ffn_sublayer(size_t l, int n) {
  const DeviceFfnLayer& f = model_.layers()[l].ffn;
  // A hybrid layer of a long prompt pass runs on its staged experts as an all-resident layer (expert_upload.h).
  const bool staged = upload_pass_ && f.hybrid() && f.moe_tiled && n > P;
  if (f.hybrid() && !staged) return hybrid_ffn_layer(l, n);
  if (f.moe) {
    // While profiling, the router, the routing and the experts are sections of their own.
    MoePhaseHooks marks;
    if (profiling_) {
      marks.after_logits = [this] { return mark(PassSection::kMoeRouter); };
      marks.after_route = [this] { return mark(PassSection::kMoeRoute); };
      marks.before_combine = [this] { return mark(PassSection::kMoeExperts); };
    }
    const MoePhaseHooks* hooks = profiling_ ? &marks : nullptr;
    if (f.moe_tiled && n > P) {  // a prompt pass: each expert read once for all the tokens that chose it
      MoeImmaWeights w = f.moe_imma;
      if (staged) {
        KESTREL_TRY_ASSIGN(w, upload_->stage(l, stream_));
        KESTREL_TRY(mark(PassSection::kExpertUpload));
      }
      return moe_imma_forward_prompt(w, x_, n, y_, moe_prompt_ws_, stream_, tuning_.moe_imma.prompt_segment_vectors,
                                     tuning_.moe_imma.grouped_gemv, hooks);
    }
    const int64_t H = model_.hparams().n_embd;
    for (int c0 = 0; c0 < n; c0 += P) {  // up to P tokens a call
      const int cn = std::min(P, n - c0);
      if (f.moe_tiled) {
        KESTREL_TRY(moe_imma_forward(f.moe_imma, x_ + c0 * H, cn, y_ + c0 * H, moe_ws_, stream_, tuning_.moe_imma,
                                     nullptr, hooks));
      } else {
        KESTREL_TRY(moe_forward(f.moe_raw, x_ + c0 * H, cn, y_ + c0 * H, moe_ws_, stream_));
      }
    }
    return ok_status();
  }
  const bool tiled = f.gate.tiled || f.up.tiled;
  if (tiled && !take_x_prepared()) KESTREL_TRY(prepare(x_, model_.hparams().n_embd, n));
  KESTREL_TRY(matmul(f.gate, x_, tiled, n, proj_a_));
  KESTREL_TRY(matmul(f.up, x_, tiled, n, proj_b_));
  if (f.down.tiled) {
    KESTREL_TRY(gemv_imma_prepare_swiglu(proj_a_, proj_b_, f.gate.n_out, n, xprep_, stream_, tuning_.programmatic));
    return gemv_prepared(f.down, n, y_, 0);
  }
  KESTREL_TRY(swiglu(proj_a_, proj_b_, f.gate.n_out * n, mixed_, stream_));
  return matmul(f.down, mixed_, false, n, y_);
}

void ForwardPass::set_position_bound(int max_pos) {
  position_bound_ = 256;
  while (position_bound_ <= max_pos) position_bound_ *= 2;
  position_bound_ = std::min(position_bound_, slots_.n_ctx());
}

Status ForwardPass::run(std::span<const PassRow> rows, float* hidden) {
  const int n = static_cast<int>(rows.size());
  if (n < 1 || n > P) {
    return make_error(ErrorCode::kInvalidArgument,
                      "forward pass: " + std::to_string(n) + " rows (1.." + std::to_string(P) + " per pass)");
  }
  // One upload: ids, slot ids, positions, the KV page of each row's position (published to the slot's page table at
  // the pass's start), the GDN run table, then each GDN layer's slot table.
  int32_t* up = static_cast<int32_t*>(host_upload_);
  for (int i = 0; i < n; ++i) {
    up[i] = rows[size_t(i)].token;
    up[R + i] = rows[size_t(i)].slot;
    up[2 * R + i] = rows[size_t(i)].position;
    KESTREL_TRY_ASSIGN(up[3 * R + i], slots_.page_at(rows[size_t(i)].slot, rows[size_t(i)].position));
  }
  KESTREL_TRY(build_runs(rows, up + 4 * R, up + 5 * R, up + 6 * R, &runs_));
  if (runs_ && !supports_runs_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "forward pass: a slot has several rows, and this model's GDN heads run a token per pass");
  }
  run_entries_ = n;
  prompt_slot_ = -1;
  GdnSlot* table = reinterpret_cast<GdnSlot*>(up + 7 * R);
  for (int g = 0; g < n_gdn_; ++g) {
    for (int i = 0; i < n; ++i) table[size_t(g) * R + i] = slot_states_[size_t(rows[size_t(i)].slot) * n_gdn_ + g];
  }
  int m = 0;
  bool want_logits = false;
  for (int i = 0; i < n; ++i) {
    const PassRow& r = rows[size_t(i)];
    if (r.logits != nullptr || r.argmax != nullptr) m = i + 1;
    want_logits = want_logits || r.logits != nullptr;
  }
  const int mode = m == 0 ? 0 : want_logits ? 2 : 1;
  int max_pos = 0;
  for (const PassRow& r : rows) max_pos = std::max(max_pos, r.position);
  set_position_bound(max_pos);
  // Replayed from a graph unless the per-layer hidden states are asked for; lm_head over every row when any wants
  // logits (one graph per logits mode).
  KESTREL_TRY(execute(n, 0, mode > 0 ? n : 0, mode, hidden, 0, n, hidden == nullptr));
  const size_t vocab = model_.hparams().n_vocab;
  for (int i = 0; i < m; ++i) {
    const PassRow& r = rows[size_t(i)];
    if (r.logits != nullptr) std::memcpy(r.logits, host_logits_ + size_t(i) * vocab, vocab * sizeof(float));
    if (r.argmax != nullptr) *r.argmax = host_argmax_[i];
  }
  return ok_status();
}

Status ForwardPass::run_prompt(int32_t slot, std::span<const int32_t> tokens, int32_t position, float* logits,
                               int32_t* argmax, float* hidden) {
  const int n = static_cast<int>(tokens.size());
  if (n < 1 || n > R) {
    return make_error(ErrorCode::kInvalidArgument,
                      "prompt pass: " + std::to_string(n) + " tokens (1.." + std::to_string(R) + " per pass)");
  }
  if (n > 1 && !supports_runs_) {
    return make_error(ErrorCode::kInvalidArgument, "prompt pass: this model's GDN heads run a token per pass");
  }
  int32_t* up = static_cast<int32_t*>(host_upload_);
  for (int i = 0; i < n; ++i) {
    up[i] = tokens[size_t(i)];
    up[R + i] = slot;
    up[2 * R + i] = position + i;
    KESTREL_TRY_ASSIGN(up[3 * R + i], slots_.page_at(slot, position + i));
    up[6 * R + i] = i;  // the run's rows in position order
  }
  // One GDN run of every row.
  up[4 * R] = 0;
  up[5 * R] = n;
  runs_ = n > 1;
  run_entries_ = 1;
  prompt_slot_ = slot;
  prompt_pos0_ = position;
  GdnSlot* table = reinterpret_cast<GdnSlot*>(up + 7 * R);
  for (int g = 0; g < n_gdn_; ++g) table[size_t(g) * R] = slot_states_[size_t(slot) * n_gdn_ + g];
  set_position_bound(position + n - 1);
  const int m = logits != nullptr || argmax != nullptr ? 1 : 0;
  const int mode = m == 0 ? 0 : logits != nullptr ? 2 : 1;
  upload_pass_ = upload_ != nullptr && n > P && n >= tuning_.expert_upload_min_tokens;
  if (upload_pass_) KESTREL_TRY(upload_->begin(stream_));
  // Launched one by one (no graph: prompt passes come in many lengths), lm_head for the last row only.
  const Status pass = execute(n, n - 1, m, mode, hidden, n - 1, 1, false);
  const Status upload_end = upload_pass_ ? upload_->end() : ok_status();
  upload_pass_ = false;
  KESTREL_TRY(pass);
  KESTREL_TRY(upload_end);
  if (logits != nullptr) std::memcpy(logits, host_logits_, model_.hparams().n_vocab * sizeof(float));
  if (argmax != nullptr) *argmax = host_argmax_[0];
  return ok_status();
}

Status ForwardPass::execute(int n, int lm_row0, int m, int logits_mode, float* hidden, int hidden_row0, int hidden_rows,
                            bool graphed) {
  // The hand-off's host thread spins on its mailbox while the pass is in flight (end_pass on every return below).
  struct LinkPass {
    HostExpertLink* link;
    explicit LinkPass(HostExpertLink* l) : link(l) {
      if (link != nullptr) link->begin_pass();
    }
    Status end() { return link != nullptr ? std::exchange(link, nullptr)->end_pass() : ok_status(); }
    ~LinkPass() { (void)end(); }
  } link_pass(link_.get());
  if (!graphed) {
    // Launched one by one (the per-layer copies of the residual stream, when asked for, sit between the kernels).
    n_marks_ = 0;
    const Status enq = enqueue(n, lm_row0, m, logits_mode, hidden, hidden_row0, hidden_rows);
    KESTREL_CUDA_TRY(cudaStreamSynchronize(stream_));
    KESTREL_TRY(enq);
  } else {
    // Replayed: one CUDA graph per (rows, logits mode, position bound, runs) captured on first use. The kernels read
    // everything that changes from the uploaded block, so a replay is the same launches. Profiling replays its own
    // graphs, the same launches with event-record nodes between the sections.
    cudaGraphExec_t& exec = graphs_[{profiling_, n, logits_mode, position_bound_, runs_}];
    if (exec == nullptr) KESTREL_TRY(capture(n, m, logits_mode, &exec));
    KESTREL_CUDA_TRY(cudaGraphLaunch(exec, stream_));
    KESTREL_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  if (profiling_ && hidden == nullptr && n_marks_ > 1) {
    for (size_t k = 1; k < n_marks_; ++k) {
      float ms = 0.0f;
      KESTREL_CUDA_TRY(cudaEventElapsedTime(&ms, events_[k - 1], events_[k]));
      profile_.ms[static_cast<int>(sections_[k])] += ms;
    }
    ++profile_.passes;
  }
  // An expert backend's error, or a join that gave up on the host (the pass ran to its end without that layer's host
  // part).
  KESTREL_TRY(link_pass.end());
  if (profiling_ && link_ != nullptr) {
    KESTREL_TRY_ASSIGN(const HostExpertLink::Times t, link_->take_times());
    profile_.host_batches += static_cast<int64_t>(t.batches);
    profile_.host_ms += static_cast<double>(t.host_ns) * 1e-6;
    profile_.host_wait_ms += static_cast<double>(t.device_wait_ns) * 1e-6;
  }
  return ok_status();
}

std::string ForwardPass::side_read_summary() const {
  if (!(tuning_.expert_side_read > 0.0f)) return "off";
  int layers = 0;
  for (const DeviceLayer& d : model_.layers()) {
    if (d.ffn.hybrid() && d.ffn.moe_tiled && d.ffn.bus.gate.data != nullptr) ++layers;
  }
  if (layers == 0) return "off (no hybrid moe_imma layer has page-locked experts)";
  char line[128];
  std::snprintf(line, sizeof line, "%d layers read %.0f%% of each token's host choices over the bus", layers,
                100.0 * tuning_.expert_side_read);
  return line;
}

std::string ForwardPass::expert_upload_summary() const {
  if (upload_ != nullptr) {
    char gb[160];
    if (upload_->direct()) {
      std::snprintf(gb, sizeof gb, "%.2f GB a pass from page-locked host experts through %.2f GB of device staging",
                    static_cast<double>(upload_->host_bytes_per_pass()) * 1e-9,
                    static_cast<double>(upload_->device_bytes()) * 1e-9);
    } else {
      std::snprintf(gb, sizeof gb, "%.2f GB a pass through %.2f GB of pinned and %.2f GB of device staging",
                    static_cast<double>(upload_->host_bytes_per_pass()) * 1e-9,
                    static_cast<double>(upload_->pinned_bytes()) * 1e-9,
                    static_cast<double>(upload_->device_bytes()) * 1e-9);
    }
    return "from " + std::to_string(tuning_.expert_upload_min_tokens) +
           " tokens: " + std::to_string(upload_->layers()) + " layers, " + gb;
  }
  if (!upload_note_.empty()) return "unavailable: " + upload_note_;
  return "off";
}

int ForwardPass::kernels_per_pass(int rows) const {
  const auto it = kernels_by_rows_.find(rows);
  return it == kernels_by_rows_.end() ? 0 : it->second;
}

Status ForwardPass::capture(int n, int m, int logits_mode, cudaGraphExec_t* exec) {
  n_marks_ = 0;  // every graph records the same sections in the same order
  KESTREL_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const Status enq = enqueue(n, 0, m, logits_mode, nullptr, 0, 0);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  KESTREL_TRY(enq);
  KESTREL_CUDA_TRY(end);
  if (!profiling_) kernels_by_rows_[n] = count_kernel_nodes(graph);
  const cudaError_t inst = cudaGraphInstantiate(exec, graph, 0);
  cudaGraphDestroy(graph);
  KESTREL_CUDA_TRY(inst);
  return ok_status();
}

Status ForwardPass::enqueue(int n, int lm_row0, int m, int logits_mode, float* hidden, int hidden_row0,
                            int hidden_rows) {
  const ModelHparams& hp = model_.hparams();
  const int64_t H = hp.n_embd;
  KESTREL_TRY(mark(PassSection::kRest));
  KESTREL_CUDA_TRY(cudaMemcpyAsync(ids_, host_upload_, upload_bytes_, cudaMemcpyHostToDevice, stream_));
  if (slots_.has_kv()) {
    KESTREL_TRY_ASSIGN(KvPageTable pages, slots_.page_table());
    KESTREL_TRY(kv_page_publish(pages, slot_ids_, positions_, row_pages_, n, stream_));
  }
  KESTREL_TRY(get_rows_device_ids(model_.token_embd(), ids_, n, h_, nullptr, stream_));
  const std::vector<DeviceLayer>& layers = model_.layers();
  KESTREL_TRY(norm(nullptr, layers[0].attn_norm, n, mixer_input_tiled(0)));
  for (size_t l = 0; l < layers.size(); ++l) {
    KESTREL_TRY(mark(PassSection::kRest));
    if (layers[l].kind == LayerKind::kGatedDeltaNet) {
      KESTREL_TRY(gdn_layer(l, gdn_index_[l], n));
      KESTREL_TRY(mark(PassSection::kGdn));
    } else {
      KESTREL_TRY(attn_layer(l, n));
      KESTREL_TRY(mark(PassSection::kAttention));
    }
    KESTREL_TRY(norm(y_, layers[l].post_attn_norm, n, ffn_input_tiled(l)));
    KESTREL_TRY(mark(PassSection::kRest));
    const bool last = l + 1 == layers.size();
    KESTREL_TRY(ffn_layer(l, n, last ? model_.output_norm() : layers[l + 1].attn_norm,
                          last ? m > 0 && logits_mode > 0 && model_.output().tiled : mixer_input_tiled(l + 1)));
    KESTREL_TRY(mark(layers[l].ffn.moe ? PassSection::kMoe : PassSection::kDenseFfn));
    if (hidden != nullptr) {
      KESTREL_CUDA_TRY(cudaMemcpyAsync(hidden + l * size_t(hidden_rows) * H, h_ + size_t(hidden_row0) * H,
                                       size_t(hidden_rows) * H * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
  }
  KESTREL_TRY(mark(PassSection::kRest));
  if (m > 0 && logits_mode > 0) {
    KESTREL_TRY(matmul(model_.output(), x_, take_x_prepared(), m, logits_, lm_row0));
    KESTREL_TRY(argmax_rows(logits_, m, hp.n_vocab, argmax_, stream_));
    KESTREL_CUDA_TRY(
        cudaMemcpyAsync(host_argmax_, argmax_, size_t(m) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    if (logits_mode == 2) {
      KESTREL_CUDA_TRY(cudaMemcpyAsync(host_logits_, logits_, size_t(m) * hp.n_vocab * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
    }
  }
  return mark(PassSection::kLmHead);
}

}  // namespace kestrel::gpu
