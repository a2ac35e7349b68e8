// Whole-vocabulary scans over a logits vector: the maximum, the greedy argmax, and the validity check of the
// checked entry point (docs/sampling.md §1, §6).
//
// Each is one pass over f32 [n_vocab] in 4-wide vectors (GCC/Clang vector extensions, which lower to SSE2 on
// x86-64 and NEON on aarch64), because they run on every sampled token: 248k logits in 20-50 µs each.
// Pure functions over borrowed spans, thread-safe.
#pragma once

#include <cstdint>
#include <span>

namespace kestrel {

// The largest value, NaN ignored; -inf when there is none.
float max_logit_of(std::span<const float> logits);

// Greedy choice: index of the largest logit, the lowest index among equal maxima. NaN is never chosen; returns 0
// when no logit is > -inf.
int32_t argmax_lowest(std::span<const float> logits);

struct LogitScan {
  bool any_nan_or_pos_inf = false;  // a value the sampler refuses
  bool any_unmasked = false;        // at least one logit that is finite (not -inf)
};
LogitScan scan_logits(std::span<const float> logits);

}  // namespace kestrel
