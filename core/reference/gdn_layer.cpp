// Reference Gated DeltaNet layer (see gdn_layer.h): wires the per-token pieces together over a batch of tokens.
#include "core/reference/gdn_layer.h"

#include <string>
#include <vector>

#include "core/reference/delta_rule.h"
#include "core/reference/gdn_conv.h"
#include "core/reference/gdn_layout.h"
#include "core/reference/gdn_prepare.h"
#include "core/reference/norm.h"

namespace kestrel::ref {
namespace {

size_t sz(int v) { return static_cast<size_t>(v); }

Status require(const float* p, const char* name) {
  if (p == nullptr) return make_error(ErrorCode::kInvalidArgument, std::string("gdn: ") + name + " is missing");
  return ok_status();
}

}  // namespace

GdnProjection gdn_projection_for(Arch arch, GdnInputLayout input) {
  if (arch != Arch::kQwen3Next) return GdnProjection::kQkvGateBetaAlpha;
  return input == GdnInputLayout::kLegacySsmIn ? GdnProjection::kSsmInBa : GdnProjection::kQkvGateBa;
}

Status gdn_check_weights(const GdnWeights& w) {
  const GdnDims& d = w.dims;
  KESTREL_TRY(d.validate());
  const uint64_t H = static_cast<uint64_t>(d.n_embd);
  const uint64_t C = static_cast<uint64_t>(d.conv_dim());
  const uint64_t Vd = static_cast<uint64_t>(d.value_dim());
  const uint64_t Vh = static_cast<uint64_t>(d.n_v_heads);
  switch (w.projection) {
    case GdnProjection::kQkvGateBetaAlpha:
      KESTREL_TRY(check_matrix(w.qkv, "attn_qkv", H, C));
      KESTREL_TRY(check_matrix(w.gate, "attn_gate", H, Vd));
      KESTREL_TRY(check_matrix(w.beta, "ssm_beta", H, Vh));
      KESTREL_TRY(check_matrix(w.alpha, "ssm_alpha", H, Vh));
      break;
    case GdnProjection::kQkvGateBa:
      KESTREL_TRY(check_matrix(w.qkv, "attn_qkv", H, C));
      KESTREL_TRY(check_matrix(w.gate, "attn_gate", H, Vd));
      KESTREL_TRY(check_matrix(w.ba, "ssm_ba", H, 2 * Vh));
      break;
    case GdnProjection::kSsmInBa:
      KESTREL_TRY(check_matrix(w.ssm_in, "ssm_in", H, C + Vd));
      KESTREL_TRY(check_matrix(w.ba, "ssm_ba", H, 2 * Vh));
      break;
  }
  KESTREL_TRY(check_matrix(w.ssm_out, "ssm_out", Vd, H));
  KESTREL_TRY(require(w.conv1d, "ssm_conv1d"));
  KESTREL_TRY(require(w.dt_bias, "ssm_dt.bias"));
  KESTREL_TRY(require(w.ssm_a, "ssm_a"));
  KESTREL_TRY(require(w.ssm_norm, "ssm_norm"));
  return ok_status();
}

Status gdn_project(const GdnWeights& w, const float* x, int n_tok, float* mixed_qkv, float* z, float* b, float* a) {
  const GdnDims& d = w.dims;
  const size_t C = sz(d.conv_dim()), Vd = sz(d.value_dim()), Vh = sz(d.n_v_heads);
  switch (w.projection) {
    case GdnProjection::kQkvGateBetaAlpha:
      KESTREL_TRY(matvec_batch(w.qkv, x, n_tok, mixed_qkv));
      KESTREL_TRY(matvec_batch(w.gate, x, n_tok, z));
      KESTREL_TRY(matvec_batch(w.beta, x, n_tok, b));
      KESTREL_TRY(matvec_batch(w.alpha, x, n_tok, a));
      return ok_status();
    case GdnProjection::kQkvGateBa:
    case GdnProjection::kSsmInBa: {
      if (w.projection == GdnProjection::kQkvGateBa) {
        KESTREL_TRY(matvec_batch(w.qkv, x, n_tok, mixed_qkv));
        KESTREL_TRY(matvec_batch(w.gate, x, n_tok, z));
      } else {
        std::vector<float> qkvz(sz(n_tok) * (C + Vd));  // f32 [n_tok, 2·key_dim + 2·value_dim], HF in_proj_qkvz
        KESTREL_TRY(matvec_batch(w.ssm_in, x, n_tok, qkvz.data()));
        for (size_t t = 0; t < sz(n_tok); ++t) {
          gdn_deinterleave_qkvz(d, qkvz.data() + t * (C + Vd), mixed_qkv + t * C, z + t * Vd);
        }
      }
      std::vector<float> ba(sz(n_tok) * 2 * Vh);  // f32 [n_tok, 2·Vh], per-K-group [b(r), a(r)]
      KESTREL_TRY(matvec_batch(w.ba, x, n_tok, ba.data()));
      for (size_t t = 0; t < sz(n_tok); ++t) gdn_split_ba(d, ba.data() + t * 2 * Vh, b + t * Vh, a + t * Vh);
      return ok_status();
    }
  }
  return make_error(ErrorCode::kInternal, "gdn: unknown projection layout");
}

Status gdn_forward(const GdnWeights& w, GdnState& state, const float* x, int n_tok, float* out, GdnMode mode) {
  KESTREL_TRY(gdn_check_weights(w));
  const GdnDims& d = w.dims;
  KESTREL_TRY(state.check(d));
  if (n_tok < 0) return make_error(ErrorCode::kInvalidArgument, "gdn: negative token count " + std::to_string(n_tok));
  if (n_tok == 0) return ok_status();

  const size_t T = sz(n_tok), C = sz(d.conv_dim()), Vd = sz(d.value_dim()), Kd = sz(d.key_dim());
  const size_t Vh = sz(d.n_v_heads), dk = sz(d.d_k), dv = sz(d.d_v);
  std::vector<float> mixed(T * C), z(T * Vd), b(T * Vh), a(T * Vh);  // f32 [T, C], [T, Vd], [T, Vh], [T, Vh]
  KESTREL_TRY(gdn_project(w, x, n_tok, mixed.data(), z.data(), b.data(), a.data()));

  // Causal conv + SiLU: u f32 [T, C].
  std::vector<float> u(T * C);
  if (mode == GdnMode::kRecurrent) {
    for (size_t t = 0; t < T; ++t) {
      gdn_conv_step(w.conv1d, d.conv_dim(), d.conv_kernel, mixed.data() + t * C, state.conv.data(), u.data() + t * C);
    }
  } else {
    gdn_conv_prefill(w.conv1d, d.conv_dim(), d.conv_kernel, mixed.data(), n_tok, state.conv.data(), u.data());
  }

  // Split / normalise / scale and gates: q, k f32 [T, Kh, dk]; v f32 [T, Vh, dv]; beta, g f32 [T, Vh].
  std::vector<float> q(T * Kd), k(T * Kd), v(T * Vd), beta(T * Vh), g(T * Vh);
  for (size_t t = 0; t < T; ++t) {
    gdn_split_qkv(d, u.data() + t * C, q.data() + t * Kd, k.data() + t * Kd, v.data() + t * Vd);
    gdn_gates(b.data() + t * Vh, a.data() + t * Vh, w.dt_bias, w.ssm_a, d.n_v_heads, beta.data() + t * Vh,
              g.data() + t * Vh);
  }

  // Delta rule per V-head: o f32 [T, Vh, dv].
  std::vector<float> o(T * Vd);
  if (mode == GdnMode::kRecurrent) {
    for (size_t t = 0; t < T; ++t) {
      for (int h = 0; h < d.n_v_heads; ++h) {
        const size_t kh = sz(gdn_k_head(d, h));
        const size_t hv = t * Vd + sz(h) * dv;
        delta_rule_step(q.data() + t * Kd + kh * dk, k.data() + t * Kd + kh * dk, v.data() + hv, g[t * Vh + sz(h)],
                        beta[t * Vh + sz(h)], d.d_k, d.d_v, state.head(d, h), o.data() + hv);
      }
    }
  } else {
    // Gather one head's sequence contiguously: qseq, kseq f32 [T, dk]; vseq, oseq f32 [T, dv]; gseq, bseq f32 [T].
    std::vector<float> qseq(T * dk), kseq(T * dk), vseq(T * dv), oseq(T * dv), gseq(T), bseq(T);
    for (int h = 0; h < d.n_v_heads; ++h) {
      const size_t kh = sz(gdn_k_head(d, h));
      for (size_t t = 0; t < T; ++t) {
        for (size_t i = 0; i < dk; ++i) {
          qseq[t * dk + i] = q[t * Kd + kh * dk + i];
          kseq[t * dk + i] = k[t * Kd + kh * dk + i];
        }
        for (size_t j = 0; j < dv; ++j) vseq[t * dv + j] = v[t * Vd + sz(h) * dv + j];
        gseq[t] = g[t * Vh + sz(h)];
        bseq[t] = beta[t * Vh + sz(h)];
      }
      delta_rule_chunked(qseq.data(), kseq.data(), vseq.data(), gseq.data(), bseq.data(), n_tok, d.d_k, d.d_v,
                         state.head(d, h), oseq.data());
      for (size_t t = 0; t < T; ++t) {
        for (size_t j = 0; j < dv; ++j) o[t * Vd + sz(h) * dv + j] = oseq[t * dv + j];
      }
    }
  }

  // Gated norm per V-head, then the output projection.
  std::vector<float> n(T * Vd);  // f32 [T, Vd]
  for (size_t t = 0; t < T; ++t) {
    for (size_t h = 0; h < Vh; ++h) {
      const size_t off = t * Vd + h * dv;
      rms_norm_gated(o.data() + off, z.data() + off, w.ssm_norm, d.d_v, d.eps, n.data() + off);
    }
  }
  return matvec_batch(w.ssm_out, n.data(), n_tok, out);
}

}  // namespace kestrel::ref
