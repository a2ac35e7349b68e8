// parse_byte_size (core/base/byte_size.h): the units people write, and clear refusals.
#include <gtest/gtest.h>

#include "core/base/byte_size.h"

namespace kestrel {
namespace {

TEST(ByteSize, PlainNumbersAndBinaryUnits) {
  EXPECT_EQ(*parse_byte_size("8000000000"), 8000000000u);
  EXPECT_EQ(*parse_byte_size("0"), 0u);
  EXPECT_EQ(*parse_byte_size("512B"), 512u);
  EXPECT_EQ(*parse_byte_size("4k"), 4096u);
  EXPECT_EQ(*parse_byte_size("4KiB"), 4096u);
  EXPECT_EQ(*parse_byte_size("512 MiB"), 512u << 20);
  EXPECT_EQ(*parse_byte_size("12G"), 12ull << 30);
  EXPECT_EQ(*parse_byte_size("12GB"), 12ull << 30);
  EXPECT_EQ(*parse_byte_size("12gib"), 12ull << 30);
  EXPECT_EQ(*parse_byte_size("1.5T"), 3ull << 39);
  EXPECT_EQ(*parse_byte_size("0.5K"), 512u);
}

TEST(ByteSize, RefusesWhatIsNotASize) {
  for (const char* bad : {"", "G", "-1G", "12X", "12GBs", "1.2.3G", "12 G B", "nan", "inf", "99999999999T"}) {
    auto r = parse_byte_size(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message.find("byte size"), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace kestrel
