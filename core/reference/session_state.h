// SessionState: everything one sequence carries between reference forward steps (design.md §3 "State").
//
// Per GDN layer the recurrent state S and the conv history (GdnState), per full-attention layer the KV cache
// (KvCache, capacity n_ctx tokens), plus the position n_past (tokens consumed; the tokens themselves are the
// caller's history, not model state). A plain value: copying it is a clone (fork) of the sequence. reset() returns to the empty
// sequence without reallocating. snapshot() serialises to a self-describing byte buffer (versioned header with the
// model's state geometry); restore() accepts only a snapshot of the same geometry and leaves the state unchanged on
// any error. Not thread-safe to mutate from two threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model_hparams.h"
#include "core/reference/gdn_state.h"
#include "core/reference/kv_cache.h"

namespace kestrel::ref {

inline constexpr uint32_t kSnapshotMagic = 0x5345534B;  // "KSES"
inline constexpr uint32_t kSnapshotVersion = 2;

class SessionState {
 public:
  // An empty sequence for a model with `hp`, holding up to n_ctx tokens (1 <= n_ctx <= hp.n_ctx_train when that
  // is known, else kOutOfRange naming both).
  static Expected<SessionState> create(const ModelHparams& hp, int n_ctx);

  int n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return n_past_; }

  void reset();
  // Makes this state an exact copy of src's sequence (a fork) while keeping this state's capacity n_ctx: the
  // per-layer state, the filled KV rows and the position. kOutOfRange when src holds more tokens than this n_ctx,
  // kInvalidArgument for a state of another model; this state is unchanged then.
  Status copy_from(const SessionState& src);

  std::vector<uint8_t> snapshot() const;
  Status restore(std::span<const uint8_t> bytes);

  // Per-layer state; the vectors are indexed by layer, entries of the other kind are empty.
  GdnState& gdn(uint32_t layer) { return gdn_[layer]; }
  KvCache& kv(uint32_t layer) { return kv_[layer]; }
  const GdnState& gdn(uint32_t layer) const { return gdn_[layer]; }
  const KvCache& kv(uint32_t layer) const { return kv_[layer]; }
  // Moves the position on by n consumed tokens (the forward pass after a successful step; a clone that copies the
  // per-layer state itself).
  void advance(int64_t n) { n_past_ += n; }

  bool operator==(const SessionState& o) const;  // bit-identical state (tests)

 private:
  uint64_t geometry_hash() const;

  int n_ctx_ = 0;
  std::vector<LayerKind> kinds_;
  std::vector<GdnState> gdn_;
  std::vector<KvCache> kv_;
  int64_t n_past_ = 0;
};

}  // namespace kestrel::ref
