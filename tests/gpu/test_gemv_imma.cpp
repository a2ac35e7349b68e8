// gpu/gemv_imma (GEMV v4: re-tiled Q4_0 / Q4_K / Q5_K on u8 x s8 tensor cores and Q6_K / Q8_0 on s8 x s8, x as four
// 7-bit digits per power-of-two group scale; the tiled layout itself is tested in test_tiled_matrix.cpp) against core's
// ref::matvec_batch: random blocks with wide-ranging scales, shapes from one tile to the longest row the kernel takes
// (n_in 64 .. 8192, n_out 16 .. 32768), every vector-count path (1, 2, 3, 5, 8, 13, 32: one to four pairs per
// segment, several segments); bit-identical repeated runs; each y[v] identical whatever n_vec; the unrolled rounds'
// bits those of the run-time loop; grouped calls (segment tables) whose bits do not depend on the table's length, nor
// on reading a settled table before the programmatic wait;
// activation edge cases; shapes and arguments the kernel does not take are refused before anything runs.
// gemm_imma (the same arithmetic for a prompt pass's many vectors) against the same reference and bound, its grouped
// form against its dense calls bit for bit.
//
// Tolerance: |gpu - ref| <= 1e-5 · Σ|w_i · x_i| + 2^-27 · Σ_G max_G|x| · Σ_{i in G} |w_i| per output. The integer
// sums are exact and the per-block scaling is f32, so the first term is the f32 summation-order room (as for ref's
// own dot product at n_in = 8192); the second is the digit representation's: each x_i is kept to within
// 2^-27 · max|x| of its 256-element group G (the last digit's half unit).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/reference/matvec.h"
#include "gpu/kernels/gemm_imma.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/memory/tiled_matrix.h"
#include "tests/gpu/block_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

constexpr double kRelTol = 1e-5;

// Random quant bytes with finite f16 scales of magnitudes 2^-14 .. 2^6.
std::vector<uint8_t> random_matrix(GgmlType t, int64_t n_cols, int64_t n_rows, std::mt19937& rng) {
  const uint64_t row_bytes = *ggml_row_bytes(t, static_cast<uint64_t>(n_cols));
  std::vector<uint8_t> m(row_bytes * static_cast<uint64_t>(n_rows));
  for (auto& b : m) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-14, 6);
  const size_t block_bytes = ggml_type_traits(t).block_bytes;
  const std::vector<size_t> offsets = test::scale_offsets(t);
  for (size_t blk = 0; blk < m.size() / block_bytes; ++blk) {
    for (size_t off : offsets) {
      const uint16_t h = f32_to_fp16(std::ldexp(mantissa(rng), exponent(rng)));
      std::memcpy(&m[blk * block_bytes + off], &h, sizeof(h));
    }
  }
  return m;
}

std::vector<float> random_vectors(int n_vec, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 4);
  std::vector<float> x(static_cast<size_t>(n_vec * n_in));
  for (auto& v : x) v = std::ldexp(normal(rng), exponent(rng));  // wide range: exercises the bf16 split
  return x;
}

// A tiled matrix resident on the device.
struct DeviceTiled {
  explicit DeviceTiled(GgmlType t, const std::vector<uint8_t>& raw, int64_t n_in, int64_t n_out)
      : buf(tiled_bytes(t, n_in, n_out)), view{t, nullptr, n_in, n_out} {
    std::vector<uint8_t> tiled(tiled_bytes(t, n_in, n_out));
    const Status s = tile_matrix(t, raw.data(), n_in, n_out, tiled);
    EXPECT_TRUE(s) << s.error().to_string();
    EXPECT_EQ(memcpy_synced(buf.as<unsigned char>(), tiled.data(), tiled.size(), cudaMemcpyHostToDevice), cudaSuccess);
    view.data = buf.as<unsigned char>();
  }
  DeviceBuffer buf;
  TiledView view;
};

