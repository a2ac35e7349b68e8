// The CPU delta rule kernels (cpu/delta_rule.h) at every instruction-set level this CPU has, against the reference
// (core/reference/delta_rule.h): the step against ref::delta_rule_step over 70 tokens, the chunk against
// ref::delta_rule_chunked on the same chunk and against 64 reference steps, from a non-zero state, for heads of
// 128 × 128 (the presets'), 32 × 32 (the golden models') and 24 × 40 (the scalar fallback at avx512).
//
// Tolerance: max|Δ| ≤ 1e-4 · max(1, max|ref|) over the outputs and the final state. The kernels sum in other orders
// (vector lanes, FMA, the chunk's matrix products), ~1e-7 relative per operation; the chunked and recurrent forms
// of the reference itself agree to ~1e-5 (tests/core/reference). A wrong decay, gate, index or triangle is O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/reference/delta_rule.h"
#include "cpu/delta_rule.h"
#include "cpu/isa.h"

namespace kestrel::cpu {
namespace {

struct Head {
  int dk, dv;
};

struct Inputs {
  std::vector<float> q, k, v, g, beta, s;
};

// n tokens of L2-normed q̂ (scaled by 1/√dk) and k̂, v ~ N(0,1), g in [−2, 0), beta in (0, 1); a state ~ N(0, 0.3).
Inputs random_inputs(int n, Head h, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  Inputs in;
  auto normed = [&](std::vector<float>& out, float scale) {
    out.resize(static_cast<size_t>(n) * h.dk);
    for (int t = 0; t < n; ++t) {
      double ss = 0.0;
      for (int i = 0; i < h.dk; ++i) {
        out[t * h.dk + i] = nd(rng);
        ss += out[t * h.dk + i] * out[t * h.dk + i];
      }
      for (int i = 0; i < h.dk; ++i) out[t * h.dk + i] *= scale / static_cast<float>(std::sqrt(ss));
    }
  };
  normed(in.q, 1.0f / std::sqrt(static_cast<float>(h.dk)));
  normed(in.k, 1.0f);
  in.v.resize(static_cast<size_t>(n) * h.dv);
  for (float& x : in.v) x = nd(rng);
  for (int t = 0; t < n; ++t) {
    in.g.push_back(-2.0f * ud(rng));
    in.beta.push_back(0.05f + 0.9f * ud(rng));
  }
  in.s.resize(static_cast<size_t>(h.dk) * h.dv);
  for (float& x : in.s) x = 0.3f * nd(rng);
  return in;
}

float rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0.0f, m = 1.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return d / m;
}

class DeltaRuleTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam()) << "; that level is tested on a machine that has it";
    }
  }
};

constexpr float kTol = 1e-4f;
constexpr Head kHeads[] = {{128, 128}, {32, 32}, {24, 40}};

TEST_P(DeltaRuleTest, StepMatchesTheReference) {
  std::mt19937 rng(3);
  for (const Head h : kHeads) {
    const int n = 70;
    const Inputs in = random_inputs(n, h, rng);
    const DeltaRuleKernels k = delta_rule_kernels(GetParam(), h.dk, h.dv);
    std::vector<float> s_ref = in.s, s_cpu = in.s;
    std::vector<float> o_ref(static_cast<size_t>(n) * h.dv), o_cpu(o_ref.size());
    for (int t = 0; t < n; ++t) {
      ref::delta_rule_step(&in.q[t * h.dk], &in.k[t * h.dk], &in.v[t * h.dv], in.g[t], in.beta[t], h.dk, h.dv,
                           s_ref.data(), &o_ref[t * h.dv]);
      k.step(&in.q[t * h.dk], &in.k[t * h.dk], &in.v[t * h.dv], in.g[t], in.beta[t], h.dk, h.dv, s_cpu.data(),
             &o_cpu[t * h.dv]);
    }
    EXPECT_LE(rel_diff(o_cpu, o_ref), kTol) << h.dk << "x" << h.dv;
    EXPECT_LE(rel_diff(s_cpu, s_ref), kTol) << h.dk << "x" << h.dv;
  }
}

TEST_P(DeltaRuleTest, ChunkMatchesTheReferenceChunkedAndRecurrentForms) {
  std::mt19937 rng(4);
  constexpr int C = kDeltaRuleChunk;
  for (const Head h : kHeads) {
    const Inputs in = random_inputs(C, h, rng);
    const DeltaRuleKernels k = delta_rule_kernels(GetParam(), h.dk, h.dv);
    std::vector<float> s_chunk = in.s, s_rec = in.s, s_cpu = in.s;
    std::vector<float> o_chunk(static_cast<size_t>(C) * h.dv), o_rec(o_chunk.size()), o_cpu(o_chunk.size());
    ref::delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), C, h.dk, h.dv,
                            s_chunk.data(), o_chunk.data());
    for (int t = 0; t < C; ++t) {
      ref::delta_rule_step(&in.q[t * h.dk], &in.k[t * h.dk], &in.v[t * h.dv], in.g[t], in.beta[t], h.dk, h.dv,
                           s_rec.data(), &o_rec[t * h.dv]);
    }
    DeltaRuleChunk c;
    c.q = in.q.data();
    c.k = in.k.data();
    c.qk_stride = h.dk;
    c.v = in.v.data();
    c.v_stride = h.dv;
    c.g = in.g.data();
    c.beta = in.beta.data();
    c.gate_stride = 1;
    c.o = o_cpu.data();
    c.o_stride = h.dv;
    k.chunk(c, h.dk, h.dv, s_cpu.data());
    const std::string what = std::to_string(h.dk) + "x" + std::to_string(h.dv);
    EXPECT_LE(rel_diff(o_cpu, o_chunk), kTol) << what << " vs the reference's chunked form";
    EXPECT_LE(rel_diff(s_cpu, s_chunk), kTol) << what << " vs the reference's chunked form";
    EXPECT_LE(rel_diff(o_cpu, o_rec), kTol) << what << " vs the reference's recurrent form";
    EXPECT_LE(rel_diff(s_cpu, s_rec), kTol) << what << " vs the reference's recurrent form";
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, DeltaRuleTest, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<Isa>& i) { return std::string(isa_name(i.param)); });

}  // namespace
}  // namespace kestrel::cpu
