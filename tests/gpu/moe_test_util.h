// moe_test_util.h: what tests/gpu/test_moe.cpp and tests/gpu/test_moe_imma.cpp share — reproducible random weight
// stacks of any type gpu/kernels/dequant.cuh handles, activations whose routing is clear of rounding, device copies of
// the weights, and the check of a layer's outputs against the reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/reference/matvec.h"
#include "tests/gpu/block_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu::test {

// Fast reproducible bytes (the expert stacks are hundreds of MB at the 35B shape).
struct XorShift {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// n_mat matrices of n_rows × n_cols: random quant bytes with f16 scales making weights of magnitude ~ scale (random
// sign for d, positive for dmin), or plain values ~ N(0, scale).
inline std::vector<unsigned char> random_weights(GgmlType t, int64_t n_cols, int64_t n_rows, int64_t n_mat, float scale,
                                                 uint64_t seed) {
  const uint64_t row_bytes = *ggml_row_bytes(t, static_cast<uint64_t>(n_cols));
  const size_t bytes = row_bytes * static_cast<uint64_t>(n_rows * n_mat);
  std::vector<unsigned char> m(bytes);
  XorShift rng{seed * 0x9E3779B97F4A7C15ull + 1};
  if (t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16) {
    std::mt19937 gen(static_cast<unsigned>(seed));
    std::normal_distribution<float> normal(0.0f, scale);
    const size_t n = static_cast<size_t>(n_cols * n_rows * n_mat);
    for (size_t i = 0; i < n; ++i) {
      store_plain(t, normal(gen), i, m.data());
    }
    return m;
  }
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(&m[i], &v, 8);
  }
  for (size_t i = bytes / 8 * 8; i < bytes; ++i) m[i] = static_cast<unsigned char>(rng.next());
  const size_t block_bytes = ggml_type_traits(t).block_bytes;
  const std::vector<size_t> offs = scale_offsets(t);
  // Divide the block scale by the typical |quant · sub-scale| of the format, so weights come out ~ scale.
  float typical = 4.0f;  // Q4_0: |q| <= 8
  if (t == GgmlType::kQ8_0) typical = 64.0f;
  if (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K) typical = 256.0f;  // 6-bit sub-scale · 4/5-bit quant
  if (t == GgmlType::kQ6_K) typical = 1024.0f;                         // int8 sub-scale · 6-bit quant
  for (size_t blk = 0; blk < bytes / block_bytes; ++blk) {
    for (size_t o = 0; o < offs.size(); ++o) {
      const uint64_t r = rng.next();
      const float mag = scale / typical * (0.25f + static_cast<float>(r % 1000) / 1000.0f);
      const float v = (o == 0 && (r >> 20) % 2 == 1) ? -mag : mag;
      const uint16_t h = f32_to_fp16(v);
      std::memcpy(&m[blk * block_bytes + offs[o]], &h, 2);
    }
  }
  return m;
}

// n_tok activation vectors of h elements, each redrawn (up to 200 times) until the k + 1 largest of its e router
// logits (ref::matvec with `router`) are more than 1e-4 apart, so a last-ulp difference between a device router
// and the reference cannot flip a choice or its order.
inline std::vector<float> draw_routable_x(const ref::QuantMatrix& router, int h, int e, int k, int n_tok,
                                          unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tok) * static_cast<size_t>(h));
  std::vector<float> logits(static_cast<size_t>(e));
  for (int t = 0; t < n_tok; ++t) {
    float* xt = x.data() + static_cast<size_t>(t) * static_cast<size_t>(h);
    bool clear = false;
    for (int attempt = 0; attempt < 200 && !clear; ++attempt) {
      for (int i = 0; i < h; ++i) xt[i] = normal(rng);
      EXPECT_TRUE(ref::matvec(router, xt, logits.data()));
      std::vector<float> sorted = logits;
      std::sort(sorted.begin(), sorted.end(), [](float p, float q) { return p > q; });
      clear = true;
      for (int j = 0; j + 1 < std::min(k + 1, e); ++j) {
        clear = clear && sorted[static_cast<size_t>(j)] - sorted[static_cast<size_t>(j + 1)] > 1e-4f;
      }
    }
    EXPECT_TRUE(clear) << "token " << t << ": no draw with clear routing gaps";
  }
  return x;
}

// Device copies of host byte vectors (the layer's weights), owned for the store's lifetime.
struct DeviceUploads {
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  const void* put(const std::vector<unsigned char>& v) {
    bufs.push_back(std::make_unique<DeviceBuffer>(v.size()));
    EXPECT_EQ(memcpy_synced(bufs.back()->as(), v.data(), v.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return bufs.back()->as();
  }
};

// The layer's outputs (n_tok rows of h) against the reference's: each within tol × its row's largest |ref| (NaN
// fails). The first mismatch is a test failure with its token, element and values; one line reports the worst
// error ratio with the layer's launch count and active experts. Returns how many elements are out of tolerance.
inline int count_out_of_tolerance(const std::vector<float>& got, const std::vector<float>& want, int n_tok, int h,
                                  double tol, const std::string& what, int launches, int n_active) {
  int bad = 0;
  double worst = 0.0;
  size_t worst_at = 0;
  for (int t = 0; t < n_tok; ++t) {
    const size_t row = static_cast<size_t>(t) * static_cast<size_t>(h);
    double scale = 0.0;
    for (int i = 0; i < h; ++i) scale = std::max(scale, std::fabs(double{want[row + static_cast<size_t>(i)]}));
    for (int i = 0; i < h; ++i) {
      const size_t at = row + static_cast<size_t>(i);
      const double err = std::fabs(double{got[at]} - double{want[at]});
      double ratio = err / (tol * scale + 1e-30);
      if (std::isnan(ratio)) ratio = 1e30;
      if (ratio > worst) {
        worst = ratio;
        worst_at = at;
      }
      if (!(ratio <= 1.0)) {
        if (bad == 0) {
          ADD_FAILURE() << "first mismatch: token " << t << " element " << i << " got " << got[at] << " want "
                        << want[at] << " |err| " << err << " row max|ref| " << scale;
        }
        ++bad;
      }
    }
  }
  std::printf("  %s: worst err %.3g x tolerance (token %zu element %zu), %d over, %d launches, %d active experts\n",
              what.c_str(), worst, worst_at / static_cast<size_t>(h), worst_at % static_cast<size_t>(h), bad, launches,
              n_active);
  return bad;
}

}  // namespace kestrel::gpu::test