// gemv_imma (under `tuning`) on the n_vec vectors that prepare(xprep) writes on the device.
template <class Prepare>
std::vector<float> run_prepared(const DeviceTiled& w, int n_vec, Prepare&& prepare, const GemvImmaTuning& tuning = {}) {
  const size_t y_elems = static_cast<size_t>(n_vec * w.view.n_rows);
  DeviceBuffer d_xp(imma_x_bytes(w.view.n_cols, n_vec));
  DeviceBuffer d_y(y_elems * sizeof(float));
  std::vector<float> y(y_elems, std::nanf(""));
  EXPECT_EQ(memset_synced(d_y.as<unsigned char>(), 0xFF, y_elems * sizeof(float)), cudaSuccess);
  const Status p = prepare(d_xp.as<unsigned char>());
  EXPECT_TRUE(p) << p.error().to_string();
  const Status s = gemv_imma(w.view, d_xp.as<unsigned char>(), n_vec, d_y.as<float>(), nullptr, false, tuning);
  EXPECT_TRUE(s) << s.error().to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(memcpy_synced(y.data(), d_y.as<unsigned char>(), y_elems * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return y;
}

std::vector<float> run(const DeviceTiled& w, const std::vector<float>& x, int n_vec,
                       const GemvImmaTuning& tuning = {}) {
  DeviceBuffer d_x(x.size() * sizeof(float));
  EXPECT_TRUE(test::upload(d_x, x));
  return run_prepared(
      w, n_vec, [&](void* xp) { return gemv_imma_prepare_x(d_x.as<float>(), w.view.n_cols, n_vec, xp, nullptr); },
      tuning);
}

// The error bound per output, f64 [n_vec, n_out]: kRelTol · Σ|w_i x_i| from core's dequantize_row, plus the
// representation term 2^-(7·digits − 1) · Σ_G max_G|x| · Σ_{i in G} |w_i| (an activation's last digit is 2^(e − 6 −
// 7·(digits − 1)) with 2^(e − 1) <= max_G|x|, and rounding errs by half of it: 2^-27 at four digits, 2^-13 at two).
std::vector<double> bounds(GgmlType t, const std::vector<uint8_t>& m, int64_t n_in, int64_t n_out,
                           const std::vector<float>& x, int n_vec, int n_digits = 4) {
  const uint64_t row_bytes = *ggml_row_bytes(t, static_cast<uint64_t>(n_in));
  std::vector<float> row(static_cast<size_t>(n_in));
  std::vector<double> mag(static_cast<size_t>(n_vec * n_out), 0.0);
  for (int64_t o = 0; o < n_out; ++o) {
    EXPECT_TRUE(dequantize_row(t, m.data() + static_cast<uint64_t>(o) * row_bytes, row.data(), n_in));
    for (int v = 0; v < n_vec; ++v) {
      double sum = 0.0;
      double digits = 0.0;
      for (int64_t g0 = 0; g0 < n_in; g0 += 256) {
        double xmax = 0.0;
        double wsum = 0.0;
        for (int64_t i = g0; i < std::min(n_in, g0 + 256); ++i) {
          const double xi = x[static_cast<size_t>(v * n_in + i)];
          const double wi = row[static_cast<size_t>(i)];
          sum += std::fabs(wi * xi);
          xmax = std::max(xmax, std::fabs(xi));
          wsum += std::fabs(wi);
        }
        digits += std::ldexp(xmax, -(7 * n_digits - 1)) * wsum;
      }
      mag[static_cast<size_t>(v * n_out + o)] = kRelTol * sum + digits + 1e-30;
    }
  }
  return mag;
}

// Every weight type gemv_imma takes.
constexpr GgmlType kImmaTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_0};

struct Shape {
  int64_t n_in, n_out;
};

// Every output within its bound of the reference (the first few misses reported).
void expect_within(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<double>& bound, int64_t n_out) {
  int bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    worst = std::max(worst, err / bound[i]);
    if (!(err <= bound[i]) && bad++ < 3) {
      ADD_FAILURE() << what << ": vector " << i / static_cast<size_t>(n_out) << " row "
                    << i % static_cast<size_t>(n_out) << " got " << got[i] << " want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << " worst err/bound " << worst;
}

void check_type(GgmlType t, const std::vector<Shape>& shapes) {
  std::mt19937 rng(1234 + static_cast<int>(t));
  for (const Shape& sh : shapes) {
    ASSERT_TRUE(gemv_imma_supports(t, sh.n_in, sh.n_out)) << sh.n_in << "x" << sh.n_out;
    const std::vector<uint8_t> m = random_matrix(t, sh.n_in, sh.n_out, rng);
    const DeviceTiled w(t, m, sh.n_in, sh.n_out);
    for (int n_vec : {1, 2, 3, 5, 8, 13, 32}) {
      const std::vector<float> x = random_vectors(n_vec, sh.n_in, rng);
      std::vector<float> want(static_cast<size_t>(n_vec * sh.n_out));
      const ref::QuantMatrix qm{t, m.data(), static_cast<uint64_t>(sh.n_in), static_cast<uint64_t>(sh.n_out)};
      ASSERT_TRUE(ref::matvec_batch(qm, x.data(), n_vec, want.data()));
      const std::vector<double> bound = bounds(t, m, sh.n_in, sh.n_out, x, n_vec);
      const std::vector<float> got = run(w, x, n_vec);
      expect_within(std::string(ggml_type_name(t)) + " " + std::to_string(sh.n_in) + "x" + std::to_string(sh.n_out) +
                        " n_vec " + std::to_string(n_vec),
                    got, want, bound, sh.n_out);
      // Repeated runs are bit-identical; each vector alone gives the same bits as inside the batch.
      const std::vector<float> again = run(w, x, n_vec);
      EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)), 0);
      for (int v : {0, n_vec - 1}) {
        const std::vector<float> xv(x.begin() + v * sh.n_in, x.begin() + (v + 1) * sh.n_in);
        const std::vector<float> alone = run(w, xv, 1);
        EXPECT_EQ(std::memcmp(alone.data(), got.data() + v * sh.n_out, alone.size() * sizeof(float)), 0)
            << "vector " << v << " of " << n_vec << " differs from the same vector alone";
      }
    }
  }
}

TEST(GemvImma, Q4_0MatchesReference) {
  KESTREL_REQUIRE_DEVICE();
  // 192 and 320 columns end inside a 256-column group; 4096/8192 columns take 16 warps per row group (8192: two
  // groups each); 512 four row groups per block; 512 x 32768 one warp per row group streaming two groups (no barrier).
  check_type(GgmlType::kQ4_0,
             {{64, 16}, {192, 48}, {320, 32}, {512, 80}, {2048, 512}, {4096, 160}, {8192, 16}, {512, 32768}});
}

TEST(GemvImma, Q4_KMatchesReference) {
  KESTREL_REQUIRE_DEVICE();
  check_type(GgmlType::kQ4_K, {{256, 16}, {768, 32}, {1280, 48}, {2048, 512}, {4096, 160}, {8192, 32}, {512, 32768}});
}

// Q5_K: Q4_K's multiply with the fifth bit OR-ed into each A byte, sums kept per digit.
TEST(GemvImma, Q5_KMatchesReference) {
  KESTREL_REQUIRE_DEVICE();
  check_type(GgmlType::kQ5_K, {{256, 16}, {768, 32}, {1280, 48}, {2048, 512}, {4096, 160}, {8192, 32}, {512, 32768}});
}

// Q6_K: one s8 × s8 m16n8k16 MMA per 16-element sub-block (its own int8 scale), q − 32 formed from the packed bits.
TEST(GemvImma, Q6_KMatchesReference) {
  KESTREL_REQUIRE_DEVICE();
  check_type(GgmlType::kQ6_K, {{256, 16}, {768, 32}, {1280, 48}, {2048, 512}, {4096, 160}, {8192, 32}, {512, 32768}});
}

// Q8_0: a block's int8 quants as the A registers of an s8 × s8 MMA; rows ending inside a 256-column group.
TEST(GemvImma, Q8_0MatchesReference) {
  KESTREL_REQUIRE_DEVICE();
  check_type(GgmlType::kQ8_0,
             {{64, 16}, {192, 48}, {320, 32}, {512, 80}, {2048, 512}, {4096, 160}, {8192, 16}, {512, 32768}});
}

// Activations the digit split must get right: a group of zeros, one huge element among small ones (those keep
// precision only to 2^-27 of the group's largest: the bound's second term), denormals, and a non-finite value,
// which turns only its own vector's outputs into NaN.
TEST(GemvImma, ActivationEdgeCases) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(99);
  for (const GgmlType t : kImmaTypes) {
    const int64_t n_in = 1024;
    const int64_t n_out = 64;
    const std::vector<uint8_t> m = random_matrix(t, n_in, n_out, rng);
    const DeviceTiled w(t, m, n_in, n_out);
    std::vector<float> x = random_vectors(3, n_in, rng);
    for (int64_t i = 0; i < 256; ++i) x[static_cast<size_t>(i)] = 0.0f;             // vector 0, group 0: zeros
    x[300] = 3.0e4f;                                                                // vector 0, group 1: one outlier
    for (int64_t i = 512; i < 768; ++i) x[static_cast<size_t>(i)] = 1e-40f;         // vector 0, group 2: denormals
    x[static_cast<size_t>(2 * n_in + 5)] = std::numeric_limits<float>::infinity();  // vector 2
    std::vector<float> want(static_cast<size_t>(3 * n_out));
    const ref::QuantMatrix qm{t, m.data(), static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)};
    ASSERT_TRUE(ref::matvec_batch(qm, x.data(), 2, want.data()));
    const std::vector<double> bound = bounds(t, m, n_in, n_out, x, 2);
    const std::vector<float> got = run(w, x, 3);
    for (int64_t i = 0; i < 2 * n_out; ++i) {
      const auto u = static_cast<size_t>(i);
      EXPECT_LE(std::fabs(static_cast<double>(got[u]) - want[u]), bound[u])
          << ggml_type_name(t) << " vector " << i / n_out << " row " << i % n_out;
    }
    for (int64_t i = 2 * n_out; i < 3 * n_out; ++i) EXPECT_TRUE(std::isnan(got[static_cast<size_t>(i)]));
  }
}

