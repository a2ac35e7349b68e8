// Tests of BlockGenerator: every supported type dequantizes (with core/quant's reference dequantizer) to values
// with mean ~0 and the requested std, K-quant scale/min constructions are exact, and the bytes of a block depend only
// on (key, block index): any chunking gives the same bytes, another key gives different ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "tools/mkmodel/block_generator.h"

namespace kestrel::mkmodel {
namespace {

struct Moments {
  double mean = 0.0;
  double std = 0.0;
  double max_abs = 0.0;
  bool finite = true;
};

Moments moments(const std::vector<float>& v) {
  Moments m;
  double s = 0.0;
  double s2 = 0.0;
  for (float x : v) {
    m.finite = m.finite && std::isfinite(x);
    s += x;
    s2 += static_cast<double>(x) * x;
    m.max_abs = std::max(m.max_abs, std::fabs(static_cast<double>(x)));
  }
  m.mean = s / static_cast<double>(v.size());
  m.std = std::sqrt(s2 / static_cast<double>(v.size()) - m.mean * m.mean);
  return m;
}

// Generates `n_blocks` blocks and dequantizes them.
std::vector<float> generate_and_dequantize(const BlockGenerator& g, uint64_t n_blocks) {
  std::vector<uint8_t> bytes(n_blocks * g.block_bytes());
  g.generate(0, n_blocks, bytes.data());
  std::vector<float> out(n_blocks * g.block_elems());
  const Status s = dequantize_row(g.type(), bytes.data(), out.data(), static_cast<int64_t>(out.size()));
  EXPECT_TRUE(s.has_value()) << (s ? "" : s.error().to_string());
  return out;
}

const GgmlType kAllTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                              GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

class BlockGeneratorTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(BlockGeneratorTypes, ZeroMeanWithRequestedStd) {
  const GgmlType type = GetParam();
  for (float target : {0.02f, 0.004f, 1.0f}) {
    const WeightInit init{InitKind::kZeroMean, target, 0.0f, 0.0f};
    auto g = BlockGenerator::create(type, init, tensor_stream_key(7, "blk.0.ffn_up_exps.weight"));
    ASSERT_TRUE(g.has_value()) << g.error().to_string();
    const uint64_t n_elems = 1 << 18;
    const std::vector<float> v = generate_and_dequantize(*g, n_elems / g->block_elems());
    const Moments m = moments(v);
    SCOPED_TRACE(std::string(ggml_type_name(type)) + " std " + std::to_string(target));
    EXPECT_TRUE(m.finite);
    // 2^18 samples: the standard error of the mean is std/512; 0.02 std is > 10 standard errors.
    EXPECT_LT(std::fabs(m.mean), 0.02 * m.std);
    EXPECT_GT(m.std, 0.85 * target);
    EXPECT_LT(m.std, 1.15 * target);
    // Symmetric around 0: as many positive as negative values, within 1%.
    int64_t balance = 0;
    for (float x : v) balance += (x > 0) - (x < 0);
    EXPECT_LT(std::llabs(balance), static_cast<long long>(v.size() / 100));
  }
}

TEST_P(BlockGeneratorTypes, BytesDependOnlyOnKeyAndBlockIndex) {
  const GgmlType type = GetParam();
  const WeightInit init{InitKind::kZeroMean, 0.05f, 0.0f, 0.0f};
  const uint64_t key = tensor_stream_key(1, "token_embd.weight");
  auto g = BlockGenerator::create(type, init, key);
  ASSERT_TRUE(g.has_value());
  const uint64_t n_blocks = 1000;
  const size_t bb = g->block_bytes();
  std::vector<uint8_t> whole(n_blocks * bb);
  g->generate(0, n_blocks, whole.data());

  // Uneven chunks, generated back to front.
  std::vector<uint8_t> pieces(n_blocks * bb);
  const uint64_t cuts[] = {0, 1, 7, 300, 301, 999, 1000};
  for (int i = 5; i >= 0; --i) {
    g->generate(cuts[i], cuts[i + 1] - cuts[i], pieces.data() + cuts[i] * bb);
  }
  EXPECT_EQ(whole, pieces);

  // The same generator built again gives the same bytes; another key (seed or name) does not.
  auto again = BlockGenerator::create(type, init, key);
  std::vector<uint8_t> same(n_blocks * bb);
  again->generate(0, n_blocks, same.data());
  EXPECT_EQ(whole, same);
  auto other = BlockGenerator::create(type, init, tensor_stream_key(2, "token_embd.weight"));
  std::vector<uint8_t> diff(n_blocks * bb);
  other->generate(0, n_blocks, diff.data());
  EXPECT_NE(whole, diff);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, BlockGeneratorTypes, ::testing::ValuesIn(kAllTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& param_info) {
                           return std::string(ggml_type_name(param_info.param));
                         });

TEST(BlockGenerator, KQuantMinsCentreEverySubBlock) {
  // Q4_K: dmin == 3.75 d exactly and m_j == 2 sc_j, so each sub-block's values are d sc (q - 7.5).
  auto g = BlockGenerator::create(GgmlType::kQ4_K, WeightInit{InitKind::kZeroMean, 0.0038f, 0, 0}, 99);
  ASSERT_TRUE(g.has_value());
  std::vector<uint8_t> bytes(64 * sizeof(BlockQ4_K));
  g->generate(0, 64, bytes.data());
  for (int i = 0; i < 64; ++i) {
    BlockQ4_K b;
    std::memcpy(&b, bytes.data() + i * sizeof b, sizeof b);
    const float d = fp16_to_f32(b.d);
    ASSERT_GT(d, 0.0f);
    EXPECT_EQ(fp16_to_f32(b.dmin), 3.75f * d) << "block " << i;
    for (int j = 0; j < 8; ++j) {
      const int sc = j < 4 ? (b.scales[j] & 63) : ((b.scales[j + 4] & 0xF) | ((b.scales[j - 4] >> 6) << 4));
      const int m = j < 4 ? (b.scales[j + 4] & 63) : ((b.scales[j + 4] >> 4) | ((b.scales[j] >> 6) << 4));
      EXPECT_GE(sc, 8);
      EXPECT_LE(sc, 31);
      EXPECT_EQ(m, 2 * sc) << "block " << i << " sub-block " << j;
    }
  }
  // Q5_K: dmin == 7.75 d.
  auto g5 = BlockGenerator::create(GgmlType::kQ5_K, WeightInit{InitKind::kZeroMean, 0.02f, 0, 0}, 5);
  ASSERT_TRUE(g5.has_value());
  std::vector<uint8_t> b5(16 * sizeof(BlockQ5_K));
  g5->generate(0, 16, b5.data());
  for (int i = 0; i < 16; ++i) {
    BlockQ5_K b;
    std::memcpy(&b, b5.data() + i * sizeof b, sizeof b);
    EXPECT_EQ(fp16_to_f32(b.dmin), 7.75f * fp16_to_f32(b.d)) << "block " << i;
  }
}

TEST(BlockGenerator, BlockScalesVaryAndQ6KScalesHaveBothSigns) {
  auto g = BlockGenerator::create(GgmlType::kQ6_K, WeightInit{InitKind::kZeroMean, 0.02f, 0, 0}, 3);
  ASSERT_TRUE(g.has_value());
  std::vector<uint8_t> bytes(256 * sizeof(BlockQ6_K));
  g->generate(0, 256, bytes.data());
  std::vector<uint16_t> ds;
  int negative = 0;
  int positive = 0;
  for (int i = 0; i < 256; ++i) {
    BlockQ6_K b;
    std::memcpy(&b, bytes.data() + i * sizeof b, sizeof b);
    ds.push_back(b.d);
    for (int8_t s : b.scales) {
      negative += s < 0;
      positive += s > 0;
      EXPECT_GE(std::abs(static_cast<int>(s)), 16);
    }
  }
  std::sort(ds.begin(), ds.end());
  EXPECT_GE(std::unique(ds.begin(), ds.end()) - ds.begin(), 6);
  EXPECT_GT(negative, 1000);
  EXPECT_GT(positive, 1000);
}

TEST(BlockGenerator, NoCodeOutsideTheSymmetricRange) {
  // Q8_0 never stores -128; Q4_0 never a 0 nibble (value -8 d); Q6_K never q == 0 (value -32 d sc).
  const WeightInit init{InitKind::kZeroMean, 0.02f, 0, 0};
  auto q8 = BlockGenerator::create(GgmlType::kQ8_0, init, 11);
  std::vector<uint8_t> b8(4096 * sizeof(BlockQ8_0));
  q8->generate(0, 4096, b8.data());
  int zeros8 = 0;
  for (size_t i = 0; i < 4096; ++i) {
    BlockQ8_0 b;
    std::memcpy(&b, b8.data() + i * sizeof b, sizeof b);
    for (int8_t q : b.qs) {
      ASSERT_NE(q, -128);
      zeros8 += q == 0;
    }
  }
  EXPECT_GT(zeros8, 4096 * 32 / 256);  // 0 is drawn twice as often: ~2/256 of the codes

  auto q4 = BlockGenerator::create(GgmlType::kQ4_0, init, 12);
  std::vector<uint8_t> b4(4096 * sizeof(BlockQ4_0));
  q4->generate(0, 4096, b4.data());
  for (size_t i = 0; i < 4096; ++i) {
    BlockQ4_0 b;
    std::memcpy(&b, b4.data() + i * sizeof b, sizeof b);
    for (uint8_t q : b.qs) {
      ASSERT_NE(q & 0xF, 0);
      ASSERT_NE(q >> 4, 0);
    }
  }

  auto q6 = BlockGenerator::create(GgmlType::kQ6_K, init, 13);
  std::vector<uint8_t> b6(1024 * sizeof(BlockQ6_K));
  q6->generate(0, 1024, b6.data());
  int thirty_two = 0;
  for (size_t i = 0; i < 1024; ++i) {
    BlockQ6_K b;
    std::memcpy(&b, b6.data() + i * sizeof b, sizeof b);
    for (int n = 0; n < 2; ++n) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t* ql = b.ql + 64 * n;
        const uint8_t qh = b.qh[32 * n + l];
        const int q[4] = {(ql[l] & 0xF) | ((qh & 3) << 4), (ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4),
                          (ql[l] >> 4) | (((qh >> 4) & 3) << 4), (ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4)};
        for (int k = 0; k < 4; ++k) {
          ASSERT_NE(q[k], 0) << "block " << i << " half " << n << " l " << l << " k " << k;
          thirty_two += q[k] == 32;
        }
      }
    }
  }
  EXPECT_GT(thirty_two, 1024 * 256 / 64 * 3 / 2);  // ~2/64 of the codes
}

