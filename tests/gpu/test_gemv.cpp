// gpu/gemv against core's ref::matvec_batch for every supported type, n_vec in {1, 2, 3, 8, 13, 32} (every
// vector-count bucket), odd shapes (n_out 1, 7, 129; n_in one block, several blocks not a multiple of the kernel's
// 1024-element chunk, 2048), matrices and activations starting off 16-byte boundaries; runs bit-identical to each
// other and independent of how many vectors share the call; argument errors refused before launching.
//
// Tolerance: the kernel dequantizes each weight exactly as core does and differs only in summation order (each
// lane's f32 partial sum over its 8-element groups, then a butterfly over 32 lanes, against core's index order),
// so |gpu - ref| <= 1e-5 · Σ|w_i · x_i| per output (the f32 rounding of either order stays far below that bound at
// n_in <= 2048: ~1e-7 in a host emulation of the kernel).
// Tests that need a device skip (GTEST_SKIP) where there is none; the argument checks run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/reference/matvec.h"
#include "gpu/kernels/gemv.h"
#include "tests/gpu/block_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

constexpr double kRelTol = 1e-5;

std::string name_of(GgmlType t) { return std::string(ggml_type_name(t)); }

constexpr GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K,
                               GgmlType::kQ5_K, GgmlType::kBF16, GgmlType::kF16,  GgmlType::kF32};

int64_t block_elems(GgmlType t) { return static_cast<int64_t>(ggml_type_traits(t).block_elems); }

// One block, several blocks (a row longer than one 1024-element chunk but not a multiple of it), 2048.
std::vector<int64_t> n_in_cases(GgmlType t) {
  const int64_t b = block_elems(t);
  if (b == 1) return {1, 67, 1031, 2048};
  if (b == 32) return {32, 32 * 37, 2048};
  return {256, 256 * 5, 2048};
}

// n_rows random rows: quant blocks are random bytes with finite random f16 scales (wide magnitudes, so the
// relative bound is tested across blocks of very different size); plain types hold finite random values.
std::vector<unsigned char> random_matrix(GgmlType t, int64_t n_cols, int64_t n_rows, std::mt19937& rng) {
  const uint64_t row_bytes = *ggml_row_bytes(t, static_cast<uint64_t>(n_cols));
  std::vector<unsigned char> m(row_bytes * static_cast<uint64_t>(n_rows));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  if (t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16) {
    std::uniform_int_distribution<int> exponent(-6, 6);
    const size_t n = static_cast<size_t>(n_cols * n_rows);
    for (size_t i = 0; i < n; ++i) {
      test::store_plain(t, std::ldexp(mantissa(rng), exponent(rng)), i, m.data());
    }
    return m;
  }
  for (auto& b : m) b = static_cast<unsigned char>(rng());
  const size_t block_bytes = ggml_type_traits(t).block_bytes;
  std::uniform_int_distribution<int> exponent(-14, 6);
  for (size_t blk = 0; blk < m.size() / block_bytes; ++blk) {
    for (size_t off : test::scale_offsets(t)) {
      const uint16_t h = f32_to_fp16(std::ldexp(mantissa(rng), exponent(rng)));
      std::memcpy(&m[blk * block_bytes + off], &h, sizeof(h));
    }
  }
  return m;
}

std::vector<float> random_vectors(int n_vec, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_vec * n_in));
  for (auto& v : x) v = normal(rng);
  return x;
}

// Σ|w_i · x_i| per output, f64 [n_vec, n_out], from core's dequantize_row.
std::vector<double> magnitudes(GgmlType t, const std::vector<unsigned char>& m, int64_t n_in, int64_t n_out,
                               const std::vector<float>& x, int n_vec) {
  const uint64_t row_bytes = *ggml_row_bytes(t, static_cast<uint64_t>(n_in));
  std::vector<float> row(static_cast<size_t>(n_in));
  std::vector<double> mag(static_cast<size_t>(n_vec * n_out), 0.0);
  for (int64_t o = 0; o < n_out; ++o) {
    const Status s = dequantize_row(t, m.data() + static_cast<uint64_t>(o) * row_bytes, row.data(), n_in);
    EXPECT_TRUE(s) << s.error().to_string();
    for (int v = 0; v < n_vec; ++v) {
      double sum = 0.0;
      for (int64_t i = 0; i < n_in; ++i) {
        sum += std::fabs(static_cast<double>(row[static_cast<size_t>(i)]) *
                         static_cast<double>(x[static_cast<size_t>(v * n_in + i)]));
      }
      mag[static_cast<size_t>(v * n_out + o)] = sum;
    }
  }
  return mag;
}