// gemv_imma_prepare_swiglu: W · (silu(gate) ⊙ up) against ref::matvec_batch of the host's silu(g)·u, in
// ref::swiglu_forward's operation order (the device's expf may differ from the host's by an ulp or two, far inside
// the bound's 1e-5 term); n_cols a multiple of 64 but not of 256 (Q4_0), 1, 3 and 8 vectors; bit-identical repeats.
TEST(GemvImma, SwigluPreparationMatchesReference) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(77);
  for (const GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_K}) {
    const Shape sh = t == GgmlType::kQ4_0 ? Shape{320, 48} : Shape{768, 32};
    const std::vector<uint8_t> m = random_matrix(t, sh.n_in, sh.n_out, rng);
    const DeviceTiled w(t, m, sh.n_in, sh.n_out);
    for (const int n_vec : {1, 3, 8}) {
      const std::vector<float> gate = random_vectors(n_vec, sh.n_in, rng);
      const std::vector<float> up = random_vectors(n_vec, sh.n_in, rng);
      std::vector<float> act(gate.size());
      for (size_t i = 0; i < act.size(); ++i) {
        const float s = gate[i] * (1.0f / (1.0f + std::exp(-gate[i])));
        act[i] = s * up[i];
      }
      std::vector<float> want(static_cast<size_t>(n_vec * sh.n_out));
      const ref::QuantMatrix qm{t, m.data(), static_cast<uint64_t>(sh.n_in), static_cast<uint64_t>(sh.n_out)};
      ASSERT_TRUE(ref::matvec_batch(qm, act.data(), n_vec, want.data()));
      DeviceBuffer d_gate(gate.size() * sizeof(float));
      DeviceBuffer d_up(up.size() * sizeof(float));
      ASSERT_TRUE(test::upload(d_gate, gate));
      ASSERT_TRUE(test::upload(d_up, up));
      const auto prepare = [&](void* xp) {
        return gemv_imma_prepare_swiglu(d_gate.as<float>(), d_up.as<float>(), sh.n_in, n_vec, xp, nullptr);
      };
      const std::vector<float> got = run_prepared(w, n_vec, prepare);
      expect_within("swiglu " + std::string(ggml_type_name(t)) + " n_vec " + std::to_string(n_vec), got, want,
                    bounds(t, m, sh.n_in, sh.n_out, act, n_vec), sh.n_out);
      const std::vector<float> again = run_prepared(w, n_vec, prepare);
      EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)), 0);
    }
  }
}

// Programmatic launches (gpu/kernels/pdl.cuh): a dense call loads its first weights before it waits for the kernel
// before it, and must read the prepared x only after. A chain on one stream — prepare x_i (a plain launch), then
// gemv_imma as a programmatic dependent, for several x_i in turn into one xprep buffer — gives the bits of plain
// launches; a read of xprep ahead of the wait would see the previous x_i (or the zeros written first).
TEST(GemvImma, ProgrammaticChainGivesPlainBits) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(2024);
  const test::DeviceStream owned;
  const cudaStream_t stream = owned.get();
  ASSERT_NE(stream, nullptr);
  for (const GgmlType t : kImmaTypes) {
    for (const Shape sh : {Shape{2048, 512}, Shape{4096, 160}, Shape{768, 48}, Shape{512, 32768}}) {
      const std::vector<uint8_t> m = random_matrix(t, sh.n_in, sh.n_out, rng);
      const DeviceTiled w(t, m, sh.n_in, sh.n_out);
      for (const int n_vec : {1, 3, 8}) {
        constexpr int kChain = 4;
        const std::vector<float> x = random_vectors(kChain * n_vec, sh.n_in, rng);
        const size_t y_elems = static_cast<size_t>(n_vec * sh.n_out);
        DeviceBuffer d_x(x.size() * sizeof(float));
        DeviceBuffer d_xp(imma_x_bytes(sh.n_in, n_vec));
        DeviceBuffer d_y(kChain * y_elems * sizeof(float));
        ASSERT_TRUE(test::upload(d_x, x));
        ASSERT_EQ(cudaMemsetAsync(d_xp.as<unsigned char>(), 0, imma_x_bytes(sh.n_in, n_vec), stream), cudaSuccess);
        for (int i = 0; i < kChain; ++i) {
          const float* xi = d_x.as<float>() + static_cast<size_t>(i * n_vec) * static_cast<size_t>(sh.n_in);
          ASSERT_TRUE(gemv_imma_prepare_x(xi, sh.n_in, n_vec, d_xp.as<unsigned char>(), stream));
          ASSERT_TRUE(gemv_imma(w.view, d_xp.as<unsigned char>(), n_vec, d_y.as<float>() + i * y_elems, stream, true));
        }
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const std::vector<float> chained = test::download<float>(d_y.as<float>(), kChain * y_elems);
        for (int i = 0; i < kChain; ++i) {
          const std::vector<float> xi(x.begin() + static_cast<ptrdiff_t>(i * n_vec * sh.n_in),
                                      x.begin() + static_cast<ptrdiff_t>((i + 1) * n_vec * sh.n_in));
          const std::vector<float> plain = run(w, xi, n_vec);
          EXPECT_EQ(std::memcmp(plain.data(), chained.data() + i * y_elems, y_elems * sizeof(float)), 0)
              << ggml_type_name(t) << " " << sh.n_in << "x" << sh.n_out << " n_vec " << n_vec << " link " << i
              << ": the programmatic launch differs from a plain one";
        }
      }
    }
  }
}

