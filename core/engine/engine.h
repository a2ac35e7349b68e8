// Engine: the compute side of Kestrel behind one narrow interface — state slots plus one batched forward per tick
// (design.md §6). The reference engine (reference_engine.h) implements it on core/reference; the CUDA engine
// (gpu/engine/cuda_engine.h) on gpu/. The daemon's Service, the CLI and the tools drive any of them through it, so
// gpu/ and cpu/ never include daemon/.
//
// A slot is one sequence's model state (GDN state + conv history per GDN layer, KV cache per attention layer, the
// position n_past), living on the engine's device. Slots are numbered 0..max_slots()-1 and recycled. The tokens a
// slot has consumed are the caller's to keep (the daemon's Session holds them for the sampler's penalties): no
// engine keeps a copy.
//
// Threading: no method is thread-safe, and calls must never overlap. The Service serialises them with one mutex
// (ServiceImpl::engine_mu_) held around every Engine call: step() runs on
// the engine loop thread; the slot_* calls may run on a caller's thread (create, clone, reset, close session) or
// the loop thread, always between two step() calls, never on a slot that a queued request is using. An engine that
// needs thread affinity (CUDA contexts) sets its device itself in each call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model_hparams.h"

namespace kestrel {

using SlotId = int32_t;

// One sequence's share of a tick: tokens appended to `slot`, logits (or the greedy token) wanted after the last.
struct EngineStepItem {
  SlotId slot = -1;
  std::span<const int32_t> tokens;  // borrowed for the call; >= 1
  // The caller needs only the greedy token after the last token — the argmax of the logits, the lowest id among
  // equal maxima, NaN never chosen (core/sampler's argmax_lowest) — so the engine may compute it where the logits
  // are and leave `logits` unwritten (a device engine then copies back 4 bytes instead of n_vocab floats).
  bool argmax_only = false;
};

// Where one item's result goes. The caller owns the logits buffer (one reused buffer for the whole tick, not a
// fresh vector per item); the engine writes it only when status is ok.
struct EngineStepOutput {
  Status status;            // an error fails this item only (its slot is unchanged); the others proceed
  std::span<float> logits;  // caller-owned f32 [n_vocab]: the logits after the item's last token (unless argmax_only)
  int32_t argmax = -1;      // the greedy token, when the item asked for argmax_only
};

// One component of the model and where its weights live.
// component: "embeddings", "gdn layers", "attention layers", "routed experts", "shared experts", "lm_head".
struct PlacementEntry {
  std::string component;
  std::string device;  // "cpu", "cuda:0"
  uint64_t bytes = 0;
};

// Where the engine keeps the model: the device it computes on and every component's bytes there. Entries sum to
// WeightCatalog::total_bytes().
struct PlacementPlan {
  std::string device;  // "cpu" or "cuda:0 (NVIDIA H200, 139 GiB)"
  std::vector<PlacementEntry> entries;
  std::string summary;  // one line on how a planned placement split the model (placement_planner.h); may be empty
};

// What a tick may hold. The engine accepts any batch; these say what it runs without splitting.
struct EngineCapabilities {
  int32_t max_items_per_pass = 1;   // sessions advanced by one pass over the weights
  int32_t max_tokens_per_item = 0;  // tokens of one item a tick should carry (the Service cuts prompts to it); 0: any
  // Tokens of a whole tick that fit one pass while sessions decode (the Service gives prompts what decoding sessions
  // leave of it, so a prompt's chunk does not add a pass to their tick; with none decoding, prompts get up to
  // max_tokens_per_item each); 0: any. Decoding sessions always get their token.
  int32_t max_tokens_per_tick = 0;
  // While sessions decode, prompts get at most max(this, the decoding sessions' tokens) tokens of a tick: the pass
  // then holds at most about twice the decoders' rows plus this floor, which keeps their inter-token latency within
  // about 2x of a tick without the prompt (a pass's time grows slower than its rows). 0: no cap beyond the above.
  int32_t prompt_tokens_beside_decode = 0;
  int32_t max_slot_ctx = 0;  // the largest n_ctx slot_alloc accepts (0: the model's training context)
};

// A cache the slots share (the CUDA engine's KV page pool), for status and metrics: the positions it holds, those the
// slots' pages hold now, and its bytes. An engine whose slots each own their state has no shared pool (all zero).
struct EngineCachePool {
  int64_t tokens_total = 0;
  int64_t tokens_held = 0;
  uint64_t bytes = 0;
};

// The most prompt tokens a tick carries beside `decoding` sessions that decode a token each (SIZE_MAX: no cap of
// this kind). The Service and the benchmarks that mimic it share this rule.
inline size_t prompt_tokens_beside_decode(const EngineCapabilities& c, size_t decoding) {
  if (decoding == 0 || c.prompt_tokens_beside_decode <= 0) return SIZE_MAX;
  return std::max(static_cast<size_t>(c.prompt_tokens_beside_decode), decoding);
}

class Engine {
 public:
  virtual ~Engine() = default;

  virtual std::string name() const = 0;  // "reference", "cuda"
  virtual const ModelHparams& hparams() const = 0;
  virtual const PlacementPlan& placement() const = 0;
  virtual EngineCapabilities capabilities() const = 0;
  virtual int32_t max_slots() const = 0;
  // The shared cache's use. Thread-safe: callable while another thread runs step() or the slot calls.
  virtual EngineCachePool cache_pool() const = 0;

  // A fresh slot with room for n_ctx tokens. kResourceExhausted when none is free or memory runs out;
  // kOutOfRange when n_ctx is larger than the engine supports.
  virtual Expected<SlotId> slot_alloc(int32_t n_ctx) = 0;
  virtual void slot_free(SlotId slot) = 0;
  virtual void slot_reset(SlotId slot) = 0;
  // dst (allocated, any n_ctx >= src's n_past) becomes an exact copy of src.
  virtual Status slot_clone(SlotId src, SlotId dst) = 0;
  // The slot's whole state (ref::SessionState::snapshot's format: versioned, geometry-checked, the same bytes for
  // every engine) and its inverse; restore refuses a snapshot of another geometry or one longer than the slot's
  // n_ctx and leaves the slot unchanged then.
  virtual Expected<std::vector<uint8_t>> slot_snapshot(SlotId slot) const = 0;
  virtual Status slot_restore(SlotId slot, std::span<const uint8_t> bytes) = 0;
  virtual int64_t slot_n_past(SlotId slot) const = 0;
  virtual int32_t slot_n_ctx(SlotId slot) const = 0;

  // Checks one item against its slot without running it: kInvalidArgument for a bad token id or empty tokens,
  // kOutOfRange when the slot's context would overflow.
  virtual Status check(const EngineStepItem& item) const = 0;

  // One tick: every item (distinct slots) advances; weights are read once per pass for the whole batch where the
  // engine can. out.size() == items.size(), each out[i].logits sized n_vocab. Deterministic: the same slot contents
  // and tokens give bit-identical logits whatever else is in the batch.
  virtual void step(std::span<const EngineStepItem> items, std::span<EngineStepOutput> out) = 0;
};

// The placement of a catalogued model with every component on `device` (for engines that keep all weights in one
// place): embeddings (token_embd), gdn layers, attention layers (everything of a layer but its experts: norms,
// mixer, router, dense FFN), routed experts, shared experts, lm_head (output_norm and output; a tied output is
// counted once, under embeddings).
class WeightCatalog;
PlacementPlan placement_all_on(const WeightCatalog& catalog, const std::string& device);

}  // namespace kestrel
