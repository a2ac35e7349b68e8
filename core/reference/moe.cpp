// Reference MoE FFN (see moe.h). Experts run grouped: for each expert (ascending id) the tokens that selected it
// go through it as one batch and are added to their outputs, so every token sums its experts in ascending id order
// and the result does not depend on which other tokens share the batch.
#include "core/reference/moe.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/reference/activations.h"
#include "core/reference/ffn.h"

namespace kestrel::ref {
namespace {

size_t sz(uint64_t v) { return static_cast<size_t>(v); }

}  // namespace

Status moe_check_weights(const MoeWeights& w) {
  const uint64_t H = w.router.n_in, E = w.router.n_out;
  KESTREL_TRY(check_matrix(w.router, "ffn_gate_inp", H, E));
  if (E == 0 || w.n_expert_used < 1 || static_cast<uint64_t>(w.n_expert_used) > E) {
    return make_error(ErrorCode::kInvalidArgument, "moe: expert_used_count " + std::to_string(w.n_expert_used) +
                                                       " must be in [1, " + std::to_string(E) + "]");
  }
  const uint64_t I = w.gate_exps.n_out;
  auto check_experts = [&](const QuantExperts& x, const char* name, uint64_t n_in, uint64_t n_out) -> Status {
    if (x.data == nullptr || x.n_in != n_in || x.n_out != n_out || x.n_expert != E) {
      return make_error(ErrorCode::kInvalidArgument,
                        std::string("moe: ") + name + " has shape {" + std::to_string(x.n_in) + ", " +
                            std::to_string(x.n_out) + ", " + std::to_string(x.n_expert) + "}" +
                            (x.data == nullptr ? " and no data" : "") + ", expected {" + std::to_string(n_in) + ", " +
                            std::to_string(n_out) + ", " + std::to_string(E) + "}");
    }
    return ok_status();
  };
  KESTREL_TRY(check_experts(w.gate_exps, "ffn_gate_exps", H, I));
  KESTREL_TRY(check_experts(w.up_exps, "ffn_up_exps", H, I));
  KESTREL_TRY(check_experts(w.down_exps, "ffn_down_exps", I, H));
  if (w.has_shared_expert()) {
    KESTREL_TRY(check_matrix(w.shared_gate_inp, "ffn_gate_inp_shexp", H, 1));
    KESTREL_TRY(check_matrix(w.gate_shexp, "ffn_gate_shexp", H, w.gate_shexp.n_out));
    KESTREL_TRY(swiglu_check(w.gate_shexp, w.up_shexp, w.down_shexp, "shared expert"));
  }
  return ok_status();
}

void moe_route(const float* logits, int n_expert, int k, int32_t* ids, float* weights) {
  std::vector<float> p(logits, logits + n_expert);  // f32 [E]: probabilities
  softmax(p.data(), n_expert);
  std::vector<bool> taken(static_cast<size_t>(n_expert), false);
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < n_expert; ++e) {  // strict '>' keeps the lowest index among equals
      if (!taken[static_cast<size_t>(e)] && (best < 0 || p[static_cast<size_t>(e)] > p[static_cast<size_t>(best)])) {
        best = e;
      }
    }
    taken[static_cast<size_t>(best)] = true;
    ids[j] = best;
    weights[j] = p[static_cast<size_t>(best)];
    sum += weights[j];
  }
  const float denom = std::max(sum, kMoeWeightSumMin);
  for (int j = 0; j < k; ++j) weights[j] = weights[j] / denom;
}

Status moe_forward(const MoeWeights& w, const float* x, int n_tok, float* out, int32_t* selected) {
  KESTREL_TRY(moe_check_weights(w));
  if (n_tok < 0) return make_error(ErrorCode::kInvalidArgument, "moe: negative token count");
  const size_t T = static_cast<size_t>(n_tok), H = sz(w.router.n_in), E = sz(w.router.n_out);
  const size_t k = static_cast<size_t>(w.n_expert_used);

  std::vector<float> logits(T * E);  // f32 [T, E]
  KESTREL_TRY(matvec_batch(w.router, x, n_tok, logits.data()));
  std::vector<int32_t> ids(T * k);  // int32 [T, k]
  std::vector<float> wts(T * k);    // f32 [T, k]
  for (size_t t = 0; t < T; ++t) {
    moe_route(logits.data() + t * E, static_cast<int>(E), static_cast<int>(k), ids.data() + t * k, wts.data() + t * k);
  }
  if (selected != nullptr) std::copy(ids.begin(), ids.end(), selected);

  std::fill(out, out + T * H, 0.0f);
  std::vector<float> xe, ye;  // f32 [n_e, H]: the tokens routed to one expert, and that expert's outputs
  std::vector<size_t> tok;    // token index of each row of xe
  std::vector<float> tok_w;   // routing weight of each row
  for (size_t e = 0; e < E; ++e) {
    tok.clear();
    tok_w.clear();
    for (size_t t = 0; t < T; ++t) {
      for (size_t j = 0; j < k; ++j) {
        if (ids[t * k + j] == static_cast<int32_t>(e)) {
          tok.push_back(t);
          tok_w.push_back(wts[t * k + j]);
        }
      }
    }
    if (tok.empty()) continue;
    xe.resize(tok.size() * H);
    ye.resize(tok.size() * H);
    for (size_t r = 0; r < tok.size(); ++r) std::copy(x + tok[r] * H, x + (tok[r] + 1) * H, xe.begin() + r * H);
    KESTREL_TRY_ASSIGN(const QuantMatrix gate, expert_matrix(w.gate_exps, e));
    KESTREL_TRY_ASSIGN(const QuantMatrix up, expert_matrix(w.up_exps, e));
    KESTREL_TRY_ASSIGN(const QuantMatrix down, expert_matrix(w.down_exps, e));
    KESTREL_TRY(swiglu_forward(gate, up, down, xe.data(), static_cast<int>(tok.size()), ye.data()));
    for (size_t r = 0; r < tok.size(); ++r) {
      float* y = out + tok[r] * H;
      for (size_t i = 0; i < H; ++i) y[i] += ye[r * H + i] * tok_w[r];
    }
  }

  if (w.has_shared_expert()) {
    std::vector<float> sh(T * H), sgate(T);  // f32 [T, H] shared expert output; f32 [T] its gate logit
    KESTREL_TRY(swiglu_forward(w.gate_shexp, w.up_shexp, w.down_shexp, x, n_tok, sh.data()));
    KESTREL_TRY(matvec_batch(w.shared_gate_inp, x, n_tok, sgate.data()));
    for (size_t t = 0; t < T; ++t) {
      const float s = sigmoid(sgate[t]);
      for (size_t i = 0; i < H; ++i) out[t * H + i] += s * sh[t * H + i];
    }
  }
  return ok_status();
}

}  // namespace kestrel::ref
