// gpu/rms_norm and residual_add_rms_norm against ref::rms_norm on random rows: lengths 1, 7, 31, 32, 33, 255, 1000,
// 2048, 5003 (not only multiples of 32 or of the block), 1..9 rows per call, values over several magnitudes; in
// place; the fused form's residual sum bit-identical to res + delta; runs bit-identical to each other.
//
// Tolerance: |gpu - ref| <= 1e-5 · |ref| per element. Only the order of the f32 sum of squares differs (plus FMA
// contraction of x·x on the device), which moves s by a few ulps (~1e-7 relative at n = 5003); each y_i is then
// the same two f32 products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/reference/norm.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/rms_norm.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

constexpr double kRelTol = 1e-5;
constexpr float kEps = 1e-6f;

std::vector<float> random_values(size_t n, std::mt19937& rng, int max_exp) {
  std::uniform_real_distribution<float> m(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-max_exp, max_exp);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(m(rng), e(rng));
  return v;
}

struct Shape {
  int64_t rows, n;
};
constexpr Shape kShapes[] = {{1, 1}, {3, 7}, {2, 31}, {4, 32}, {5, 33}, {1, 255}, {9, 1000}, {2, 2048}, {3, 5003}};

TEST(RmsNorm, MatchesReferenceOnOddShapes) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(7);
  for (const Shape& sh : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(sh.rows) + " n " + std::to_string(sh.n));
    const size_t total = static_cast<size_t>(sh.rows * sh.n);
    const std::vector<float> x = random_values(total, rng, 4);
    const std::vector<float> w = random_values(static_cast<size_t>(sh.n), rng, 1);
    std::vector<float> want(total);
    for (int64_t r = 0; r < sh.rows; ++r) {
      ref::rms_norm(x.data() + r * sh.n, w.data(), static_cast<int>(sh.n), kEps, want.data() + r * sh.n);
    }
    DeviceBuffer dx(total * 4), dw(w.size() * 4), dy(total * 4);
    ASSERT_TRUE(test::upload(dx, x));
    ASSERT_TRUE(test::upload(dw, w));
    const auto st = rms_norm(dx.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps, dy.as<float>(), nullptr);
    ASSERT_TRUE(st) << st.error().to_string();
    KESTREL_CUDA_OK(cudaDeviceSynchronize());
    const auto got = test::download<float>(dy.as(), total);
    const std::string diff = test::compare_close(got, want, {}, kRelTol);
    EXPECT_TRUE(diff.empty()) << diff;

    // Again: bit-identical. Then in place: the same bits.
    ASSERT_TRUE(rms_norm(dx.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps, dy.as<float>(), nullptr));
    KESTREL_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::download<float>(dy.as(), total) == got) << "second run differs";
    ASSERT_TRUE(rms_norm(dx.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps, dx.as<float>(), nullptr));
    KESTREL_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::download<float>(dx.as(), total) == got) << "in-place run differs";
  }
}

TEST(RmsNorm, FusedResidualAddMatchesAddThenNorm) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(8);
  for (const Shape& sh : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(sh.rows) + " n " + std::to_string(sh.n));
    const size_t total = static_cast<size_t>(sh.rows * sh.n);
    const std::vector<float> res = random_values(total, rng, 3);
    const std::vector<float> delta = random_values(total, rng, 3);
    const std::vector<float> w = random_values(static_cast<size_t>(sh.n), rng, 1);
    std::vector<float> sum(total), want(total);
    for (size_t i = 0; i < total; ++i) sum[i] = res[i] + delta[i];
    for (int64_t r = 0; r < sh.rows; ++r) {
      ref::rms_norm(sum.data() + r * sh.n, w.data(), static_cast<int>(sh.n), kEps, want.data() + r * sh.n);
    }
    DeviceBuffer dr(total * 4), dd(total * 4), dw(w.size() * 4), dy(total * 4);
    ASSERT_TRUE(test::upload(dr, res));
    ASSERT_TRUE(test::upload(dd, delta));
    ASSERT_TRUE(test::upload(dw, w));
    const auto st = residual_add_rms_norm(dr.as<float>(), dd.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps,
                                          dy.as<float>(), nullptr);
    ASSERT_TRUE(st) << st.error().to_string();
    KESTREL_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::download<float>(dr.as(), total) == sum) << "residual sum is not res + delta bit for bit";
    const auto got = test::download<float>(dy.as(), total);
    const std::string diff = test::compare_close(got, want, {}, kRelTol);
    EXPECT_TRUE(diff.empty()) << diff;
    // Same norm bits as the plain kernel on the summed residual.
    DeviceBuffer dy2(total * 4);
    ASSERT_TRUE(rms_norm(dr.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps, dy2.as<float>(), nullptr));
    KESTREL_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(test::download<float>(dy2.as(), total) == got) << "fused and plain norms differ";
  }
}

