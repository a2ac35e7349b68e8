// Scalar delta rule kernels (delta_rule.h): the reference's own functions — the step as is, the chunk gathered into
// contiguous rows (thread-local, grown once) for ref::delta_rule_chunked, which allocates its own per-call scratch:
// this level is the reference's arithmetic, not a fast path.
#include <algorithm>
#include <vector>

#include "cpu/delta_rule.h"

namespace kestrel::cpu {
namespace {

void chunk_scalar(const DeltaRuleChunk& c, int d_k, int d_v, float* s) {
  constexpr int C = kDeltaRuleChunk;
  const size_t dk = static_cast<size_t>(d_k), dv = static_cast<size_t>(d_v);
  thread_local std::vector<float> buf;  // q, k f32 [C, dk]; v, o f32 [C, dv]; g, beta f32 [C]
  buf.resize(C * (2 * dk + 2 * dv + 2));
  float* q = buf.data();
  float* k = q + C * dk;
  float* v = k + C * dk;
  float* o = v + C * dv;
  float* g = o + C * dv;
  float* beta = g + C;
  for (size_t t = 0; t < C; ++t) {
    std::copy_n(c.q + static_cast<int64_t>(t) * c.qk_stride, dk, q + t * dk);
    std::copy_n(c.k + static_cast<int64_t>(t) * c.qk_stride, dk, k + t * dk);
    std::copy_n(c.v + static_cast<int64_t>(t) * c.v_stride, dv, v + t * dv);
    g[t] = c.g[static_cast<int64_t>(t) * c.gate_stride];
    beta[t] = c.beta[static_cast<int64_t>(t) * c.gate_stride];
  }
  ref::delta_rule_chunked(q, k, v, g, beta, C, d_k, d_v, s, o, C);
  for (size_t t = 0; t < C; ++t) std::copy_n(o + t * dv, dv, c.o + static_cast<int64_t>(t) * c.o_stride);
}

}  // namespace

extern const DeltaRuleKernels kDeltaRuleScalar;
const DeltaRuleKernels kDeltaRuleScalar = {ref::delta_rule_step, chunk_scalar};

}  // namespace kestrel::cpu