TEST(BlockGenerator, FloatInits) {
  const uint64_t n = 4096;
  auto norm = BlockGenerator::create(GgmlType::kF32, WeightInit{InitKind::kUniform, 0.0f, 0.9f, 1.1f}, 1);
  ASSERT_TRUE(norm.has_value());
  std::vector<float> v(n);
  norm->generate(0, n, reinterpret_cast<uint8_t*>(v.data()));
  const Moments mn = moments(v);
  EXPECT_NEAR(mn.mean, 1.0, 0.01);
  for (float x : v) {
    EXPECT_GE(x, 0.9f);
    EXPECT_LE(x, 1.1f);
  }

  auto ssm_a = BlockGenerator::create(GgmlType::kF32, WeightInit{InitKind::kNegExp, 0.0f, 0.0f, 2.7725887f}, 2);
  ASSERT_TRUE(ssm_a.has_value());
  ssm_a->generate(0, n, reinterpret_cast<uint8_t*>(v.data()));
  float lo = 0.0f;
  float hi = -100.0f;
  for (float x : v) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_GE(lo, -16.0001f);
  EXPECT_LT(lo, -15.0f);
  EXPECT_LE(hi, -1.0f);
  EXPECT_GT(hi, -1.1f);
}

TEST(BlockGenerator, RefusesWhatItCannotWrite) {
  const WeightInit zero_mean{InitKind::kZeroMean, 0.02f, 0, 0};
  auto unsupported = BlockGenerator::create(GgmlType::kQ2_K, zero_mean, 1);
  ASSERT_FALSE(unsupported.has_value());
  EXPECT_EQ(unsupported.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(unsupported.error().message.find("q2_K"), std::string::npos);

  auto uniform_q4 = BlockGenerator::create(GgmlType::kQ4_0, WeightInit{InitKind::kUniform, 0, 0.9f, 1.1f}, 1);
  ASSERT_FALSE(uniform_q4.has_value());
  EXPECT_EQ(uniform_q4.error().code, ErrorCode::kInvalidArgument);

  auto no_std = BlockGenerator::create(GgmlType::kQ8_0, WeightInit{InitKind::kZeroMean, 0.0f, 0, 0}, 1);
  EXPECT_FALSE(no_std.has_value());
}

TEST(BlockGenerator, StreamKeysDifferBySeedAndName) {
  EXPECT_EQ(tensor_stream_key(1, "a"), tensor_stream_key(1, "a"));
  EXPECT_NE(tensor_stream_key(1, "a"), tensor_stream_key(2, "a"));
  EXPECT_NE(tensor_stream_key(1, "blk.1.attn_q.weight"), tensor_stream_key(1, "blk.2.attn_q.weight"));
}

}  // namespace
}  // namespace kestrel::mkmodel