// rms_norm_prepare: the same residual sum and norm bits as the two-kernel forms, and the prepared bytes
// gemv_imma_prepare_x writes from those norms, on widths of one group, odd group counts and partial last groups
// (n = 64 · k), 1..32 rows, plain and programmatic launches, each chained behind a kernel that writes its inputs.
TEST(RmsNorm, PrepareMatchesNormThenPrepare) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(9);
  const test::DeviceStream owned;
  const cudaStream_t stream = owned.get();
  ASSERT_NE(stream, nullptr);
  constexpr Shape kPrepShapes[] = {{1, 64}, {3, 256}, {2, 320}, {1, 2048}, {8, 2048}, {5, 1216}, {32, 4096}, {1, 8192}};
  for (const Shape& sh : kPrepShapes) {
    for (const bool fused : {true, false}) {
      for (const bool programmatic : {false, true}) {
        SCOPED_TRACE("rows " + std::to_string(sh.rows) + " n " + std::to_string(sh.n) + (fused ? " fused" : " plain") +
                     (programmatic ? " programmatic" : ""));
        const size_t total = static_cast<size_t>(sh.rows * sh.n);
        const std::vector<float> res = random_values(total, rng, 3);
        const std::vector<float> delta = random_values(total, rng, 3);
        const std::vector<float> w = random_values(static_cast<size_t>(sh.n), rng, 1);
        const uint64_t prep_bytes = imma_x_bytes(sh.n, static_cast<int>(sh.rows));
        ASSERT_GT(prep_bytes, 0u);
        DeviceBuffer dr(total * 4), dd(total * 4), dw(w.size() * 4), dy(total * 4), dp(prep_bytes);
        DeviceBuffer dr2(total * 4), dy2(total * 4), dp2(prep_bytes);
        ASSERT_TRUE(test::upload(dr, res));
        ASSERT_TRUE(test::upload(dr2, res));
        ASSERT_TRUE(test::upload(dd, delta));
        ASSERT_TRUE(test::upload(dw, w));
        KESTREL_CUDA_OK(memset_synced(dp.as(), 0xA5, prep_bytes));
        KESTREL_CUDA_OK(memset_synced(dp2.as(), 0x5A, prep_bytes));
        const float* d = fused ? dd.as<float>() : nullptr;
        // Each path behind a kernel that writes the rows it reads (a plain norm of delta into res), so that a read
        // before the programmatic wait would see the uploaded rows instead.
        ASSERT_TRUE(rms_norm(dd.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps, dr2.as<float>(), stream));
        if (fused) {
          ASSERT_TRUE(
              residual_add_rms_norm(dr2.as<float>(), d, dw.as<float>(), sh.rows, sh.n, kEps, dy2.as<float>(), stream));
        } else {
          ASSERT_TRUE(rms_norm(dr2.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps, dy2.as<float>(), stream));
        }
        ASSERT_TRUE(gemv_imma_prepare_x(dy2.as<float>(), sh.n, static_cast<int>(sh.rows), dp2.as(), stream));
        ASSERT_TRUE(rms_norm(dd.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps, dr.as<float>(), stream));
        const auto st = rms_norm_prepare(dr.as<float>(), d, dw.as<float>(), sh.rows, sh.n, kEps, dy.as<float>(),
                                         dp.as(), stream, programmatic);
        ASSERT_TRUE(st) << st.error().to_string();
        KESTREL_CUDA_OK(cudaStreamSynchronize(stream));
        EXPECT_TRUE(test::download<float>(dr.as(), total) == test::download<float>(dr2.as(), total))
            << "residual rows differ";
        EXPECT_TRUE(test::download<float>(dy.as(), total) == test::download<float>(dy2.as(), total))
            << "norm rows differ";
        EXPECT_TRUE(test::download<uint8_t>(dp.as(), prep_bytes) == test::download<uint8_t>(dp2.as(), prep_bytes))
            << "prepared bytes differ from gemv_imma_prepare_x's";
        // Without xprep: the norm alone, the same rows.
        DeviceBuffer dy3(total * 4);
        ASSERT_TRUE(rms_norm(dd.as<float>(), dw.as<float>(), sh.rows, sh.n, kEps, dr.as<float>(), stream));
        ASSERT_TRUE(rms_norm_prepare(dr.as<float>(), d, dw.as<float>(), sh.rows, sh.n, kEps, dy3.as<float>(), nullptr,
                                     stream, programmatic));
        KESTREL_CUDA_OK(cudaStreamSynchronize(stream));
        EXPECT_TRUE(test::download<float>(dr.as(), total) == test::download<float>(dr2.as(), total))
            << "residual rows differ (the norm alone)";
        EXPECT_TRUE(test::download<float>(dy3.as(), total) == test::download<float>(dy2.as(), total))
            << "norm rows differ (the norm alone)";
      }
    }
  }
}

TEST(RmsNorm, ArgumentErrors) {
  float* p = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced: every call below is refused
  EXPECT_EQ(rms_norm(p, p, 1, 0, kEps, p, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(rms_norm(nullptr, p, 1, 4, kEps, p, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(rms_norm(p, p, -1, 4, kEps, p, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(residual_add_rms_norm(p, p + 64, p + 128, 1, 4, kEps, p, nullptr).error().code,
            ErrorCode::kInvalidArgument);  // y aliases res
  EXPECT_EQ(residual_add_rms_norm(p, nullptr, p + 128, 1, 4, kEps, p + 64, nullptr).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(rms_norm_prepare(p, nullptr, p + 128, 1, 100, kEps, p + 256, p + 512, nullptr, false).error().code,
            ErrorCode::kInvalidArgument);  // n not a multiple of 64
  EXPECT_EQ(rms_norm_prepare(p, nullptr, p + 128, 1, 64, kEps, p + 257, p + 512, nullptr, false).error().code,
            ErrorCode::kInvalidArgument);  // y not 16-byte aligned
  EXPECT_EQ(rms_norm_prepare(p, p + 64, p + 128, 1, 64, kEps, p, p + 512, nullptr, false).error().code,
            ErrorCode::kInvalidArgument);  // y aliases res
}

}  // namespace
}  // namespace kestrel::gpu
