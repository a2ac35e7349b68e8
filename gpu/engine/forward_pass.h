// ForwardPass: one decode pass of the whole model on the GPU for up to kPassMaxTokens sessions, one token each, every
// session at its own position in its own state slot (model-spec.md §2; ref::forward is the oracle):
//
//   h = token_embd[ids]                                          get_rows
// Every norm writes x and, where the next GEMV reads prepared activations (gemv_imma), x's prepared form too.
//   per layer l:  x = rms_norm(h) · attn_norm                    (fused with the previous residual add)
//                 GDN:  qkv, z, b, a = W x  → gdn_decode (conv, delta rule, gated norm, state in the slot) → ssm_out
//                 attn: q|gate, k, v = W x  → attention_decode (q/k norm, RoPE, KV append, softmax) → attn_output
//                 h += y;  x = rms_norm(h) · post_attention_norm  rms_norm_prepare
//                 MoE (moe_imma or moe_forward; a hybrid layer below) or dense SwiGLU (gemv, swiglu, gemv)
//                 h += y;  x = rms_norm(h) · next norm          rms_norm_prepare
//   logits = output · x (output_norm applied)                    only for the rows that ask for them
//
// A prompt's tokens share a pass as rows of one slot (PassRow): attention appends all their K/V before it attends,
// and the GDN layers run them as one run per slot on gdn_runs instead of gdn_decode (the same bits per token).
// A prompt pass (run_prompt) holds up to kPromptPassMaxTokens tokens of one slot: every layer runs over all of them
// before the next layer starts — the projections kPassMaxTokens rows a GEMV call, attention as one attention_prompt
// call (every row's K/V appended first, then tiles of rows against shared K/V tiles), the GDN layers as one run, the
// MoE layers as one moe_imma_prompt call (each expert read once for every token that chose it; a hybrid layer hands
// all the rows to the host at once, so the host too reads each of its experts once), lm_head for the last token only
// — so a layer's weights come from memory once per prompt pass rather than once per 32 tokens. Each token gets the
// bits run() gives it but for attention's, whose prompt kernel splits the positions differently (f32 rounding).
//
// Every kernel is enqueued on one stream; a pass is one CUDA graph per row count, logits mode, position bound (the
// smallest power of two from 256 above every position, capped at the slots' n_ctx, so attention's grid is never more
// than twice what the longest sequence needs) and GDN kernel (runs or not), captured on first use: the token ids,
// slots, positions, the KV page of each row's position (written into the slot's page table by kv_page_publish, so a
// replay follows the slots' pages as data), the run table and state pointers it reads come in one upload, ending
// with one copy of the logits rows to pinned host memory and one stream synchronisation. Profiling and the per-layer
// captures launch the same kernels one by one instead. Projections run on GEMV v4 (gemv_imma, activations prepared
// once per input and shared by every matrix that reads it) where the matrix is tiled, else on gpu::gemv. Each kernel
// is batch-invariant (a row's bits do not depend on the other rows), so a session's logits do not depend on the batch.
//
// The kernel choices that do not follow from the shapes (GpuTuning, gpu/kernels/tuning.h) are fixed at create() and
// passed to every launch.
//
// A hybrid MoE layer (DeviceFfnLayer::hybrid(): some routed experts on the host) runs moe_imma_forward_hybrid /
// moe_forward_hybrid (gpu/kernels/moe_hybrid.h) with the hand-off in the same stream, as kernels, so it is captured in
// the pass's graph like every other node:
//   routing (device) → expert_handoff_publish: x and the host choices into mapped host memory, then the mailbox's
//   sequence number → the resident experts and the shared expert (device), while the link's host thread, spinning on
//   the mailbox, computes the host experts with ExpertBackend::run → expert_handoff_join: waits for the host's number,
//   copies the host partial sums into device memory → combine (device experts by ascending id, + the host partial, +
//   the gated shared expert).
// The layers share one set of mapped buffers (each layer's hand-off completes before the next layer's starts, in
// stream order). A backend error is kept by the link (HostExpertLink) and run() returns it after the stream has
// drained. Layers with every expert resident run the all-resident kernels (their launches and bits are those of a
// model without host experts); layers with none launch no routed-expert kernel.
//
// Ownership: borrows the DeviceModel, the StateSlots and the ExpertBackend for its lifetime; owns its scratch (device
// and pinned host memory, sized once for kPromptPassMaxTokens rows). One pass at a time; not thread-safe (the link's
// thread serves the hybrid layers while run() waits for the stream).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/expert_backend.h"
#include "gpu/engine/device_model.h"
#include "gpu/engine/expert_upload.h"
#include "gpu/engine/host_expert_link.h"
#include "gpu/kernels/tuning.h"
#include "gpu/memory/state_slots.h"

