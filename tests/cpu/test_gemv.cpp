// The CPU GEMV kernels against ref::matvec_batch (dequantized rows, f32 dot in index order) for every weight type,
// at every instruction-set level this CPU has (the others are skipped with a message), on odd shapes: rows not a
// multiple of the 4-row tiles, F32/F16/BF16 rows whose length is not a multiple of the SIMD width, Q4_0/Q8_0 rows of
// an odd number of blocks, and batches of 1, 3, 8, 32 and 35 (past one group of 32 vectors and the 4-vector tiles).
//
// Tolerance: the scalar level performs the reference's operations in its order and must match bit for bit. kF32
// kernels decode exactly the reference's weights and differ only in summation order (vector accumulators, a fixed
// horizontal reduction, FMA's single rounding), so each result is within the classic dot-product bound
// γ_n·Σ|w_i·x_i| (γ_n = n·u / (1 − n·u), u = 2^-24) of the exact value, as is the reference's: the test allows
// 2·γ_n·Σ|w_i·x_i|. Int8 kernels (act_q8.h: kQ8 per 32, kQ8K per 256) compute with the dequantized activations
// x̃ = q·d of their form: they are compared
// with the reference applied to x̃, their integer dot products exact and their f32 combination within the same
// bound, taken over the two terms a K-quant weight is made of (d·sc·q and dmin·m, summed apart by the kernel):
// 2·γ_n·Σ(|a_i| + |b_i|)·|x̃_i|. A wrong nibble, scale or block offset moves a result by O(Σ|w_i·x_i|/√n) or more,
// far past it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/quant/quant.h"
#include "core/reference/matvec.h"
#include "cpu/act_q8.h"
#include "cpu/gemv.h"
#include "cpu/isa.h"

namespace kestrel::cpu {
namespace {

struct Case {
  GgmlType type;
  int64_t n_in;
  int64_t n_out;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    for (int64_t n_in : {1, 7, 13, 100, 257, 300, 515}) out.push_back({t, n_in, 17});
  }
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    for (int64_t n_in : {32, 96, 288, 544}) out.push_back({t, n_in, 19});
  }
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    for (int64_t n_in : {256, 512, 768}) out.push_back({t, n_in, 13});
  }
  return out;
}

struct Matrix {
  std::vector<uint8_t> bytes;
  ref::QuantMatrix view;
};

Matrix random_matrix(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(c.n_in * c.n_out));
  for (float& v : w) v = dist(rng);
  const uint64_t row_bytes = *ggml_row_bytes(c.type, static_cast<uint64_t>(c.n_in));
  Matrix m;
  m.bytes.resize(row_bytes * static_cast<uint64_t>(c.n_out));
  for (int64_t o = 0; o < c.n_out; ++o) {
    EXPECT_TRUE(
        quantize_row(c.type, w.data() + o * c.n_in, m.bytes.data() + static_cast<uint64_t>(o) * row_bytes, c.n_in));
  }
  m.view = ref::QuantMatrix{c.type, m.bytes.data(), static_cast<uint64_t>(c.n_in), static_cast<uint64_t>(c.n_out)};
  return m;
}

