// The reference Engine: engine.h's interface over the scalar f32 reference forward pass (core/reference).
//
// Each slot is one ref::SessionState; step() runs ref::forward for every item in turn, so a failing item (bad slot,
// bad token id, context overflow) fails alone and leaves its slot unchanged while the others proceed. Gated-DeltaNet
// layers run in the recurrent (token-by-token) form, so the logits after a token do not depend on how a prefill was
// cut into chunks across ticks, nor on what else is in the batch: bit-identical for the same slot contents and
// tokens. Slow by design; it is the oracle the CPU and GPU engines are checked against.
//
// placement() is placement_all_on(catalog, "cpu") (engine.h).
//
// Ownership: borrows `model` (its mapping holds the weights) for the engine's lifetime. Threading: engine.h.
#pragma once

#include <cstdint>
#include <memory>

#include "core/base/expected.h"
#include "core/engine/engine.h"
#include "core/model/model.h"

namespace kestrel {

// kInvalidArgument when max_slots < 1 or the model's weights do not fit the reference ops.
Expected<std::unique_ptr<Engine>> make_reference_engine(const Model& model, int32_t max_slots);

}  // namespace kestrel
