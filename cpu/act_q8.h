// Activations quantized to int8 for the int8 GEMV kernels (gemv.h: kernels whose input is kQ8 or kQ8K), in two
// forms, each computed only when a kernel of the product reads it.
//
// kQ8, per 32-element block (Q4_0 and Q8_0 weights: each weight block has its own scale, so each activation block
// may too). Each vector of n_in f32 values (n_in a multiple of 32) becomes, per block b of 32 elements:
//   d_b = max_i |x_i| / 127,  q_i = nearbyint(x_i / d_b) in [−127, 127]   (d_b = 0 and q = 0 for an all-zero block;
//                                                                          ties to even, as cvtps2dq rounds)
// and three derived arrays the kernels read instead of recomputing them per weight row:
//   dl:  f32   [n_in / 4]   d_b repeated over the block's 8 lanes of 4 elements (one 32-bit lane of a VNNI dot)
//   ns4: int32 [n_in / 4]   −(q_4l + q_4l+1 + q_4l+2 + q_4l+3): with a weight format stored as unsigned u = w + c,
//                            Σ u·q + c·ns4 = Σ w·q per lane, exactly (Q4_0 c = 8, Q6_K 32, Q8_0 128)
//   ds:  f32   [n_in / 32]  d_b · Σ_block q
//   d:   f32   [n_in / 32]  d_b itself, one per block (the AVX-512 kernels at one vector multiply 8 blocks' weight
//                            scales by 8 of these with one multiply, not one per pair of blocks)
//   nq:  int32 [n_in / 8]   8 · (ns4_l + ns4_{l+4}) for l < 4 of each block (4 per block): the offset-8 term of the
//                            AVX-512 Q4_0 kernel's lanes, each of which sums elements 4l..4l+3 and 16+4l..16+4l+3
//
// kQ8K, per 256-element super-block (the K-quants: Q4_K, Q5_K, Q6_K, whose sub-block scales are small integers, so
// with one activation scale per super-block a kernel sums Σ sc_j · Σ_{i∈j} u_i·q_i in integers and converts once
// per super-block; ggml's q8_K is this form). Per super-block s of 256 elements (n_in a multiple of 256):
//   dk_s = max_i |x_i| / 127,  qk_i = nearbyint(x_i / dk_s)                (the same rounding as kQ8)
//   bsum: int16 [n_in / 16]  Σ of each 16 consecutive qk (|bsum| <= 2032): the K-quants' min and offset terms
// The rounding step is up to 8× coarser than kQ8's where a super-block's blocks differ in scale.
//
// So an int8 kernel computes Σ_i w_i · x̃_i with x̃_i = q_i · d, the dequantized activations of its form: it equals
// ref::matvec_batch(W, x̃) up to f32 summation order, and x̃ differs from x by at most d / 2 per element, d/2 =
// max|x| / 254 over the element's block (kQ8) or super-block (kQ8K). (ggml's q8_0 / q8_K activations are these
// blocks; it rounds ties away from zero.)
//
// Thread-safety: the quantize functions write only their outputs. ActQ8Buffer is a plain owner, one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/isa.h"

namespace kestrel::cpu {

inline constexpr int64_t kActQ8Block = 32;
inline constexpr int64_t kActQ8KBlock = 256;
inline constexpr int64_t kActQ8KSum = 16;  // elements per bsum

// Read-only view of n_vec quantized vectors of n_in elements (vector v's arrays start at v · their per-vector size).
// The kQ8 arrays are null unless that form was reserved, the kQ8K ones likewise.
struct ActQ8View {
  const int8_t* q = nullptr;      // kQ8: int8 [n_vec, n_in]
  const float* dl = nullptr;      // kQ8: f32 [n_vec, n_in / 4]
  const int32_t* ns4 = nullptr;   // kQ8: int32 [n_vec, n_in / 4]
  const float* ds = nullptr;      // kQ8: f32 [n_vec, n_in / 32]
  const float* d = nullptr;       // kQ8: f32 [n_vec, n_in / 32]
  const int32_t* nq = nullptr;    // kQ8: int32 [n_vec, n_in / 8]
  const int8_t* qk = nullptr;     // kQ8K: int8 [n_vec, n_in]
  const float* dk = nullptr;      // kQ8K: f32 [n_vec, n_in / 256]
  const int16_t* bsum = nullptr;  // kQ8K: int16 [n_vec, n_in / 16]
};

// Which forms a buffer holds.
struct ActQ8Forms {
  bool block32 = false;   // kQ8
  bool block256 = false;  // kQ8K (n_in a multiple of 256)
};

// Grow-only storage for one quantized batch.
class ActQ8Buffer {
 public:
  // Sizes the arrays of the asked forms for n_vec vectors of n_in elements (never shrinks) and returns their view
  // (the arrays of a form not asked are null in it).
  ActQ8View reserve(int64_t n_vec, int64_t n_in, ActQ8Forms forms = {true, false});
  int8_t* q() { return q_.data(); }
  float* dl() { return dl_.data(); }
  int32_t* ns4() { return ns4_.data(); }
  float* ds() { return ds_.data(); }
  float* d() { return d_.data(); }
  int32_t* nq() { return nq_.data(); }
  int8_t* qk() { return qk_.data(); }
  float* dk() { return dk_.data(); }
  int16_t* bsum() { return bsum_.data(); }

 private:
  std::vector<int8_t> q_;
  std::vector<float> dl_;
  std::vector<int32_t> ns4_;
  std::vector<float> ds_;
  std::vector<float> d_;
  std::vector<int32_t> nq_;
  std::vector<int8_t> qk_;
  std::vector<float> dk_;
  std::vector<int16_t> bsum_;
};

// Quantizes vectors [v_begin, v_end) of x: f32 [n_vec, n_in] into `out`'s kQ8 arrays (sized by reserve for n_vec,
// n_in), with the plain scalar operations above. `isa` picks the code (AVX-512: 16 lanes at a time; the other
// levels: scalar); every level writes the same bytes, so every level's kernels read the same activations.
void act_q8_quantize(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out,
                     Isa isa = isa_selected());

// The same into the kQ8K arrays (n_in a multiple of 256).
void act_q8k_quantize(const float* x, int64_t n_in, int64_t v_begin, int64_t v_end, ActQ8Buffer& out,
                      Isa isa = isa_selected());

}  // namespace kestrel::cpu
