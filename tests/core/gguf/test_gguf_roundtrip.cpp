// GgufWriter → GgufFile round trips: every value type (bit-exact, order kept), nested arrays, tensors of several
// types and ranks with their bytes, default and custom alignment, streaming in odd pieces, open() vs from_bytes(),
// the typed getters, and a hand-made v2 file.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "tests/core/gguf/gguf_test_files.h"

namespace kestrel {
namespace {

using testing::GgufBytes;
using testing::TempPath;

std::vector<std::pair<std::string, GgufValue>> all_kinds_of_metadata() {
  std::vector<std::pair<std::string, GgufValue>> m;
  auto add = [&](std::string k, GgufValue v) { m.emplace_back(std::move(k), std::move(v)); };
  add("z.first", GgufValue::string("order is kept, not sorted"));
  add("u8.max", GgufValue::u8(255));
  add("i8.min", GgufValue::i8(-128));
  add("u16.max", GgufValue::u16(65535));
  add("i16.min", GgufValue::i16(-32768));
  add("u32.max", GgufValue::u32(0xFFFFFFFFu));
  add("i32.min", GgufValue::i32(std::numeric_limits<int32_t>::min()));
  add("u64.max", GgufValue::u64(std::numeric_limits<uint64_t>::max()));
  add("i64.min", GgufValue::i64(std::numeric_limits<int64_t>::min()));
  add("f32.qnan_payload", GgufValue::f32(std::bit_cast<float>(0x7fc12345u)));
  add("f32.snan", GgufValue::f32(std::bit_cast<float>(0xff800001u)));
  add("f32.neg_zero", GgufValue::f32(-0.0f));
  add("f32.denormal", GgufValue::f32(std::numeric_limits<float>::denorm_min()));
  add("f32.inf", GgufValue::f32(-std::numeric_limits<float>::infinity()));
  add("f64.nan_payload", GgufValue::f64(std::bit_cast<double>(0x7ff4000000000abcull)));
  add("f64.neg_zero", GgufValue::f64(-0.0));
  add("f64.pi", GgufValue::f64(3.141592653589793));
  add("bool.true", GgufValue::boolean(true));
  add("bool.false", GgufValue::boolean(false));
  add("str.empty", GgufValue::string(""));
  add("str.utf8", GgufValue::string("\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x90\xa6 \xc4\xa0"));
  add("str.nul", GgufValue::string(std::string("a\0b", 3)));
  add("", GgufValue::string("the empty key is legal"));
  add("arr.u8", GgufValue::array(GgufValueType::kUint8, {GgufValue::u8(0), GgufValue::u8(255)}));
  add("arr.i8", GgufValue::array(GgufValueType::kInt8, {GgufValue::i8(-1), GgufValue::i8(127)}));
  add("arr.u16", GgufValue::array(GgufValueType::kUint16, {GgufValue::u16(1), GgufValue::u16(65535)}));
  add("arr.i16", GgufValue::array(GgufValueType::kInt16, {GgufValue::i16(-2)}));
  add("arr.u32", GgufValue::array(GgufValueType::kUint32, {GgufValue::u32(3), GgufValue::u32(0xFFFFFFFFu)}));
  add("arr.i32", GgufValue::i32_array({11, 11, 10, 0, -5}));
  add("arr.u64", GgufValue::array(GgufValueType::kUint64, {GgufValue::u64(std::numeric_limits<uint64_t>::max())}));
  add("arr.i64", GgufValue::array(GgufValueType::kInt64, {GgufValue::i64(-9), GgufValue::i64(9)}));
  add("arr.f32", GgufValue::f32_array({1.5f, -0.0f, std::bit_cast<float>(0x7fa00001u)}));
  add("arr.f64", GgufValue::array(GgufValueType::kFloat64, {GgufValue::f64(-0.0), GgufValue::f64(1e300)}));
  add("arr.bool", GgufValue::array(GgufValueType::kBool, {GgufValue::boolean(true), GgufValue::boolean(false)}));
  add("arr.str", GgufValue::string_array({"", "\xc4\xa0the", "<|im_start|>", std::string(1000, 'q')}));
  add("arr.empty", GgufValue::array(GgufValueType::kFloat64, {}));
  add("arr.nested", GgufValue::array(GgufValueType::kArray,
                                     {GgufValue::i32_array({1, 2, 3}), GgufValue::string_array({"x"}),
                                      GgufValue::array(GgufValueType::kUint8, {}),
                                      GgufValue::array(GgufValueType::kArray, {GgufValue::f32_array({-0.0f})})}));
  add("arr.nested_empty", GgufValue::array(GgufValueType::kArray, {}));
  return m;
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;
  GgmlType type;
};

std::vector<TensorSpec> tensor_specs() {
  return {
      {"token_embd.weight", {32, 6}, GgmlType::kQ8_0},                // 2-D, 204 bytes
      {"output_norm.weight", {7}, GgmlType::kF32},                    // 1-D, 28 bytes (padded)
      {"blk.0.ffn_up_exps.weight", {256, 2, 3, 2}, GgmlType::kQ4_K},  // 4-D, 12 blocks
      {"blk.0.ssm_conv1d.weight", {4, 3, 2}, GgmlType::kF16},         // 3-D
      {"blk.0.ffn_down_exps.weight", {256, 3}, GgmlType::kQ6_K},
      {"blk.0.attn_q.weight", {64, 2}, GgmlType::kBF16},
      {"blk.0.ssm_a", {5}, GgmlType::kI32},
  };
}

std::vector<uint8_t> random_bytes(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

class GgufRoundTrip : public ::testing::TestWithParam<uint32_t> {};  // param: alignment (0: default)

TEST_P(GgufRoundTrip, MetadataAndTensorsSurviveExactly) {
  const uint32_t alignment = GetParam();
  TempPath path("roundtrip");
  auto meta = all_kinds_of_metadata();
  if (alignment != 0) meta.insert(meta.begin() + 3, {"general.alignment", GgufValue::u32(alignment)});
  const auto specs = tensor_specs();

  std::vector<std::vector<uint8_t>> data;
  uint64_t expected_size = 0;
  {
    auto w = GgufWriter::create(path.str());
    ASSERT_TRUE(w) << w.error().to_string();
    // Tensors first, metadata after: the writer accepts any order before write_header().
    for (const auto& s : specs) ASSERT_TRUE(w->add_tensor(s.name, s.ne, s.type));
    for (const auto& [k, v] : meta) ASSERT_TRUE(w->add_metadata(k, v)) << k;
    EXPECT_EQ(w->total_bytes(), 0u);
    ASSERT_TRUE(w->write_header());
    expected_size = w->total_bytes();
    EXPECT_GT(expected_size, w->bytes_written());
    for (size_t i = 0; i < specs.size(); ++i) {
      data.push_back(random_bytes(w->tensors()[i].n_bytes, static_cast<uint32_t>(i + 1)));
      ASSERT_TRUE(w->write_tensor(specs[i].name, data.back()));
    }
    ASSERT_TRUE(w->finish());
    EXPECT_EQ(w->bytes_written(), expected_size);
  }

  auto f = GgufFile::open(path.str());
  ASSERT_TRUE(f) << f.error().to_string();
  const uint64_t align = alignment ? alignment : 32;
  EXPECT_EQ(f->path(), path.str());
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), align);
  EXPECT_EQ(f->file_size(), expected_size);
  EXPECT_EQ(f->data_offset() % align, 0u);

