#include "core/gguf/ggml_type.h"

#include <array>
#include <cctype>
#include <string>

namespace kestrel {
namespace {

struct Entry {
  GgmlType type;
  GgmlTypeTraits traits;
};

// Block geometry from ggml's type_traits (ggml.c) and block structs (ggml-common.h).
constexpr std::array<Entry, 32> kTypes = {{
    {GgmlType::kF32, {"f32", 1, 4}},
    {GgmlType::kF16, {"f16", 1, 2}},
    {GgmlType::kQ4_0, {"q4_0", 32, 18}},
    {GgmlType::kQ4_1, {"q4_1", 32, 20}},
    {GgmlType::kQ5_0, {"q5_0", 32, 22}},
    {GgmlType::kQ5_1, {"q5_1", 32, 24}},
    {GgmlType::kQ8_0, {"q8_0", 32, 34}},
    {GgmlType::kQ8_1, {"q8_1", 32, 36}},
    {GgmlType::kQ2_K, {"q2_K", 256, 84}},
    {GgmlType::kQ3_K, {"q3_K", 256, 110}},
    {GgmlType::kQ4_K, {"q4_K", 256, 144}},
    {GgmlType::kQ5_K, {"q5_K", 256, 176}},
    {GgmlType::kQ6_K, {"q6_K", 256, 210}},
    {GgmlType::kQ8_K, {"q8_K", 256, 292}},
    {GgmlType::kIQ2_XXS, {"iq2_xxs", 256, 66}},
    {GgmlType::kIQ2_XS, {"iq2_xs", 256, 74}},
    {GgmlType::kIQ3_XXS, {"iq3_xxs", 256, 98}},
    {GgmlType::kIQ1_S, {"iq1_s", 256, 50}},
    {GgmlType::kIQ4_NL, {"iq4_nl", 32, 18}},
    {GgmlType::kIQ3_S, {"iq3_s", 256, 110}},
    {GgmlType::kIQ2_S, {"iq2_s", 256, 82}},
    {GgmlType::kIQ4_XS, {"iq4_xs", 256, 136}},
    {GgmlType::kI8, {"i8", 1, 1}},
    {GgmlType::kI16, {"i16", 1, 2}},
    {GgmlType::kI32, {"i32", 1, 4}},
    {GgmlType::kI64, {"i64", 1, 8}},
    {GgmlType::kF64, {"f64", 1, 8}},
    {GgmlType::kIQ1_M, {"iq1_m", 256, 56}},
    {GgmlType::kBF16, {"bf16", 1, 2}},
    {GgmlType::kTQ1_0, {"tq1_0", 256, 54}},
    {GgmlType::kTQ2_0, {"tq2_0", 256, 66}},
    {GgmlType::kMXFP4, {"mxfp4", 32, 17}},
}};

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type) {
  for (const Entry& e : kTypes) {
    if (static_cast<uint32_t>(e.type) == raw_type) return e.traits;
  }
  return std::nullopt;
}

GgmlTypeTraits ggml_type_traits(GgmlType type) {
  auto t = ggml_type_traits(static_cast<uint32_t>(type));
  return t ? *t : GgmlTypeTraits{"invalid", 1, 0};
}

std::string_view ggml_type_name(GgmlType type) { return ggml_type_traits(type).name; }

Expected<GgmlType> ggml_type_from_name(std::string_view name) {
  std::string known;
  for (const Entry& e : kTypes) {
    if (iequal(e.traits.name, name)) return e.type;
  }
  for (const Entry& e : kTypes) {
    if (!known.empty()) known += ", ";
    known += e.traits.name;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown tensor type '" + std::string(name) + "' (known: " + known + ")");
}

Expected<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n_elems) {
  const GgmlTypeTraits t = ggml_type_traits(type);
  if (t.block_bytes == 0) return make_error(ErrorCode::kInvalidArgument, "invalid tensor type");
  if (n_elems % t.block_elems != 0) {
    return make_error(ErrorCode::kInvalidArgument, "row of " + std::to_string(n_elems) +
                                                       " elements is not a multiple of " + std::string(t.name) +
                                                       "'s block of " + std::to_string(t.block_elems));
  }
  return n_elems / t.block_elems * t.block_bytes;
}

}  // namespace kestrel