namespace kestrel::gpu {

// Rows of one pass (run()): the MoE and GEMV kernels take up to 32 vectors a call.
inline constexpr int kPassMaxTokens = 32;
// Tokens of one prompt pass (run_prompt()): the row buffers hold this many rows, and each layer's kernels run over
// them kPassMaxTokens rows a call, so a layer's weights are read from memory once for all of them.
inline constexpr int kPromptPassMaxTokens = 512;

// A pass's rows are tokens. Rows of one slot are that session's consecutive tokens (positions p, p + 1, … in any row
// order) where supports_runs(): attention appends every row's K/V before any row attends, and the GDN layers run
// each slot's rows as one run (gpu/kernels/gdn_runs.h) with the decode kernel's arithmetic, so a token's bits are
// the same whether it comes alone or in a run, and whatever else the pass holds.
struct PassRow {
  int32_t slot = 0;           // state slot
  int32_t token = 0;          // token id, in [0, n_vocab) (checked by the caller)
  int32_t position = 0;       // the token's position (the slot's n_past), < the slot pool's n_ctx; the slot holds
                              // the KV page of this position (StateSlots::reserve)
  float* logits = nullptr;    // host f32 [n_vocab] to receive the logits after this token, or null for none
  int32_t* argmax = nullptr;  // host int32 to receive the greedy token after this token (gpu/kernels/argmax.h), or null
};

// Where a pass's time goes, summed over the passes run while profiling is on (CUDA events between the sections).
// kGdnIn: a GDN layer's input projections; kGdn: the rest of the layer (the conv, the delta rule, the gated norm and
// ssm_out). A device MoE layer (moe_imma) in four: kMoeRouter (the router's logits and x's prepared form), kMoeRoute
// (the routing and the expert tables), kMoeExperts (the grouped gate+up product, SwiGLU, the grouped down product),
// kMoe (the combine and the norm after it; a hybrid layer or a raw-layout MoE layer all in kMoe).
enum class PassSection {
  kRest,
  kGdnIn,
  kGdn,
  kAttention,
  kMoeRouter,
  kMoeRoute,
  kMoeExperts,
  kMoe,
  kExpertUpload,
  kDenseFfn,
  kLmHead,
  kCount
};
const char* pass_section_name(PassSection s);

struct PassProfile {
  double ms[static_cast<int>(PassSection::kCount)] = {};
  int passes = 0;
  // Hybrid layers: the host batches, the host's time computing them, and the time the device waited for them.
  int64_t host_batches = 0;
  double host_ms = 0;
  double host_wait_ms = 0;
};

class ForwardPass {
 public:
  // backend: computes the host experts of the model's hybrid layers (required when it has any; its experts() must be
  // exactly the experts the DeviceModel left on the host — kInvalidArgument otherwise).
  static Expected<std::unique_ptr<ForwardPass>> create(const DeviceModel& model, const StateSlots& slots,
                                                       const GpuTuning& tuning, cudaStream_t stream,
                                                       ExpertBackend* backend = nullptr);
  ~ForwardPass();
  ForwardPass(const ForwardPass&) = delete;
  ForwardPass& operator=(const ForwardPass&) = delete;

  // Device bytes the scratch of a pass takes for this model with slots of n_ctx tokens (for the memory check made
  // before anything is allocated).
  static uint64_t scratch_bytes(const ModelHparams& hp, int n_ctx);

  // True when rows of one slot may share a pass (the GDN heads are on gdn_runs' kernel: every preset).
  bool supports_runs() const { return supports_runs_; }

  // Runs one pass over rows (1..kPassMaxTokens rows; rows of one slot only where supports_runs(), at consecutive
  // positions) and waits for it. lm_head runs for rows
  // [0, m) where m - 1 is the last row that wants logits or the argmax (so callers put those rows first); the logits
  // rows are copied back only when some row wants them, else only the argmax ids. When hidden is given
  // (host f32 [n_layer, rows, H]) it receives the residual stream after every layer (for the per-layer tests).
  Status run(std::span<const PassRow> rows, float* hidden = nullptr);

  // Runs 1..kPromptPassMaxTokens consecutive tokens of one slot (positions position, position + 1, …; the slot holds
  // their KV pages) as one prompt pass (above); the results are run()'s up to attention_prompt's rounding, and
  // bit-identical from run to run. logits (host f32 [n_vocab]) / argmax: of the last token, when not null;
  // hidden (host f32 [n_layer, H]): the last token's residual stream after every layer. Launched kernel by kernel
  // (prompt passes come in many lengths; the launches are few per token). Several tokens need supports_runs().
  Status run_prompt(int32_t slot, std::span<const int32_t> tokens, int32_t position, float* logits, int32_t* argmax,
                    float* hidden = nullptr);

