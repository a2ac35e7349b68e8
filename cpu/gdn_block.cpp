// GdnBlock (gdn_block.h): batched projections, then per-session recurrent GDN with the reference's per-token ops.
#include "cpu/gdn_block.h"

#include <algorithm>
#include <optional>

#include "core/reference/delta_rule.h"
#include "core/reference/gdn_conv.h"
#include "core/reference/gdn_layout.h"
#include "core/reference/gdn_prepare.h"
#include "core/reference/norm.h"
#include "cpu/delta_rule.h"

namespace kestrel::cpu {
namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void GdnBlock::run(const Pass& pass, const ref::GdnWeights& w, uint32_t layer, const float* x, float* out) {
  const ref::GdnDims& d = w.dims;
  const size_t R = sz(pass.n_rows), C = sz(d.conv_dim()), Vd = sz(d.value_dim()), Kd = sz(d.key_dim());
  const size_t Vh = sz(d.n_v_heads), dk = sz(d.d_k), dv = sz(d.d_v);
  float* mixed = grow(mixed_, R * C);
  float* z = grow(z_, R * Vd);
  float* b = grow(b_, R * Vh);
  float* a = grow(a_, R * Vh);

  std::optional<SectionTimer> timer(std::in_place, pass.profile, StepSection::kGdnIn);
  // Input projections (ref::gdn_project's layouts), all matrices in one pool job.
  switch (w.projection) {
    case ref::GdnProjection::kQkvGateBetaAlpha: {
      const GemvTask t[4] = {task_of(w.qkv, x, pass.n_rows, mixed), task_of(w.gate, x, pass.n_rows, z),
                             task_of(w.beta, x, pass.n_rows, b), task_of(w.alpha, x, pass.n_rows, a)};
      pass.mm->run(t);
      break;
    }
    case ref::GdnProjection::kQkvGateBa: {
      float* ba = grow(extra_, R * 2 * Vh);  // f32 [R, 2·Vh], per-K-group [b(r), a(r)]
      const GemvTask t[3] = {task_of(w.qkv, x, pass.n_rows, mixed), task_of(w.gate, x, pass.n_rows, z),
                             task_of(w.ba, x, pass.n_rows, ba)};
      pass.mm->run(t);
      for (size_t r = 0; r < R; ++r) ref::gdn_split_ba(d, ba + r * 2 * Vh, b + r * Vh, a + r * Vh);
      break;
    }
    case ref::GdnProjection::kSsmInBa: {
      // f32 [R, C + Vd] (HF in_proj_qkvz), then f32 [R, 2·Vh] (ssm_ba) after it in the same buffer.
      float* qkvz = grow(extra_, R * (C + Vd) + R * 2 * Vh);
      float* ba = qkvz + R * (C + Vd);
      const GemvTask t[2] = {task_of(w.ssm_in, x, pass.n_rows, qkvz), task_of(w.ba, x, pass.n_rows, ba)};
      pass.mm->run(t);
      for (size_t r = 0; r < R; ++r) {
        ref::gdn_deinterleave_qkvz(d, qkvz + r * (C + Vd), mixed + r * C, z + r * Vd);
        ref::gdn_split_ba(d, ba + r * 2 * Vh, b + r * Vh, a + r * Vh);
      }
      break;
    }
  }

  timer.emplace(pass.profile, StepSection::kGdnState);
  // Conv step, split / normalise / scale and gates (the reference's per-token ops), split over the pool.
  float* u = grow(u_, R * C);
  float* q = grow(q_, R * Kd);
  float* k = grow(k_, R * Kd);
  float* v = grow(v_, R * Vd);
  float* beta = grow(beta_, R * Vh);
  float* g = grow(g_, R * Vh);
  // Per session, one item per K-head (the conv of its q and k channels, then their norms), one per block of
  // kConvBlock value channels, and one for the gates. Each channel's conv runs through the session's tokens in order,
  // as ref::gdn_conv_step does, so the bits are the reference's whatever the split.
  constexpr size_t kConvBlock = 512;
  const size_t n_kh = sz(d.n_k_heads), n_vb = (Vd + kConvBlock - 1) / kConvBlock;
  const size_t per_segment = n_kh + n_vb + 1;
  const int K = d.conv_kernel;
  auto prepare = [&](int64_t item) {
    const Segment& s = pass.segments[sz(item) / per_segment];
    const size_t j = sz(item) % per_segment;
    ref::GdnState& st = s.state->gdn(layer);
    const size_t r0 = sz(s.row0), r1 = sz(s.row0 + s.n_tok);
    auto conv = [&](size_t r, size_t c0, size_t n_ch) {
      ref::gdn_conv_step(w.conv1d + c0 * sz(K), static_cast<int>(n_ch), K, mixed + r * C + c0,
                         st.conv.data() + c0 * sz(K - 1), u + r * C + c0);
    };
    if (j < n_kh) {
      for (size_t r = r0; r < r1; ++r) {
        conv(r, j * dk, dk);
        conv(r, Kd + j * dk, dk);
        ref::gdn_split_qk_head(d, u + r * C, static_cast<int>(j), q + r * Kd, k + r * Kd);
      }
    } else if (j < n_kh + n_vb) {
      const size_t c0 = (j - n_kh) * kConvBlock, n_ch = std::min(kConvBlock, Vd - c0);
      for (size_t r = r0; r < r1; ++r) {
        conv(r, 2 * Kd + c0, n_ch);
        std::copy_n(u + r * C + 2 * Kd + c0, n_ch, v + r * Vd + c0);
      }
    } else {
      for (size_t r = r0; r < r1; ++r) {
        ref::gdn_gates(b + r * Vh, a + r * Vh, w.dt_bias, w.ssm_a, d.n_v_heads, beta + r * Vh, g + r * Vh);
      }
    }
  };
  pass.mm->pool().for_each(static_cast<int64_t>(pass.segments.size() * per_segment), prepare);

  // Delta rule and gated norm per (session, V-head): each item owns one head's state. Tokens that fill a chunk of
  // kDeltaRuleChunk positions aligned to the sequence (position % 64 == 0 .. + 63) within this pass run the chunked
  // form; the others (a prompt's first and last partial chunks, decode tokens) the recurrent step.
  float* o = grow(o_, R * Vd);
  float* n = grow(n_, R * Vd);
  const DeltaRuleKernels dr = delta_rule_kernels(pass.mm->isa(), d.d_k, d.d_v);
  auto heads = [&](int64_t item) {
    const Segment& s = pass.segments[sz(item) / Vh];
    const int h = static_cast<int>(sz(item) % Vh);
    float* state = s.state->gdn(layer).head(d, h);
    const size_t kh = sz(ref::gdn_k_head(d, h));
    for (size_t r = sz(s.row0); r < sz(s.row0 + s.n_tok);) {
      const int64_t pos = s.n_past + static_cast<int64_t>(r - sz(s.row0));
      const size_t hv = r * Vd + sz(h) * dv;
      if (pos % kDeltaRuleChunk == 0 && r + kDeltaRuleChunk <= sz(s.row0 + s.n_tok)) {
        DeltaRuleChunk c;
        c.q = q + r * Kd + kh * dk;
        c.k = k + r * Kd + kh * dk;
        c.qk_stride = static_cast<int64_t>(Kd);
        c.v = v + hv;
        c.v_stride = static_cast<int64_t>(Vd);
        c.g = g + r * Vh + sz(h);
        c.beta = beta + r * Vh + sz(h);
        c.gate_stride = static_cast<int64_t>(Vh);
        c.o = o + hv;
        c.o_stride = static_cast<int64_t>(Vd);
        dr.chunk(c, d.d_k, d.d_v, state);
        for (size_t t = r; t < r + kDeltaRuleChunk; ++t) {
          const size_t ht = t * Vd + sz(h) * dv;
          ref::rms_norm_gated(o + ht, z + ht, w.ssm_norm, d.d_v, d.eps, n + ht);
        }
        r += kDeltaRuleChunk;
        continue;
      }
      dr.step(q + r * Kd + kh * dk, k + r * Kd + kh * dk, v + hv, g[r * Vh + sz(h)], beta[r * Vh + sz(h)], d.d_k, d.d_v,
              state, o + hv);
      ref::rms_norm_gated(o + hv, z + hv, w.ssm_norm, d.d_v, d.eps, n + hv);
      ++r;
    }
  };
  pass.mm->pool().for_each(static_cast<int64_t>(pass.segments.size() * Vh), heads);

  timer.emplace(pass.profile, StepSection::kGdnOut);
  const GemvTask t[1] = {task_of(w.ssm_out, n, pass.n_rows, out)};
  pass.mm->run(t);
}

}  // namespace kestrel::cpu
