// Scalar GEMV kernels (gemv.h): each 256-element chunk of a row is dequantized by core/quant into a stack tile and
// dotted with every vector in index order, one f32 accumulator per vector carried across the row — the same
// operations in the same order as ref::matvec_batch, hence bit-identical to it. Compiled without vector flags and
// with -ffp-contract=off (cpu/CMakeLists.txt), so it runs on any x86-64 and never fuses a multiply-add.
#include <algorithm>

#include "core/quant/quant.h"
#include "cpu/gemv.h"

namespace kestrel::cpu {
namespace {

constexpr int64_t kChunk = 256;  // elements dequantized at a time: one K-quant super-block, 8 Q4_0/Q8_0 blocks
constexpr int64_t kMaxVec = 32;  // vectors sharing one decode of a chunk

// Bytes from the start of a row to element `first` (a multiple of the type's block size).
template <GgmlType kType>
uint64_t chunk_offset(int64_t first) {
  if constexpr (kType == GgmlType::kF32) return static_cast<uint64_t>(first) * 4;
  if constexpr (kType == GgmlType::kF16 || kType == GgmlType::kBF16) return static_cast<uint64_t>(first) * 2;
  if constexpr (kType == GgmlType::kQ8_0) return static_cast<uint64_t>(first / 32) * 34;
  if constexpr (kType == GgmlType::kQ4_0) return static_cast<uint64_t>(first / 32) * 18;
  if constexpr (kType == GgmlType::kQ4_K) return static_cast<uint64_t>(first / 256) * 144;
  if constexpr (kType == GgmlType::kQ5_K) return static_cast<uint64_t>(first / 256) * 176;
  if constexpr (kType == GgmlType::kQ6_K) return static_cast<uint64_t>(first / 256) * 210;
  return 0;
}

template <GgmlType kType>
void gemv_rows_scalar(const GemvTask& t, int64_t row_begin, int64_t row_end) {
  float tile[kChunk];  // f32 [kChunk]: one dequantized chunk of a row
  float acc[kMaxVec];  // f32 [kMaxVec]: the running dot product of each vector of the group
  for (int64_t o = row_begin; o < row_end; ++o) {
    const uint8_t* row = t.w + static_cast<uint64_t>(o) * t.row_bytes;
    for (int64_t v0 = 0; v0 < t.n_vec; v0 += kMaxVec) {
      const int64_t nv = std::min(kMaxVec, t.n_vec - v0);
      std::fill(acc, acc + nv, 0.0f);
      for (int64_t base = 0; base < t.n_in; base += kChunk) {
        const int64_t len = std::min(kChunk, t.n_in - base);
        // The task was checked by gemv_task: the type dequantizes and len is a whole number of blocks.
        (void)dequantize_row(kType, row + chunk_offset<kType>(base), tile, len);
        for (int64_t v = 0; v < nv; ++v) {
          const float* x = t.x + gemv_x_row(t, v0 + v) * t.n_in + base;
          float a = acc[v];
          for (int64_t i = 0; i < len; ++i) a += tile[i] * x[i];
          acc[v] = a;
        }
      }
      for (int64_t v = 0; v < nv; ++v) t.y[(v0 + v) * t.n_out + o] = acc[v];
    }
  }
}

}  // namespace

extern const GemvKernels kGemvScalar;
const GemvKernels kGemvScalar = {
    {gemv_rows_scalar<GgmlType::kF32>},  {gemv_rows_scalar<GgmlType::kF16>},  {gemv_rows_scalar<GgmlType::kBF16>},
    {gemv_rows_scalar<GgmlType::kQ8_0>}, {gemv_rows_scalar<GgmlType::kQ4_0>}, {gemv_rows_scalar<GgmlType::kQ4_K>},
    {gemv_rows_scalar<GgmlType::kQ5_K>}, {gemv_rows_scalar<GgmlType::kQ6_K>},
};

}  // namespace kestrel::cpu