  // Profiling: while on, passes replay graphs that record an event after each section, and the sections' times
  // add up in profile().
  Status set_profiling(bool on);
  const PassProfile& profile() const { return profile_; }
  // How prompt passes treat the hybrid layers' host experts: "off", "from 128 tokens: 40 layers, 18.1 GB a pass over
  // 1.36 GB of staging", or why they cannot be uploaded.
  std::string expert_upload_summary() const;
  // The hybrid layers' side read in decode steps (GpuTuning::expert_side_read): "off", or its layers and share.
  std::string side_read_summary() const;
  void clear_profile() { profile_ = PassProfile{}; }
  // Kernel launches in the last graph captured for passes of `rows` rows (without profiling), 0 before one is; -1
  // when the runtime could not list the graph's nodes.
  int kernels_per_pass(int rows) const;

 private:
  ForwardPass(const DeviceModel& model, const StateSlots& slots, const GpuTuning& tuning, cudaStream_t stream,
              ExpertBackend* backend)
      : model_(model), slots_(slots), tuning_(tuning), stream_(stream), backend_(backend) {}
  Status allocate();
  Status mark(PassSection section);
  // y = m · x for n rows: x's rows from row0 (f32, or xprep_'s vectors from row0 when x_prepared), y's from 0;
  // kPassMaxTokens rows a GEMV call.
  Status matmul(const DeviceMatrix& m, const float* x, bool x_prepared, int n, float* y, int row0 = 0);
  // The same for a tiled m from xprep_'s vectors row0 … row0 + n − 1.
  Status gemv_prepared(const DeviceMatrix& m, int n, float* y, int row0);
  // position_bound_ for a pass whose largest position is max_pos.
  void set_position_bound(int max_pos);
  // The pass of n rows as the upload describes it: lm_head over rows [lm_row0, lm_row0 + m) (logits_mode as enqueue),
  // hidden (when not null) the residual rows [hidden_row0, + hidden_rows) after every layer; graphed: replayed from the
  // pass's CUDA graph (else launched one by one); then the profile and the hand-off's errors and times.
  Status execute(int n, int lm_row0, int m, int logits_mode, float* hidden, int hidden_row0, int hidden_rows,
                 bool graphed);
  Status prepare(const float* x, int64_t n_cols, int n);
  // The norm of h_ (after h_ += delta when delta is not null) with weight w into x_; when `prepare_for` (the next
  // sub-layer's first GEMV reads prepared activations) also x_'s prepared form into xprep_, in the same kernel, and
  // x_prepared_ says so until that GEMV takes it.
  Status norm(const float* delta, const float* w, int n, bool prepare_for);
  // Whether x_ is prepared already (rms_norm_prepare wrote xprep_); reading it clears it, as the next preparation
  // overwrites xprep_.
  bool take_x_prepared() { return std::exchange(x_prepared_, false); }
  // Whether layer l's attention or GDN input projections, its dense FFN's gate and up, or lm_head read prepared
  // activations of x_.
  bool mixer_input_tiled(size_t l) const;
  bool ffn_input_tiled(size_t l) const;
  Status gdn_layer(size_t l, int gdn_index, int n);
  Status attn_layer(size_t l, int n);
  // The GDN step of layer gdn_index from its projections' outputs, then ssm_out into y_.
  Status gdn_step_and_out(const DeviceGdnLayer& g, const GdnDecodeInputs& in, int gdn_index, int n);
  // Every launch and copy of a pass of n rows with lm_head over rows [lm_row0, lm_row0 + m), on stream_ (marks and
  // the per-layer hidden copies of rows [hidden_row0, + hidden_rows) only when profiling / hidden ask for them).
  // logits_mode: 0 no lm_head, 1 lm_head and argmax (ids copied back), 2 also the logits rows copied back.
  Status enqueue(int n, int lm_row0, int m, int logits_mode, float* hidden, int hidden_row0, int hidden_rows);
  Status capture(int n, int m, int logits_mode, cudaGraphExec_t* exec);
  // Layer l's FFN and the norm after it (weight next_w, prepared when prepare_next: rms_norm_prepare with the residual
  // add).
  Status ffn_layer(size_t l, int n, const float* next_w, bool prepare_next);
  // Layer l's FFN alone (its output in y_): hybrid, raw MoE or dense.
  Status ffn_sublayer(size_t l, int n);
  Status hybrid_ffn_layer(size_t l, int n);

  const DeviceModel& model_;
  const StateSlots& slots_;
  const GpuTuning tuning_;
  cudaStream_t stream_;
  ExpertBackend* backend_ = nullptr;