// The kernels that compile the groups per slice in (2, 4, 8) and unroll a round give the bits of the run-time loop
// (GemvImmaTuning::compiled_groups false): the same operations in the same order. Shapes for 2 (12288 rows of 2048,
// S = 4), 4 (16384 rows, S = 2) and 8 (32768 rows, S = 1) groups per slice — the splits the shape rule gives these
// shapes but for Q4_0 (one group per warp), forced (GemvImmaTuning::split) so every type runs them — with one and two
// vectors (the one-pair kernel), three and eight (two and four pairs: compiled in for 2 only).
TEST(GemvImma, UnrolledRoundsGiveTheRunTimeLoopsBits) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(77);
  for (const GgmlType t : kImmaTypes) {
    for (const auto& [sh, split] :
         {std::pair{Shape{2048, 12288}, 4}, std::pair{Shape{2048, 16384}, 2}, std::pair{Shape{2048, 32768}, 1}}) {
      GemvImmaTuning compiled;
      compiled.split = split;
      GemvImmaTuning run_time = compiled;
      run_time.compiled_groups = false;
      const std::vector<uint8_t> m = random_matrix(t, sh.n_in, sh.n_out, rng);
      const DeviceTiled w(t, m, sh.n_in, sh.n_out);
      for (const int n_vec : {1, 2, 3, 8}) {
        const std::vector<float> x = random_vectors(n_vec, sh.n_in, rng);
        const std::vector<float> unrolled = run(w, x, n_vec, compiled);
        const std::vector<float> loop = run(w, x, n_vec, run_time);
        ASSERT_EQ(unrolled.size(), loop.size());
        EXPECT_EQ(std::memcmp(unrolled.data(), loop.data(), loop.size() * sizeof(float)), 0)
            << ggml_type_name(t) << " " << sh.n_in << "x" << sh.n_out << " n_vec " << n_vec
            << ": the unrolled rounds differ from the run-time loop";
      }
    }
  }
}

// The flat kernel (dense calls at one group per warp, no rounds; one wave at 1-2 vectors) gives the persistent
// kernel's bits (GemvImmaTuning::flat_kernel false) at the same split, for one to four vector pairs and one to four
// segments.
// Shapes: 8192 rows of 2048 (S = 8, 4096 warps: the 9.4 MB projections), 2048 of 4096 (S = 16), 80 rows of 512 (S = 2,
// four row groups a block, the last block part-empty), 48 of 192 (a partial group), 16 of 64, and for Q4_0 12288 rows
// of 2048 (S = 8 in 6144 warps: the flat kernel in more than one wave, as lm_head Q4_0 runs).
TEST(GemvImma, FlatKernelGivesThePersistentKernelsBits) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(4096);
  GemvImmaTuning persistent_kernel;
  persistent_kernel.flat_kernel = false;
  for (const GgmlType t : kImmaTypes) {
    const bool blocks32 = t == GgmlType::kQ4_0 || t == GgmlType::kQ8_0;
    std::vector<Shape> shapes = {{2048, 8192}, {4096, 2048}, {512, 80}};
    if (blocks32) shapes.insert(shapes.end(), {Shape{192, 48}, Shape{64, 16}});
    if (t == GgmlType::kQ4_0) shapes.push_back(Shape{2048, 12288});
    for (const Shape sh : shapes) {
      const std::vector<uint8_t> m = random_matrix(t, sh.n_in, sh.n_out, rng);
      const DeviceTiled w(t, m, sh.n_in, sh.n_out);
      for (const int n_vec : {1, 2, 3, 8, 13, 32}) {
        const std::vector<float> x = random_vectors(n_vec, sh.n_in, rng);
        const std::vector<float> flat = run(w, x, n_vec);
        const std::vector<float> persistent = run(w, x, n_vec, persistent_kernel);
        ASSERT_EQ(flat.size(), persistent.size());
        EXPECT_EQ(std::memcmp(flat.data(), persistent.data(), flat.size() * sizeof(float)), 0)
            << ggml_type_name(t) << " " << sh.n_in << "x" << sh.n_out << " n_vec " << n_vec
            << ": the flat kernel differs from the persistent one";
        if (n_vec > 8) continue;  // the persistent kernel's bits are checked against the reference at 13 and 32
        std::vector<float> want(flat.size());
        const ref::QuantMatrix qm{t, m.data(), static_cast<uint64_t>(sh.n_in), static_cast<uint64_t>(sh.n_out)};
        ASSERT_TRUE(ref::matvec_batch(qm, x.data(), n_vec, want.data()));
        expect_within(
            "flat " + std::string(ggml_type_name(t)) + " " + std::to_string(sh.n_in) + "x" + std::to_string(sh.n_out),
            flat, want, bounds(t, m, sh.n_in, sh.n_out, x, n_vec), sh.n_out);
      }
    }
  }
}

