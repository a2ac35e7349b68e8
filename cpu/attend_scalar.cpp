// Scalar attention kernel (attend.h): ref::attend_head's code, its score buffer per thread and grown once instead of
// allocated per call. Compiled with core's flags (cpu/CMakeLists.txt), so its arithmetic is the reference's.
#include <cstddef>
#include <vector>

#include "core/reference/activations.h"
#include "cpu/attend.h"

namespace kestrel::cpu {
namespace {

void attend_scalar(const ref::KvCache& cache, int kv_head, int n_pos, const float* q, float scale, float* out) {
  thread_local std::vector<float> p;  // f32 [n_pos]: scores, then probabilities
  if (p.size() < static_cast<size_t>(n_pos)) p.resize(static_cast<size_t>(n_pos));
  const int hd = cache.head_dim;
  for (int pos = 0; pos < n_pos; ++pos) {
    p[static_cast<size_t>(pos)] = ref::dot_f32(q, cache.k_at(pos, kv_head), hd) * scale;
  }
  ref::softmax(p.data(), n_pos);
  for (int i = 0; i < hd; ++i) out[i] = 0.0f;
  for (int pos = 0; pos < n_pos; ++pos) {
    const float* vp = cache.v_at(pos, kv_head);
    for (int i = 0; i < hd; ++i) out[i] += p[static_cast<size_t>(pos)] * vp[i];
  }
}

}  // namespace

extern const AttendFn kAttendScalar;
const AttendFn kAttendScalar = attend_scalar;

}  // namespace kestrel::cpu
