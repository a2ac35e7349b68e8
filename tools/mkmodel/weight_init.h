// WeightInit: the distribution kestrel-mkmodel draws one tensor's values from, chosen by the tensor's role
// (docs/mkmodel.md "Weights" explains every choice).
//
// Projections are zero-mean with variance 1/fan_in so activations keep their magnitude; output projections
// (attn_output, ssm_out, ffn_down*) are smaller so the residual stream grows slowly; norm weights sit near 1 (GGUF
// stores the +1 already); ssm_a = -exp(A_log) with A_log ~ U(log 1, log 16). Pure functions, thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "core/model/model_hparams.h"
#include "core/model/tensor_layout.h"

namespace kestrel::mkmodel {

enum class InitKind {
  kZeroMean,  // symmetric around 0 with standard deviation `std` (any output type, quantized ones included)
  kUniform,   // uniform in [lo, hi] (float output types only)
  kNegExp,    // -exp(u), u uniform in [lo, hi] (float output types only; ssm_a)
};

struct WeightInit {
  InitKind kind = InitKind::kZeroMean;
  float std = 0.0f;  // kZeroMean
  float lo = 0.0f;   // kUniform, kNegExp
  float hi = 0.0f;

  std::string describe() const;  // "N0(0.0221)", "U[0.9,1.1]", "-exp(U[0,2.77])"
};

// The distribution for `spec` (a tensor of expected_tensors(hp)): by its name without the "blk.N." prefix.
WeightInit weight_init_for(const TensorSpec& spec);

// "blk.3.attn_q.weight" -> "attn_q.weight"; globals are returned unchanged.
std::string_view tensor_base_name(std::string_view name);

}  // namespace kestrel::mkmodel
