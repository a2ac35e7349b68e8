// A calibration prompt through the CPU engine that counts which routed experts each layer's tokens choose: the
// routing counts the placement planner fills a GPU budget with, hottest expert first (core/engine/routing_counts.h).
// The CPU engine reads the weights from the file mapping, so this needs no GPU and no copy of the model; on the
// 35B-A3B preset 256 tokens take a few seconds on a 16-core host.
//
// The prompt is a built-in English text of mixed registers (prose, code, dialogue, numbers) in the model's own
// tokenizer, repeated to the asked length. Counts from real traffic would be better; these are what a fresh start
// has.
//
// Thread-safety: one call at a time per model (it builds and drops its own engine and worker pool).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/routing_counts.h"
#include "core/model/model.h"

namespace kestrel::cpu {

// The built-in calibration text.
std::string_view calibration_text();

// The first n_tokens of calibration_text() in the model's tokenizer, the text repeated as often as needed;
// kInvalidArgument if n_tokens < 1 or a token id is outside the model's vocabulary.
Expected<std::vector<int32_t>> calibration_tokens(const Model& model, int32_t n_tokens);

// Runs `tokens` as one prompt through a CPU engine of `threads` compute threads (0: one per physical core) and
// returns its routing counts. kFailedPrecondition for a model without routed experts.
Expected<RoutingCounts> calibrate_routing(const Model& model, const std::vector<int32_t>& tokens, int32_t threads);

}  // namespace kestrel::cpu
