// get_rows: gather rows of a matrix kept on the device in its raw GGUF block layout, as f32 (the embedding lookup).
//
// Types: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K; the values are bit-identical to core's
// dequantize_row on the same bytes (gpu/kernels/dequant.cuh says how). Out-of-range ids never read outside the matrix:
//   get_rows            validates a host copy of the ids before it launches (kOutOfRange naming the first bad id),
//   get_rows_device_ids for ids that exist only on the device (e.g. inside a CUDA graph): a bad id yields a row
//                       of quiet NaNs and is counted in *bad_ids (device int32, optional), so the caller can report.
// Both enqueue one kernel on `stream` and return without waiting; errors found before the launch leave dst
// untouched. Thread-safe (no shared state); the caller keeps src, ids and dst alive until the stream has run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "gpu/kernels/device_views.h"

namespace kestrel::gpu {

bool get_rows_supports(GgmlType type);

// dst: device f32 [ids_host.size(), src.n_cols]; ids_dev: device int32 [ids_host.size()] holding the same values
// as ids_host (a host copy the caller already has, e.g. the token ids it uploaded).
Status get_rows(const DeviceMatrixView& src, std::span<const int32_t> ids_host, const int32_t* ids_dev, float* dst,
                cudaStream_t stream);

// dst: device f32 [n_ids, src.n_cols]; ids_dev: device int32 [n_ids]; bad_ids: device int32 [1] or null, to which
// the kernel adds the number of ids outside [0, n_rows) (the caller zeroes it when it wants a fresh count).
Status get_rows_device_ids(const DeviceMatrixView& src, const int32_t* ids_dev, int64_t n_ids, float* dst,
                           int32_t* bad_ids, cudaStream_t stream);

}  // namespace kestrel::gpu
