// gpu/get_rows against core's scalar dequantize_row, bit for bit, for every supported type: random block bytes
// (every quant pattern, finite random scales; F16/BF16/F32 rows are random bits, NaN and inf included), an odd
// number of rows and ids, repeated ids, grids that have to stride, and out-of-range ids through both entry points.
// Tests that need a device skip (GTEST_SKIP) where there is none; the argument checks run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "gpu/kernels/get_rows.h"
#include "tests/gpu/block_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

std::string name_of(GgmlType t) { return std::string(ggml_type_name(t)); }

struct Case {
  GgmlType type;
  int64_t n_cols;
};

constexpr Case kCases[] = {
    {GgmlType::kF32, 67},  {GgmlType::kF16, 67},   {GgmlType::kBF16, 67},  {GgmlType::kQ8_0, 96},
    {GgmlType::kQ4_0, 96}, {GgmlType::kQ4_K, 512}, {GgmlType::kQ5_K, 768}, {GgmlType::kQ6_K, 512},
};

// Random bytes for n_rows rows; block scales replaced by finite halves of random sign and magnitude (subnormal
// halves included), so both sides compute with finite numbers and NaN payloads cannot differ.
std::vector<unsigned char> random_matrix(GgmlType t, int64_t n_cols, int64_t n_rows, std::mt19937& rng) {
  const uint64_t row_bytes = *ggml_row_bytes(t, static_cast<uint64_t>(n_cols));
  std::vector<unsigned char> m(row_bytes * static_cast<uint64_t>(n_rows));
  for (auto& b : m) b = static_cast<unsigned char>(rng());
  const GgmlTypeTraits traits = ggml_type_traits(t);
  const std::vector<size_t> offsets = test::scale_offsets(t);
  if (!offsets.empty()) {
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-26, 6);
    for (size_t blk = 0; blk < m.size() / traits.block_bytes; ++blk) {
      for (size_t off : offsets) {
        const uint16_t h = f32_to_fp16(std::ldexp(mantissa(rng), exponent(rng)));
        std::memcpy(&m[blk * traits.block_bytes + off], &h, sizeof(h));
      }
    }
  }
  return m;
}

// f32 [ids.size(), n_cols] from core's dequantize_row.
std::vector<float> expected_rows(GgmlType t, const std::vector<unsigned char>& m, int64_t n_cols,
                                 const std::vector<int32_t>& ids) {
  const uint64_t row_bytes = *ggml_row_bytes(t, static_cast<uint64_t>(n_cols));
  std::vector<float> out(ids.size() * static_cast<size_t>(n_cols));
  for (size_t r = 0; r < ids.size(); ++r) {
    const Status s = dequantize_row(t, m.data() + static_cast<uint64_t>(ids[r]) * row_bytes,
                                    out.data() + r * static_cast<size_t>(n_cols), n_cols);
    EXPECT_TRUE(s) << s.error().to_string();
  }
  return out;
}

