// What one pass of the CPU engine over the weights carries: the sessions' token rows stacked into one batch.
//
// Rows of the batch (f32 [n_rows, H] activations) are grouped by session: a Segment is one session's consecutive
// tokens, rows [row0, row0 + n_tok), at positions n_past .. n_past + n_tok − 1 of its sequence. Every weight
// matrix is read once per pass for all rows; per-session work (conv, delta rule, KV cache, attention) runs per
// segment. Scratch vectors are members of the blocks and grow to the largest pass seen, so a steady-state pass
// allocates nothing in them. Threading: one pass at a time; items of one pool job touch disjoint outputs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/reference/session_state.h"
#include "cpu/matmul.h"
#include "cpu/step_profile.h"

namespace kestrel::cpu {

struct Segment {
  ref::SessionState* state = nullptr;  // the session's state (GDN state, conv history, KV caches)
  int row0 = 0;                        // first row of the batch
  int n_tok = 0;                       // rows of this session in the pass (>= 1)
  int64_t n_past = 0;                  // tokens the session held before the pass
};

struct Pass {
  MatmulRunner* mm = nullptr;
  StepProfile* profile = nullptr;  // where to add section times (nullptr: not profiling)
  std::span<const Segment> segments;
  int n_rows = 0;  // Σ n_tok
};

// v grown to at least n elements (never shrunk); returns its data.
inline float* grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// A GemvTask of a checked matrix (the engine checks every matrix's type when it is made).
GemvTask task_of(const ref::QuantMatrix& w, const float* x, int64_t n_vec, float* y);

}  // namespace kestrel::cpu
