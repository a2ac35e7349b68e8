// tile_stack_device against the host tiler (tile_matrix_stack, itself checked against an independent untiling in
// test_tiled_matrix): every tiled type on small, odd and engine-sized shapes, stacks of three slices tiled in two
// calls, byte for byte; slices outside the call's range stay untouched; bad arguments are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/quant/quant.h"
#include "gpu/kernels/tile_device.h"
#include "gpu/memory/tiled_matrix.h"
#include "tests/gpu/block_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

struct Shape {
  GgmlType type;
  int64_t n_cols, n_rows;
};

TEST(TileDevice, MatchesHostTilerOnEveryType) {
  KESTREL_REQUIRE_DEVICE();
  const Shape shapes[] = {
      {GgmlType::kQ4_0, 64, 16},    {GgmlType::kQ4_0, 192, 48},   {GgmlType::kQ4_0, 2048, 512},
      {GgmlType::kQ4_0, 512, 2048}, {GgmlType::kQ8_0, 64, 16},    {GgmlType::kQ8_0, 320, 32},
      {GgmlType::kQ4_K, 256, 16},   {GgmlType::kQ4_K, 768, 48},   {GgmlType::kQ4_K, 2048, 512},
      {GgmlType::kQ5_K, 256, 16},   {GgmlType::kQ5_K, 1280, 32},  {GgmlType::kQ6_K, 256, 16},
      {GgmlType::kQ6_K, 768, 32},   {GgmlType::kQ6_K, 512, 2048},
  };
  std::mt19937 rng(7);
  test::DeviceStream stream;
  ASSERT_NE(stream.get(), nullptr);
  for (const Shape& s : shapes) {
    SCOPED_TRACE(std::string(ggml_type_name(s.type)) + " {" + std::to_string(s.n_cols) + ", " +
                 std::to_string(s.n_rows) + "}");
    constexpr int64_t kSlices = 3;
    const uint64_t slice = tiled_bytes(s.type, s.n_cols, s.n_rows);
    const std::vector<uint8_t> raw = test::random_blocks(s.type, slice * kSlices, rng);
    std::vector<uint8_t> want(raw.size());
    ASSERT_TRUE(tile_matrix_stack(s.type, raw.data(), s.n_cols, s.n_rows, kSlices, want, 1).has_value());

    test::DeviceBuffer d_raw(raw.size()), d_out(raw.size());
    ASSERT_TRUE(test::upload(d_raw, raw));
    KESTREL_CUDA_OK(cudaMemset(d_out.as(), 0xA5, raw.size()));
    // Slices 1 and 2 first: slice 0 keeps its fill.
    ASSERT_TRUE(tile_stack_device(s.type, d_raw.as(), s.n_cols, s.n_rows, 1, 2, d_out.as(), stream.get()).has_value());
    KESTREL_CUDA_OK(cudaStreamSynchronize(stream.get()));
    std::vector<uint8_t> got(raw.size());
    KESTREL_CUDA_OK(cudaMemcpy(got.data(), d_out.as(), got.size(), cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < slice; ++i) ASSERT_EQ(got[i], 0xA5) << "slice 0 byte " << i << " written";
    ASSERT_EQ(std::memcmp(got.data() + slice, want.data() + slice, 2 * slice), 0);
    ASSERT_TRUE(tile_stack_device(s.type, d_raw.as(), s.n_cols, s.n_rows, 0, 1, d_out.as(), stream.get()).has_value());
    KESTREL_CUDA_OK(cudaStreamSynchronize(stream.get()));
    KESTREL_CUDA_OK(cudaMemcpy(got.data(), d_out.as(), got.size(), cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i << " of " << got.size();
  }
}

TEST(TileDevice, RefusesBadArguments) {
  KESTREL_REQUIRE_DEVICE();
  test::DeviceBuffer buf(1 << 16);
  auto* p = buf.as<uint8_t>();
  EXPECT_FALSE(tile_stack_device(GgmlType::kQ4_0, p, 96, 16, 0, 1, p, nullptr).has_value());   // 96 % 64
  EXPECT_FALSE(tile_stack_device(GgmlType::kQ4_K, p, 128, 16, 0, 1, p, nullptr).has_value());  // 128 % 256
  EXPECT_FALSE(tile_stack_device(GgmlType::kF16, p, 64, 16, 0, 1, p, nullptr).has_value());
  EXPECT_FALSE(tile_stack_device(GgmlType::kQ4_0, p, 64, 17, 0, 1, p, nullptr).has_value());
  EXPECT_FALSE(tile_stack_device(GgmlType::kQ4_0, nullptr, 64, 16, 0, 1, p, nullptr).has_value());
  EXPECT_FALSE(tile_stack_device(GgmlType::kQ4_0, p, 64, 16, 0, 1, p + 8, nullptr).has_value());  // misaligned out
  EXPECT_FALSE(tile_stack_device(GgmlType::kQ4_0, p, 64, 16, -1, 1, p, nullptr).has_value());
  EXPECT_TRUE(tile_stack_device(GgmlType::kQ4_0, p, 64, 16, 0, 0, p, nullptr).has_value());  // nothing to do
}

}  // namespace
}  // namespace kestrel::gpu
