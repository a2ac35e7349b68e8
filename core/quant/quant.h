// Scalar (de)quantizers for the GGUF block formats Kestrel computes with, bit-exact with llama.cpp's semantics.
//
// These are the reference every CPU and GPU kernel is tested against; they favour clarity over speed.
// Dequantize: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K. Quantize: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
// `n` counts elements and must be a multiple of the type's block size (kInvalidArgument otherwise).
// Other errors: kUnsupported for a type outside the lists above; quantizing NaN/inf into a block format is
// kInvalidArgument, and values whose f16 block scale would overflow are kOutOfRange. Q8_0/Q4_0 quantize exactly as
// ggml's reference quantizers; the K-quants follow their approach without being byte-identical.
// Pure functions: thread-safe, no allocation beyond their own stack.
#pragma once

#include <cstdint>
#include <span>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"

namespace kestrel {

bool quant_can_dequantize(GgmlType type);
bool quant_can_quantize(GgmlType type);

// dst: f32 [n]; src: ggml_row_bytes(type, n) bytes.
Status dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
// dst: ggml_row_bytes(type, n) bytes; src: f32 [n].
Status quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN).
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

}  // namespace kestrel