// Uploads m (at byte `offset` into its allocation) and x (at float `x_offset`), runs gemv, returns y f32
// [n_vec, n_out].
std::vector<float> run_gemv(GgmlType t, const std::vector<unsigned char>& m, size_t offset, int64_t n_in, int64_t n_out,
                            const std::vector<float>& x, int n_vec, size_t x_offset = 0) {
  DeviceBuffer d_w(m.size() + offset);
  DeviceBuffer d_x((x.size() + x_offset) * sizeof(float));
  const size_t y_elems = static_cast<size_t>(n_vec * n_out);
  DeviceBuffer d_y(y_elems * sizeof(float));
  std::vector<float> y(y_elems, std::nanf(""));
  EXPECT_NE(d_w.as<unsigned char>(), nullptr);
  EXPECT_NE(d_x.as<unsigned char>(), nullptr);
  EXPECT_NE(d_y.as<unsigned char>(), nullptr);
  if (d_w.as<unsigned char>() == nullptr || d_x.as<unsigned char>() == nullptr || d_y.as<unsigned char>() == nullptr)
    return y;
  EXPECT_EQ(memcpy_synced(d_w.as<unsigned char>() + offset, m.data(), m.size(), cudaMemcpyHostToDevice), cudaSuccess);
  float* x_dev = reinterpret_cast<float*>(d_x.as<unsigned char>()) + x_offset;
  EXPECT_EQ(memcpy_synced(x_dev, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(memset_synced(d_y.as<unsigned char>(), 0xFF, y_elems * sizeof(float)), cudaSuccess);  // NaN until written
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const DeviceMatrixView view{t, d_w.as<unsigned char>() + offset, n_in, n_out};
  const Status s = gemv(view, x_dev, n_vec, reinterpret_cast<float*>(d_y.as<unsigned char>()), stream);
  EXPECT_TRUE(s) << s.error().to_string();
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(memcpy_synced(y.data(), d_y.as<unsigned char>(), y_elems * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return y;
}

// Compares one configuration with ref::matvec_batch; returns the number of outputs outside the bound.
int check_case(GgmlType t, int64_t n_in, int64_t n_out, int n_vec, size_t offset, std::mt19937& rng,
               size_t x_offset = 0) {
  const std::vector<unsigned char> m = random_matrix(t, n_in, n_out, rng);
  const std::vector<float> x = random_vectors(n_vec, n_in, rng);
  std::vector<float> want(static_cast<size_t>(n_vec * n_out));
  const ref::QuantMatrix qm{t, m.data(), static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)};
  const Status s = ref::matvec_batch(qm, x.data(), n_vec, want.data());
  EXPECT_TRUE(s) << s.error().to_string();
  const std::vector<double> mag = magnitudes(t, m, n_in, n_out, x, n_vec);
  const std::vector<float> got = run_gemv(t, m, offset, n_in, n_out, x, n_vec, x_offset);
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    const double bound = kRelTol * mag[i] + 1e-30;
    if (!(err <= bound)) {
      if (bad < 3) {
        ADD_FAILURE() << name_of(t) << " n_in " << n_in << " n_out " << n_out << " n_vec " << n_vec << " offset "
                      << offset << " x_offset " << x_offset << ": vector " << i / static_cast<size_t>(n_out) << " row "
                      << i % static_cast<size_t>(n_out) << " got " << got[i] << " want " << want[i] << " (|err| " << err
                      << " > " << bound << ")";
      }
      ++bad;
    }
  }
  return bad;
}

TEST(Gemv, EveryTypeShapeAndVectorCountMatchesReference) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(20261129);
  for (GgmlType t : kTypes) {
    for (int64_t n_in : n_in_cases(t)) {
      for (int64_t n_out : {1, 7, 129}) {
        for (int n_vec : {1, 2, 3, 8, 13, 32}) {
          EXPECT_EQ(check_case(t, n_in, n_out, n_vec, 0, rng), 0);
        }
      }
    }
  }
}

TEST(Gemv, MatrixAndActivationsOffSixteenByteBoundaries) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(5);
  // Offsets 2..14 move every row start, so the first and last 16-byte unit of each chunk are partial; x one or
  // three floats past a 16-byte boundary takes the kernel's scalar activation loads.
  for (GgmlType t : kTypes) {
    const size_t step = t == GgmlType::kF32 ? 4 : 2;
    for (size_t offset = step; offset < 16; offset += 2 * step) {
      for (size_t x_offset : {0, 1, 3}) EXPECT_EQ(check_case(t, n_in_cases(t)[1], 7, 3, offset, rng, x_offset), 0);
    }
  }
}

TEST(Gemv, Q4RowsOfSeveralStepsMatchReference) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(4242);
  // Q4_0/Q4_K rows of whole 256-element groups on 16-byte aligned w and x take the v2 kernel (gpu/kernels/gemv_q4.cu),
  // which walks a row in 2048-element steps, 4 rows per warp and 16 per block, vectors in slices of 8: rows of
  // several steps with a partial last one (2816 = 2048 + 768, 4352 = 2 * 2048 + 256), row counts off the 4/16
  // grid, vector counts on both sides of a slice, and the matrix or x moved by whole 16-byte units.
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_K}) {
    for (int64_t n_in : {2816, 4352}) {
      for (int64_t n_out : {5, 16, 37}) {
        for (int n_vec : {1, 8, 9, 32}) EXPECT_EQ(check_case(t, n_in, n_out, n_vec, 0, rng), 0);
      }
    }
    EXPECT_EQ(check_case(t, 2816, 37, 3, 16, rng, 4), 0);
    // Taller matrices take 2 rows per warp (>= 2048 rows) and 4 (>= 8192), with a partial last warp and block.
    EXPECT_EQ(check_case(t, 2304, 2053, 3, 0, rng), 0);
    EXPECT_EQ(check_case(t, 2304, 8195, 9, 0, rng), 0);
  }
}

