// SamplingParams::validate: one check per field, each naming the field, its allowed range and what it got.
#include "core/sampler/sampling_params.h"

#include <cmath>
#include <cstdio>
#include <string>

namespace kestrel {
namespace {

std::string show(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Error bad_field(const char* field, const char* allowed, const std::string& got) {
  return make_error(ErrorCode::kInvalidArgument,
                    std::string("sampling parameter ") + field + " must be " + allowed + ", got " + got);
}

}  // namespace

SamplingParams kestrel_default_sampling() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.min_p = 0.05f;
  p.seed = 0;
  return p;
}

Status SamplingParams::validate() const {
  // Written as !(ok) so that NaN, for which every comparison is false, fails each check.
  if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
    return bad_field("temperature", "a finite number >= 0 (0 = greedy)", show(temperature));
  }
  if (top_k < 0) return bad_field("top_k", ">= 0 (0 = off)", std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad_field("top_p", "in (0, 1] (1 = off)", show(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad_field("min_p", "in [0, 1] (0 = off)", show(min_p));
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
    return bad_field("repetition_penalty", "a finite number > 0 (1 = off)", show(repetition_penalty));
  }
  if (!std::isfinite(presence_penalty)) {
    return bad_field("presence_penalty", "a finite number (0 = off)", show(presence_penalty));
  }
  if (!std::isfinite(frequency_penalty)) {
    return bad_field("frequency_penalty", "a finite number (0 = off)", show(frequency_penalty));
  }
  if (penalty_last_n < -1) {
    return bad_field("penalty_last_n", ">= -1 (-1 = whole history, 0 = off)", std::to_string(penalty_last_n));
  }
  if (n_logprobs < 0 || n_logprobs > kMaxLogprobs) {
    return bad_field("n_logprobs", "in [0, 20]", std::to_string(n_logprobs));
  }
  return ok_status();
}

bool SamplingParams::penalties_active() const {
  return penalty_last_n != 0 && (repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f);
}

}  // namespace kestrel
