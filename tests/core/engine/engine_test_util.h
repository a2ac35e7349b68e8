// Helpers of the engine tests (reference, CPU, CUDA): the golden fixture models, one tick with caller-owned logits
// buffers as the Service runs it, and the relative difference the tests compare engines by.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/model.h"
#include "core/reference/forward.h"
#include "core/reference/model_weights.h"
#include "core/reference/session_state.h"

namespace kestrel::test {

inline std::string fixture_model_path(const std::string& name) {
  return std::string(KESTREL_GOLDEN_FIXTURES_DIR) + "/" + name + "/" + name + ".gguf";
}

inline std::unique_ptr<Model> open_fixture(const std::string& name) {
  auto m = Model::open(fixture_model_path(name));
  EXPECT_TRUE(m.has_value()) << (m ? "" : m.error().to_string());
  return m ? std::move(*m) : nullptr;
}

// The reference forward pass with recurrent GDN (what decode steps run) over one fresh session of n_ctx tokens: what
// the engine and Service tests compare against, token for token.
class RefSession {
 public:
  RefSession(const Model& m, int n_ctx) {
    auto w = ref::RefModelWeights::from_catalog(m.catalog());
    auto st = ref::SessionState::create(m.hparams(), n_ctx);
    EXPECT_TRUE(w.has_value() && st.has_value());
    if (w) weights_.emplace(std::move(*w));
    if (st) state_.emplace(std::move(*st));
    options_.gdn_mode = ref::GdnMode::kRecurrent;
  }
  // Feeds tokens: the last one's logits, and with capture_hidden every layer's hidden state of it.
  ref::ForwardOutput feed(std::span<const int32_t> tokens, bool capture_hidden = false) {
    ref::ForwardOutput out;
    ref::ForwardOptions o = options_;
    o.capture_hidden = capture_hidden;
    EXPECT_TRUE(weights_ && state_ && ref::forward(*weights_, *state_, tokens, o, &out));
    return out;
  }
  int64_t n_past() const { return state_ ? state_->n_past() : 0; }

 private:
  std::optional<ref::RefModelWeights> weights_;
  std::optional<ref::SessionState> state_;
  ref::ForwardOptions options_;
};

// n token ids spread over the golden vocabulary (start + i·stride mod `mod`).
inline std::vector<int32_t> iota_tokens(int n, int start = 10, int stride = 7, int mod = 1000) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((start + i * stride) % mod));
  return t;
}

// One tick's results: a status and, where it is ok, the logits of each item.
struct TickResult {
  std::vector<Status> status;
  std::vector<std::vector<float>> logits;  // f32 [n_vocab] per item (empty where the item failed)
};

inline TickResult run_tick(Engine& e, const std::vector<EngineStepItem>& items) {
  const size_t n_vocab = e.hparams().n_vocab;
  TickResult r;
  r.logits.assign(items.size(), std::vector<float>(n_vocab));
  std::vector<EngineStepOutput> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) out[i].logits = r.logits[i];
  e.step(items, out);
  for (size_t i = 0; i < items.size(); ++i) {
    r.status.push_back(out[i].status);
    if (!out[i].status) r.logits[i].clear();
  }
  return r;
}

// The logits after `tokens` fed to one slot in one item.
inline std::vector<float> run_one(Engine& e, SlotId slot, std::span<const int32_t> tokens) {
  TickResult r = run_tick(e, {{slot, tokens}});
  EXPECT_TRUE(r.status[0]) << r.status[0].error().to_string();
  return r.logits[0];
}

inline int32_t argmax(const std::vector<float>& v) {
  int32_t best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

// max|a − b| / max(1, max|b|).
inline float rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0.0f, m = 1.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return d / m;
}

}  // namespace kestrel::test
