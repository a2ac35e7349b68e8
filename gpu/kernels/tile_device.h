// tile_stack_device: the re-tiling of tile_matrix_stack (gpu/memory/tiled_matrix.h) on the device, for raw GGUF
// matrices copied there as they are in the file (a prompt pass's routed experts uploaded from host memory,
// gpu/engine/expert_upload.h). The layout comes from gpu/memory/tile_pieces.h, the host tiler's own definition, so the
// bytes equal tile_matrix's.
//
// Enqueues one kernel on `stream` and returns without waiting; the caller keeps raw and out alive until it has run.
// Thread-safe (no shared state).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"

namespace kestrel::gpu {

// Slices [first, first + count) of a stack of n_rows × n_cols matrices of `type`: raw slice s at raw + s · S (GGUF
// rows back to back), its tiled form at out + s · S, S = tiled_bytes(type, n_cols, n_rows) (raw and tiled sizes are
// equal). Device pointers, raw any alignment, out 16-byte aligned. kInvalidArgument when tiled_supports refuses the
// shape, a pointer is null or misaligned, or first / count is negative; count 0 enqueues nothing.
Status tile_stack_device(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, int64_t first, int64_t count,
                         void* out, cudaStream_t stream);

}  // namespace kestrel::gpu
