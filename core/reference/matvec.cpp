// Reference matrix-vector products: dequantize a row, dot it with each input (see matvec.h).
#include "core/reference/matvec.h"

#include <string>
#include <vector>

#include "core/quant/quant.h"
#include "core/reference/activations.h"

namespace kestrel::ref {

QuantMatrix f32_matrix(const float* data, uint64_t n_in, uint64_t n_out) {
  return QuantMatrix{GgmlType::kF32, reinterpret_cast<const uint8_t*>(data), n_in, n_out};
}

Expected<uint64_t> matrix_row_bytes(const QuantMatrix& w) {
  if (!quant_can_dequantize(w.type)) {
    return make_error(ErrorCode::kUnsupported,
                      "reference matvec: cannot dequantize weights of type " + std::string(ggml_type_name(w.type)));
  }
  if (w.data == nullptr && w.n_in > 0 && w.n_out > 0) {
    return make_error(ErrorCode::kInvalidArgument, "reference matvec: null weight data for a " +
                                                       std::to_string(w.n_out) + "x" + std::to_string(w.n_in) +
                                                       " matrix");
  }
  return ggml_row_bytes(w.type, w.n_in);
}

Status check_matrix(const QuantMatrix& w, std::string_view name, uint64_t n_in, uint64_t n_out) {
  if (w.data == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "reference: weight " + std::string(name) + " is missing");
  }
  if (w.n_in != n_in || w.n_out != n_out) {
    return make_error(ErrorCode::kInvalidArgument, "reference: weight " + std::string(name) + " has shape {" +
                                                       std::to_string(w.n_in) + ", " + std::to_string(w.n_out) +
                                                       "}, expected {" + std::to_string(n_in) + ", " +
                                                       std::to_string(n_out) + "}");
  }
  return ok_status();
}

Expected<QuantMatrix> expert_matrix(const QuantExperts& w, uint64_t e) {
  if (e >= w.n_expert) {
    return make_error(ErrorCode::kOutOfRange, "expert " + std::to_string(e) + " out of range (the tensor holds " +
                                                  std::to_string(w.n_expert) + " experts)");
  }
  const QuantMatrix whole{w.type, w.data, w.n_in, w.n_out};
  KESTREL_TRY_ASSIGN(const uint64_t row_bytes, matrix_row_bytes(whole));
  return QuantMatrix{w.type, w.data + e * w.n_out * row_bytes, w.n_in, w.n_out};
}

Status matvec(const QuantMatrix& w, const float* x, float* y) { return matvec_batch(w, x, 1, y); }

Status matvec_batch(const QuantMatrix& w, const float* x, int n_tok, float* y) {
  KESTREL_TRY_ASSIGN(const uint64_t row_bytes, matrix_row_bytes(w));
  if (n_tok < 0) {
    return make_error(ErrorCode::kInvalidArgument, "reference matvec: negative batch size " + std::to_string(n_tok));
  }
  const int n_in = static_cast<int>(w.n_in);
  std::vector<float> row(w.n_in);  // f32 [n_in]: one dequantized weight row
  for (uint64_t o = 0; o < w.n_out; ++o) {
    KESTREL_TRY(dequantize_row(w.type, w.data + o * row_bytes, row.data(), static_cast<int64_t>(w.n_in)));
    for (int t = 0; t < n_tok; ++t) {
      y[static_cast<size_t>(t) * w.n_out + o] = dot_f32(row.data(), x + static_cast<size_t>(t) * w.n_in, n_in);
    }
  }
  return ok_status();
}

}  // namespace kestrel::ref
