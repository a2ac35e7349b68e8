// BlockGenerator: zero-mean quant blocks straight from a counter-based PRNG (splitmix64 streams keyed by
// (seed, tensor name, block index)).
//
// Constructions (value = what dequantize_row returns; all symmetric around 0, so the mean is 0 in expectation):
//   Q8_0  d * q, q a random int8 with -128 replaced by 0                      -> q in [-127, 127], 0 twice as likely
//   Q4_0  d * (q - 8), q a random nibble with 0 replaced by 8                 -> q - 8 in [-7, 7]
//   Q4_K  d * sc_j * q - dmin * m_j with dmin = 3.75 d (exact in fp16) and m_j = 2 sc_j, q a random nibble
//         -> d * sc_j * (q - 7.5): every 32-element sub-block is symmetric, whatever sc_j (random in [8, 31])
//   Q5_K  the same with 5-bit q, dmin = 7.75 d, m_j = 2 sc_j                  -> d * sc_j * (q - 15.5)
//   Q6_K  d * sc_g * (q - 32), q random 6 bits with 0 replaced by 32, sc_g a random int8 in +-[16, 127]
//   F32/F16/BF16  uniform in [-sqrt(3) std, sqrt(3) std] (or the init's [lo, hi]), element i from hash(key, i)
// The super-block scale d of each block is one of 8 values d0 * (0.75 .. 1.25) picked at random, so kernels that
// read the wrong block's d, a wrong sub-block scale or min, or swap scale and min produce visibly wrong numbers.
#include "tools/mkmodel/block_generator.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"

namespace kestrel::mkmodel {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64: a stream of 64-bit words.
class Rng {
 public:
  explicit Rng(uint64_t state) : state_(state) {}
  uint64_t next() {
    state_ += kGolden;
    return mix64(state_);
  }
  void fill(uint8_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const uint64_t w = next();
      std::memcpy(dst + i, &w, 8);
    }
    if (i < n) {
      const uint64_t w = next();
      std::memcpy(dst + i, &w, n - i);
    }
  }

 private:
  uint64_t state_;
};

inline Rng block_rng(uint64_t key, uint64_t block) { return Rng(mix64(key ^ mix64(block + 0x632BE59BD9B4E019ull))); }

// Uniform integer in [lo, hi] from 16 random bits.
inline int uniform_int(uint64_t bits16, int lo, int hi) {
  return lo + static_cast<int>(((bits16 & 0xFFFF) * static_cast<uint64_t>(hi - lo + 1)) >> 16);
}

// A uniform double in (0, 1), symmetric around 0.5 over the 2^24 possible values.
inline double unit_from(uint64_t w) { return (static_cast<double>(w >> 40) + 0.5) * (1.0 / 16777216.0); }

// Mean of x^2 over the integers lo..hi.
constexpr double mean_square(int lo, int hi) {
  double s = 0.0;
  for (int x = lo; x <= hi; ++x) s += static_cast<double>(x) * x;
  return s / (hi - lo + 1);
}
// Mean of (q - c)^2 over q = 0..n-1.
constexpr double mean_square_centered(int n, double c) {
  double s = 0.0;
  for (int q = 0; q < n; ++q) s += (q - c) * (q - c);
  return s / n;
}

// Sub-block scale ranges. K-quant mins are m = 2 sc and must fit 6 bits, so sc <= 31.
constexpr int kKScMin = 8;
constexpr int kKScMax = 31;
constexpr int kQ6ScMin = 16;
constexpr int kQ6ScMax = 127;
constexpr float kQ4KMinRatio = 3.75f;  // dmin / d: dmin * 2 sc = 7.5 d sc, the mean of d sc q for q uniform 0..15
constexpr float kQ5KMinRatio = 7.75f;  // dmin * 2 sc = 15.5 d sc, the mean for q uniform 0..31

// E[value^2] / d^2 for each construction (with the sub-block scale drawn from its range).
double q8_0_second_moment() {  // q in [-127, 127] with 0 counted twice, over 256 byte values
  return mean_square(-127, 127) * 255.0 / 256.0;
}
double q4_0_second_moment() { return mean_square(-7, 7) * 15.0 / 16.0; }
double q4_k_second_moment() { return mean_square(kKScMin, kKScMax) * mean_square_centered(16, 7.5); }
double q5_k_second_moment() { return mean_square(kKScMin, kKScMax) * mean_square_centered(32, 15.5); }
double q6_k_second_moment() { return mean_square(kQ6ScMin, kQ6ScMax) * mean_square(-31, 31) * 63.0 / 64.0; }