  ASSERT_EQ(f->metadata().size(), meta.size());
  for (size_t i = 0; i < meta.size(); ++i) {
    EXPECT_EQ(f->metadata()[i].first, meta[i].first) << i;
    EXPECT_TRUE(f->metadata()[i].second == meta[i].second)
        << meta[i].first << ": " << f->metadata()[i].second.describe();
  }
  EXPECT_EQ(f->find("f32.snan")->raw_u64(), 0xff800001u);
  EXPECT_EQ(f->find("f64.nan_payload")->raw_u64(), 0x7ff4000000000abcull);
  EXPECT_EQ(f->find("f32.neg_zero")->raw_u64(), 0x80000000u);

  ASSERT_EQ(f->tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.ne, specs[i].ne);
    EXPECT_EQ(t.type, specs[i].type);
    EXPECT_EQ(t.offset % align, 0u);
    EXPECT_EQ(t.n_bytes, data[i].size());
    auto span = f->tensor_data(t);
    ASSERT_EQ(span.size(), data[i].size());
    EXPECT_TRUE(std::equal(span.begin(), span.end(), data[i].begin())) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(span.data()) % align, 0u) << "mapping keeps the file alignment";
    EXPECT_EQ(f->find_tensor(t.name), &t);
  }
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up_exps.weight")->rows(), 12u);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up_exps.weight")->n_elements, 3072u);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up_exps.weight")->shape_string(), "{256, 2, 3, 2}");
  EXPECT_EQ(f->find_tensor("output_norm.weight")->rows(), 1u);
  EXPECT_EQ(f->find_tensor("missing"), nullptr);

  // The same image through from_bytes parses identically.
  auto bytes = testing::read_file_bytes(path.str());
  auto g = GgufFile::from_bytes(bytes);
  ASSERT_TRUE(g) << g.error().to_string();
  EXPECT_EQ(g->path(), "");
  EXPECT_EQ(g->data_offset(), f->data_offset());
  ASSERT_EQ(g->tensors().size(), f->tensors().size());
  for (size_t i = 0; i < specs.size(); ++i) {
    auto a = f->tensor_data(f->tensors()[i]);
    auto b = g->tensor_data(g->tensors()[i]);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  }
  // Moving the file keeps tensors, index and spans valid.
  GgufFile moved = std::move(*g);
  EXPECT_EQ(moved.find_tensor("blk.0.ssm_a")->ne[0], 5u);
  EXPECT_EQ(moved.tensor_data(*moved.find_tensor("blk.0.ssm_a")).size(), 20u);
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufRoundTrip, ::testing::Values(0u, 32u, 64u, 1u, 4096u));