// A grouped call's (gemv_imma_segments) segment gives the same bits whatever else the table holds: its split must
// not follow the item count (a split chosen by it would reorder the sums, as the MoE layer's batch would). The same
// three segments (two matrices, vector pairs and a single vector, one vector in two segments) run alone, then
// followed by empty segments (n_vec = 0) to 8192 items, and followed by garbage with a device count of 3 segments in
// use (n_used), and repeated to 8192 items all counted in use: the same bits, each within its bound of
// ref::matvec_batch, and those of the run-time groups-per-slice
// loop (GemvImmaTuning::compiled_groups false) — for tables of the one-pair and the four-pair kernel. Rows of 2048 (S =
// 2, 4 groups a slice), 2368 (ten groups, the last slice partial: S = 4), 4096 (S = 4, 4 a slice) and 512 columns (S =
// 1, 2 a slice: the MoE down matrices).
TEST(GemvImma, GroupedCallBitsDoNotDependOnItsItemCount) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(515);
  for (const GgmlType t : kImmaTypes) {
    const bool blocks32 = t == GgmlType::kQ4_0 || t == GgmlType::kQ8_0;
    for (const Shape sh : {Shape{2048, 64}, Shape{blocks32 ? 2368 : 4096, 48}, Shape{512, 32}}) {
      const std::vector<uint8_t> ma = random_matrix(t, sh.n_in, sh.n_out, rng);
      const std::vector<uint8_t> mb = random_matrix(t, sh.n_in, sh.n_out, rng);
      const DeviceTiled wa(t, ma, sh.n_in, sh.n_out);
      const DeviceTiled wb(t, mb, sh.n_in, sh.n_out);
      constexpr int kVec = 4;
      constexpr int kOut = 5;
      const std::vector<float> x = random_vectors(kVec, sh.n_in, rng);
      DeviceBuffer d_x(x.size() * sizeof(float));
      DeviceBuffer d_xp(imma_x_bytes(sh.n_in, kVec));
      ASSERT_TRUE(test::upload(d_x, x));
      ASSERT_TRUE(gemv_imma_prepare_x(d_x.as<float>(), sh.n_in, kVec, d_xp.as<unsigned char>(), nullptr));
      // Segment j: matrix, vectors, output rows (y row out[k] = W x[vec[k]]).
      struct Use {
        const DeviceTiled* w;
        const std::vector<uint8_t>* m;
        std::vector<int> vec, out;
      };
      const std::vector<Use> uses = {{&wa, &ma, {0, 1}, {0, 1}}, {&wb, &mb, {2}, {2}}, {&wa, &ma, {3, 1}, {3, 4}}};
      const int n_rg = static_cast<int>(sh.n_out / 16);
      const int n_big = (8192 + n_rg - 1) / n_rg;  // segments for 8192 items
      std::vector<ImmaSegment> table(static_cast<size_t>(n_big));
      for (size_t j = 0; j < uses.size(); ++j) {
        table[j].data = uses[j].w->view.data;
        table[j].n_vec = static_cast<int32_t>(uses[j].vec.size());
        for (size_t k = 0; k < uses[j].vec.size(); ++k) {
          table[j].vec[k] = uses[j].vec[k];
          table[j].out[k] = uses[j].out[k];
        }
      }
      DeviceBuffer d_table(table.size() * sizeof(ImmaSegment));
      ASSERT_TRUE(test::upload(d_table, table));
      // The same segments, then garbage (wild pointers and indices) that a device count of 3 in use must keep unread.
      std::vector<ImmaSegment> wild(table);
      std::memset(static_cast<void*>(wild.data() + uses.size()), 0x7F,
                  (wild.size() - uses.size()) * sizeof(ImmaSegment));
      DeviceBuffer d_wild(wild.size() * sizeof(ImmaSegment));
      ASSERT_TRUE(test::upload(d_wild, wild));
      DeviceBuffer d_used(sizeof(int32_t));
      ASSERT_TRUE(test::upload(d_used, std::vector<int32_t>{static_cast<int32_t>(uses.size())}));
      // The three segments again and again to 8192 items, all counted in use: each block's run of items (v4.11) then
      // spans several segments and ends inside one; every repeat writes its rows with the same bits.
      std::vector<ImmaSegment> cycled(table);
      for (size_t j = uses.size(); j < cycled.size(); ++j) cycled[j] = table[j % uses.size()];
      DeviceBuffer d_cycled(cycled.size() * sizeof(ImmaSegment));
      ASSERT_TRUE(test::upload(d_cycled, cycled));
      DeviceBuffer d_used_all(sizeof(int32_t));
      ASSERT_TRUE(test::upload(d_used_all, std::vector<int32_t>{n_big}));
      const size_t y_elems = static_cast<size_t>(kOut * sh.n_out);
      for (const int bound_vec : {2, 8}) {
        std::vector<float> got[4];
        for (int big = 0; big < 4; ++big) {
          DeviceBuffer d_y(y_elems * sizeof(float));
          ASSERT_EQ(memset_synced(d_y.as<unsigned char>(), 0xFF, y_elems * sizeof(float)), cudaSuccess);
          const int n_seg = big ? n_big : static_cast<int>(uses.size());
          const DeviceBuffer& tab = big == 2 ? d_wild : (big == 3 ? d_cycled : d_table);
          const int32_t* used = big == 2 ? d_used.as<int32_t>() : (big == 3 ? d_used_all.as<int32_t>() : nullptr);
          const Status s =
              gemv_imma_segments(t, sh.n_in, sh.n_out, tab.as<ImmaSegment>(), n_seg, d_xp.as<unsigned char>(),
                                 d_y.as<float>(), sh.n_out, nullptr, bound_vec, false, used);
          ASSERT_TRUE(s) << s.error().to_string();
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          got[big] = test::download<float>(d_y.as<float>(), y_elems);
        }
        {  // the run-time groups-per-slice loop on the same table: the compiled (unrolled) kernels' bits
          GemvImmaTuning run_time;
          run_time.compiled_groups = false;
          DeviceBuffer d_y(y_elems * sizeof(float));
          ASSERT_EQ(memset_synced(d_y.as<unsigned char>(), 0xFF, y_elems * sizeof(float)), cudaSuccess);
          const Status s = gemv_imma_segments(t, sh.n_in, sh.n_out, d_table.as<ImmaSegment>(),
                                              static_cast<int>(uses.size()), d_xp.as<unsigned char>(), d_y.as<float>(),
                                              sh.n_out, nullptr, bound_vec, false, nullptr, false, run_time);
          ASSERT_TRUE(s) << s.error().to_string();
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<float> loop = test::download<float>(d_y.as<float>(), y_elems);
          EXPECT_EQ(std::memcmp(got[0].data(), loop.data(), y_elems * sizeof(float)), 0)
              << ggml_type_name(t) << " " << sh.n_in << "x" << sh.n_out << " bound " << bound_vec
              << ": the unrolled grouped kernel differs from the run-time loop";
        }
        const std::string what = std::string(ggml_type_name(t)) + " " + std::to_string(sh.n_in) + "x" +
                                 std::to_string(sh.n_out) + " bound " + std::to_string(bound_vec);
        EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), y_elems * sizeof(float)), 0)
            << what << ": the segments' bits depend on the table's length";
        EXPECT_EQ(std::memcmp(got[0].data(), got[2].data(), y_elems * sizeof(float)), 0)
            << what << ": a count of segments in use (garbage after them) changes the bits";
        EXPECT_EQ(std::memcmp(got[0].data(), got[3].data(), y_elems * sizeof(float)), 0)
            << what << ": a long counted table (runs of items across segments) changes the bits";
        for (const Use& u : uses) {
          for (size_t k = 0; k < u.vec.size(); ++k) {
            const std::vector<float> xv(x.begin() + u.vec[k] * sh.n_in, x.begin() + (u.vec[k] + 1) * sh.n_in);
            std::vector<float> want(static_cast<size_t>(sh.n_out));
            const ref::QuantMatrix qm{t, u.m->data(), static_cast<uint64_t>(sh.n_in), static_cast<uint64_t>(sh.n_out)};
            ASSERT_TRUE(ref::matvec_batch(qm, xv.data(), 1, want.data()));
            const std::vector<float> row(got[1].begin() + u.out[k] * sh.n_out,
                                         got[1].begin() + (u.out[k] + 1) * sh.n_out);
            expect_within(what + " y row " + std::to_string(u.out[k]), row, want,
                          bounds(t, *u.m, sh.n_in, sh.n_out, xv, 1), sh.n_out);
          }
        }
      }
    }
  }
}

