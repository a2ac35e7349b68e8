// Gated DeltaNet geometry, head mapping and zero state (see gdn_state.h).
#include "core/reference/gdn_state.h"

#include <string>

namespace kestrel::ref {

Status GdnDims::validate() const {
  auto bad = [](const char* what, int value) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string("gdn: ") + what + " must be positive (got " + std::to_string(value) + ")");
  };
  if (n_embd <= 0) return bad("n_embd", n_embd);
  if (n_k_heads <= 0) return bad("n_k_heads", n_k_heads);
  if (n_v_heads <= 0) return bad("n_v_heads", n_v_heads);
  if (d_k <= 0) return bad("d_k", d_k);
  if (d_v <= 0) return bad("d_v", d_v);
  if (conv_kernel <= 0) return bad("conv_kernel", conv_kernel);
  if (n_v_heads % n_k_heads != 0) {
    return make_error(ErrorCode::kInvalidArgument, "gdn: n_v_heads " + std::to_string(n_v_heads) +
                                                       " is not a multiple of n_k_heads " + std::to_string(n_k_heads));
  }
  return ok_status();
}

GdnDims GdnDims::from_hparams(const ModelHparams& hp) {
  GdnDims d;
  d.n_embd = static_cast<int>(hp.n_embd);
  d.n_k_heads = static_cast<int>(hp.ssm_n_k_heads);
  d.n_v_heads = static_cast<int>(hp.ssm_n_v_heads);
  d.d_k = static_cast<int>(hp.ssm_d_state);
  d.d_v = static_cast<int>(hp.ssm_head_v_dim());
  d.conv_kernel = static_cast<int>(hp.ssm_conv_kernel);
  d.eps = hp.rms_eps;
  d.mapping = hp.head_mapping();
  return d;
}

int gdn_k_head(const GdnDims& dims, int v_head) {
  return dims.mapping == HeadMapping::kGrouped ? v_head / dims.v_per_k() : v_head % dims.n_k_heads;
}

GdnState GdnState::zeros(const GdnDims& dims) {
  GdnState st;
  st.s.assign(static_cast<size_t>(dims.n_v_heads) * dims.d_k * dims.d_v, 0.0f);
  st.conv.assign(static_cast<size_t>(dims.conv_dim()) * (dims.conv_kernel - 1), 0.0f);
  return st;
}

Status GdnState::check(const GdnDims& dims) const {
  const size_t want_s = static_cast<size_t>(dims.n_v_heads) * dims.d_k * dims.d_v;
  const size_t want_conv = static_cast<size_t>(dims.conv_dim()) * (dims.conv_kernel - 1);
  if (s.size() != want_s || conv.size() != want_conv) {
    return make_error(ErrorCode::kInvalidArgument, "gdn: state holds " + std::to_string(s.size()) + " S and " +
                                                       std::to_string(conv.size()) + " conv floats, the layer needs " +
                                                       std::to_string(want_s) + " and " + std::to_string(want_conv) +
                                                       " (state made for other dims?)");
  }
  return ok_status();
}

}  // namespace kestrel::ref
