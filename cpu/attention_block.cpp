// AttentionBlock (attention_block.h): batched projections, per-session norms/RoPE/cache and causal attention.
#include "cpu/attention_block.h"

#include <cmath>
#include <vector>

#include "core/reference/activations.h"
#include "core/reference/norm.h"
#include "core/reference/rope.h"
#include "cpu/attend.h"

namespace kestrel::cpu {
namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

// ref::rope_neox_partial's operations in its order, its cos/sin tables in a per-thread buffer grown once.
void rope_rotate(float* x, int n_head, int head_dim, int n_rot, float freq_base, int64_t pos) {
  const int half = n_rot / 2;
  thread_local std::vector<float> buf;  // f32 [3·half]: inv_freq, cos, sin
  if (buf.size() < sz(3 * half)) buf.resize(sz(3 * half));
  float* inv_freq = buf.data();
  float* c = inv_freq + half;
  float* sn = c + half;
  ref::rope_inv_freq(n_rot, freq_base, inv_freq);
  const float p = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    const float theta = p * inv_freq[i];
    c[i] = std::cos(theta);
    sn[i] = std::sin(theta);
  }
  for (int h = 0; h < n_head; ++h) {
    float* xh = x + sz(h) * sz(head_dim);
    for (int i = 0; i < half; ++i) {
      const float a = xh[i];
      const float b = xh[i + half];
      xh[i] = a * c[i] + (-b) * sn[i];
      xh[i + half] = b * c[i] + a * sn[i];
    }
  }
}

}  // namespace

void AttentionBlock::run(const Pass& pass, const ref::AttnWeights& w, uint32_t layer, const float* x, float* out) {
  const ref::AttnDims& d = w.dims;
  const size_t R = sz(pass.n_rows), hd = sz(d.head_dim), n_head = sz(d.n_head);
  const size_t q_width = n_head * 2 * hd, kv_width = sz(d.n_head_kv) * hd, o_width = n_head * hd;
  float* qg = grow(qg_, R * q_width);
  float* k = grow(k_, R * kv_width);
  float* v = grow(v_, R * kv_width);
  {
    const GemvTask t[3] = {task_of(w.q, x, pass.n_rows, qg), task_of(w.k, x, pass.n_rows, k),
                           task_of(w.v, x, pass.n_rows, v)};
    pass.mm->run(t);
  }

  float* q = grow(q_, R * o_width);
  float* gate = grow(gate_, R * o_width);
  auto prepare = [&](int64_t item) {
    const Segment& s = pass.segments[sz(item)];
    ref::KvCache& cache = s.state->kv(layer);
    for (int t = 0; t < s.n_tok; ++t) {
      const size_t r = sz(s.row0 + t);
      const int64_t pos = s.n_past + t;
      for (size_t h = 0; h < n_head; ++h) {
        const float* src = qg + r * q_width + h * 2 * hd;
        ref::rms_norm(src, w.q_norm, d.head_dim, d.eps, q + r * o_width + h * hd);
        for (size_t i = 0; i < hd; ++i) gate[r * o_width + h * hd + i] = src[hd + i];
      }
      rope_rotate(q + r * o_width, d.n_head, d.head_dim, d.n_rot, d.freq_base, pos);
      float* kt = k + r * kv_width;
      for (size_t j = 0; j < sz(d.n_head_kv); ++j) ref::rms_norm(kt + j * hd, w.k_norm, d.head_dim, d.eps, kt + j * hd);
      rope_rotate(kt, d.n_head_kv, d.head_dim, d.n_rot, d.freq_base, pos);
      // Room was checked before the pass (the engine's check of every item), so append cannot fail here.
      (void)cache.append(kt, v + r * kv_width);
    }
  };
  pass.mm->pool().for_each(static_cast<int64_t>(pass.segments.size()), prepare);

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  const int group = d.n_head / d.n_head_kv;
  const AttendFn attend = attend_kernel(pass.mm->isa(), d.head_dim);
  float* att = grow(att_, R * o_width);
  auto heads = [&](int64_t item) {
    const Segment& s = pass.segments[sz(item) / n_head];
    const int h = static_cast<int>(sz(item) % n_head);
    const ref::KvCache& cache = s.state->kv(layer);
    for (int t = 0; t < s.n_tok; ++t) {
      const size_t off = sz(s.row0 + t) * o_width + sz(h) * hd;
      attend(cache, h / group, static_cast<int>(s.n_past) + t + 1, q + off, scale, att + off);
      for (size_t i = 0; i < hd; ++i) att[off + i] = att[off + i] * ref::sigmoid(gate[off + i]);
    }
  };
  pass.mm->pool().for_each(static_cast<int64_t>(pass.segments.size() * n_head), heads);

  const GemvTask t[1] = {task_of(w.o, att, pass.n_rows, out)};
  pass.mm->run(t);
}

}  // namespace kestrel::cpu