// A settled table (gemv_imma_segments' table_settled): the grouped GEMV reads its table and first weights before its
// programmatic wait, which is safe behind a SwiGLU preparation that holds its dependents until its own wait. A chain
// on one stream — per link device copies that write gate and up, the preparation (programmatic, holding) into one
// shared xprep, then the grouped GEMV on that link's table (programmatic, settled) — gives the bits of plain launches:
// a read of xprep ahead of the wait would see the link before's activations. Rows of 512 (the MoE down matrices: 2
// groups, S = 1) and 2048 columns, one and two vectors a segment.
TEST(GemvImma, SettledTableChainGivesPlainBits) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(606);
  const test::DeviceStream owned;
  const cudaStream_t stream = owned.get();
  ASSERT_NE(stream, nullptr);
  for (const GgmlType t : kImmaTypes) {
    for (const Shape sh : {Shape{512, 2048}, Shape{2048, 512}}) {
      const std::vector<uint8_t> ma = random_matrix(t, sh.n_in, sh.n_out, rng);
      const std::vector<uint8_t> mb = random_matrix(t, sh.n_in, sh.n_out, rng);
      const DeviceTiled wa(t, ma, sh.n_in, sh.n_out);
      const DeviceTiled wb(t, mb, sh.n_in, sh.n_out);
      constexpr int kVec = 3;
      constexpr int kChain = 4;
      // Link i's table: a pair on one matrix, a single vector on the other (which one alternates with i).
      std::vector<ImmaSegment> tables(2 * kChain);
      for (int i = 0; i < kChain; ++i) {
        ImmaSegment& p = tables[2 * i];
        ImmaSegment& q = tables[2 * i + 1];
        p.data = (i % 2 ? wb : wa).view.data;
        p.n_vec = 2;
        p.vec[0] = 0, p.vec[1] = 2, p.out[0] = 0, p.out[1] = 1;
        q.data = (i % 2 ? wa : wb).view.data;
        q.n_vec = 1;
        q.vec[0] = 1, q.out[0] = 2;
      }
      DeviceBuffer d_tables(tables.size() * sizeof(ImmaSegment));
      ASSERT_TRUE(test::upload(d_tables, tables));
      const size_t act_elems = static_cast<size_t>(kVec * sh.n_in);
      const std::vector<float> gate = random_vectors(kChain * kVec, sh.n_in, rng);
      const std::vector<float> up = random_vectors(kChain * kVec, sh.n_in, rng);
      DeviceBuffer d_all_gate(gate.size() * sizeof(float)), d_all_up(up.size() * sizeof(float));
      ASSERT_TRUE(test::upload(d_all_gate, gate));
      ASSERT_TRUE(test::upload(d_all_up, up));
      DeviceBuffer d_gate(act_elems * sizeof(float)), d_up(act_elems * sizeof(float));
      DeviceBuffer d_xp(imma_x_bytes(sh.n_in, kVec));
      const size_t y_elems = static_cast<size_t>(kVec * sh.n_out);
      DeviceBuffer d_y(2 * kChain * y_elems * sizeof(float));
      ASSERT_EQ(cudaMemsetAsync(d_xp.as<unsigned char>(), 0, imma_x_bytes(sh.n_in, kVec), stream), cudaSuccess);
      for (int run = 0; run < 2; ++run) {  // 0: plain launches, 1: the programmatic chain
        const bool pdl = run == 1;
        for (int i = 0; i < kChain; ++i) {
          const size_t off = static_cast<size_t>(i) * act_elems * sizeof(float);
          ASSERT_EQ(cudaMemcpyAsync(d_gate.as<unsigned char>(), d_all_gate.as<unsigned char>() + off,
                                    act_elems * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                    cudaSuccess);
          ASSERT_EQ(cudaMemcpyAsync(d_up.as<unsigned char>(), d_all_up.as<unsigned char>() + off,
                                    act_elems * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                    cudaSuccess);
          ASSERT_TRUE(gemv_imma_prepare_swiglu(d_gate.as<float>(), d_up.as<float>(), sh.n_in, kVec,
                                               d_xp.as<unsigned char>(), stream, pdl, pdl));
          float* y = d_y.as<float>() + (static_cast<size_t>(run) * kChain + static_cast<size_t>(i)) * y_elems;
          const Status s = gemv_imma_segments(t, sh.n_in, sh.n_out, d_tables.as<ImmaSegment>() + 2 * i, 2,
                                              d_xp.as<unsigned char>(), y, sh.n_out, stream, 2, pdl, nullptr, pdl);
          ASSERT_TRUE(s) << s.error().to_string();
        }
      }
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const std::vector<float> got = test::download<float>(d_y.as<float>(), 2 * kChain * y_elems);
      for (int i = 0; i < kChain; ++i) {
        EXPECT_EQ(std::memcmp(got.data() + i * y_elems, got.data() + (kChain + i) * y_elems, y_elems * sizeof(float)),
                  0)
            << ggml_type_name(t) << " " << sh.n_in << "x" << sh.n_out << " link " << i
            << ": the settled table's programmatic chain differs from plain launches";
      }
      // The plain launches themselves against the reference (link 0: pair on wa, single on wb).
      std::vector<float> act(act_elems);
      for (size_t e = 0; e < act_elems; ++e) {
        const float sg = gate[e] * (1.0f / (1.0f + std::exp(-gate[e])));
        act[e] = sg * up[e];
      }
      const int vecs[3] = {0, 2, 1};  // y rows 0, 1, 2
      for (int r = 0; r < 3; ++r) {
        const std::vector<uint8_t>& m = r < 2 ? ma : mb;
        const std::vector<float> xv(act.begin() + vecs[r] * sh.n_in, act.begin() + (vecs[r] + 1) * sh.n_in);
        std::vector<float> want(static_cast<size_t>(sh.n_out));
        const ref::QuantMatrix qm{t, m.data(), static_cast<uint64_t>(sh.n_in), static_cast<uint64_t>(sh.n_out)};
        ASSERT_TRUE(ref::matvec_batch(qm, xv.data(), 1, want.data()));
        const std::vector<float> row(got.begin() + r * sh.n_out, got.begin() + (r + 1) * sh.n_out);
        expect_within("settled " + std::string(ggml_type_name(t)) + " y row " + std::to_string(r), row, want,
                      bounds(t, m, sh.n_in, sh.n_out, xv, 1), sh.n_out);
      }
    }
  }
}

TEST(GemvImma, RefusesShapesAndArguments) {
  EXPECT_FALSE(gemv_imma_supports(GgmlType::kQ4_0, 8256, 16));  // longer than 8192
  EXPECT_FALSE(gemv_imma_supports(GgmlType::kQ4_0, 32, 16));    // not whole units
  EXPECT_FALSE(gemv_imma_supports(GgmlType::kBF16, 256, 16));
  EXPECT_FALSE(gemv_imma_supports(GgmlType::kQ8_0, 8192, 16 * 32768));  // 4.6 GB: past a 32-bit scale offset
  EXPECT_TRUE(gemv_imma_supports(GgmlType::kQ8_0, 8192, 16 * 16384));   // 2.3 GB   // other types keep gemv()
  EXPECT_FALSE(gemv_imma_supports(GgmlType::kQ6_K, 128, 16));           // not whole super-blocks
  EXPECT_EQ(imma_x_bytes(96, 1), 0u);
  EXPECT_EQ(imma_x_bytes(64, 65536), 0u);
  alignas(16) static float x[64];
  alignas(16) static float y[16];
  alignas(16) static uint8_t w[18 * 2 * 16];
  alignas(16) static uint8_t xp[4096];
  ASSERT_LE(imma_x_bytes(64, 1), sizeof(xp));
  EXPECT_FALSE(gemv_imma_prepare_x(x, 96, 1, xp, nullptr));
  EXPECT_FALSE(gemv_imma_prepare_x(x + 1, 64, 1, xp, nullptr));
  EXPECT_FALSE(gemv_imma_prepare_swiglu(x, x + 1, 64, 1, xp, nullptr));    // up misaligned
  EXPECT_FALSE(gemv_imma_prepare_swiglu(nullptr, x, 64, 1, xp, nullptr));  // gate null
  EXPECT_FALSE(gemv_imma_prepare_swiglu(x, x, 96, 1, xp, nullptr));        // not whole units
  const TiledView view{GgmlType::kQ4_0, w, 64, 16};
  EXPECT_FALSE(gemv_imma(view, xp, 0, y, nullptr));
  EXPECT_FALSE(gemv_imma(view, xp, 33, y, nullptr));
  EXPECT_FALSE(gemv_imma(view, xp + 4, 1, y, nullptr));                         // xprep not 16-byte aligned
  EXPECT_FALSE(gemv_imma(view, xp, 1, reinterpret_cast<float*>(xp), nullptr));  // y overlaps xprep
  const TiledView bad{GgmlType::kQ4_0, w, 64, 17};
  EXPECT_FALSE(gemv_imma(bad, xp, 1, y, nullptr));
  alignas(16) static ImmaSegment seg[1];
  EXPECT_FALSE(gemv_imma_segments(GgmlType::kQ4_0, 64, 16, seg, 1, xp, y, 16, nullptr, 0));  // bound 1..8
  EXPECT_FALSE(gemv_imma_segments(GgmlType::kQ4_0, 64, 16, seg, 1, xp, y, 16, nullptr, 9));
  EXPECT_FALSE(gemv_imma_segments(GgmlType::kQ4_0, 64, 16, seg, 1, xp, y, 15, nullptr));   // y_stride < n_rows
  EXPECT_FALSE(gemv_imma_segments(GgmlType::kQ6_K, 128, 16, seg, 1, xp, y, 16, nullptr));  // not whole super-blocks
  EXPECT_FALSE(gemv_imma_segments(GgmlType::kBF16, 64, 16, seg, 1, xp, y, 16, nullptr));
}

// ---- gemm_imma: the same arithmetic for many vectors (prompt passes) ------------------------------------------------

// gemm_imma on n_vec vectors of x (prepared on the device); y filled with NaN bits first.
std::vector<float> run_gemm(const DeviceTiled& w, const std::vector<float>& x, int n_vec,
                            GemmDigits digits = GemmDigits::kFour) {
  const size_t y_elems = static_cast<size_t>(n_vec) * static_cast<size_t>(w.view.n_rows);
  DeviceBuffer d_x(x.size() * sizeof(float));
  DeviceBuffer d_xp(imma_x_bytes(w.view.n_cols, n_vec));
  DeviceBuffer d_y(y_elems * sizeof(float));
  EXPECT_TRUE(test::upload(d_x, x));
  EXPECT_EQ(memset_synced(d_y.as<unsigned char>(), 0xFF, y_elems * sizeof(float)), cudaSuccess);
  EXPECT_TRUE(gemv_imma_prepare_x(d_x.as<float>(), w.view.n_cols, n_vec, d_xp.as<unsigned char>(), nullptr));
  const Status s = gemm_imma(w.view, d_xp.as<unsigned char>(), n_vec, d_y.as<float>(), nullptr, digits);
  EXPECT_TRUE(s) << s.error().to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return test::download<float>(d_y.as<float>(), y_elems);
}

// Every type gemm_imma takes against ref::matvec_batch within test_gemv_imma's bound (at four digits and at two): rows
// ending inside a 256-row block tile (33 and 17 row groups), 256 .. 8192 columns (one to 32 groups), vector counts
// inside one segment, across segments and blocks, and a prompt pass's 512; bit-identical repeats; the first and last
// vectors alone give their bits inside the batch. Two digits must also differ from four somewhere (they drop a real
// part of x).
TEST(GemmImma, MatchesReference) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(4321);
  std::vector<std::pair<GgmlType, Shape>> cases;
  for (const GgmlType t : kImmaTypes) {
    for (const Shape sh : {Shape{256, 16}, Shape{2048, 528}, Shape{512, 2048}, Shape{4096, 272}, Shape{8192, 48}}) {
      if (t != GgmlType::kQ4_0 && sh.n_in == 4096) continue;  // the other types: four shapes each
      cases.emplace_back(t, sh);
    }
  }
  for (const auto& [t, sh] : cases) {
    ASSERT_TRUE(gemm_imma_supports(t, sh.n_in, sh.n_out));
    const std::vector<uint8_t> m = random_matrix(t, sh.n_in, sh.n_out, rng);
    const DeviceTiled w(t, m, sh.n_in, sh.n_out);
    for (const int n_vec : {1, 7, 8, 9, 17, 63, sh.n_in == 512 ? 512 : 300}) {
      const std::vector<float> x = random_vectors(n_vec, sh.n_in, rng);
      std::vector<float> want(static_cast<size_t>(n_vec * sh.n_out));
      const ref::QuantMatrix qm{t, m.data(), static_cast<uint64_t>(sh.n_in), static_cast<uint64_t>(sh.n_out)};
      ASSERT_TRUE(ref::matvec_batch(qm, x.data(), n_vec, want.data()));
      std::vector<float> four;
      for (const GemmDigits digits : {GemmDigits::kFour, GemmDigits::kTwo}) {
        const int nd = static_cast<int>(digits);
        const std::string what = "gemm " + std::string(ggml_type_name(t)) + " " + std::to_string(sh.n_in) + "x" +
                                 std::to_string(sh.n_out) + " n_vec " + std::to_string(n_vec) + ", " +
                                 std::to_string(nd) + " digits";
        const std::vector<float> got = run_gemm(w, x, n_vec, digits);
        expect_within(what, got, want, bounds(t, m, sh.n_in, sh.n_out, x, n_vec, nd), sh.n_out);
        const std::vector<float> again = run_gemm(w, x, n_vec, digits);
        EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)), 0) << what << ": repeat differs";
        for (const int v : {0, n_vec - 1}) {
          const std::vector<float> xv(x.begin() + v * sh.n_in, x.begin() + (v + 1) * sh.n_in);
          const std::vector<float> alone = run_gemm(w, xv, 1, digits);
          EXPECT_EQ(std::memcmp(alone.data(), got.data() + v * sh.n_out, alone.size() * sizeof(float)), 0)
              << what << ": vector " << v << " differs from the same vector alone";
        }
        if (digits == GemmDigits::kFour) {
          four = got;
        } else {
          EXPECT_NE(std::memcmp(four.data(), got.data(), got.size() * sizeof(float)), 0)
              << what << ": the same bits as four digits";
        }
      }
    }
  }
}