TEST(Gemv, EmptyRowsWriteZeros) {
  KESTREL_REQUIRE_DEVICE();
  DeviceBuffer d_y(3 * 5 * sizeof(float));
  KESTREL_CUDA_OK(memset_synced(d_y.as<unsigned char>(), 0xFF, 3 * 5 * sizeof(float)));
  DeviceBuffer d_x(4);
  const DeviceMatrixView view{GgmlType::kQ4_K, d_x.as<unsigned char>(), 0, 5};
  const Status s = gemv(view, reinterpret_cast<const float*>(d_x.as<unsigned char>()), 3,
                        reinterpret_cast<float*>(d_y.as<unsigned char>()), nullptr);
  ASSERT_TRUE(s) << s.error().to_string();
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> y(15, 1.0f);
  KESTREL_CUDA_OK(memcpy_synced(y.data(), d_y.as<unsigned char>(), y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Gemv, RepeatedRunsAreBitIdentical) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(77);
  for (GgmlType t : kTypes) {
    constexpr int64_t kOut = 129;
    constexpr int kVec = 32;
    const int64_t n_in = n_in_cases(t).back();
    const std::vector<unsigned char> m = random_matrix(t, n_in, kOut, rng);
    const std::vector<float> x = random_vectors(kVec, n_in, rng);
    const std::vector<float> first = run_gemv(t, m, 0, n_in, kOut, x, kVec);
    const std::vector<float> second = run_gemv(t, m, 0, n_in, kOut, x, kVec);
    EXPECT_TRUE(same_bits(first, second)) << name_of(t);
    // Each vector's result does not depend on how many vectors share the call (bucket 32 vs bucket 1).
    const std::vector<float> last(x.end() - n_in, x.end());
    const std::vector<float> alone = run_gemv(t, m, 0, n_in, kOut, last, 1);
    const std::vector<float> in_batch(first.end() - kOut, first.end());
    EXPECT_TRUE(same_bits(alone, in_batch)) << name_of(t);
  }
}

// ---- argument checks: refused before anything touches the device, so these run without a GPU ------------------

template <class T>
T* fake_device_ptr(uintptr_t at) {
  return reinterpret_cast<T*>(at);
}

TEST(GemvArgs, RefusedBeforeLaunch) {
  const auto* x = fake_device_ptr<const float>(0x20000);
  auto* y = fake_device_ptr<float>(0x40000);
  const void* w = fake_device_ptr<const void>(0x10000);

  EXPECT_FALSE(gemv_supports(GgmlType::kQ4_1));
  Status s = gemv({GgmlType::kQ4_1, w, 64, 4}, x, 1, y, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);

  for (int n_vec : {0, -1, kGemvMaxVectors + 1}) {
    s = gemv({GgmlType::kQ8_0, w, 64, 4}, x, n_vec, y, nullptr);
    ASSERT_FALSE(s) << n_vec;
    EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(s.error().message.find("n_vec"), std::string::npos) << s.error().message;
  }

  s = gemv({GgmlType::kQ4_K, w, 100, 4}, x, 1, y, nullptr);  // n_in not a multiple of 256
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  s = gemv({GgmlType::kQ4_0, w, -32, 4}, x, 1, y, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  s = gemv({GgmlType::kQ8_0, fake_device_ptr<const void>(0x10001), 64, 4}, x, 1, y, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  s = gemv({GgmlType::kF32, fake_device_ptr<const void>(0x10002), 64, 4}, x, 1, y, nullptr);  // f32 needs 4
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  s = gemv({GgmlType::kF16, w, 64, 4}, fake_device_ptr<const float>(0x20002), 1, y, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  s = gemv({GgmlType::kF16, w, 64, 4}, x, 1, fake_device_ptr<float>(0x40001), nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  s = gemv({GgmlType::kQ6_K, nullptr, 256, 4}, x, 1, y, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  s = gemv({GgmlType::kQ6_K, w, 256, 4}, nullptr, 1, y, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  s = gemv({GgmlType::kQ6_K, w, 256, 4}, x, 1, nullptr, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  // y overlapping x: x is f32 [2, 256] at 0x20000, y starts inside it.
  s = gemv({GgmlType::kQ6_K, w, 256, 4}, x, 2, fake_device_ptr<float>(0x20000 + 1020), nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.error().message.find("overlaps"), std::string::npos) << s.error().message;

  // Nothing to compute: succeeds without a launch.
  EXPECT_TRUE(gemv({GgmlType::kQ6_K, w, 256, 0}, x, 4, y, nullptr));
}

}  // namespace
}  // namespace kestrel::gpu
