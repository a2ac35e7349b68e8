// gemv_q4 (internal to gpu/kernels/gemv.cu): the v2 GEMV kernel for Q4_0 and Q4_K weights whose rows are whole 16-byte
// units (n_cols a multiple of 256) on 16-byte aligned weight and activation pointers; gemv() sends these here and
// keeps every other case on the v1 kernel. Same contract as gemv() (gemv.h): each weight element dequantized
// exactly as core's dequantize_row, f32 accumulation in an order fixed by the shape, no atomics, y[v] independent
// of n_vec. docs/gpu.md ("GEMV over raw blocks") describes the layout.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "gpu/kernels/device_views.h"

namespace kestrel::gpu::detail {

// True when gemv_q4 takes this call: Q4_0/Q4_K, n_cols > 0 and a multiple of 256, w and x 16-byte aligned.
// Depends only on the matrix and x, never on n_vec.
bool gemv_q4_applies(const DeviceMatrixView& w, const float* x);

// Enqueues the kernel; arguments already checked by gemv() (n_rows > 0, n_vec in [1, kGemvMaxVectors]).
// x: f32 [n_vec, n_cols]; y: f32 [n_vec, n_rows]. Thread-safe; returns without waiting.
Status gemv_q4(const DeviceMatrixView& w, int64_t row_bytes, const float* x, int n_vec, float* y, cudaStream_t stream);

}  // namespace kestrel::gpu::detail