// The grouped form: segments of 0 .. 8 vectors on two matrices (vectors repeated, outputs scattered), counted in use
// with garbage after the count: each output row has the bits of a dense call on its vector alone, rows no segment
// names stay untouched, and a count keeps the garbage unread. Every type gemm_imma takes, both digit counts, expert
// shapes (2048 -> 512, 512 -> 2048).
TEST(GemmImma, SegmentsGiveTheDenseCallsBits) {
  KESTREL_REQUIRE_DEVICE();
  std::mt19937 rng(888);
  std::vector<std::tuple<GgmlType, Shape, GemmDigits>> cases;
  for (const GgmlType t : kImmaTypes) {
    for (const GemmDigits digits : {GemmDigits::kFour, GemmDigits::kTwo}) {
      for (const Shape sh : {Shape{2048, 512}, Shape{512, 2048}}) cases.emplace_back(t, sh, digits);
    }
  }
  for (const auto& [t, sh, digits] : cases) {
    const std::vector<uint8_t> ma = random_matrix(t, sh.n_in, sh.n_out, rng);
    const std::vector<uint8_t> mb = random_matrix(t, sh.n_in, sh.n_out, rng);
    const DeviceTiled wa(t, ma, sh.n_in, sh.n_out);
    const DeviceTiled wb(t, mb, sh.n_in, sh.n_out);
    constexpr int kVec = 20;
    const std::vector<float> x = random_vectors(kVec, sh.n_in, rng);
    DeviceBuffer d_x(x.size() * sizeof(float));
    DeviceBuffer d_xp(imma_x_bytes(sh.n_in, kVec));
    ASSERT_TRUE(test::upload(d_x, x));
    ASSERT_TRUE(gemv_imma_prepare_x(d_x.as<float>(), sh.n_in, kVec, d_xp.as<unsigned char>(), nullptr));
    struct Use {
      const DeviceTiled* w;
      std::vector<int> vec;
    };
    const std::vector<Use> uses = {
        {&wa, {0, 1, 2, 3, 4, 5, 6, 7}}, {&wb, {8}},         {&wa, {}},
        {&wb, {19, 3, 11, 12, 13}},      {&wa, {9, 10, 14}}, {&wb, {15, 16, 17, 18, 0, 1, 2}}};
    std::vector<ImmaSegment> table(uses.size() + 3);
    std::memset(static_cast<void*>(table.data() + uses.size()), 0x7F, 3 * sizeof(ImmaSegment));
    int n_out = 0;
    std::vector<std::pair<const Use*, int>> rows;  // y row -> (segment, vector)
    for (size_t j = 0; j < uses.size(); ++j) {
      table[j] = ImmaSegment{};
      table[j].data = uses[j].w->view.data;
      table[j].n_vec = static_cast<int32_t>(uses[j].vec.size());
      for (size_t k = 0; k < uses[j].vec.size(); ++k) {
        table[j].vec[k] = uses[j].vec[k];
        table[j].out[k] = n_out + 1;  // row 0 and every other row stay untouched
        rows.emplace_back(&uses[j], uses[j].vec[k]);
        n_out += 2;
      }
    }
    DeviceBuffer d_table(table.size() * sizeof(ImmaSegment));
    ASSERT_TRUE(test::upload(d_table, table));
    DeviceBuffer d_used(sizeof(int32_t));
    ASSERT_TRUE(test::upload(d_used, std::vector<int32_t>{static_cast<int32_t>(uses.size())}));
    const size_t y_elems = static_cast<size_t>(n_out + 1) * static_cast<size_t>(sh.n_out);
    DeviceBuffer d_y(y_elems * sizeof(float));
    ASSERT_EQ(memset_synced(d_y.as<unsigned char>(), 0xFF, y_elems * sizeof(float)), cudaSuccess);
    const Status s =
        gemm_imma_segments(t, sh.n_in, sh.n_out, d_table.as<ImmaSegment>(), static_cast<int>(table.size()),
                           d_xp.as<unsigned char>(), d_y.as<float>(), sh.n_out, nullptr, d_used.as<int32_t>(), digits);
    ASSERT_TRUE(s) << s.error().to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = test::download<float>(d_y.as<float>(), y_elems);
    for (size_t i = 0; i < rows.size(); ++i) {
      const int v = rows[i].second;
      const std::vector<float> xv(x.begin() + v * sh.n_in, x.begin() + (v + 1) * sh.n_in);
      const std::vector<float> dense = run_gemm(*rows[i].first->w, xv, 1, digits);
      EXPECT_EQ(std::memcmp(dense.data(), got.data() + (2 * i + 1) * static_cast<size_t>(sh.n_out),
                            dense.size() * sizeof(float)),
                0)
          << ggml_type_name(t) << " " << sh.n_in << "x" << sh.n_out << " y row " << 2 * i + 1 << " (vector " << v
          << "), " << static_cast<int>(digits) << " digits";
    }
    uint32_t untouched = 0xFFFFFFFFu;
    for (int r = 0; r <= n_out; r += 2) {
      for (int64_t c = 0; c < sh.n_out; ++c) {
        uint32_t bits;
        std::memcpy(&bits, &got[static_cast<size_t>(r) * static_cast<size_t>(sh.n_out) + static_cast<size_t>(c)], 4);
        untouched &= bits;
      }
    }
    EXPECT_EQ(untouched, 0xFFFFFFFFu) << "a row no segment names was written";
  }
}

