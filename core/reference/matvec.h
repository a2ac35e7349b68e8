// Reference matrix-vector products over raw GGUF weights (model-spec.md §6.2 shapes, §6.4 types).
//
// A QuantMatrix is a non-owning view of one 2-D weight in its raw ggml block layout: ggml ne {n_in, n_out}, i.e.
// n_out rows of n_in elements (PyTorch [out, in] row-major), each row ggml_row_bytes(type, n_in) bytes. Products
// dequantize one row at a time with core/quant dequantize_row and take an f32 dot product in index order (see the
// numerics policy in activations.h), so y[o] = Σ_i dequant(w)[o][i] · x[i] exactly as written, for every type.
// A QuantExperts is the 3-D stack {n_in, n_out, E} of a MoE expert tensor; expert_matrix() slices expert e.
//
// Errors: kInvalidArgument (null data, n_in not a multiple of the type's block), kUnsupported (a type core/quant
// cannot dequantize), kOutOfRange (expert index). Views never own their bytes: the file mapping (or test buffer)
// must outlive them. All functions are pure and thread-safe; they allocate one row of scratch per call.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"

namespace kestrel::ref {

struct QuantMatrix {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;  // n_out rows of ggml_row_bytes(type, n_in) bytes
  uint64_t n_in = 0;              // ne0: elements per row (input features)
  uint64_t n_out = 0;             // ne1: rows (output features)
};

struct QuantExperts {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;  // n_expert matrices of n_out rows, expert-major
  uint64_t n_in = 0;              // ne0
  uint64_t n_out = 0;             // ne1
  uint64_t n_expert = 0;          // ne2
};

// A view of f32 weights (tests, and F32 tensors such as the router). `data`: f32 [n_out, n_in].
QuantMatrix f32_matrix(const float* data, uint64_t n_in, uint64_t n_out);

// Checks type, data pointer and row geometry; returns the bytes of one row.
Expected<uint64_t> matrix_row_bytes(const QuantMatrix& w);

// kInvalidArgument unless w has data and shape {n_in, n_out}; the message names the tensor role and both shapes.
Status check_matrix(const QuantMatrix& w, std::string_view name, uint64_t n_in, uint64_t n_out);

// The matrix of expert e: data + e · n_out · row_bytes. kOutOfRange when e >= n_expert.
Expected<QuantMatrix> expert_matrix(const QuantExperts& w, uint64_t e);

// y = W x. x: f32 [n_in]; y: f32 [n_out] (must not alias x).
Status matvec(const QuantMatrix& w, const float* x, float* y);

// y[t] = W x[t] for t < n_tok. x: f32 [n_tok, n_in]; y: f32 [n_tok, n_out] (must not alias x).
// Each row is dequantized once for the whole batch; every y[t] is bit-identical to matvec(w, x[t]).
Status matvec_batch(const QuantMatrix& w, const float* x, int n_tok, float* y);

}  // namespace kestrel::ref
