// The small value-type helpers declared in service.h: finish_reason_name and SamplingOverrides::apply_to.
#include "daemon/engine/service.h"

namespace kestrel::daemon {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken: return "stop token";
    case FinishReason::kStopString: return "stop string";
    case FinishReason::kMaxTokens: return "max tokens";
    case FinishReason::kContextFull: return "context full";
    case FinishReason::kAborted: return "aborted";
    case FinishReason::kShutdown: return "shutdown";
  }
  return "unknown";
}

SamplingParams SamplingOverrides::apply_to(SamplingParams base) const {
  if (temperature) base.temperature = *temperature;
  if (top_p) base.top_p = *top_p;
  if (min_p) base.min_p = *min_p;
  if (repetition_penalty) base.repetition_penalty = *repetition_penalty;
  if (presence_penalty) base.presence_penalty = *presence_penalty;
  if (frequency_penalty) base.frequency_penalty = *frequency_penalty;
  if (top_k) base.top_k = *top_k;
  if (penalty_last_n) base.penalty_last_n = *penalty_last_n;
  if (seed) base.seed = *seed;
  return base;
}

}  // namespace kestrel::daemon