TEST(GgufRoundTrip, StreamingInOddPiecesMatchesWholeWrites) {
  TempPath whole("whole"), pieces("pieces");
  const auto specs = tensor_specs();
  std::vector<uint8_t> all;
  for (int pass = 0; pass < 2; ++pass) {
    auto w = GgufWriter::create(pass == 0 ? whole.str() : pieces.str());
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->add_metadata("general.alignment", GgufValue::u32(64)));
    for (const auto& s : specs) ASSERT_TRUE(w->add_tensor(s.name, s.ne, s.type));
    ASSERT_TRUE(w->write_header());
    if (pass == 0) {
      for (const auto& t : w->tensors()) {
        auto d = random_bytes(t.n_bytes, 7);
        all.insert(all.end(), d.begin(), d.end());
        ASSERT_TRUE(w->write_tensor(t.name, d));
      }
    } else {
      // Pieces of 1, 2, 3, ... bytes, crossing tensor boundaries.
      size_t pos = 0;
      for (size_t n = 1; pos < all.size(); ++n) {
        const size_t take = std::min(n, all.size() - pos);
        ASSERT_TRUE(w->append_tensor_data(std::span(all).subspan(pos, take)));
        pos += take;
      }
    }
    ASSERT_TRUE(w->finish());
  }
  EXPECT_EQ(testing::read_file_bytes(whole.str()), testing::read_file_bytes(pieces.str()));
}

