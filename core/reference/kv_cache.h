// Reference KV cache of one gated full-attention layer for one sequence (model-spec.md §4, §8).
//
// Slot p holds the key and value of the token at position p (positions are consecutive from 0):
//   k f32 [n_ctx][n_head_kv][head_dim]  K after the k-norm and RoPE
//   v f32 [n_ctx][n_head_kv][head_dim]  raw V (straight from W_v)
// n_used slots are filled; append() adds the next one and refuses (kOutOfRange) when the cache is full.
// A plain value: copy it to fork a sequence. Not thread-safe to mutate from two threads.
#pragma once

#include <vector>

#include "core/base/expected.h"

namespace kestrel::ref {

struct KvCache {
  int n_ctx = 0;  // capacity in tokens
  int n_head_kv = 0;
  int head_dim = 0;
  int n_used = 0;        // filled slots = position of the next token
  std::vector<float> k;  // f32 [n_ctx, n_head_kv, head_dim]
  std::vector<float> v;  // f32 [n_ctx, n_head_kv, head_dim]

  // An empty cache with room for n_ctx tokens (n_ctx, n_head_kv, head_dim > 0, else kInvalidArgument).
  static Expected<KvCache> make(int n_ctx, int n_head_kv, int head_dim);

  // Stores one token's keys and values. k_tok, v_tok: f32 [n_head_kv, head_dim]. kOutOfRange when full.
  Status append(const float* k_tok, const float* v_tok);
  void clear() { n_used = 0; }

  // f32 [head_dim] of slot `pos`, kv head `head`.
  const float* k_at(int pos, int head) const { return k.data() + offset(pos, head); }
  const float* v_at(int pos, int head) const { return v.data() + offset(pos, head); }

 private:
  size_t offset(int pos, int head) const {
    return (static_cast<size_t>(pos) * n_head_kv + static_cast<size_t>(head)) * head_dim;
  }
};

}  // namespace kestrel::ref