TEST(GemmImma, RefusesShapesAndArguments) {
  EXPECT_FALSE(gemm_imma_supports(GgmlType::kF16, 256, 16));  // the types gemv_imma tiles only
  for (const GgmlType t : kImmaTypes) EXPECT_TRUE(gemm_imma_supports(t, 256, 16)) << ggml_type_name(t);
  EXPECT_FALSE(gemm_imma_supports(GgmlType::kQ4_0, 320, 16));  // not whole 256-column groups
  EXPECT_TRUE(gemm_imma_supports(GgmlType::kQ4_0, 512, 2048));
  alignas(16) static float y[16];
  alignas(16) static uint8_t w[18 * 8 * 16];
  alignas(16) static uint8_t xp[4096];
  const TiledView view{GgmlType::kQ4_0, w, 256, 16};
  EXPECT_FALSE(gemm_imma(view, xp, 0, y, nullptr));
  EXPECT_FALSE(gemm_imma(view, xp + 4, 1, y, nullptr));                         // xprep not 16-byte aligned
  EXPECT_FALSE(gemm_imma(view, xp, 1, reinterpret_cast<float*>(xp), nullptr));  // y overlaps xprep
  const TiledView f16{GgmlType::kF16, w, 256, 16};
  EXPECT_FALSE(gemm_imma(f16, xp, 1, y, nullptr));
  EXPECT_FALSE(gemm_imma(view, xp, 1, y, nullptr, static_cast<GemmDigits>(3)));
  alignas(16) static ImmaSegment seg[1];
  EXPECT_FALSE(gemm_imma_segments(GgmlType::kQ4_0, 256, 16, seg, 1, xp, y, 15, nullptr));  // y_stride < n_rows
  EXPECT_FALSE(gemm_imma_segments(GgmlType::kQ4_0, 256, 16, nullptr, 1, xp, y, 16, nullptr));
}

}  // namespace
}  // namespace kestrel::gpu
