// Reference SwiGLU feed-forward (see ffn.h).
#include "core/reference/ffn.h"

#include <string>
#include <vector>

#include "core/reference/activations.h"

namespace kestrel::ref {

Status swiglu_check(const QuantMatrix& gate, const QuantMatrix& up, const QuantMatrix& down, const char* what) {
  const std::string w(what);
  KESTREL_TRY(check_matrix(gate, w + " gate", gate.n_in, gate.n_out));
  KESTREL_TRY(check_matrix(up, w + " up", gate.n_in, gate.n_out));
  KESTREL_TRY(check_matrix(down, w + " down", gate.n_out, gate.n_in));
  return ok_status();
}

Status swiglu_forward(const QuantMatrix& gate, const QuantMatrix& up, const QuantMatrix& down, const float* x,
                      int n_tok, float* y) {
  if (n_tok < 0) return make_error(ErrorCode::kInvalidArgument, "swiglu: negative token count");
  const size_t n = static_cast<size_t>(n_tok) * gate.n_out;
  std::vector<float> g(n), u(n);  // f32 [n_tok, I] each
  KESTREL_TRY(matvec_batch(gate, x, n_tok, g.data()));
  KESTREL_TRY(matvec_batch(up, x, n_tok, u.data()));
  for (size_t i = 0; i < n; ++i) g[i] = silu(g[i]) * u[i];
  return matvec_batch(down, g.data(), n_tok, y);
}

Status dense_ffn_forward(const DenseFfnWeights& w, const float* x, int n_tok, float* out) {
  KESTREL_TRY(swiglu_check(w.gate, w.up, w.down, "ffn"));
  return swiglu_forward(w.gate, w.up, w.down, x, n_tok, out);
}

}  // namespace kestrel::ref
