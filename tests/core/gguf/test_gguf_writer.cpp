// GgufWriter contract: refuses malformed input and misuse with the right code, checks tensor completeness,
// reports total_bytes() after write_header(), removes its partial file when abandoned, and surfaces I/O failures.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "tests/core/gguf/gguf_test_files.h"

namespace kestrel {
namespace {

using testing::TempPath;

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

void expect_error(const Status& s, ErrorCode code, const std::string& part) {
  ASSERT_FALSE(s) << "expected an error containing: " << part;
  EXPECT_EQ(s.error().code, code) << s.error().to_string();
  EXPECT_NE(s.error().message.find(part), std::string::npos) << s.error().message;
}

TEST(GgufWriter, RefusesMalformedMetadata) {
  TempPath path("w-meta");
  auto w = GgufWriter::create(path.str());
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->add_metadata("a", GgufValue::u32(1)));
  expect_error(w->add_metadata("a", GgufValue::u8(2)), ErrorCode::kInvalidArgument, "duplicate metadata key 'a'");
  expect_error(w->add_metadata("general.alignment", GgufValue::u32(48)), ErrorCode::kInvalidArgument,
               "general.alignment must be a u32 power of two, got 48");
  expect_error(w->add_metadata("general.alignment", GgufValue::u32(0)), ErrorCode::kInvalidArgument, "power of two");
  expect_error(w->add_metadata("general.alignment", GgufValue::u64(64)), ErrorCode::kInvalidArgument, "(u64)");
  expect_error(w->add_metadata("mixed", GgufValue::array(GgufValueType::kInt32, {GgufValue::i32(1), GgufValue::u8(2)})),
               ErrorCode::kInvalidArgument, "array of i32 holds a u8 at index 1");
  GgufValue deep = GgufValue::i32_array({1});
  for (uint32_t d = 1; d < kGgufMaxArrayDepth; ++d) deep = GgufValue::array(GgufValueType::kArray, {deep});
  ASSERT_TRUE(w->add_metadata("deep.ok", deep));
  expect_error(w->add_metadata("deep.bad", GgufValue::array(GgufValueType::kArray, {deep})),
               ErrorCode::kInvalidArgument, "nested deeper than 8");
  EXPECT_EQ(w->alignment(), kGgufDefaultAlignment);
  ASSERT_TRUE(w->add_metadata("general.alignment", GgufValue::u32(256)));
  EXPECT_EQ(w->alignment(), 256u);
}

TEST(GgufWriter, RefusesMalformedTensors) {
  TempPath path("w-tensor");
  auto w = GgufWriter::create(path.str());
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->add_tensor("a", {32}, GgmlType::kQ8_0));
  expect_error(w->add_tensor("a", {4}, GgmlType::kF32), ErrorCode::kInvalidArgument, "duplicate tensor name 'a'");
  expect_error(w->add_tensor("b", {33, 2}, GgmlType::kQ8_0), ErrorCode::kInvalidArgument,
               "rows of 33 elements, not a multiple of the block size 32");
  expect_error(w->add_tensor("c", {}, GgmlType::kF32), ErrorCode::kInvalidArgument, "0 dimensions");
  expect_error(w->add_tensor("d", {1, 1, 1, 1, 1}, GgmlType::kF32), ErrorCode::kInvalidArgument, "5 dimensions");
  expect_error(w->add_tensor("e", {4, 0}, GgmlType::kF32), ErrorCode::kInvalidArgument, "invalid shape {4, 0}");
  expect_error(w->add_tensor("f", {1ull << 32, 1ull << 32}, GgmlType::kF32), ErrorCode::kInvalidArgument,
               "invalid shape");
  expect_error(w->add_tensor("g", {4}, static_cast<GgmlType>(4)), ErrorCode::kInvalidArgument, "invalid type 4");
  expect_error(w->add_tensor(std::string(64, 'n'), {4}, GgmlType::kF32), ErrorCode::kInvalidArgument,
               "is 64 bytes; GGUF readers accept at most 63");
  ASSERT_TRUE(w->add_tensor(std::string(63, 'n'), {4}, GgmlType::kF32));
}

