// exp_portable: e^x in f32 from + - * and exact bit operations only, so every IEEE-754 platform returns the same
// bits.
//
// The draw turns logits into weights with exp. std::exp comes from the platform's libm (glibc, musl, Apple, MSVC),
// and their last-bit differences could, rarely, move a draw across a boundary: the same seed would then give a
// different token on another machine. This function avoids libm: Cody–Waite reduction x = k·ln2 + r with
// |r| <= ln2/2 (k by the round-to-nearest "shifter" trick), a degree-7 Taylor polynomial for e^r (truncation error
// < 4e-9 relative) and 2^k built from its bits. Accuracy: within 2 ulp of the correctly rounded f32 result
// (tests/core/sampler/test_portable_exp.cpp). f32 rather than f64 because a weight only needs to be far more exact
// than the logits it comes from (f32 themselves), and four f32 lanes per SSE2 register make a 248k-entry
// vocabulary pass about four times cheaper. No branches and no calls, so loops over a vocabulary vectorize.
//
// Bit-for-bit portability needs the caller's translation unit compiled without floating-point contraction: a fused
// multiply-add rounds differently. core/sampler/CMakeLists.txt builds every sampler source with -ffp-contract=off;
// code elsewhere should call the out-of-line exp_portable() rather than include the inline form.
// Pure functions, thread-safe.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace kestrel {

// e^x. Returns 0 for x < -87 (e^-87 ≈ 1.6e-38, the bottom of the normal f32 range: such weights are 0 next to the
// best token's 1), +inf for x > 88, NaN for NaN. Out of line, compiled with -ffp-contract=off.
float exp_portable(float x);

namespace sampler_detail {

// The inline form of exp_portable, for sampler translation units only (see above).
inline float exp_portable_inline(float x) {
  constexpr float kLog2e = 0x1.715476p0f;
  // ln 2 split so that k * kLn2Hi is exact for |k| < 256 (kLn2Hi has 16 significant bits).
  constexpr float kLn2Hi = 0x1.62e4p-1f;
  constexpr float kLn2Lo = 0x1.7f7d1cp-20f;
  constexpr float kShifter = 0x1.8p23f;  // adding it rounds to an integer held in the low mantissa bits
  constexpr float kInvFact2 = 1.0f / 2, kInvFact3 = 1.0f / 6, kInvFact4 = 1.0f / 24, kInvFact5 = 1.0f / 120,
                  kInvFact6 = 1.0f / 720;
  constexpr float kInvFact7 = 1.0f / 5040;

  // Selects, not branches, so loops vectorize. NaN passes through every step and comes out NaN.
  float xc = x < -87.0f ? -87.0f : x;  // keeps 2^k a normal f32: k in [-126, 127]
  xc = xc > 88.0f ? 88.0f : xc;
  const float shifted = xc * kLog2e + kShifter;
  const float k = shifted - kShifter;  // nearest integer to x / ln 2, exactly
  const float r = (xc - k * kLn2Hi) - k * kLn2Lo;
  float p = kInvFact7;
  p = p * r + kInvFact6;
  p = p * r + kInvFact5;
  p = p * r + kInvFact4;
  p = p * r + kInvFact3;
  p = p * r + kInvFact2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t k_bits = std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kShifter);  // k mod 2^32
  const float scale = std::bit_cast<float>((k_bits + 127u) << 23);
  float value = p * scale;
  value = x < -87.0f ? 0.0f : value;
  value = x > 88.0f ? std::numeric_limits<float>::infinity() : value;
  return value;
}

}  // namespace sampler_detail
}  // namespace kestrel
