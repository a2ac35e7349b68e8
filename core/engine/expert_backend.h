// The typed hand-off of a MoE layer's routed experts between devices (design.md §6 "The CPU/GPU hand-off is typed").
//
// An ExpertBatch names one MoE layer, its token rows and, per token, the k routing choices (expert id, weight) of
// the router; an ExpertBackend computes the experts it holds over them. The hybrid engine runs the router on the GPU,
// copies the layer's input rows and the choices of host-resident experts into pinned host memory, and has the CPU
// backend (cpu/expert_backend.h) compute those while the GPU computes its own experts and the shared expert; the
// results join in stream order — the CUDA engine's host thread runs each batch the device publishes in mapped memory
// and raises a flag the device polls (gpu/engine/host_expert_link.h) — so a decode step stays one CUDA graph.
// Kestrel's answer to kt-kernel's cudaLaunchHostFunc hand-off, with types instead of integers cast to pointers.
//
// What a backend writes, per token t (x_t its input row, y_t its output row, choices c_t[0..k)):
//   y_t = 0.0f, then for each choice j of this backend in ascending expert id:  y_t += expert_e(x_t) · c_t[j].weight
//   expert_e(x) = down_e( silu(gate_e x) ⊙ up_e x )        (model-spec.md §5.1; no bias, no scaling)
// which is the routed part of ref::moe_forward in the reference's own order. So a token's row depends on its input
// row and its choices alone: not on the order of its choices, on the other tokens of the batch, on the backend's
// thread count, or on the thread that calls run(). A choice marked kExpertNotHere (an expert another device
// computes) is skipped; a token without a choice of this backend gets a zero row. Two backends over complementary
// sets of experts sum to one backend over their union up to the rounding of adding the two partial sums (f32
// addition is not associative); bit-identical placement independence would need one join in one order, and is not
// promised here.
//
// No CUDA or intrinsic types: core/ has no devices. The buffers are the caller's (pinned host memory in the hybrid
// engine; any host memory works).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/placement_planner.h"
#include "core/model/model_hparams.h"

namespace kestrel {

// The most choices a token may carry (expert_used_count is 8 or 10 in the models Kestrel reads).
inline constexpr int32_t kMaxExpertChoices = 64;

// The id of a choice this backend skips: an expert another backend (the GPU) computes.
inline constexpr int32_t kExpertNotHere = -1;

// One routing choice of one token.
struct ExpertChoice {
  int32_t expert = kExpertNotHere;  // expert id in [0, n_expert), or kExpertNotHere
  float weight = 0.0f;              // its routing weight (the renormalised top-k probability, ref::moe_route)
};
static_assert(std::is_trivially_copyable_v<ExpertChoice> && sizeof(ExpertChoice) == 8);

// One layer's routed-expert work for a backend. A plain struct of borrowed pointers: the caller owns every buffer and
// keeps them valid and unchanged until the run() that computes the batch returns.
struct ExpertBatch {
  int32_t layer = -1;                     // the model's block index of a MoE layer
  int32_t n_tokens = 0;                   // rows of x and y; 0: nothing to do
  int32_t hidden = 0;                     // elements of a row: the model's n_embd
  int32_t k = 0;                          // choices per token, in [1, min(n_expert, kMaxExpertChoices)]
  const float* x = nullptr;               // f32 [n_tokens, hidden] input rows (normed by post_attention_norm)
  const ExpertChoice* choices = nullptr;  // [n_tokens, k]: token t's choices at t·k, any order, ids distinct
  float* y = nullptr;                     // f32 [n_tokens, hidden] output rows, every row written; overlaps nothing
};
static_assert(std::is_trivially_copyable_v<ExpertBatch>);

// Which routed experts a backend holds: held[l][e] != 0 for expert e of layer l. A layer's row is empty when it has
// no routed experts (or none of them is held) and n_expert long otherwise.
struct ExpertSet {
  std::vector<std::vector<uint8_t>> held;  // [n_layer][n_expert or 0]

  bool holds(int32_t layer, int32_t expert) const;
  uint64_t count() const;            // experts held over all layers
  std::vector<bool> layers() const;  // [n_layer]: whether layer l holds at least one expert

  // Every expert of every MoE layer of a model with these hyper-parameters.
  static ExpertSet all(const ModelHparams& hp);
  // The experts a placement puts on `device`: PlacementDecision::expert_on_gpu for kGpu, its complement for kHost.
  static ExpertSet on_device(const PlacementDecision& decision, WeightDevice device);
};

// The checks every backend makes before it touches anything, for a backend holding `held` of a model whose rows are
// `hidden` long:
//   kOutOfRange: layer outside [0, held.held.size()); an expert id outside [0, n_expert) other than kExpertNotHere;
//   kInvalidArgument: a layer without routed experts, hidden != the model's, n_tokens < 0, k outside
//     [1, min(n_expert, kMaxExpertChoices)], a null buffer with n_tokens > 0, y overlapping x or the choices, an
//     expert id twice among one token's choices;
//   kNotFound: a choice of an expert the backend does not hold (and not marked kExpertNotHere).
// The message names the layer, the token and the expert. Pure; allocates only for an error's message.
Status check_expert_batch(const ExpertBatch& batch, const ExpertSet& held, int32_t hidden);

// Computes ExpertBatches for the experts of one ExpertSet (experts()).
//
// Contract:
// - run() computes a batch on the calling thread (and the backend's own workers) and returns once y is written. It
//   blocks on nothing but the batch itself, and allocates nothing after the first batches (the scratch has grown to
//   the largest batch seen).
// - Every batch is checked first (check()); a refused batch returns its error and nothing is written: not y, not
//   the backend's state.
// - One batch at a time: a run() begins only after the previous one returned (Threading below); the backend touches
//   none of a batch's buffers after its run() has returned.
// Threading: the calls (run, check) come from one caller at a time — any thread that is not one of the backend's
// workers, and not necessarily the same thread for each call, as long as each call happens after the previous one
// returned (the CUDA engine's hand-off thread, gpu/engine/host_expert_link.h, is one such caller). The batch's
// buffers are read and y written by the calling thread and the backend's workers during run(); its return makes y's
// writes visible to its caller.
class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;  // stops the backend's threads

  virtual const ExpertSet& experts() const = 0;
  virtual int32_t hidden() const = 0;  // the model's n_embd

  virtual Status check(const ExpertBatch& batch) const = 0;
  virtual Status run(const ExpertBatch& batch) = 0;
};

}  // namespace kestrel
