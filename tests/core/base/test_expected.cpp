#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/base/expected.h"

namespace kestrel {
namespace {

Expected<int> parse_positive(int v) {
  if (v <= 0) return make_error(ErrorCode::kInvalidArgument, "not positive: " + std::to_string(v));
  return v;
}

Expected<int> doubled(int v) {
  KESTREL_TRY_ASSIGN(int x, parse_positive(v));
  return 2 * x;
}

Status check(int v) {
  KESTREL_TRY(parse_positive(v));
  return ok_status();
}

TEST(Expected, ValueAndError) {
  auto ok = parse_positive(3);
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, 3);
  auto bad = parse_positive(-1);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.error().to_string(), "invalid argument: not positive: -1");
}

TEST(Expected, TryPropagates) {
  EXPECT_EQ(*doubled(4), 8);
  auto bad = doubled(0);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "not positive: 0");
  EXPECT_TRUE(check(1));
  EXPECT_FALSE(check(-5));
  EXPECT_EQ(check(-5).error().code, ErrorCode::kInvalidArgument);
}

TEST(Expected, MoveOnlyValue) {
  Expected<std::unique_ptr<int>> e(std::make_unique<int>(7));
  ASSERT_TRUE(e);
  std::unique_ptr<int> p = std::move(e).value();
  EXPECT_EQ(*p, 7);
}

}  // namespace
}  // namespace kestrel
