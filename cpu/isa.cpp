// Instruction-set detection and the process-wide choice (isa.h).
#include "cpu/isa.h"

#include <cstddef>
#include <cstdlib>
#include <iterator>

namespace kestrel::cpu {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvxVnni: return "avxvnni";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa isa : kAllIsas) {
    if (isa_name(isa) == name) return isa;
  }
  return std::nullopt;
}

namespace {

bool features_of(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case Isa::kAvxVnni: return features_of(Isa::kAvx2) && __builtin_cpu_supports("avxvnni");
    case Isa::kAvx512:
      return features_of(Isa::kAvx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

}  // namespace

bool isa_supported(Isa isa) {
  // Each level's feature checks once per process: callers on hot paths (the activation quantizer, per vector) ask
  // this on every call.
  static const bool supported[] = {features_of(Isa::kScalar), features_of(Isa::kAvx2), features_of(Isa::kAvxVnni),
                                   features_of(Isa::kAvx512)};
  const auto i = static_cast<size_t>(isa);
  return i < std::size(supported) && supported[i];
}

Isa isa_choose(std::string_view request) {
  // The best supported level at or below the request (any level when the request names none). Levels are not
  // nested in every CPU (an AVX-512 VNNI part may lack AVX-VNNI), so each is checked on its own.
  const std::optional<Isa> asked = isa_from_name(request);
  Isa best = Isa::kScalar;
  for (Isa isa : kAllIsas) {
    if (asked && static_cast<int>(isa) > static_cast<int>(*asked)) break;
    if (isa_supported(isa)) best = isa;
  }
  return best;
}

Isa isa_selected() {
  static const Isa chosen = [] {
    const char* env = std::getenv("KESTREL_CPU_ISA");
    return isa_choose(env != nullptr ? std::string_view(env) : std::string_view());
  }();
  return chosen;
}

}  // namespace kestrel::cpu
