// The per-layer check the CUDA engine tests (test_cuda_engine, test_cuda_hybrid) share: a 9-token prompt through a
// CUDA engine and through the reference forward pass, every layer's hidden state of the last token and its logits
// compared.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/model.h"
#include "gpu/engine/cuda_engine.h"
#include "tests/core/engine/engine_test_util.h"

namespace kestrel::test {

// Runs 8 prompt tokens, then a ninth with its hidden states, through `e` (a fresh slot of n_ctx tokens) and through
// the reference (recurrent GDN); expects every layer's hidden state and the logits within `tol` (rel_diff) and sets
// *worst to the largest per-layer difference.
inline void expect_hidden_states_match_reference(const Model& model, gpu::CudaEngine& e, int n_ctx, float tol,
                                                 float* worst) {
  *worst = 0.0f;
  const std::vector<int32_t> prompt = iota_tokens(9, 3, 11);
  RefSession reference(model, n_ctx);
  ASSERT_FALSE(reference.feed(std::span<const int32_t>(prompt).first(8)).logits.empty());
  const ref::ForwardOutput last = reference.feed(std::span<const int32_t>(prompt).subspan(8), /*capture_hidden=*/true);
  ASSERT_FALSE(last.logits.empty());

  auto cs = e.slot_alloc(n_ctx);
  ASSERT_TRUE(cs);
  run_one(e, *cs, std::span<const int32_t>(prompt).first(8));
  std::vector<float> logits(model.hparams().n_vocab);
  EngineStepItem item{*cs, std::span<const int32_t>(prompt).subspan(8)};
  EngineStepOutput out;
  out.logits = logits;
  std::vector<float> hidden;
  e.step_with_hidden(std::span<const EngineStepItem>(&item, 1), std::span<EngineStepOutput>(&out, 1), &hidden);
  ASSERT_TRUE(out.status) << out.status.error().to_string();
  const size_t H = model.hparams().n_embd;
  ASSERT_EQ(hidden.size(), last.hidden.size());
  for (uint32_t l = 0; l < model.hparams().n_layer; ++l) {
    std::vector<float> a(hidden.begin() + l * H, hidden.begin() + (l + 1) * H);
    std::vector<float> b(last.hidden.begin() + l * H, last.hidden.begin() + (l + 1) * H);
    const float d = rel_diff(a, b);
    EXPECT_LE(d, tol) << "layer " << l;
    *worst = std::max(*worst, d);
  }
  EXPECT_LE(rel_diff(logits, last.logits), tol);
}

}  // namespace kestrel::test
