// Views of weights held in their raw GGUF block layout at device-usable addresses (device memory, or mapped
// page-locked host memory for the hybrid layer's side read): the shapes every kernel entry point takes. Not owned.
#pragma once

#include <cstdint>

#include "core/gguf/ggml_type.h"

namespace kestrel::gpu {

// A matrix: n_rows rows of n_cols elements (ggml ne0 = n_cols, ne1 = n_rows), each row ggml_row_bytes(type, n_cols)
// bytes, rows back to back.
struct DeviceMatrixView {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;  // device; 2-byte aligned (4 for F32)
  int64_t n_cols = 0;
  int64_t n_rows = 0;
};

// A stack of n_expert such matrices, expert-major (ggml ne2 = n_expert).
struct DeviceExpertsView {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;  // device; 2-byte aligned (4 for F32)
  int64_t n_cols = 0;
  int64_t n_rows = 0;
  int64_t n_expert = 0;
};

}  // namespace kestrel::gpu