// The largest fp16 d <= target whose `ratio` multiple is exactly an fp16 as well (so dmin * m is exactly the centre of
// the sub-block's range). d * ratio is exact in f32 (11 + 5 significant bits).
void exact_scale_pair(float target, float ratio, uint16_t* d_out, uint16_t* dmin_out) {
  uint16_t h = f32_to_fp16(target);
  if (fp16_to_f32(h) > target && h > 0) --h;
  for (; h > 0; --h) {
    const float d = fp16_to_f32(h);
    const float dmin = d * ratio;
    const uint16_t hm = f32_to_fp16(dmin);
    if (fp16_to_f32(hm) == dmin) {
      *d_out = h;
      *dmin_out = hm;
      return;
    }
  }
  *d_out = 0;
  *dmin_out = 0;
}

// SWAR masks over 8 bytes: the top bit of each byte / nibble is set where that byte / nibble is zero.
constexpr uint64_t kBytes7F = 0x7F7F7F7F7F7F7F7Full;
constexpr uint64_t kBytes80 = 0x8080808080808080ull;
constexpr uint64_t kNibbles7 = 0x7777777777777777ull;
constexpr uint64_t kNibbles8 = 0x8888888888888888ull;
inline uint64_t zero_bytes(uint64_t x) { return ~(((x & kBytes7F) + kBytes7F) | x) & kBytes80; }
inline uint64_t zero_nibbles(uint64_t x) { return ~(((x & kNibbles7) + kNibbles7) | x) & kNibbles8; }

inline uint64_t load64(const void* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}
inline void store64(void* p, uint64_t w) { std::memcpy(p, &w, 8); }

// Packs 8 six-bit scales and mins the way ggml's get_scale_min_k4 reads them.
void pack_k_scales(const int sc[8], const int m[8], uint8_t out[kKScaleSize]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// Random K-quant sub-block scales in [kKScMin, kKScMax] with mins m = 2 sc.
void random_k_scales(Rng& rng, uint8_t out[kKScaleSize]) {
  int sc[8];
  int m[8];
  const uint64_t w0 = rng.next();
  const uint64_t w1 = rng.next();
  for (int j = 0; j < 8; ++j) {
    const uint64_t bits = j < 4 ? (w0 >> (16 * j)) : (w1 >> (16 * (j - 4)));
    sc[j] = uniform_int(bits, kKScMin, kKScMax);
    m[j] = 2 * sc[j];
  }
  pack_k_scales(sc, m, out);
}

}  // namespace

uint64_t tensor_stream_key(uint64_t seed, std::string_view tensor_name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a 64
  for (char c : tensor_name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001B3ull;
  }
  return mix64(mix64(seed * kGolden + 0x2545F4914F6CDD1Dull) ^ h);
}

bool block_generator_supports(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return true;
    default: return false;
  }
}

