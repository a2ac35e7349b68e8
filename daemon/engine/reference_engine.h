// The reference Engine: engine.h's interface over the scalar f32 reference forward pass (core/reference).
//
// Each slot is one ref::SessionState; step() runs ref::forward for every item in turn, so a failing item (bad slot,
// bad token id, context overflow) fails alone and leaves its slot unchanged while the others proceed. Gated-DeltaNet
// layers run in the recurrent (token-by-token) form, so the logits after a token do not depend on how a prefill was
// cut into chunks across ticks, nor on what else is in the batch: bit-identical for the same slot contents and
// tokens. Slow by design; it is the oracle the CPU and GPU engines are checked against.
//
// placement() reports one entry per component on "cpu", sized from the WeightCatalog's byte accounting: embeddings
// (token_embd), gdn layers, attention layers (everything of a layer but its experts: norms, mixer, router, dense
// FFN), routed experts, shared experts, lm_head (output_norm and output; the tied output is counted once, under
// embeddings). Entries sum to WeightCatalog::total_bytes().
//
// Ownership: borrows `model` (its mapping holds the weights) for the engine's lifetime. Threading: engine.h.
#pragma once

#include <cstdint>
#include <memory>

#include "core/base/expected.h"
#include "core/model/model.h"
#include "daemon/engine/engine.h"

namespace kestrel::daemon {

// kInvalidArgument when max_slots < 1 or the model's weights do not fit the reference ops.
Expected<std::unique_ptr<Engine>> make_reference_engine(const Model& model, int32_t max_slots);

// The placement entries of a catalogued model with every component on `device` (shared by engines that keep all
// weights in one place).
std::vector<PlacementSummaryEntry> placement_all_on(const WeightCatalog& catalog, const std::string& device);

}  // namespace kestrel::daemon
