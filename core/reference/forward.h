// The reference forward pass of a whole model (model-spec.md §2): embedding lookup → per layer {attn_norm → GDN or
// gated attention → residual → post_attention_norm → MoE or dense FFN → residual} → output_norm → lm_head.
//
// One call appends n_tok tokens of one sequence: a prefill (n_tok > 1; GDN layers run the chunked form unless
// told otherwise) or a decode step (n_tok == 1). Inputs are validated before the state is touched: an empty batch,
// a token id outside [0, n_vocab) (kInvalidArgument naming the id and its index) or a batch that would pass the
// session's context (kOutOfRange) leaves the session unchanged. Everything is f32 and deterministic: the same
// inputs give bit-identical outputs on every run.
// Thread-safety: distinct sessions may run concurrently over the same (read-only) weights.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/base/expected.h"
#include "core/reference/model_weights.h"
#include "core/reference/session_state.h"

namespace kestrel::ref {

struct ForwardOptions {
  bool all_logits = false;       // logits of every token (else only the last)
  bool capture_hidden = false;   // residual stream after each layer
  bool capture_routing = false;  // selected experts of each MoE layer
  GdnMode gdn_mode = GdnMode::kChunked;
};

struct ForwardOutput {
  int n_tok = 0;
  std::vector<float> logits;     // f32 [n_tok or 1, n_vocab]
  std::vector<float> hidden;     // f32 [n_layer, n_tok, H] when capture_hidden (before the final norm)
  std::vector<int32_t> routing;  // int32 [n_layer, n_tok, k] when capture_routing; -1 for dense layers
};

Status forward(const RefModelWeights& w, SessionState& session, std::span<const int32_t> tokens,
               const ForwardOptions& options, ForwardOutput* out);

// Checks a batch against the model and session without running it (used by callers that queue work).
Status check_tokens(const RefModelWeights& w, const SessionState& session, std::span<const int32_t> tokens);

}  // namespace kestrel::ref