std::vector<float> random_vectors(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

// Σ_i (|a_i| + |b_i|)·|x_i| of every output, w_i = a_i − b_i: for Q4_K/Q5_K a_i = d·sc·q (the row dequantized with
// every dmin zeroed) and b_i = dmin·m; for the other types a_i = w_i, b_i = 0.
std::vector<float> abs_dots(const Matrix& m, const std::vector<float>& x, int64_t n_vec) {
  const int64_t n_in = static_cast<int64_t>(m.view.n_in), n_out = static_cast<int64_t>(m.view.n_out);
  const bool k45 = m.view.type == GgmlType::kQ4_K || m.view.type == GgmlType::kQ5_K;
  std::vector<float> row(static_cast<size_t>(n_in)), a(static_cast<size_t>(n_in));
  std::vector<float> out(static_cast<size_t>(n_vec * n_out));
  const uint64_t row_bytes = *ref::matrix_row_bytes(m.view);
  const uint64_t block_bytes = *ggml_row_bytes(m.view.type, 256);
  for (int64_t o = 0; o < n_out; ++o) {
    const uint8_t* src = m.view.data + static_cast<uint64_t>(o) * row_bytes;
    EXPECT_TRUE(dequantize_row(m.view.type, src, row.data(), n_in));
    a = row;
    if (k45) {
      std::vector<uint8_t> no_min(src, src + row_bytes);
      for (uint64_t off = 0; off < row_bytes; off += block_bytes) no_min[off + 2] = no_min[off + 3] = 0;  // dmin
      EXPECT_TRUE(dequantize_row(m.view.type, no_min.data(), a.data(), n_in));
    }
    for (int64_t v = 0; v < n_vec; ++v) {
      double s = 0.0;
      for (int64_t i = 0; i < n_in; ++i) {
        const double ai = a[i], bi = ai - row[i];
        s += (std::fabs(ai) + std::fabs(bi)) * std::fabs(static_cast<double>(x[v * n_in + i]));
      }
      out[v * n_out + o] = static_cast<float>(s);
    }
  }
  return out;
}

// x as an int8 kernel sees it: quantized per block (kQ8) or super-block (kQ8K), then dequantized (q · d).
std::vector<float> dequantized_activations(const std::vector<float>& x, int64_t n_vec, int64_t n_in, GemvInput form) {
  ActQ8Buffer buf;
  std::vector<float> out(x.size());
  if (form == GemvInput::kQ8K) {
    const ActQ8View q = buf.reserve(n_vec, n_in, ActQ8Forms{false, true});
    act_q8k_quantize(x.data(), n_in, 0, n_vec, buf);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(q.qk[i]) * q.dk[i / kActQ8KBlock];
  } else {
    const ActQ8View q = buf.reserve(n_vec, n_in);
    act_q8_quantize(x.data(), n_in, 0, n_vec, buf);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(q.q[i]) * q.dl[i / 4];
  }
  return out;
}

std::vector<float> run(Isa isa, GemvInput act, const Matrix& m, const std::vector<float>& x, int64_t n_vec,
                       int64_t row_begin, int64_t row_end, std::vector<float> y) {
  auto task = gemv_task(m.view, x.data(), n_vec, y.data());
  EXPECT_TRUE(task.has_value());
  const GemvKernel k = gemv_kernel(isa, m.view.type, act);
  ActQ8Buffer buf;
  const int64_t n_in = static_cast<int64_t>(m.view.n_in);
  if (k.input == GemvInput::kQ8) {
    task->xq = buf.reserve(n_vec, n_in);
    act_q8_quantize(x.data(), n_in, 0, n_vec, buf);
  } else if (k.input == GemvInput::kQ8K) {
    task->xq = buf.reserve(n_vec, n_in, ActQ8Forms{false, true});
    act_q8k_quantize(x.data(), n_in, 0, n_vec, buf);
  }
  k.fn(*task, row_begin, row_end);
  return y;
}

// (level, preferred activation form): every level with both forms; a type without a kQ8 kernel at a level runs
// its kF32 one under kQ8 too.
class GemvTest : public ::testing::TestWithParam<std::tuple<Isa, GemvInput>> {
 protected:
  void SetUp() override {
    if (!isa_supported(isa())) {
      GTEST_SKIP() << "this CPU lacks " << isa_name(isa()) << "; that level is tested on a machine that has it";
    }
  }
  Isa isa() const { return std::get<0>(GetParam()); }
  GemvInput act() const { return std::get<1>(GetParam()); }
};

TEST_P(GemvTest, MatchesTheReferenceOnOddShapes) {
  std::mt19937 rng(29);
  const Isa isa = this->isa();
  for (const Case& c : cases()) {
    const Matrix m = random_matrix(c, rng);
    const GemvInput form = gemv_kernel(isa, c.type, act()).input;
    for (int64_t n_vec : {1, 3, 8, 32, 35}) {
      const std::vector<float> x = random_vectors(n_vec * c.n_in, rng);
      // The reference's input: x itself, or for an int8 kernel the activations it actually multiplies.
      const std::vector<float> xr = form != GemvInput::kF32 ? dequantized_activations(x, n_vec, c.n_in, form) : x;
      std::vector<float> expect(static_cast<size_t>(n_vec * c.n_out));
      ASSERT_TRUE(ref::matvec_batch(m.view, xr.data(), static_cast<int>(n_vec), expect.data()));
      const std::vector<float> got =
          run(isa, act(), m, x, n_vec, 0, c.n_out, std::vector<float>(static_cast<size_t>(n_vec * c.n_out)));
      const std::vector<float> mag = abs_dots(m, xr, n_vec);
      const double u = std::ldexp(1.0, -24);
      const double gamma = static_cast<double>(c.n_in) * u / (1.0 - static_cast<double>(c.n_in) * u);
      for (size_t i = 0; i < got.size(); ++i) {
        const std::string where = std::string(ggml_type_name(c.type)) + " n_in " + std::to_string(c.n_in) + " n_vec " +
                                  std::to_string(n_vec) + " output " + std::to_string(i);
        if (isa == Isa::kScalar) {
          ASSERT_EQ(got[i], expect[i]) << where;
        } else {
          ASSERT_LE(std::fabs(static_cast<double>(got[i]) - expect[i]), 2.0 * gamma * mag[i]) << where;
        }
      }
    }
  }
}

TEST_P(GemvTest, RowsDoNotDependOnBatchOrSplit) {
  std::mt19937 rng(7);
  const Isa isa = this->isa();
  const GemvInput act = this->act();
  for (const Case& c : cases()) {
    const Matrix m = random_matrix(c, rng);
    const int64_t n_vec = 35;
    const std::vector<float> x = random_vectors(n_vec * c.n_in, rng);
    const size_t n_y = static_cast<size_t>(n_vec * c.n_out);
    const std::vector<float> whole = run(isa, act, m, x, n_vec, 0, c.n_out, std::vector<float>(n_y));
    // Rows in two calls of uneven size.
    const int64_t cut = c.n_out / 3;
    std::vector<float> split = run(isa, act, m, x, n_vec, 0, cut, std::vector<float>(n_y));
    split = run(isa, act, m, x, n_vec, cut, c.n_out, split);
    EXPECT_EQ(split, whole) << ggml_type_name(c.type) << " n_in " << c.n_in;
    // Each vector alone.
    for (int64_t v = 0; v < n_vec; v += 11) {
      const std::vector<float> xv(x.begin() + v * c.n_in, x.begin() + (v + 1) * c.n_in);
      const std::vector<float> alone =
          run(isa, act, m, xv, 1, 0, c.n_out, std::vector<float>(static_cast<size_t>(c.n_out)));
      const std::vector<float> in_batch(whole.begin() + v * c.n_out, whole.begin() + (v + 1) * c.n_out);
      EXPECT_EQ(alone, in_batch) << ggml_type_name(c.type) << " n_in " << c.n_in << " vector " << v;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, GemvTest,
                         ::testing::Combine(::testing::ValuesIn(kAllIsas),
                                            ::testing::Values(GemvInput::kF32, GemvInput::kQ8)),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, GemvInput>>& i) {
                           return std::string(isa_name(std::get<0>(i.param))) +
                                  (std::get<1>(i.param) == GemvInput::kQ8 ? "_q8" : "_f32");
                         });

// avxvnni's int8 kernels are avx2's with other instructions for the same int32 dot products: the same bits.
TEST(GemvLevels, AvxVnniGivesTheAvx2Bits) {
  if (!isa_supported(Isa::kAvxVnni)) GTEST_SKIP() << "this CPU lacks avxvnni";
  std::mt19937 rng(3);
  for (const Case& c : cases()) {
    const Matrix m = random_matrix(c, rng);
    const int64_t n_vec = 5;
    const std::vector<float> x = random_vectors(n_vec * c.n_in, rng);
    const size_t n_y = static_cast<size_t>(n_vec * c.n_out);
    EXPECT_EQ(run(Isa::kAvxVnni, GemvInput::kQ8, m, x, n_vec, 0, c.n_out, std::vector<float>(n_y)),
              run(Isa::kAvx2, GemvInput::kQ8, m, x, n_vec, 0, c.n_out, std::vector<float>(n_y)))
        << ggml_type_name(c.type) << " n_in " << c.n_in;
  }
}

TEST(Isa, ChoiceHonoursTheRequestDownwardOnly) {
  EXPECT_EQ(isa_choose("scalar"), Isa::kScalar);
  const Isa best = isa_choose("");
  EXPECT_TRUE(isa_supported(best));
  EXPECT_EQ(isa_choose("avx512"), best) << "a request above what the CPU has is clamped";
  EXPECT_EQ(isa_choose("bogus"), best);
  if (isa_supported(Isa::kAvx2)) {
    EXPECT_EQ(isa_choose("avx2"), Isa::kAvx2);
  }
  // avxvnni: itself where the CPU has it, else the best level below it (an AVX-512 part may lack AVX-VNNI).
  EXPECT_EQ(isa_choose("avxvnni"), isa_supported(Isa::kAvxVnni) ? Isa::kAvxVnni : isa_choose("avx2"));
  EXPECT_FALSE(gemv_supports(GgmlType::kQ5_0));
  const float w[2] = {1.0f, 2.0f};
  ref::QuantMatrix q5{GgmlType::kQ5_0, reinterpret_cast<const uint8_t*>(w), 32, 1};
  EXPECT_EQ(gemv_task(q5, w, 1, nullptr).error().code, ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace kestrel::cpu
