// core/reference norms and RoPE: formulas checked against double-precision evaluations written here, RoPE known
// values (position 0 is the identity; position 1 hand-computed), the half-split pairing and the untouched tail.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/reference/activations.h"
#include "core/reference/norm.h"
#include "core/reference/rope.h"
#include "tests/core/reference/ref_test_util.h"

namespace kestrel::ref {
namespace {

using test::random_vec;

TEST(RefNorm, RmsNormMatchesFormula) {
  const int n = 37;
  const auto x = random_vec(n, 1, -3.0f, 3.0f);
  const auto w = random_vec(n, 2, 0.5f, 1.5f);
  std::vector<float> y(n);
  rms_norm(x.data(), w.data(), n, 1e-6f, y.data());
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i] * inv * w[i], 1e-6 * std::abs(x[i] * inv * w[i]) + 1e-7);
  // In place gives the same bits.
  std::vector<float> z = x;
  rms_norm(z.data(), w.data(), n, 1e-6f, z.data());
  EXPECT_EQ(z, y);
}

TEST(RefNorm, RmsNormEpsMatters) {
  const std::vector<float> x(8, 1e-4f), w(8, 1.0f);
  std::vector<float> y(8);
  rms_norm(x.data(), w.data(), 8, 1e-6f, y.data());
  // mean(x²) = 1e-8, so y = 1e-4 / sqrt(1e-8 + 1e-6) = 1e-4 / sqrt(1.01e-6).
  EXPECT_NEAR(y[0], 1e-4 / std::sqrt(1.01e-6), 1e-6);
}

TEST(RefNorm, GatedNormMatchesFormula) {
  const int n = 16;
  const auto x = random_vec(n, 3, -2.0f, 2.0f);
  const auto z = random_vec(n, 4, -4.0f, 4.0f);
  const auto w = random_vec(n, 5, 0.5f, 1.5f);
  std::vector<float> y(n);
  rms_norm_gated(x.data(), z.data(), w.data(), n, 1e-6f, y.data());
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
  for (int i = 0; i < n; ++i) {
    const double silu_z = z[i] / (1.0 + std::exp(-static_cast<double>(z[i])));
    const double want = x[i] * inv * w[i] * silu_z;
    EXPECT_NEAR(y[i], want, 2e-6 * std::abs(want) + 1e-7) << i;
  }
}

TEST(RefNorm, L2NormAsHf) {
  const int n = 16;
  const auto x = random_vec(n, 6);
  std::vector<float> y(n);
  l2_norm(x.data(), n, kL2NormEps, y.data());
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  double out_ss = 0.0;
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(y[i], x[i] / std::sqrt(ss + 1e-6), 1e-6);
    out_ss += static_cast<double>(y[i]) * y[i];
  }
  EXPECT_NEAR(out_ss, 1.0, 1e-5);
  // HF's rsqrt(Σx² + eps) differs from llama.cpp's 1/max(‖x‖, eps) for tiny vectors: here ‖x‖ = 1e-3.
  const std::vector<float> tiny = {1e-3f, 0.0f};
  std::vector<float> t(2);
  l2_norm(tiny.data(), 2, kL2NormEps, t.data());
  EXPECT_NEAR(t[0], 1e-3 / std::sqrt(1e-6 + 1e-6), 1e-6);  // ≈ 0.7071, not 1
}

TEST(RefActivations, SoftplusThresholdAndSigmoid) {
  EXPECT_EQ(softplus(25.0f), 25.0f);
  EXPECT_EQ(softplus(20.5f), 20.5f);
  EXPECT_NEAR(softplus(0.0f), std::log(2.0f), 1e-7);
  EXPECT_NEAR(softplus(-30.0f), std::exp(-30.0), 1e-18);
  EXPECT_EQ(sigmoid(0.0f), 0.5f);
  EXPECT_EQ(sigmoid(-1000.0f), 0.0f);
  EXPECT_EQ(silu(-1000.0f), -0.0f);
  std::vector<float> p = {1.0f, 3.0f, 2.0f, 1000.0f};
  softmax(p.data(), 3);  // only the first three
  EXPECT_NEAR(p[0] + p[1] + p[2], 1.0f, 1e-6);
  EXPECT_NEAR(p[1] / p[0], std::exp(2.0), 1e-4);
}

TEST(RefRope, PositionZeroIsIdentity) {
  const int n_head = 3, hd = 32, n_rot = 16;
  const auto x = random_vec(n_head * hd, 7);
  std::vector<float> y = x;
  rope_neox_partial(y.data(), n_head, hd, n_rot, 1e7f, 0);
  EXPECT_EQ(y, x);
}

TEST(RefRope, PositionOneHandComputed) {
  // One head of 8 dims, n_rot 4 (pairs (0,2) and (1,3)), base 100: θ_0 = 1, θ_1 = 100^(-1/2) = 0.1.
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  rope_neox_partial(x.data(), 1, 8, 4, 100.0f, 1);
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.1), s1 = std::sin(0.1);
  EXPECT_NEAR(x[0], 1 * c0 - 3 * s0, 1e-6);
  EXPECT_NEAR(x[2], 3 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(x[1], 2 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(x[3], 4 * c1 + 2 * s1, 1e-6);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(x[i], static_cast<float>(i + 1)) << "dims >= n_rot must not move";
}

TEST(RefRope, AnglesFollowTheSpec) {
  const int n_rot = 64;
  const float base = 1e7f;
  const int64_t pos = 1234;
  std::vector<float> c(n_rot / 2), s(n_rot / 2), inv(n_rot / 2);
  rope_inv_freq(n_rot, base, inv.data());
  rope_cos_sin(n_rot, base, pos, c.data(), s.data());
  for (int i = 0; i < n_rot / 2; ++i) {
    const double want_inv = std::pow(1e7, -2.0 * i / n_rot);
    EXPECT_NEAR(inv[i], want_inv, 1e-6 * want_inv);
    const double theta = pos * want_inv;
    // f32 angles: an absolute error of a few ulp of θ (θ <= 1234).
    EXPECT_NEAR(c[i], std::cos(theta), 3e-4) << i;
    EXPECT_NEAR(s[i], std::sin(theta), 3e-4) << i;
  }
  // A unit vector on dim i rotates within the pair (i, i + 32) only.
  const int hd = 256;
  for (int i : {0, 5, 31}) {
    std::vector<float> x(hd, 0.0f);
    x[i] = 1.0f;
    rope_neox_partial(x.data(), 1, hd, n_rot, base, pos);
    for (int d = 0; d < hd; ++d) {
      if (d == i) {
        EXPECT_EQ(x[d], c[i]);
      } else if (d == i + 32) {
        EXPECT_EQ(x[d], s[i]);
      } else {
        EXPECT_EQ(x[d], 0.0f) << "dim " << d << " moved for unit dim " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kestrel::ref