Expected<BlockGenerator> BlockGenerator::create(GgmlType type, const WeightInit& init, uint64_t key) {
  if (!block_generator_supports(type)) {
    return make_error(ErrorCode::kUnsupported, "kestrel-mkmodel cannot generate " + std::string(ggml_type_name(type)) +
                                                   " (supported: f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K)");
  }
  const bool is_float = type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
  if (!is_float && init.kind != InitKind::kZeroMean) {
    return make_error(ErrorCode::kInvalidArgument, "a " + init.describe() + " tensor cannot be generated as " +
                                                       std::string(ggml_type_name(type)) + " (float types only)");
  }
  if (init.kind == InitKind::kZeroMean && !(init.std > 0.0f && std::isfinite(init.std))) {
    return make_error(ErrorCode::kInvalidArgument, "weight std must be positive and finite, got " + init.describe());
  }

  BlockGenerator g;
  g.type_ = type;
  g.init_ = init;
  g.key_ = key;
  const GgmlTypeTraits traits = ggml_type_traits(type);
  g.block_elems_ = traits.block_elems;
  g.block_bytes_ = traits.block_bytes;
  if (is_float) return g;

  double moment = 1.0;
  float ratio = 0.0f;
  switch (type) {
    case GgmlType::kQ8_0: moment = q8_0_second_moment(); break;
    case GgmlType::kQ4_0: moment = q4_0_second_moment(); break;
    case GgmlType::kQ4_K:
      moment = q4_k_second_moment();
      ratio = kQ4KMinRatio;
      break;
    case GgmlType::kQ5_K:
      moment = q5_k_second_moment();
      ratio = kQ5KMinRatio;
      break;
    case GgmlType::kQ6_K: moment = q6_k_second_moment(); break;
    default: break;
  }
  double mean_f2 = 0.0;
  std::array<double, kScaleTableSize> factors{};
  for (int i = 0; i < kScaleTableSize; ++i) {
    factors[i] = 0.75 + 0.5 * i / (kScaleTableSize - 1);
    mean_f2 += factors[i] * factors[i] / kScaleTableSize;
  }
  const double d0 = static_cast<double>(init.std) / std::sqrt(moment * mean_f2);
  if (d0 * 1.25 * (ratio > 0 ? ratio : 1.0f) > 60000.0) {
    return make_error(ErrorCode::kInvalidArgument, "weight " + init.describe() + " is too large for " +
                                                       std::string(ggml_type_name(type)) + " scales");
  }
  for (int i = 0; i < kScaleTableSize; ++i) {
    const float target = static_cast<float>(d0 * factors[i]);
    if (ratio > 0.0f) {
      exact_scale_pair(target, ratio, &g.d_table_[i], &g.dmin_table_[i]);
    } else {
      g.d_table_[i] = f32_to_fp16(target);
    }
  }
  return g;
}

void BlockGenerator::generate(uint64_t first_block, uint64_t count, uint8_t* dst) const {
  switch (type_) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16: generate_float(first_block, count, dst); return;
    case GgmlType::kQ8_0:
      for (uint64_t i = 0; i < count; ++i) generate_q8_0(first_block + i, dst + i * block_bytes_);
      return;
    case GgmlType::kQ4_0:
      for (uint64_t i = 0; i < count; ++i) generate_q4_0(first_block + i, dst + i * block_bytes_);
      return;
    case GgmlType::kQ4_K:
      for (uint64_t i = 0; i < count; ++i) generate_q4_k(first_block + i, dst + i * block_bytes_);
      return;
    case GgmlType::kQ5_K:
      for (uint64_t i = 0; i < count; ++i) generate_q5_k(first_block + i, dst + i * block_bytes_);
      return;
    case GgmlType::kQ6_K:
      for (uint64_t i = 0; i < count; ++i) generate_q6_k(first_block + i, dst + i * block_bytes_);
      return;
    default: return;  // create() admits no other type
  }
}

void BlockGenerator::generate_float(uint64_t first, uint64_t count, uint8_t* dst) const {
  const double half_width = std::sqrt(3.0) * static_cast<double>(init_.std);
  for (uint64_t i = 0; i < count; ++i) {
    const double u = unit_from(mix64(key_ + (first + i + 1) * kGolden));
    double v = 0.0;
    switch (init_.kind) {
      case InitKind::kZeroMean: v = (2.0 * u - 1.0) * half_width; break;
      case InitKind::kUniform: v = init_.lo + (init_.hi - init_.lo) * u; break;
      case InitKind::kNegExp: v = -std::exp(init_.lo + (init_.hi - init_.lo) * u); break;
    }
    const float f = static_cast<float>(v);
    if (type_ == GgmlType::kF32) {
      std::memcpy(dst + 4 * i, &f, 4);
    } else {
      const uint16_t h = type_ == GgmlType::kF16 ? f32_to_fp16(f) : f32_to_bf16(f);
      std::memcpy(dst + 2 * i, &h, 2);
    }
  }
}

void BlockGenerator::generate_q8_0(uint64_t block, uint8_t* dst) const {
  Rng rng = block_rng(key_, block);
  BlockQ8_0 b;
  b.d = d_table_[rng.next() % kScaleTableSize];
  rng.fill(reinterpret_cast<uint8_t*>(b.qs), sizeof b.qs);
  for (size_t i = 0; i < sizeof b.qs; i += 8) {  // -128 (0x80) -> 0
    const uint64_t w = load64(b.qs + i);
    store64(b.qs + i, w & ~((zero_bytes(w ^ kBytes80) >> 7) * 0xFF));
  }
  std::memcpy(dst, &b, sizeof b);
}

