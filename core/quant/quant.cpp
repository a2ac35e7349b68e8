// Dispatch of dequantize_row / quantize_row to the per-format kernels, with the argument checks they share.
//
// Errors: kUnsupported for a type Kestrel cannot (de)quantize (names the type and the ones it can),
// kInvalidArgument for n < 0, n not a multiple of the block size, or a null pointer with n > 0; quantizers add
// kInvalidArgument for NaN/inf input to a block format and kOutOfRange when a block's f16 scale would overflow.
#include "core/quant/quant.h"

#include <string>

#include "core/quant/blocks.h"
#include "core/quant/quant_internal.h"

namespace kestrel {
namespace {

namespace qi = quant_internal;

constexpr const char* kSupported = "f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K";

bool is_supported(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return true;
    default: return false;
  }
}

// Checks type, n and pointers; returns the number of blocks.
Expected<int64_t> check_row(GgmlType type, const void* src, const void* dst, int64_t n, const char* what) {
  if (!is_supported(type)) {
    const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
    const std::string name = traits ? std::string(traits->name) : "type " + std::to_string(static_cast<uint32_t>(type));
    return make_error(ErrorCode::kUnsupported,
                      std::string("cannot ") + what + " " + name + " (supported: " + kSupported + ")");
  }
  if (n < 0) {
    return make_error(ErrorCode::kInvalidArgument, std::string(what) + ": negative element count " + std::to_string(n));
  }
  const GgmlTypeTraits traits = ggml_type_traits(type);
  if (n % traits.block_elems != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string(what) + " " + std::string(traits.name) + ": " + std::to_string(n) +
                          " elements is not a multiple of the block of " + std::to_string(traits.block_elems));
  }
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string(what) + ": null buffer for " + std::to_string(n) + " elements");
  }
  return n / traits.block_elems;
}

}  // namespace

bool quant_can_dequantize(GgmlType type) { return is_supported(type); }
bool quant_can_quantize(GgmlType type) { return is_supported(type); }

Status dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  KESTREL_TRY_ASSIGN(const int64_t nb, check_row(type, src, dst, n, "dequantize"));
  if (n == 0) return ok_status();
  switch (type) {
    case GgmlType::kF32: qi::dequantize_f32(src, dst, n); break;
    case GgmlType::kF16: qi::dequantize_f16(src, dst, n); break;
    case GgmlType::kBF16: qi::dequantize_bf16(src, dst, n); break;
    case GgmlType::kQ8_0: qi::dequantize_q8_0(src, dst, nb); break;
    case GgmlType::kQ4_0: qi::dequantize_q4_0(src, dst, nb); break;
    case GgmlType::kQ4_K: qi::dequantize_q4_k(src, dst, nb); break;
    case GgmlType::kQ5_K: qi::dequantize_q5_k(src, dst, nb); break;
    case GgmlType::kQ6_K: qi::dequantize_q6_k(src, dst, nb); break;
    default: return make_error(ErrorCode::kInternal, "dequantize: supported type without a kernel");
  }
  return ok_status();
}

Status quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  KESTREL_TRY_ASSIGN(const int64_t nb, check_row(type, src, dst, n, "quantize"));
  if (n == 0) return ok_status();
  switch (type) {
    case GgmlType::kF32: qi::quantize_f32(src, dst, n); return ok_status();
    case GgmlType::kF16: qi::quantize_f16(src, dst, n); return ok_status();
    case GgmlType::kBF16: qi::quantize_bf16(src, dst, n); return ok_status();
    case GgmlType::kQ8_0: return qi::quantize_q8_0(src, dst, nb);
    case GgmlType::kQ4_0: return qi::quantize_q4_0(src, dst, nb);
    case GgmlType::kQ4_K: return qi::quantize_q4_k(src, dst, nb);
    case GgmlType::kQ5_K: return qi::quantize_q5_k(src, dst, nb);
    case GgmlType::kQ6_K: return qi::quantize_q6_k(src, dst, nb);
    default: return make_error(ErrorCode::kInternal, "quantize: supported type without a kernel");
  }
}

}  // namespace kestrel
