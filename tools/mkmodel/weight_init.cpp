// weight_init_for(): the role of each tensor -> its value distribution. The numbers are explained in docs/mkmodel.md.
#include "tools/mkmodel/weight_init.h"

#include <cmath>
#include <cstdio>

namespace kestrel::mkmodel {

namespace {

constexpr float kOutputProjectionGain = 0.5f;  // attn_output, ssm_out, ffn_down*: half the 1/sqrt(fan_in) std
constexpr float kLogitGain = 3.0f;             // output.weight: logits with std ~3 for a unit-RMS final hidden state
constexpr float kEmbeddingStd = 0.25f;         // token_embd: small next to what the layers add (see docs/mkmodel.md)
constexpr float kSharedGateGain = 0.5f;        // ffn_gate_inp_shexp: sigmoid input with std ~0.5
constexpr float kConvTapStd = 0.5f;            // ssm_conv1d: N(0, 1/4) per tap
constexpr float kNormLo = 0.9f;                // every *norm.weight: 1 +- 0.1
constexpr float kNormHi = 1.1f;
constexpr float kDtBiasLo = -0.5f;  // ssm_dt.bias
constexpr float kDtBiasHi = 0.5f;
constexpr float kALogHi = 2.772588722f;  // log(16): ssm_a = -exp(A_log), A_log ~ U(log 1, log 16)

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

WeightInit zero_mean(float std) { return WeightInit{InitKind::kZeroMean, std, 0.0f, 0.0f}; }
WeightInit uniform(float lo, float hi) { return WeightInit{InitKind::kUniform, 0.0f, lo, hi}; }

}  // namespace

std::string WeightInit::describe() const {
  char buf[64];
  switch (kind) {
    case InitKind::kZeroMean: std::snprintf(buf, sizeof buf, "N0(%.4g)", static_cast<double>(std)); break;
    case InitKind::kUniform:
      std::snprintf(buf, sizeof buf, "U[%.3g,%.3g]", static_cast<double>(lo), static_cast<double>(hi));
      break;
    case InitKind::kNegExp:
      std::snprintf(buf, sizeof buf, "-exp(U[%.3g,%.3g])", static_cast<double>(lo), static_cast<double>(hi));
      break;
  }
  return buf;
}

std::string_view tensor_base_name(std::string_view name) {
  if (!starts_with(name, "blk.")) return name;
  const size_t dot = name.find('.', 4);
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

WeightInit weight_init_for(const TensorSpec& spec) {
  const std::string_view base = tensor_base_name(spec.name);
  const float fan_in = spec.ne.empty() ? 1.0f : static_cast<float>(spec.ne[0]);
  const float unit = 1.0f / std::sqrt(fan_in);  // std of a projection that keeps activation magnitude

  if (ends_with(base, "norm.weight")) return uniform(kNormLo, kNormHi);  // incl. ssm_norm (no +1 there, also ~1)
  if (base == "ssm_a") return WeightInit{InitKind::kNegExp, 0.0f, 0.0f, kALogHi};
  if (base == "ssm_dt.bias") return uniform(kDtBiasLo, kDtBiasHi);
  if (base == "ssm_conv1d.weight") return zero_mean(kConvTapStd);
  if (base == "token_embd.weight") return zero_mean(kEmbeddingStd);
  if (base == "output.weight") return zero_mean(kLogitGain * unit);
  if (base == "ffn_gate_inp_shexp.weight") return zero_mean(kSharedGateGain * unit);
  if (base == "attn_output.weight" || base == "ssm_out.weight" || starts_with(base, "ffn_down")) {
    return zero_mean(kOutputProjectionGain * unit);
  }
  // Input projections and the router: attn_q/k/v, attn_qkv, attn_gate, ssm_in, ssm_ba, ssm_beta, ssm_alpha,
  // ffn_gate_inp, ffn_gate*, ffn_up*.
  return zero_mean(unit);
}

}  // namespace kestrel::mkmodel
