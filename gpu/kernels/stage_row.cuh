// stage_row.cuh: a warp copies a chunk of a raw GGUF row (blocks of any ggml type) into its slice of shared memory
// with coalesced 16-byte loads, reading no byte outside the chunk. Shared by the raw-block GEMV (gpu/kernels/gemv.cu)
// and the raw-block MoE experts (gpu/kernels/moe_experts.cu). Device code only; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels/dequant.cuh"

namespace kestrel::gpu::stage_row {

// 16-byte units that cover `bytes` starting anywhere up to 14 bytes into the first unit (block sizes are even).
constexpr int units_for(int bytes) { return (bytes + 14 + 15) / 16; }

// The aligned 16-byte unit at `unit`, keeping only the bytes in [lo, hi) (both even) and zeros elsewhere, so no byte
// outside the row is read. Streaming loads: the weight is read once.
__device__ __forceinline__ uint4 load_unit(uintptr_t unit, uintptr_t lo, uintptr_t hi) {
  if (unit >= lo && unit + 16 <= hi) return __ldcs(reinterpret_cast<const uint4*>(unit));
  uint32_t word[4] = {0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uintptr_t at = unit + 2 * static_cast<uintptr_t>(k);
    if (at >= lo && at < hi) {
      const uint32_t half = __ldcs(reinterpret_cast<const unsigned short*>(at));
      word[k / 2] |= half << (16 * (k % 2));
    }
  }
  return make_uint4(word[0], word[1], word[2], word[3]);
}

// Copies the raw bytes of elements [base, base + elems) of a row (base a multiple of T's block size, elems at most
// 32·kUnitsPerLane units' worth) into `slice` (consecutive lanes, consecutive units) and returns where the chunk's
// first block starts in the slice. Warp-synchronous: every lane calls it; the slice may hold the previous chunk.
template <GgmlType T, int kUnitsPerLane>
__device__ __forceinline__ const uint8_t* stage_chunk(const uint8_t* row, int64_t base, int elems, uint4* slice,
                                                      int lane) {
  using D = Dequant<T>;
  const uintptr_t lo =
      reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>(base / D::kBlockElems) * sizeof(typename D::Block);
  const uintptr_t hi = lo + static_cast<uintptr_t>(elems / D::kBlockElems) * sizeof(typename D::Block);
  const uintptr_t first = lo & ~static_cast<uintptr_t>(15);
  const int units = static_cast<int>((hi - first + 15) / 16);
  uint4 raw[kUnitsPerLane];
#pragma unroll
  for (int k = 0; k < kUnitsPerLane; ++k) {
    const int u = lane + 32 * k;
    if (u < units) raw[k] = load_unit(first + 16 * static_cast<uintptr_t>(u), lo, hi);
  }
  __syncwarp();  // every lane is done reading the previous chunk from the slice
#pragma unroll
  for (int k = 0; k < kUnitsPerLane; ++k) {
    const int u = lane + 32 * k;
    if (u < units) slice[u] = raw[k];
  }
  __syncwarp();
  return reinterpret_cast<const uint8_t*>(slice) + (lo - first);
}

}  // namespace kestrel::gpu::stage_row
