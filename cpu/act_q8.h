// Activations quantized per 32-element block for the int8 GEMV kernels (gemv.h: kernels whose input is kQ8).
//
// Each vector of n_in f32 values (n_in a multiple of 32) becomes, per block b of 32 elements:
//   d_b = max_i |x_i| / 127,  q_i = nearbyint(x_i / d_b) in [−127, 127]   (d_b = 0 and q = 0 for an all-zero block;
//                                                                          ties to even, as cvtps2dq rounds)
// and three derived arrays the kernels read instead of recomputing them per weight row:
//   dl:  f32   [n_in / 4]   d_b repeated over the block's 8 lanes of 4 elements (one 32-bit lane of a VNNI dot)
//   ns4: int32 [n_in / 4]   −(q_4l + q_4l+1 + q_4l+2 + q_4l+3): with a weight format stored as unsigned u = w + c,
//                            Σ u·q + c·ns4 = Σ w·q per lane, exactly (Q4_0 c = 8, Q6_K 32, Q8_0 128)
//   ds:  f32   [n_in / 32]  d_b · Σ_block q (the K-quant min terms: dmin·m_j·ds_j)
// So an int8 kernel computes Σ_i w_i · x̃_i with x̃_i = q_i · d_b, the dequantized activation: it equals
// ref::matvec_batch(W, x̃) up to f32 summation order, and x̃ differs from x by at most d_b / 2 = max|x_block| / 254
// per element. (ggml's q8_0 activations are the same blocks; it rounds ties away from zero.)
//
// Thread-safety: act_q8_quantize writes only its outputs. ActQ8Buffer is a plain owner, one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

namespace kestrel::cpu {

inline constexpr int64_t kActQ8Block = 32;

// Read-only view of n_vec quantized vectors of n_in elements (vector v's arrays start at v · their per-vector size).
struct ActQ8View {
  const int8_t* q = nullptr;     // int8 [n_vec, n_in]
  const float* dl = nullptr;     // f32 [n_vec, n_in / 4]
  const int32_t* ns4 = nullptr;  // int32 [n_vec, n_in / 4]
  const float* ds = nullptr;     // f32 [n_vec, n_in / 32]
};

// Grow-only storage for one quantized batch.
class ActQ8Buffer {
 public:
  // Sizes the arrays for n_vec vectors of n_in elements (never shrinks) and returns their view.
  ActQ8View reserve(int64_t n_vec, int64_t n_in);
  int8_t* q() { return q_.data(); }
  float* dl() { return dl_.data(); }
  int32_t* ns4() { return ns4_.data(); }
  float* ds() { return ds_.data(); }

 private:
  std::vector<int8_t> q_;
  std::vector<float> dl_;
  std::vector<int32_t> ns4_;
  std::vector<float> ds_;
};

// Quantizes vectors [v_begin, v_end) of x: f32 [n_vec, n_in] into `out` (sized by reserve for n_vec, n_in), with
// the plain scalar operations above; every level's kernels read the same bytes.
void act_q8_quantize(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out);

}  // namespace kestrel::cpu