TEST(GgufRoundTrip, TypedGetters) {
  TempPath path("getters");
  {
    auto w = GgufWriter::create(path.str());
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->add_metadata("n.u8", GgufValue::u8(7)));
    ASSERT_TRUE(w->add_metadata("n.u32", GgufValue::u32(151936)));
    ASSERT_TRUE(w->add_metadata("n.i32", GgufValue::i32(-4)));
    ASSERT_TRUE(w->add_metadata("n.u64big", GgufValue::u64(std::numeric_limits<uint64_t>::max())));
    ASSERT_TRUE(w->add_metadata("n.f32", GgufValue::f32(1e-6f)));
    ASSERT_TRUE(w->add_metadata("n.f64", GgufValue::f64(10000000.0)));
    ASSERT_TRUE(w->add_metadata("b", GgufValue::boolean(true)));
    ASSERT_TRUE(w->add_metadata("s", GgufValue::string("qwen35moe")));
    ASSERT_TRUE(w->add_metadata("tokens", GgufValue::string_array({"a", "b", "c"})));
    ASSERT_TRUE(w->add_metadata("sections", GgufValue::i32_array({11, 11, 10, 0})));
    ASSERT_TRUE(
        w->add_metadata("bytes", GgufValue::array(GgufValueType::kUint8, {GgufValue::u8(1), GgufValue::u8(200)})));
    ASSERT_TRUE(w->add_metadata("u64s", GgufValue::array(GgufValueType::kUint64, {GgufValue::u64(1ull << 63)})));
    ASSERT_TRUE(w->write_header());
    ASSERT_TRUE(w->finish());
  }
  auto f = GgufFile::open(path.str());
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_EQ(*f->get_u64("n.u8"), 7u);
  EXPECT_EQ(*f->get_u64("n.u32"), 151936u);
  EXPECT_EQ(*f->get_i64("n.i32"), -4);
  EXPECT_EQ(*f->get_i64("n.u32"), 151936);
  EXPECT_EQ(*f->get_f64("n.f32"), static_cast<double>(1e-6f));
  EXPECT_EQ(*f->get_f64("n.f64"), 1e7);
  EXPECT_EQ(*f->get_f64("n.u32"), 151936.0);
  EXPECT_TRUE(*f->get_bool("b"));
  EXPECT_EQ(*f->get_string("s"), "qwen35moe");
  EXPECT_EQ(*f->get_string_array("tokens"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(*f->get_int_array("sections"), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(*f->get_int_array("bytes"), (std::vector<int64_t>{1, 200}));

  auto missing = f->get_u64("nope");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("'nope' not found in '" + path.str() + "'"), std::string::npos);

  auto neg = f->get_u64("n.i32");
  ASSERT_FALSE(neg);
  EXPECT_EQ(neg.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(neg.error().message.find("metadata key 'n.i32': value -4 (i32) is negative"), std::string::npos);

  auto wrong = f->get_string("n.u32");
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().message, "metadata key 'n.u32': value is u32, expected string");
  EXPECT_FALSE(f->get_bool("n.u8"));
  EXPECT_FALSE(f->get_i64("n.u64big"));

  auto not_strings = f->get_string_array("sections");
  ASSERT_FALSE(not_strings);
  EXPECT_EQ(not_strings.error().message, "metadata key 'sections' is an array of i32, expected an array of string");
  auto not_ints = f->get_int_array("tokens");
  ASSERT_FALSE(not_ints);
  EXPECT_EQ(not_ints.error().message, "metadata key 'tokens' is an array of string, expected an array of integers");
  EXPECT_FALSE(f->get_int_array("s"));
  auto too_big = f->get_int_array("u64s");
  ASSERT_FALSE(too_big);
  EXPECT_NE(too_big.error().message.find("element 0"), std::string::npos);
}

TEST(GgufRoundTrip, ReadsHandMadeVersion2File) {
  GgufBytes b;
  b.header(2, 1, 2).kv_str("general.architecture", "qwen3next").kv_u32("general.alignment", 16);
  b.tensor_info("a", {4}, GgmlType::kF32, 0).pad(16).raw("0123456789abcdef");
  auto f = GgufFile::from_bytes(b.bytes());
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 16u);
  ASSERT_EQ(f->tensors().size(), 1u);
  auto span = f->tensor_data(f->tensors()[0]);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(span.data()), span.size()), "0123456789abcdef");
}

TEST(GgufRoundTrip, TensorsInAnyOrderAndGapsAreAccepted) {
  // Offsets need not ascend or be contiguous; only alignment, bounds and overlap matter.
  GgufBytes b;
  b.header(3, 2, 0).tensor_info("second", {8}, GgmlType::kF32, 64).tensor_info("first", {8}, GgmlType::kI8, 0);
  b.pad(32).zeros(96);
  auto f = GgufFile::from_bytes(b.bytes());
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_EQ(f->tensor_data(f->tensors()[0]).size(), 32u);
  EXPECT_EQ(f->tensor_data(f->tensors()[1]).size(), 8u);
}

TEST(GgufRoundTrip, ForeignTensorInfoGivesEmptySpan) {
  auto bytes = testing::make_sample_gguf(0);
  ASSERT_TRUE(bytes) << bytes.error().to_string();
  auto f = GgufFile::from_bytes(*bytes);
  ASSERT_TRUE(f);
  GgufTensorInfo foreign = f->tensors()[0];
  foreign.offset = f->file_size();
  EXPECT_TRUE(f->tensor_data(foreign).empty());
  foreign.offset = std::numeric_limits<uint64_t>::max() - 8;
  EXPECT_TRUE(f->tensor_data(foreign).empty());
}

TEST(GgufRoundTrip, SampleFilesParse) {
  for (int v = 0; v < testing::kSampleVariants; ++v) {
    auto bytes = testing::make_sample_gguf(v);
    ASSERT_TRUE(bytes) << bytes.error().to_string();
    auto f = GgufFile::from_bytes(*bytes);
    ASSERT_TRUE(f) << v << ": " << f.error().to_string();
  }
}

}  // namespace
}  // namespace kestrel