TEST(GgufWriter, EnforcesCallOrderAndTensorSizes) {
  TempPath path("w-order");
  auto w = GgufWriter::create(path.str());
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->add_tensor("a", {8}, GgmlType::kF32));  // 32 bytes
  ASSERT_TRUE(w->add_tensor("b", {3}, GgmlType::kF16));  // 6 bytes
  expect_error(w->append_tensor_data(std::vector<uint8_t>(4)), ErrorCode::kFailedPrecondition, "before write_header");
  expect_error(w->finish(), ErrorCode::kFailedPrecondition, "before write_header");
  ASSERT_TRUE(w->write_header());
  expect_error(w->write_header(), ErrorCode::kFailedPrecondition, "twice");
  expect_error(w->add_metadata("late", GgufValue::u8(1)), ErrorCode::kFailedPrecondition, "after write_header");
  expect_error(w->add_tensor("late", {1}, GgmlType::kF32), ErrorCode::kFailedPrecondition, "after write_header");
  EXPECT_EQ(w->tensors()[0].offset, 0u);
  EXPECT_EQ(w->tensors()[1].offset, 32u);
  EXPECT_EQ(w->total_bytes(), w->bytes_written() + 32 + 32);  // both tensors padded to 32

  expect_error(w->write_tensor("b", std::vector<uint8_t>(6)), ErrorCode::kInvalidArgument, "the next tensor is 'a'");
  expect_error(w->write_tensor("a", std::vector<uint8_t>(31)), ErrorCode::kInvalidArgument,
               "got 31 bytes, the tensor has 32");
  ASSERT_TRUE(w->append_tensor_data(std::vector<uint8_t>(20)));
  expect_error(w->write_tensor("a", std::vector<uint8_t>(32)), ErrorCode::kInvalidArgument, "20 of 32 bytes written");
  ASSERT_TRUE(w->append_tensor_data(std::vector<uint8_t>(14)));  // finishes a, 2 bytes into b
  expect_error(w->finish(), ErrorCode::kFailedPrecondition, "tensor 'b' [2 of 2] has 2 of 6 bytes");
  expect_error(w->append_tensor_data(std::vector<uint8_t>(5)), ErrorCode::kInvalidArgument,
               "1 bytes of tensor data past the end");
  ASSERT_TRUE(w->finish());
  EXPECT_EQ(w->bytes_written(), w->total_bytes());
  expect_error(w->finish(), ErrorCode::kFailedPrecondition, "finished");
  auto f = GgufFile::open(path.str());
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_EQ(f->file_size(), w->total_bytes());
}

TEST(GgufWriter, AbandonedWriterRemovesItsFile) {
  TempPath path("w-abandon");
  {
    auto w = GgufWriter::create(path.str());
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->add_tensor("a", {8}, GgmlType::kF32));
    ASSERT_TRUE(w->write_header());
    EXPECT_TRUE(exists(path.str()));
  }
  EXPECT_FALSE(exists(path.str()));
  {
    auto w = GgufWriter::create(path.str());
    ASSERT_TRUE(w);
    GgufWriter moved = std::move(*w);  // the moved-from writer must not remove the file
    ASSERT_TRUE(moved.write_header());
    ASSERT_TRUE(moved.finish());
  }
  EXPECT_TRUE(exists(path.str()));
}

TEST(GgufWriter, CreateInMissingDirectoryIsNotFound) {
  auto w = GgufWriter::create("/nonexistent-kestrel-dir/x.gguf");
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, ErrorCode::kNotFound);
  EXPECT_NE(w.error().message.find("'/nonexistent-kestrel-dir/x.gguf'"), std::string::npos);
}

TEST(GgufWriter, WriteFailureIsReported) {
  if (!exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  {
    // Larger than the stdio buffer: fwrite itself fails.
    auto w = GgufWriter::create("/dev/full");
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->add_tensor("big", {1u << 20}, GgmlType::kF32));
    ASSERT_TRUE(w->write_header());
    Status s = w->append_tensor_data(std::vector<uint8_t>(4u << 20));
    expect_error(s, ErrorCode::kIo, "writing '/dev/full' failed");
    expect_error(w->finish(), ErrorCode::kFailedPrecondition, "an earlier write failed");
  }
  {
    // Small: everything sits in the buffer until finish() flushes.
    auto w = GgufWriter::create("/dev/full");
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->write_header());
    expect_error(w->finish(), ErrorCode::kIo, "finishing '/dev/full' failed");
  }
  EXPECT_TRUE(exists("/dev/full")) << "the writer must never remove what is not a regular file";
}

}  // namespace
}  // namespace kestrel
