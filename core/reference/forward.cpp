#include "core/reference/forward.h"

#include <algorithm>
#include <string>

#include "core/quant/quant.h"
#include "core/reference/norm.h"

namespace kestrel::ref {
namespace {

// x: f32 [n_tok, H] normed rows of h.
void norm_rows(const float* h, const float* w, int n_tok, int n_embd, float eps, float* x) {
  for (int t = 0; t < n_tok; ++t) {
    rms_norm(h + static_cast<size_t>(t) * n_embd, w, n_embd, eps, x + static_cast<size_t>(t) * n_embd);
  }
}

void add_rows(float* h, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) h[i] += y[i];
}

}  // namespace

Status check_tokens(const RefModelWeights& w, const SessionState& session, std::span<const int32_t> tokens) {
  if (tokens.empty()) return make_error(ErrorCode::kInvalidArgument, "empty batch: at least one token is needed");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= w.hp.n_vocab) {
      return make_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(tokens[i]) + " at index " +
                                                         std::to_string(i) + " is outside the vocabulary [0, " +
                                                         std::to_string(w.hp.n_vocab) + ")");
    }
  }
  const int64_t need = session.n_past() + static_cast<int64_t>(tokens.size());
  if (need > session.n_ctx()) {
    return make_error(ErrorCode::kOutOfRange, "context limit: " + std::to_string(session.n_past()) + " tokens + " +
                                                  std::to_string(tokens.size()) + " new exceed the session's " +
                                                  std::to_string(session.n_ctx()));
  }
  return ok_status();
}

Status forward(const RefModelWeights& w, SessionState& session, std::span<const int32_t> tokens,
               const ForwardOptions& options, ForwardOutput* out) {
  KESTREL_TRY(check_tokens(w, session, tokens));
  const int n_tok = static_cast<int>(tokens.size());
  const int n_embd = static_cast<int>(w.hp.n_embd);
  const size_t n_act = static_cast<size_t>(n_tok) * n_embd;
  const float eps = w.hp.rms_eps;
  const int k_used = static_cast<int>(w.hp.n_expert_used);
  const int64_t pos0 = session.n_past();

  out->n_tok = n_tok;
  out->hidden.clear();
  out->routing.clear();
  if (options.capture_hidden) out->hidden.reserve(static_cast<size_t>(w.layers.size()) * n_act);
  if (options.capture_routing) out->routing.assign(w.layers.size() * n_tok * std::max(k_used, 1), -1);

  // Embedding lookup: row `token` of token_embd, dequantized (no scaling).
  std::vector<float> h(n_act);  // f32 [n_tok, H] residual stream
  KESTREL_TRY_ASSIGN(const uint64_t embd_row_bytes, matrix_row_bytes(w.token_embd));
  for (int t = 0; t < n_tok; ++t) {
    const uint8_t* row = w.token_embd.data + static_cast<size_t>(tokens[t]) * embd_row_bytes;
    KESTREL_TRY(dequantize_row(w.token_embd.type, row, h.data() + static_cast<size_t>(t) * n_embd, n_embd));
  }

  std::vector<float> x(n_act);  // f32 [n_tok, H] normed input of a sub-layer
  std::vector<float> y(n_act);  // f32 [n_tok, H] sub-layer output
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const RefLayerWeights& lw = w.layers[l];
    const uint32_t li = static_cast<uint32_t>(l);
    norm_rows(h.data(), lw.attn_norm, n_tok, n_embd, eps, x.data());
    if (lw.kind == LayerKind::kGatedDeltaNet) {
      KESTREL_TRY(gdn_forward(lw.gdn, session.gdn(li), x.data(), n_tok, y.data(), options.gdn_mode));
    } else {
      KESTREL_TRY(attn_forward(lw.attn, session.kv(li), x.data(), n_tok, pos0, y.data()));
    }
    add_rows(h.data(), y.data(), n_act);
    norm_rows(h.data(), lw.post_attention_norm, n_tok, n_embd, eps, x.data());
    if (lw.is_moe) {
      int32_t* sel = options.capture_routing ? out->routing.data() + l * n_tok * k_used : nullptr;
      KESTREL_TRY(moe_forward(lw.moe, x.data(), n_tok, y.data(), sel));
    } else {
      KESTREL_TRY(dense_ffn_forward(lw.dense, x.data(), n_tok, y.data()));
    }
    add_rows(h.data(), y.data(), n_act);
    if (options.capture_hidden) out->hidden.insert(out->hidden.end(), h.begin(), h.end());
  }

  // Final norm and lm_head for the requested rows.
  const int first = options.all_logits ? 0 : n_tok - 1;
  const int n_out = n_tok - first;
  std::vector<float> y_last(static_cast<size_t>(n_out) * n_embd);
  norm_rows(h.data() + static_cast<size_t>(first) * n_embd, w.output_norm, n_out, n_embd, eps, y_last.data());
  out->logits.assign(static_cast<size_t>(n_out) * w.hp.n_vocab, 0.0f);
  KESTREL_TRY(matvec_batch(w.output, y_last.data(), n_out, out->logits.data()));
  session.advance(static_cast<int64_t>(tokens.size()));
  return ok_status();
}

}  // namespace kestrel::ref
