// Instruction-set levels of the CPU kernels and the one run-time choice among them.
//
// Each level is one translation unit compiled with its own flags (gemv_scalar.cpp, gemv_avx2.cpp, gemv_avxvnni.cpp,
// gemv_avx512.cpp); isa_supported() checks the CPU's features (__builtin_cpu_supports, once per level and process) and
// isa_selected() picks the best supported level once per process, lowered by the environment variable
// KESTREL_CPU_ISA=scalar|avx2|avxvnni|avx512 (to the best level the CPU has at or below the one named; an unknown value
// is ignored). Pure and thread-safe.
#pragma once

#include <optional>
#include <string_view>

namespace kestrel::cpu {

enum class Isa {
  kScalar,   // plain C++, no vector flags
  kAvx2,     // AVX2 + FMA + F16C
  kAvxVnni,  // that + AVX-VNNI (256-bit vpdpbusd / vpdpwssd: Alder Lake and later client cores, Zen 5)
  kAvx512,   // AVX-512 F/BW/VL/VNNI/BF16
};

inline constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512};

std::string_view isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);

// Whether this CPU executes every instruction the level's translation unit is compiled for.
bool isa_supported(Isa isa);

// The best supported level at or below `request` (KESTREL_CPU_ISA's value), or the best supported level when the
// request names no level.
Isa isa_choose(std::string_view request);

// isa_choose(getenv("KESTREL_CPU_ISA")), computed on the first call and fixed for the process.
Isa isa_selected();

}  // namespace kestrel::cpu