void BlockGenerator::generate_q4_0(uint64_t block, uint8_t* dst) const {
  Rng rng = block_rng(key_, block);
  BlockQ4_0 b;
  b.d = d_table_[rng.next() % kScaleTableSize];
  rng.fill(b.qs, sizeof b.qs);
  for (size_t i = 0; i < sizeof b.qs; i += 8) {  // nibble 0 -> 8
    const uint64_t w = load64(b.qs + i);
    store64(b.qs + i, w | zero_nibbles(w));
  }
  std::memcpy(dst, &b, sizeof b);
}

void BlockGenerator::generate_q4_k(uint64_t block, uint8_t* dst) const {
  Rng rng = block_rng(key_, block);
  BlockQ4_K b;
  const uint64_t pick = rng.next() % kScaleTableSize;
  b.d = d_table_[pick];
  b.dmin = dmin_table_[pick];
  random_k_scales(rng, b.scales);
  rng.fill(b.qs, sizeof b.qs);
  std::memcpy(dst, &b, sizeof b);
}

void BlockGenerator::generate_q5_k(uint64_t block, uint8_t* dst) const {
  Rng rng = block_rng(key_, block);
  BlockQ5_K b;
  const uint64_t pick = rng.next() % kScaleTableSize;
  b.d = d_table_[pick];
  b.dmin = dmin_table_[pick];
  random_k_scales(rng, b.scales);
  rng.fill(b.qh, sizeof b.qh);
  rng.fill(b.qs, sizeof b.qs);
  std::memcpy(dst, &b, sizeof b);
}

void BlockGenerator::generate_q6_k(uint64_t block, uint8_t* dst) const {
  Rng rng = block_rng(key_, block);
  BlockQ6_K b;
  b.d = d_table_[rng.next() % kScaleTableSize];
  const uint64_t signs = rng.next();
  for (int w = 0; w < 4; ++w) {
    const uint64_t bits = rng.next();
    for (int k = 0; k < 4; ++k) {
      const int g = 4 * w + k;
      const int magnitude = uniform_int(bits >> (16 * k), kQ6ScMin, kQ6ScMax);
      b.scales[g] = static_cast<int8_t>(((signs >> g) & 1) ? -magnitude : magnitude);
    }
  }
  rng.fill(b.ql, sizeof b.ql);
  rng.fill(b.qh, sizeof b.qh);
  // q == 0 (low nibble 0 and high pair 0) becomes q == 32 (high pair 2): the values become symmetric in [-31, 31].
  // Element layout per 128-element half n (l < 32): y[l] <- ql[l] low nibble, qh[l] bits 0-1; y[l+32] <- ql[l+32]
  // low, bits 2-3; y[l+64] <- ql[l] high, bits 4-5; y[l+96] <- ql[l+32] high, bits 6-7. Eight l at a time:
  for (size_t n = 0; n < 2; ++n) {
    for (size_t l = 0; l < 32; l += 8) {
      const uint64_t za = zero_nibbles(load64(b.ql + 64 * n + l));       // bits 3 / 7: y[l] / y[l+64] nibble zero
      const uint64_t zb = zero_nibbles(load64(b.ql + 64 * n + 32 + l));  // same for y[l+32] / y[l+96]
      uint64_t h = load64(b.qh + 32 * n + l);
      const uint64_t zero_pairs = ~(h | (h >> 1)) & 0x5555555555555555ull;  // bit 2k: pair k zero
      // Nibble-zero flags moved to the low bit of their pair: za bits 3, 7 -> 0, 4; zb bits 3, 7 -> 2, 6.
      const uint64_t zero_nibble_at_pair = ((za >> 3) & 0x1111111111111111ull) | ((zb >> 1) & 0x4444444444444444ull);
      h |= (zero_nibble_at_pair & zero_pairs) << 1;  // pair 0 -> 2
      store64(b.qh + 32 * n + l, h);
    }
  }
  std::memcpy(dst, &b, sizeof b);
}

}  // namespace kestrel::mkmodel
