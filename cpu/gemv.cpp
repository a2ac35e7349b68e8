// Kernel lookup by level and type (gemv.h); the kernels themselves are in gemv_<isa>.cpp.
#include "cpu/gemv.h"

#include <string>

namespace kestrel::cpu {

extern const GemvKernels kGemvScalar;
extern const GemvKernels kGemvAvx2;
extern const GemvKernels kGemvAvxVnni;
extern const GemvKernels kGemvAvx512;

const GemvKernels& gemv_kernels(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return kGemvScalar;
    case Isa::kAvx2: return kGemvAvx2;
    case Isa::kAvxVnni: return kGemvAvxVnni;
    case Isa::kAvx512: return kGemvAvx512;
  }
  return kGemvScalar;
}

GemvKernel gemv_kernel(Isa isa, GgmlType type, GemvInput prefer) {
  const GemvKernels& k = gemv_kernels(isa);
  const GemvTypeKernels* t = nullptr;
  switch (type) {
    case GgmlType::kF32: t = &k.f32; break;
    case GgmlType::kF16: t = &k.f16; break;
    case GgmlType::kBF16: t = &k.bf16; break;
    case GgmlType::kQ8_0: t = &k.q8_0; break;
    case GgmlType::kQ4_0: t = &k.q4_0; break;
    case GgmlType::kQ4_K: t = &k.q4_k; break;
    case GgmlType::kQ5_K: t = &k.q5_k; break;
    case GgmlType::kQ6_K: t = &k.q6_k; break;
    default: return GemvKernel{};
  }
  if (prefer != GemvInput::kF32 && t->on_q8 != nullptr) return GemvKernel{t->on_q8, t->q8_form};
  return GemvKernel{t->on_f32, GemvInput::kF32};
}

bool gemv_supports(GgmlType type) { return gemv_kernel(Isa::kScalar, type, GemvInput::kF32).fn != nullptr; }

Expected<GemvTask> gemv_task(const ref::QuantMatrix& w, const float* x, int64_t n_vec, float* y) {
  if (!gemv_supports(w.type)) {
    return make_error(ErrorCode::kUnsupported,
                      "cpu gemv: no kernel for weights of type " + std::string(ggml_type_name(w.type)));
  }
  KESTREL_TRY_ASSIGN(const uint64_t row_bytes, ref::matrix_row_bytes(w));
  if (w.data == nullptr) return make_error(ErrorCode::kInvalidArgument, "cpu gemv: null weight data");
  GemvTask t;
  t.type = w.type;
  t.w = w.data;
  t.row_bytes = row_bytes;
  t.n_in = static_cast<int64_t>(w.n_in);
  t.n_out = static_cast<int64_t>(w.n_out);
  t.x = x;
  t.n_vec = n_vec;
  t.y = y;
  return t;
}

}  // namespace kestrel::cpu
