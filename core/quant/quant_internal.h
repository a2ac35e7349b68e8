// Internal to core/quant: the per-format row kernels behind quant.cpp's dispatch, and the helpers the K-quant
// formats share (6-bit scale packing, the sub-block scale/min fits). Not part of Kestrel's public API.
//
// Every row kernel takes whole blocks and has had its arguments checked by quant.cpp (non-null pointers, n a
// non-negative multiple of the block size). Blocks are read and written through memcpy, so src/dst need no alignment.
// Quantizers return an error for input they cannot represent (NaN/inf, scales past the f16 range).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/base/expected.h"

namespace kestrel::quant_internal {

// ---- plain types (fp16.cpp). n: elements. -----------------------------------------------------------------------
void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void quantize_f32(const float* src, void* dst, int64_t n);
void quantize_f16(const float* src, void* dst, int64_t n);
void quantize_bf16(const float* src, void* dst, int64_t n);

// ---- block types (one file each). nb: blocks; src/dst f32 [nb * block elements]. --------------------------------
void dequantize_q8_0(const void* src, float* dst, int64_t nb);
void dequantize_q4_0(const void* src, float* dst, int64_t nb);
void dequantize_q4_k(const void* src, float* dst, int64_t nb);
void dequantize_q5_k(const void* src, float* dst, int64_t nb);
void dequantize_q6_k(const void* src, float* dst, int64_t nb);
Status quantize_q8_0(const float* src, void* dst, int64_t nb);
Status quantize_q4_0(const float* src, void* dst, int64_t nb);
Status quantize_q4_k(const float* src, void* dst, int64_t nb);
Status quantize_q5_k(const float* src, void* dst, int64_t nb);
Status quantize_q6_k(const float* src, void* dst, int64_t nb);

// ---- shared helpers (kquant_common.cpp) --------------------------------------------------------------------------

// kInvalidArgument naming the first NaN/inf element of x [n], for quantizers whose scales cannot carry them.
Status check_finite(const float* x, int64_t n, std::string_view type_name);
// kOutOfRange when a block scale rounded to f16 is not finite (the block's values are too large for the format).
Status check_scale_finite(uint16_t scale_f16, int64_t block, std::string_view type_name);

// v clamped to [lo, hi] (NaN -> lo), then rounded to nearest, ties to even.
int round_clamped(float v, int lo, int hi);

// Q4_K/Q5_K pack 8 six-bit scales and 8 six-bit mins into 12 bytes: sub-blocks 0..3 sit in the low 6 bits of
// bytes 0..3 (scales) and 4..7 (mins); sub-blocks 4..7 keep their low 4 bits in bytes 8..11 (scale low nibble,
// min high nibble) and their top 2 bits in the top bits of bytes 0..3 (scale) and 4..7 (min) of sub-block j-4.
// This is ggml's get_scale_min_k4.
void k4_get_scale_min(int j, const uint8_t* packed, uint8_t* scale, uint8_t* min);
// Inverse of k4_get_scale_min for one sub-block; `packed` must start zeroed; scale, min < 64.
void k4_put_scale_min(int j, uint8_t scale, uint8_t min, uint8_t* packed);

// Fits x [n] ≈ scale * levels - min_out with levels integers in [0, nmax], scale >= 0, min_out >= 0, minimising the
// weighted squared error sum w (scale * levels + (-min_out) - x)^2 over a grid of candidate step sizes; writes the
// levels of the best fit. All-equal non-positive x gives scale 0 and min_out = -x.
float fit_scale_min(const float* x, const float* w, int n, int nmax, uint8_t* levels, float* min_out);
// Fits x [n] ≈ scale * levels with levels integers in [-nmax, nmax - 1] (the element of largest magnitude lands on
// -nmax), weights x^2; returns the (signed) scale, 0 for an all-zero x.
float fit_scale_symmetric(const float* x, int n, int nmax);

// Q4_K and Q5_K share everything but the quant width: per 32-element sub-block fits of (scale, min), 6-bit
// quantisation of both against the block's f16 d/dmin, then requantisation of x [256] with the stored scales.
// Writes d, dmin, packed scales [12] and the quants levels [256] in [0, nmax].
Status quantize_k4_superblock(const float* x, int nmax, int64_t block, std::string_view type_name, uint16_t* d,
                              uint16_t* dmin, uint8_t* packed_scales, uint8_t* levels);

}  // namespace kestrel::quant_internal
