// SessionState: everything one sequence carries between reference forward steps (design.md §3 "State").
//
// Per GDN layer the recurrent state S and the conv history (GdnState), per full-attention layer the KV cache
// (KvCache, capacity n_ctx tokens), plus the token history (for repetition penalties and snapshots) and the
// position n_past. A plain value: copying it is a clone (fork) of the sequence. reset() returns to the empty
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
inline constexpr uint32_t kSnapshotVersion = 1;

class SessionState {
 public:
  // An empty sequence for a model with `hp`, holding up to n_ctx tokens (1 <= n_ctx <= hp.n_ctx_train when that
  // is known, else kOutOfRange naming both).
  static Expected<SessionState> create(const ModelHparams& hp, int n_ctx);

  int n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

  void reset();

  std::vector<uint8_t> snapshot() const;
  Status restore(std::span<const uint8_t> bytes);

  // Per-layer state; the vectors are indexed by layer, entries of the other kind are empty.
  GdnState& gdn(uint32_t layer) { return gdn_[layer]; }
  KvCache& kv(uint32_t layer) { return kv_[layer]; }
  const GdnState& gdn(uint32_t layer) const { return gdn_[layer]; }
  const KvCache& kv(uint32_t layer) const { return kv_[layer]; }
  // Called by the forward pass after a successful step.
  void append_tokens(std::span<const int32_t> ids) { tokens_.insert(tokens_.end(), ids.begin(), ids.end()); }

  bool operator==(const SessionState& o) const;  // bit-identical state (tests)

 private:
  uint64_t geometry_hash() const;

  int n_ctx_ = 0;
  std::vector<LayerKind> kinds_;
  std::vector<GdnState> gdn_;
  std::vector<KvCache> kv_;
  std::vector<int32_t> tokens_;
};

}  // namespace kestrel::ref
