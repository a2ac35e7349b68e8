// GgufValue: factories keep the on-disk type, checked conversions, exact equality and describe() rendering.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <string>

#include "core/gguf/gguf_value.h"

namespace kestrel {
namespace {

TEST(GgufValue, FactoriesKeepTypeAndValue) {
  EXPECT_EQ(GgufValue().type(), GgufValueType::kUint8);
  EXPECT_EQ(GgufValue::u8(250).type(), GgufValueType::kUint8);
  EXPECT_EQ(GgufValue::i8(-3).type(), GgufValueType::kInt8);
  EXPECT_EQ(GgufValue::u16(7).type(), GgufValueType::kUint16);
  EXPECT_EQ(GgufValue::i16(-7).type(), GgufValueType::kInt16);
  EXPECT_EQ(GgufValue::u32(7).type(), GgufValueType::kUint32);
  EXPECT_EQ(GgufValue::i32(-7).type(), GgufValueType::kInt32);
  EXPECT_EQ(GgufValue::u64(7).type(), GgufValueType::kUint64);
  EXPECT_EQ(GgufValue::i64(-7).type(), GgufValueType::kInt64);
  EXPECT_EQ(GgufValue::f32(1.0f).type(), GgufValueType::kFloat32);
  EXPECT_EQ(GgufValue::f64(1.0).type(), GgufValueType::kFloat64);
  EXPECT_EQ(GgufValue::boolean(true).type(), GgufValueType::kBool);
  EXPECT_EQ(GgufValue::string("x").type(), GgufValueType::kString);
  EXPECT_EQ(GgufValue::i8(-3).raw_i64(), -3);
  EXPECT_EQ(GgufValue::u8(250).raw_u64(), 250u);
  EXPECT_EQ(GgufValue::f32(0.5f).raw_u64(), std::bit_cast<uint32_t>(0.5f));
  EXPECT_EQ(GgufValue::f64(0.5).raw_f64(), 0.5);
  EXPECT_TRUE(GgufValue::i16(1).is_integer());
  EXPECT_FALSE(GgufValue::boolean(true).is_integer());
  EXPECT_TRUE(GgufValue::f32(1).is_float());

  GgufValue a = GgufValue::string_array({"a", "b"});
  EXPECT_TRUE(a.is_array());
  EXPECT_EQ(a.array_type(), GgufValueType::kString);
  ASSERT_EQ(a.items().size(), 2u);
  EXPECT_EQ(a.items()[1].raw_string(), "b");
  EXPECT_TRUE(GgufValue::u32(1).items().empty());
}

TEST(GgufValue, CheckedConversions) {
  EXPECT_EQ(*GgufValue::u32(4000000000u).to_u64(), 4000000000u);
  EXPECT_EQ(*GgufValue::i16(12).to_u64(), 12u);
  EXPECT_EQ(*GgufValue::boolean(true).to_u64(), 1u);
  auto neg = GgufValue::i32(-1).to_u64();
  ASSERT_FALSE(neg);
  EXPECT_EQ(neg.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(neg.error().message.find("-1 (i32) is negative"), std::string::npos) << neg.error().message;

  EXPECT_EQ(*GgufValue::i64(std::numeric_limits<int64_t>::min()).to_i64(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*GgufValue::u64(42).to_i64(), 42);
  auto big = GgufValue::u64(std::numeric_limits<uint64_t>::max()).to_i64();
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().message.find("18446744073709551615 (u64) does not fit"), std::string::npos);
  EXPECT_FALSE(GgufValue::f32(1.0f).to_i64());

  EXPECT_EQ(*GgufValue::f32(0.25f).to_f64(), 0.25);
  EXPECT_EQ(*GgufValue::i32(-3).to_f64(), -3.0);
  EXPECT_EQ(*GgufValue::u64(10).to_f64(), 10.0);
  EXPECT_FALSE(GgufValue::string("1").to_f64());

  EXPECT_TRUE(*GgufValue::boolean(true).to_bool());
  EXPECT_FALSE(*GgufValue::boolean(false).to_bool());
  auto not_bool = GgufValue::u8(1).to_bool();
  ASSERT_FALSE(not_bool);
  EXPECT_EQ(not_bool.error().message, "value is u8, expected bool");

  EXPECT_EQ(*GgufValue::string("hi").to_string(), "hi");
  auto not_str = GgufValue::u32(1).to_string();
  ASSERT_FALSE(not_str);
  EXPECT_EQ(not_str.error().message, "value is u32, expected string");
  EXPECT_FALSE(GgufValue::string_array({"x"}).to_string());
}

TEST(GgufValue, EqualityIsBitExact) {
  const float qnan = std::bit_cast<float>(0x7fc12345u);
  const float snan = std::bit_cast<float>(0x7f800001u);
  EXPECT_EQ(GgufValue::f32(qnan), GgufValue::f32(qnan));
  EXPECT_EQ(GgufValue::f32(snan).raw_u64(), 0x7f800001u);
  EXPECT_FALSE(GgufValue::f32(qnan) == GgufValue::f32(std::bit_cast<float>(0x7fc00000u)));
  EXPECT_FALSE(GgufValue::f32(0.0f) == GgufValue::f32(-0.0f));
  EXPECT_FALSE(GgufValue::f64(0.0) == GgufValue::f64(-0.0));
  EXPECT_FALSE(GgufValue::u32(1) == GgufValue::i32(1));
  EXPECT_FALSE(GgufValue::i32_array({1, 2}) == GgufValue::i32_array({1, 3}));
  EXPECT_FALSE(GgufValue::i32_array({}) == GgufValue::f32_array({}));
  EXPECT_EQ(GgufValue::string_array({"a", ""}), GgufValue::string_array({"a", ""}));
}

TEST(GgufValue, DescribeScalars) {
  EXPECT_EQ(GgufValue::u8(255).describe(), "255");
  EXPECT_EQ(GgufValue::i64(std::numeric_limits<int64_t>::min()).describe(), "-9223372036854775808");
  EXPECT_EQ(GgufValue::u64(std::numeric_limits<uint64_t>::max()).describe(), "18446744073709551615");
  EXPECT_EQ(GgufValue::f32(1e-6f).describe(), "1e-06");
  EXPECT_EQ(GgufValue::f32(10000000.0f).describe(), "1e+07");
  EXPECT_EQ(GgufValue::f64(0.1).describe(), "0.1");
  EXPECT_EQ(GgufValue::f32(-0.0f).describe(), "-0");
  EXPECT_EQ(GgufValue::boolean(false).describe(), "false");
  EXPECT_EQ(GgufValue::string("qwen35moe").describe(), "\"qwen35moe\"");
  EXPECT_EQ(GgufValue::string("").describe(), "\"\"");
  EXPECT_EQ(GgufValue::string("a\"b\\c\nd\x01").describe(), "\"a\\\"b\\\\c\\nd\\x01\"");
}

TEST(GgufValue, DescribeTruncatesLongStringsOnCodePoints) {
  const std::string long_ascii(100, 'x');
  EXPECT_EQ(GgufValue::string(long_ascii).describe(), "\"" + std::string(60, 'x') + "\"... (100 bytes)");
  // 59 ASCII bytes then a 2-byte 'é': the cut at 60 would split it, so it backs off to 59.
  const std::string s = std::string(59, 'a') + "\xc3\xa9" + "tail";
  EXPECT_EQ(GgufValue::string(s).describe(), "\"" + std::string(59, 'a') + "\"... (65 bytes)");
  EXPECT_EQ(GgufValue::string("\xc3\xa9t\xc3\xa9").describe(), "\"\xc3\xa9t\xc3\xa9\"");
}

TEST(GgufValue, DescribeArrays) {
  std::vector<std::string> vocab = {"!", "\"", "#", "$", "%", "&"};
  EXPECT_EQ(GgufValue::string_array(vocab).describe(), "[string x 6] ['!', '\"', '#', '$', ...]");
  EXPECT_EQ(GgufValue::i32_array({11, 11, 10, 0}).describe(), "[i32 x 4] [11, 11, 10, 0]");
  EXPECT_EQ(GgufValue::i32_array({}).describe(), "[i32 x 0] []");
  EXPECT_EQ(GgufValue::string_array({"it's"}).describe(), "[string x 1] ['it\\'s']");
  EXPECT_EQ(GgufValue::f32_array({0.5f, -1.0f, 2.0f}).describe(2), "[f32 x 3] [0.5, -1, ...]");
  EXPECT_EQ(GgufValue::f32_array({0.5f}).describe(0), "[f32 x 1] [...]");
  GgufValue nested = GgufValue::array(GgufValueType::kArray,
                                      {GgufValue::i32_array({1, 2}), GgufValue::array(GgufValueType::kUint8, {})});
  EXPECT_EQ(nested.describe(), "[array x 2] [[i32 x 2] [1, 2], [u8 x 0] []]");
}

TEST(GgufValue, TypeNamesAndValidity) {
  EXPECT_EQ(gguf_value_type_name(GgufValueType::kString), "string");
  EXPECT_EQ(gguf_value_type_name(GgufValueType::kFloat64), "f64");
  EXPECT_TRUE(gguf_value_type_is_valid(0));
  EXPECT_TRUE(gguf_value_type_is_valid(12));
  EXPECT_FALSE(gguf_value_type_is_valid(13));
  EXPECT_FALSE(gguf_value_type_is_valid(0xFFFFFFFFu));
}

}  // namespace
}  // namespace kestrel