// First element whose bits differ, or -1.
int64_t first_mismatch(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

uint32_t bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Uploads m and ids, runs get_rows (checked entry point), returns dst.
std::vector<float> run_get_rows(GgmlType t, const std::vector<unsigned char>& m, int64_t n_cols, int64_t n_rows,
                                const std::vector<int32_t>& ids) {
  DeviceBuffer d_src(m.size());
  DeviceBuffer d_ids(ids.size() * sizeof(int32_t));
  const size_t out_elems = ids.size() * static_cast<size_t>(n_cols);
  DeviceBuffer d_dst(out_elems * sizeof(float));
  std::vector<float> out(out_elems);
  EXPECT_NE(d_src.as<void>(), nullptr);
  EXPECT_NE(d_dst.as<void>(), nullptr);
  if (d_src.as<void>() == nullptr || d_ids.as<void>() == nullptr || d_dst.as<void>() == nullptr) return out;
  EXPECT_EQ(memcpy_synced(d_src.as<void>(), m.data(), m.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(memcpy_synced(d_ids.as<void>(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const DeviceMatrixView view{t, d_src.as<void>(), n_cols, n_rows};
  const Status s = get_rows(view, ids, d_ids.as<int32_t>(), d_dst.as<float>(), stream);
  EXPECT_TRUE(s) << s.error().to_string();
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(memcpy_synced(out.data(), d_dst.as<void>(), out_elems * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

TEST(GetRows, EveryTypeMatchesCoreBitForBit) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(4242);
  constexpr int64_t kRows = 37;
  for (const Case& c : kCases) {
    const std::vector<unsigned char> m = random_matrix(c.type, c.n_cols, kRows, rng);
    std::vector<int32_t> ids(29);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % kRows);
    ids[0] = 0;
    ids[1] = kRows - 1;
    ids[5] = ids[2];  // repeated ids
    ids[6] = ids[2];
    const std::vector<float> want = expected_rows(c.type, m, c.n_cols, ids);
    const std::vector<float> got = run_get_rows(c.type, m, c.n_cols, kRows, ids);
    const int64_t bad = first_mismatch(want, got);
    EXPECT_EQ(bad, -1) << name_of(c.type) << ": output " << bad / c.n_cols << " (id " << ids[bad / c.n_cols]
                       << ") column " << bad % c.n_cols << ": want 0x" << std::hex << bits(want[bad]) << " got 0x"
                       << bits(got[bad]);
  }
}

TEST(GetRows, StridesOverManyIdsAndWideRows) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(99);
  // More ids than one grid dimension holds (65535).
  {
    constexpr int64_t kRows = 5;
    const std::vector<unsigned char> m = random_matrix(GgmlType::kQ8_0, 32, kRows, rng);
    std::vector<int32_t> ids(70001);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % kRows);
    EXPECT_EQ(
        first_mismatch(expected_rows(GgmlType::kQ8_0, m, 32, ids), run_get_rows(GgmlType::kQ8_0, m, 32, kRows, ids)),
        -1);
  }
  // Rows wider than 64 column blocks of 256 threads.
  {
    constexpr int64_t kCols = 256 * 70;
    const std::vector<unsigned char> m = random_matrix(GgmlType::kQ6_K, kCols, 3, rng);
    const std::vector<int32_t> ids = {2, 0, 2};
    EXPECT_EQ(
        first_mismatch(expected_rows(GgmlType::kQ6_K, m, kCols, ids), run_get_rows(GgmlType::kQ6_K, m, kCols, 3, ids)),
        -1);
  }
}

TEST(GetRows, CheckedEntryPointRefusesBadIdsBeforeLaunching) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(7);
  constexpr int64_t kRows = 9;
  const std::vector<unsigned char> m = random_matrix(GgmlType::kQ4_K, 256, kRows, rng);
  DeviceBuffer d_src(m.size());
  DeviceBuffer d_ids(4 * sizeof(int32_t));
  DeviceBuffer d_dst(4 * 256 * sizeof(float));
  KESTREL_CUDA_OK(memcpy_synced(d_src.as<void>(), m.data(), m.size(), cudaMemcpyHostToDevice));
  KESTREL_CUDA_OK(memset_synced(d_dst.as<void>(), 0xAB, 4 * 256 * sizeof(float)));
  const DeviceMatrixView view{GgmlType::kQ4_K, d_src.as<void>(), 256, kRows};
  for (int32_t bad : {static_cast<int32_t>(kRows), -1, std::numeric_limits<int32_t>::max()}) {
    const std::vector<int32_t> ids = {1, 2, bad, 3};
    KESTREL_CUDA_OK(memcpy_synced(d_ids.as<void>(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    const Status s = get_rows(view, ids, d_ids.as<int32_t>(), d_dst.as<float>(), nullptr);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code, ErrorCode::kOutOfRange);
    EXPECT_NE(s.error().message.find("position 2"), std::string::npos) << s.error().message;
  }
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  std::vector<unsigned char> dst(4 * 256 * sizeof(float));
  KESTREL_CUDA_OK(memcpy_synced(dst.data(), d_dst.as<void>(), dst.size(), cudaMemcpyDeviceToHost));
  for (unsigned char b : dst) ASSERT_EQ(b, 0xAB);  // nothing was written
}

TEST(GetRows, DeviceIdsEntryPointWritesNaNRowsAndCountsBadIds) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(8);
  constexpr int64_t kRows = 11;
  constexpr int64_t kCols = 512;
  const std::vector<unsigned char> m = random_matrix(GgmlType::kQ5_K, kCols, kRows, rng);
  const std::vector<int32_t> ids = {
      3, -1, 10, kRows, std::numeric_limits<int32_t>::min(), 0, std::numeric_limits<int32_t>::max(), 3};
  const size_t out_elems = ids.size() * kCols;
  DeviceBuffer d_src(m.size());
  DeviceBuffer d_ids(ids.size() * sizeof(int32_t));
  DeviceBuffer d_dst(out_elems * sizeof(float));
  DeviceBuffer d_bad(sizeof(int32_t));
  KESTREL_CUDA_OK(memcpy_synced(d_src.as<void>(), m.data(), m.size(), cudaMemcpyHostToDevice));
  KESTREL_CUDA_OK(memcpy_synced(d_ids.as<void>(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  KESTREL_CUDA_OK(memset_synced(d_bad.as<void>(), 0, sizeof(int32_t)));
  const DeviceMatrixView view{GgmlType::kQ5_K, d_src.as<void>(), kCols, kRows};
  const Status s = get_rows_device_ids(view, d_ids.as<int32_t>(), static_cast<int64_t>(ids.size()), d_dst.as<float>(),
                                       d_bad.as<int32_t>(), nullptr);
  ASSERT_TRUE(s) << s.error().to_string();
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got(out_elems);
  int32_t n_bad = -1;
  KESTREL_CUDA_OK(memcpy_synced(got.data(), d_dst.as<void>(), out_elems * sizeof(float), cudaMemcpyDeviceToHost));
  KESTREL_CUDA_OK(memcpy_synced(&n_bad, d_bad.as<void>(), sizeof(int32_t), cudaMemcpyDeviceToHost));
  EXPECT_EQ(n_bad, 4);
  for (size_t r = 0; r < ids.size(); ++r) {
    const std::vector<float> row(got.begin() + static_cast<int64_t>(r) * kCols,
                                 got.begin() + static_cast<int64_t>(r + 1) * kCols);
    if (ids[r] >= 0 && ids[r] < kRows) {
      EXPECT_EQ(first_mismatch(expected_rows(GgmlType::kQ5_K, m, kCols, {ids[r]}), row), -1) << "output " << r;
    } else {
      for (float v : row) ASSERT_EQ(bits(v), 0x7FC00000u) << "output " << r;
    }
  }
}

// ---- argument checks: refused before anything touches the device, so these run without a GPU ------------------

const void* fake_device_ptr(uintptr_t at) { return reinterpret_cast<const void*>(at); }

TEST(GetRowsArgs, RefusedBeforeLaunch) {
  auto* dst = static_cast<float*>(const_cast<void*>(fake_device_ptr(0x20000)));
  const auto* ids_dev = static_cast<const int32_t*>(fake_device_ptr(0x30000));
  const std::vector<int32_t> ids = {0, 1};

  const DeviceMatrixView q4_1{GgmlType::kQ4_1, fake_device_ptr(0x10000), 64, 4};
  EXPECT_FALSE(get_rows_supports(GgmlType::kQ4_1));
  Status s = get_rows(q4_1, ids, ids_dev, dst, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);

  const DeviceMatrixView ragged{GgmlType::kQ4_K, fake_device_ptr(0x10000), 100, 4};  // not a multiple of 256
  s = get_rows(ragged, ids, ids_dev, dst, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  const DeviceMatrixView misaligned{GgmlType::kQ8_0, fake_device_ptr(0x10001), 64, 4};
  s = get_rows(misaligned, ids, ids_dev, dst, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  const DeviceMatrixView f32_at_2{GgmlType::kF32, fake_device_ptr(0x10002), 64, 4};  // f32 needs 4 bytes
  s = get_rows(f32_at_2, ids, ids_dev, dst, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  const DeviceMatrixView ok{GgmlType::kQ6_K, fake_device_ptr(0x10000), 256, 4};
  s = get_rows(ok, ids, nullptr, dst, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  const std::vector<int32_t> bad_ids = {0, 4};
  s = get_rows(ok, bad_ids, ids_dev, dst, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kOutOfRange);

  s = get_rows_device_ids(ok, ids_dev, -1, dst, nullptr, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);

  // Nothing to gather: succeeds without a launch.
  EXPECT_TRUE(get_rows(ok, {}, ids_dev, dst, nullptr));
  EXPECT_TRUE(get_rows_device_ids(ok, ids_dev, 0, dst, nullptr, nullptr));
}

}  // namespace
}  // namespace kestrel::gpu