  // Device scratch, one allocation: R = kPromptPassMaxTokens rows, P = kPassMaxTokens rows.
  void* base_ = nullptr;
  int32_t* ids_ = nullptr;        // int32 [R]  token ids, then slot ids, positions, row pages (one upload)
  int32_t* slot_ids_ = nullptr;   // int32 [R]
  int32_t* positions_ = nullptr;  // int32 [R]
  int32_t* row_pages_ = nullptr;  // int32 [R]  the KV page holding each row's position
  int32_t* run_start_ = nullptr;  // int32 [R]  the GDN run table (gdn_runs.h): entry starts, lengths, row order
  int32_t* run_len_ = nullptr;    // int32 [R]
  int32_t* run_order_ = nullptr;  // int32 [R]
  GdnSlot* gdn_slots_ = nullptr;  // [n_gdn_layers][R]
  float* h_ = nullptr;            // f32 [R, H] residual stream
  float* x_ = nullptr;            // f32 [R, H] normed sub-layer input
  float* y_ = nullptr;            // f32 [R, H] sub-layer output
  void* xprep_ = nullptr;         // prepared activations of the current input (gemv_imma_prepare_x)
  float* proj_a_ = nullptr;       // f32 [R, max(C + Vd, n_head·2·hd, I)]  qkv / q|gate / ffn gate
  float* proj_b_ = nullptr;       // f32 [R, max(Vd, n_kv·hd, I)]          z / k / ffn up
  float* proj_c_ = nullptr;       // f32 [R, max(2·Vh, n_kv·hd)]            b or ba / v
  float* proj_d_ = nullptr;       // f32 [R, Vh]                            a
  float* mixed_ = nullptr;        // f32 [R, max(Vd, n_head·hd, I)]         gdn / attention output, SwiGLU act
  float* logits_ = nullptr;       // f32 [P, n_vocab]
  int32_t* argmax_ = nullptr;     // int32 [P]
  void* gdn_ws_ = nullptr;
  void* attn_ws_ = nullptr;
  size_t attn_ws_bytes_ = 0;
  void* moe_ws_ = nullptr;
  void* moe_prompt_ws_ = nullptr;   // moe_imma_forward_prompt's, for R tokens (tiled all-resident MoE layers)
  void* gdn_chunk_ws_ = nullptr;    // gdn_chunked's, for R tokens (null: prompt passes run gdn_runs)
  float* rope_inv_freq_ = nullptr;  // f32 [n_rot / 2]
  // Hybrid layers: the routing's host choices and the host partial sums, on the device.
  ExpertChoice* host_choices_dev_ = nullptr;  // [R, k]
  float* host_y_dev_ = nullptr;               // f32 [R, H]

  // Pinned host staging: the upload block (ids, slots, positions, row pages, gdn slot table) and the logits rows.
  void* host_upload_ = nullptr;
  size_t upload_bytes_ = 0;
  float* host_logits_ = nullptr;    // f32 [P, n_vocab]
  int32_t* host_argmax_ = nullptr;  // int32 [P]
  // The hybrid layers' hand-off to the expert backend (mapped buffers and the serving thread), when the model has any.
  std::unique_ptr<HostExpertLink> link_;
  // Long prompt passes' copies of the hybrid layers' host experts (null: none, or not available: upload_note_ says
  // why).
  std::unique_ptr<ExpertUpload> upload_;
  std::string upload_note_;
  bool upload_pass_ = false;  // the pass in flight stages its hybrid layers' experts (run_prompt)

  std::vector<int> gdn_index_;  // per layer: index among GDN layers, -1 for attention
  int n_gdn_ = 0;
  std::vector<GdnSlot> slot_states_;  // [n_slots][n_gdn]: each slot's GDN state pointers (device memory)

  // The captured passes, by (profiled, rows, logits mode, position bound, runs): profiled graphs carry the section
  // events.
  std::map<std::tuple<bool, int, int, int, bool>, cudaGraphExec_t> graphs_;
  std::map<int, int> kernels_by_rows_;  // kernel nodes of the last unprofiled graph captured, by rows
  int position_bound_ = 0;              // of the pass being enqueued: attention's grid covers positions below it
  bool runs_ = false;                   // of the pass being enqueued: some slot has several rows (GDN on gdn_runs)
  int run_entries_ = 0;                 // of the pass being enqueued: entries of the GDN run table
  int prompt_slot_ = -1;                // of a prompt pass being enqueued: its slot (-1: not a prompt pass)
  int prompt_pos0_ = 0;                 // and its first position
  bool x_prepared_ = false;             // while enqueuing: xprep_ holds x_'s prepared rows (norm())
  bool supports_runs_ = false;

  bool profiling_ = false;
  std::vector<cudaEvent_t> events_;    // [0] at the pass's start, then one per section end
  std::vector<PassSection> sections_;  // the section each event closes
  size_t n_marks_ = 0;
  PassProfile profile_;
};

}  // namespace kestrel::gpu
