// Reference gated full-attention layer (see attention.h).
#include "core/reference/attention.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/reference/activations.h"
#include "core/reference/norm.h"
#include "core/reference/rope.h"

namespace kestrel::ref {
namespace {

size_t sz(int v) { return static_cast<size_t>(v); }

}  // namespace

Status AttnDims::validate() const {
  if (n_embd <= 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 || n_rot < 0) {
    return make_error(ErrorCode::kInvalidArgument, "attention: sizes must be positive (n_embd " +
                                                       std::to_string(n_embd) + ", n_head " + std::to_string(n_head) +
                                                       ", n_head_kv " + std::to_string(n_head_kv) + ", head_dim " +
                                                       std::to_string(head_dim) + ")");
  }
  if (n_head % n_head_kv != 0) {
    return make_error(ErrorCode::kInvalidArgument, "attention: n_head " + std::to_string(n_head) +
                                                       " is not a multiple of n_head_kv " + std::to_string(n_head_kv));
  }
  if (n_rot % 2 != 0 || n_rot > head_dim) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "attention: n_rot " + std::to_string(n_rot) + " must be even and at most head_dim " + std::to_string(head_dim));
  }
  return ok_status();
}

AttnDims AttnDims::from_hparams(const ModelHparams& hp) {
  AttnDims d;
  d.n_embd = static_cast<int>(hp.n_embd);
  d.n_head = static_cast<int>(hp.n_head);
  d.n_head_kv = static_cast<int>(hp.n_head_kv);
  d.head_dim = static_cast<int>(hp.head_dim);
  d.n_rot = static_cast<int>(hp.n_rot);
  d.freq_base = hp.rope_freq_base;
  d.eps = hp.rms_eps;
  return d;
}

Status attn_check_weights(const AttnWeights& w) {
  const AttnDims& d = w.dims;
  KESTREL_TRY(d.validate());
  const uint64_t H = static_cast<uint64_t>(d.n_embd);
  const uint64_t q_out = static_cast<uint64_t>(d.n_head) * 2 * static_cast<uint64_t>(d.head_dim);
  const uint64_t kv_out = static_cast<uint64_t>(d.n_head_kv) * static_cast<uint64_t>(d.head_dim);
  KESTREL_TRY(check_matrix(w.q, "attn_q", H, q_out));
  KESTREL_TRY(check_matrix(w.k, "attn_k", H, kv_out));
  KESTREL_TRY(check_matrix(w.v, "attn_v", H, kv_out));
  KESTREL_TRY(check_matrix(w.o, "attn_output", static_cast<uint64_t>(d.n_head) * d.head_dim, H));
  if (w.q_norm == nullptr || w.k_norm == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "attention: attn_q_norm or attn_k_norm is missing");
  }
  return ok_status();
}

void attend_head(const KvCache& cache, int kv_head, int n_pos, const float* q, float scale, float* out) {
  const int hd = cache.head_dim;
  std::vector<float> p(sz(n_pos));  // f32 [n_pos]: scores, then probabilities
  for (int pos = 0; pos < n_pos; ++pos) p[sz(pos)] = dot_f32(q, cache.k_at(pos, kv_head), hd) * scale;
  softmax(p.data(), n_pos);
  for (int i = 0; i < hd; ++i) out[i] = 0.0f;
  for (int pos = 0; pos < n_pos; ++pos) {
    const float* vp = cache.v_at(pos, kv_head);
    for (int i = 0; i < hd; ++i) out[i] += p[sz(pos)] * vp[i];
  }
}

Status attn_forward(const AttnWeights& w, KvCache& cache, const float* x, int n_tok, int64_t pos0, float* out) {
  KESTREL_TRY(attn_check_weights(w));
  const AttnDims& d = w.dims;
  if (cache.n_head_kv != d.n_head_kv || cache.head_dim != d.head_dim) {
    return make_error(ErrorCode::kInvalidArgument, "attention: cache made for " + std::to_string(cache.n_head_kv) +
                                                       " kv heads of " + std::to_string(cache.head_dim) +
                                                       ", layer has " + std::to_string(d.n_head_kv) + " of " +
                                                       std::to_string(d.head_dim));
  }
  if (n_tok < 0) return make_error(ErrorCode::kInvalidArgument, "attention: negative token count");
  if (pos0 != cache.n_used) {
    return make_error(ErrorCode::kFailedPrecondition, "attention: batch starts at position " + std::to_string(pos0) +
                                                          " but the cache holds " + std::to_string(cache.n_used) +
                                                          " tokens");
  }
  if (n_tok > cache.n_ctx - cache.n_used) {
    return make_error(ErrorCode::kOutOfRange, "attention: " + std::to_string(n_tok) + " more tokens do not fit the " +
                                                  std::to_string(cache.n_ctx) + "-token cache (" +
                                                  std::to_string(cache.n_used) + " used)");
  }
  if (n_tok == 0) return ok_status();

  const size_t T = sz(n_tok), hd = sz(d.head_dim);
  const size_t q_width = sz(d.n_head) * 2 * hd, kv_width = sz(d.n_head_kv) * hd, o_width = sz(d.n_head) * hd;
  std::vector<float> qg(T * q_width), k(T * kv_width), v(T * kv_width);  // f32 [T, n_head·2hd], [T, n_kv·hd] ×2
  KESTREL_TRY(matvec_batch(w.q, x, n_tok, qg.data()));
  KESTREL_TRY(matvec_batch(w.k, x, n_tok, k.data()));
  KESTREL_TRY(matvec_batch(w.v, x, n_tok, v.data()));

  std::vector<float> q(T * o_width), gate(T * o_width);  // f32 [T, n_head, hd] each
  for (size_t t = 0; t < T; ++t) {
    const int64_t pos = pos0 + static_cast<int64_t>(t);
    for (size_t h = 0; h < sz(d.n_head); ++h) {
      const float* src = qg.data() + t * q_width + h * 2 * hd;
      rms_norm(src, w.q_norm, d.head_dim, d.eps, q.data() + t * o_width + h * hd);
      for (size_t i = 0; i < hd; ++i) gate[t * o_width + h * hd + i] = src[hd + i];
    }
    rope_neox_partial(q.data() + t * o_width, d.n_head, d.head_dim, d.n_rot, d.freq_base, pos);
    float* kt = k.data() + t * kv_width;
    for (size_t j = 0; j < sz(d.n_head_kv); ++j) rms_norm(kt + j * hd, w.k_norm, d.head_dim, d.eps, kt + j * hd);
    rope_neox_partial(kt, d.n_head_kv, d.head_dim, d.n_rot, d.freq_base, pos);
  }
  for (size_t t = 0; t < T; ++t) KESTREL_TRY(cache.append(k.data() + t * kv_width, v.data() + t * kv_width));

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  const int group = d.n_head / d.n_head_kv;
  const int n_past = cache.n_used - n_tok;
  std::vector<float> attn(T * o_width);  // f32 [T, n_head, hd]: gated attention output
  for (size_t t = 0; t < T; ++t) {
    for (int h = 0; h < d.n_head; ++h) {
      const size_t off = t * o_width + sz(h) * hd;
      attend_head(cache, h / group, n_past + static_cast<int>(t) + 1, q.data() + off, scale, attn.data() + off);
      for (size_t i = 0; i < hd; ++i) attn[off + i] = attn[off + i] * sigmoid(gate[off + i]);
    }
  }
  return matvec_batch(w.o, attn.data(), n_tok, out);
}

}  // namespace kestrel::ref
