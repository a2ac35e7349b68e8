// Rng: the sampler's pseudo-random stream, xoshiro256** (Blackman & Vigna, 2018) seeded by splitmix64.
//
// Why not std::mt19937 + std::uniform_real_distribution: the engines are specified, but the distributions are
// implementation-defined, so libstdc++ and libc++ turn the same seed into different tokens. Everything here is
// integer arithmetic spelled out in this file, and next_double() is the top 53 bits times 2^-53, so one seed
// gives one stream on every compiler and CPU. The stream is part of Kestrel's reproducibility contract: changing
// it changes every seeded generation (tests/core/sampler/test_rng.cpp pins its first outputs).
//
// A small value type (32 bytes of state); copying it forks the stream. Not thread-safe; one per session.
#pragma once

#include <array>
#include <cstdint>

#include "core/base/expected.h"

namespace kestrel {

// One splitmix64 step: advances *state by the golden-ratio increment and returns the mixed value.
uint64_t splitmix64_next(uint64_t* state);

class Rng {
 public:
  using State = std::array<uint64_t, 4>;

  // State words are four successive splitmix64 outputs from `seed` (Vigna's recommended seeding; never all zero).
  explicit Rng(uint64_t seed);
  // Restores a state saved with state(); kInvalidArgument for the all-zero state, which xoshiro cannot leave.
  static Expected<Rng> from_state(const State& state);

  uint64_t next_u64();
  // Uniform in [0, 1): (next_u64() >> 11) * 2^-53. Consumes exactly one next_u64().
  double next_double();

  const State& state() const { return s_; }

 private:
  Rng() = default;
  State s_{};
};

}  // namespace kestrel
