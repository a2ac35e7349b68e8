// GgufFile on damaged input: every truncation, flipped bytes in the header/metadata/tensor-info region, hand-made
// corrupt files (each with its error code and a distinctive part of the message), and open() failures.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "tests/core/gguf/gguf_test_files.h"

namespace kestrel {
namespace {

using testing::GgufBytes;
using testing::TempPath;

constexpr uint64_t kHuge = uint64_t{1} << 63;
constexpr uint32_t kArrayType = static_cast<uint32_t>(GgufValueType::kArray);

void expect_parse_error(const std::vector<uint8_t>& bytes, ErrorCode code, const std::string& part) {
  auto f = GgufFile::from_bytes(bytes);
  ASSERT_FALSE(f) << "parsed, but expected an error containing: " << part;
  EXPECT_EQ(f.error().code, code) << f.error().to_string();
  EXPECT_NE(f.error().message.find(part), std::string::npos) << "message: " << f.error().message;
}

// Reads every metadata value and every tensor byte's ends; checks each span lies inside the file.
void touch_everything(const GgufFile& f) {
  size_t n = 0;
  for (const auto& [k, v] : f.metadata()) n += k.size() + v.describe().size();
  EXPECT_GT(n + 1, 0u);
  for (const GgufTensorInfo& t : f.tensors()) {
    ASSERT_LE(t.offset, f.file_size());
    ASSERT_LE(f.data_offset() + t.offset + t.n_bytes, f.file_size());
    auto span = f.tensor_data(t);
    ASSERT_EQ(span.size(), t.n_bytes);
    volatile uint8_t sink = span.front();
    sink = span.back();
    (void)sink;
  }
}

TEST(GgufCorrupt, EveryTruncationIsRejected) {
  auto bytes = testing::make_sample_gguf(0);
  ASSERT_TRUE(bytes) << bytes.error().to_string();
  auto full = GgufFile::from_bytes(*bytes);
  ASSERT_TRUE(full) << full.error().to_string();
  // The sample ends exactly at the end of its last tensor, so every shorter prefix is invalid.
  const GgufTensorInfo& last = full->tensors().back();
  ASSERT_EQ(full->data_offset() + last.offset + last.n_bytes, bytes->size());
  for (size_t n = 0; n < bytes->size(); ++n) {
    auto f = GgufFile::from_bytes(std::span(*bytes).first(n));
    ASSERT_FALSE(f) << "prefix of " << n << " of " << bytes->size() << " bytes parsed";
    EXPECT_EQ(f.error().code, ErrorCode::kDataLoss) << n << ": " << f.error().to_string();
  }
}

TEST(GgufCorrupt, FlippedBytesGiveErrorOrValidFile) {
  for (int variant = 0; variant < testing::kSampleVariants; ++variant) {
    auto bytes = testing::make_sample_gguf(variant);
    ASSERT_TRUE(bytes) << bytes.error().to_string();
    auto clean = GgufFile::from_bytes(*bytes);
    ASSERT_TRUE(clean);
    const size_t region = static_cast<size_t>(std::min<uint64_t>(clean->data_offset(), bytes->size()));
    int parsed = 0, rejected = 0;
    for (size_t i = 0; i < region; ++i) {
      for (int op = 0; op < 8; ++op) {
        std::vector<uint8_t> m = *bytes;
        static constexpr uint8_t kXor[] = {0xFF, 0x01, 0x80, 0x7F, 0x10, 0x40};
        if (op < 6) {
          m[i] ^= kXor[op];
        } else {
          m[i] = op == 6 ? 0x00 : 0xFF;
        }
        auto f = GgufFile::from_bytes(m);
        if (f) {
          ++parsed;
          touch_everything(*f);
        } else {
          ++rejected;
          EXPECT_TRUE(f.error().code == ErrorCode::kDataLoss || f.error().code == ErrorCode::kUnsupported)
              << f.error().to_string();
          EXPECT_FALSE(f.error().message.empty());
        }
      }
    }
    EXPECT_GT(rejected, 0);
    EXPECT_GT(parsed, 0);  // e.g. flips inside string contents and values still parse
  }
}

TEST(GgufCorrupt, EmptyAndTinyInput) {
  expect_parse_error({}, ErrorCode::kDataLoss, "truncated: the magic needs 4 bytes at byte 0 but the file has 0 bytes");
  expect_parse_error(GgufBytes().raw("GGUF").u32(3).bytes(), ErrorCode::kDataLoss, "the tensor count needs 8 bytes");
}

TEST(GgufCorrupt, BadMagic) {
  expect_parse_error(GgufBytes().raw("GGML").u32(3).u64(0).u64(0).bytes(), ErrorCode::kDataLoss,
                     "bad magic 'GGML' (0x4c4d4747) at byte 0: not a GGUF file");
  expect_parse_error(GgufBytes().u32(0x00000102).u32(3).u64(0).u64(0).bytes(), ErrorCode::kDataLoss,
                     "bad magic '??\?\?'");
}

TEST(GgufCorrupt, UnsupportedVersions) {
  expect_parse_error(GgufBytes().header(1, 0, 0).bytes(), ErrorCode::kUnsupported,
                     "GGUF version 1 is not supported (versions 2 and 3 are)");
  expect_parse_error(GgufBytes().header(4, 0, 0).bytes(), ErrorCode::kUnsupported, "GGUF version 4 is not supported");
  expect_parse_error(GgufBytes().header(0x03000000, 0, 0).bytes(), ErrorCode::kUnsupported, "(a big-endian file?)");
  EXPECT_TRUE(GgufFile::from_bytes(GgufBytes().header(3, 0, 0).bytes()));
}

TEST(GgufCorrupt, HugeHeaderCounts) {
  expect_parse_error(GgufBytes().header(3, 0, kHuge).bytes(), ErrorCode::kDataLoss,
                     "header claims 9223372036854775808 metadata entries and 0 tensors, more than the 0 bytes");
  expect_parse_error(GgufBytes().header(3, ~uint64_t{0}, 1).kv_u32("a", 1).bytes(), ErrorCode::kDataLoss,
                     "header claims 1 metadata entries and 18446744073709551615 tensors");
}

TEST(GgufCorrupt, UnknownValueType) {
  // header 24 bytes, key "k" 9 bytes: the type sits at byte 33.
  expect_parse_error(GgufBytes().header(3, 0, 1).str("k").u32(13).u32(0).bytes(), ErrorCode::kUnsupported,
                     "metadata key 'k' [1 of 1]: unknown value type 13 at byte 33");
  expect_parse_error(GgufBytes().header(3, 0, 1).str("arr").u32(kArrayType).u32(77).u64(0).bytes(),
                     ErrorCode::kUnsupported, "metadata key 'arr' [1 of 1]: unknown array element type 77 at byte 39");
}

TEST(GgufCorrupt, UnknownTensorType) {
  GgufBytes b;
  b.header(3, 1, 0).tensor_info_raw("blk.0.attn_q.weight", {32}, 4, 0).pad(32).zeros(64);
  expect_parse_error(b.bytes(), ErrorCode::kUnsupported,
                     "tensor 'blk.0.attn_q.weight' [1 of 1] has unknown tensor type 4 at byte");
}

TEST(GgufCorrupt, HugeStringLengths) {
  expect_parse_error(GgufBytes().header(3, 0, 1).u64(kHuge).raw("key").zeros(16).bytes(), ErrorCode::kDataLoss,
                     "metadata key #1 of 1: string length 9223372036854775808 at byte 24 exceeds the 19 bytes left");
  GgufBytes v;
  v.header(3, 0, 1).str("general.name").u32(static_cast<uint32_t>(GgufValueType::kString)).u64(~uint64_t{0}).raw("x");
  expect_parse_error(v.bytes(), ErrorCode::kDataLoss,
                     "metadata key 'general.name' [1 of 1]: string length 18446744073709551615");
  GgufBytes t;
  t.header(3, 1, 0).u64(kHuge).zeros(40);
  expect_parse_error(t.bytes(), ErrorCode::kDataLoss, "tensor #1 of 1 (name): string length 9223372036854775808");
}

TEST(GgufCorrupt, HugeArrayCounts) {
  GgufBytes a;
  a.header(3, 0, 1).str("a").u32(kArrayType).u32(static_cast<uint32_t>(GgufValueType::kUint32)).u64(kHuge).u32(1);
  expect_parse_error(a.bytes(), ErrorCode::kDataLoss,
                     "metadata key 'a' [1 of 1]: array of 9223372036854775808 u32 at byte 37 needs more than 2^64 "
                     "bytes but only 4 are left");
  GgufBytes s;
  s.header(3, 0, 1).str("tokens").u32(kArrayType).u32(static_cast<uint32_t>(GgufValueType::kString)).u64(1000);
  s.str("a").str("b");
  expect_parse_error(s.bytes(), ErrorCode::kDataLoss, "array of 1000 string at byte 42 needs at least 8000 bytes");
  // The count of an inner array of an array of arrays.
  GgufBytes n;
  n.header(3, 0, 1).str("n").u32(kArrayType).u32(kArrayType).u64(1);
  n.u32(static_cast<uint32_t>(GgufValueType::kUint64)).u64(kHuge + 5);
  expect_parse_error(n.bytes(), ErrorCode::kDataLoss, "array of 9223372036854775813 u64");
}

TEST(GgufCorrupt, TooManyMetadataValues) {
  GgufBytes b;
  b.header(3, 0, 1).str("blob").u32(kArrayType).u32(static_cast<uint32_t>(GgufValueType::kUint8));
  b.u64(kGgufMaxMetadataValues + 1).zeros(static_cast<size_t>(kGgufMaxMetadataValues + 1));
  expect_parse_error(b.bytes(), ErrorCode::kUnsupported, "the metadata holds more than 4194304 values");
}

TEST(GgufCorrupt, NestingDepthLimit) {
  auto nested = [](uint32_t depth) {
    GgufBytes b;
    b.header(3, 0, 1).str("deep").u32(kArrayType);
    for (uint32_t d = 1; d < depth; ++d) b.u32(kArrayType).u64(1);
    b.u32(static_cast<uint32_t>(GgufValueType::kInt32)).u64(1).u32(7);
    return b.bytes();
  };
  auto ok = GgufFile::from_bytes(nested(kGgufMaxArrayDepth));
  ASSERT_TRUE(ok) << ok.error().to_string();
  const GgufValue* v = ok->find("deep");
  for (uint32_t d = 1; d < kGgufMaxArrayDepth; ++d) v = &v->items().at(0);
  EXPECT_EQ(v->items().at(0).raw_i64(), 7);
  expect_parse_error(nested(kGgufMaxArrayDepth + 1), ErrorCode::kUnsupported,
                     "metadata key 'deep' [1 of 1]: arrays nested deeper than 8 levels");
}

TEST(GgufCorrupt, BoolOtherThanZeroOrOne) {
  expect_parse_error(
      GgufBytes().header(3, 0, 1).str("b").u32(static_cast<uint32_t>(GgufValueType::kBool)).u8(2).bytes(),
      ErrorCode::kDataLoss, "metadata key 'b' [1 of 1]: bool value 2 at byte 37 is neither 0 nor 1");
}

TEST(GgufCorrupt, DuplicateKey) {
  GgufBytes b;
  b.header(3, 0, 3).kv_u32("a", 1).kv_u32("b", 2).kv_str("a", "again");
  expect_parse_error(b.bytes(), ErrorCode::kDataLoss, "duplicate metadata key 'a' (entries 1 and 3 of 3)");
}

TEST(GgufCorrupt, BadAlignmentValues) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufBytes b;
    b.header(3, 0, 1).kv_u32("general.alignment", a);
    expect_parse_error(
        b.bytes(), ErrorCode::kDataLoss,
        "metadata key 'general.alignment' is " + std::to_string(a) + ", expected a nonzero power of two");
  }
  GgufBytes w;
  w.header(3, 0, 1).str("general.alignment").u32(static_cast<uint32_t>(GgufValueType::kUint64)).u64(32);
  expect_parse_error(w.bytes(), ErrorCode::kDataLoss, "metadata key 'general.alignment' is u64, expected u32");
}

TEST(GgufCorrupt, TensorShapeProblems) {
  auto one_tensor = [](const std::vector<uint64_t>& ne, GgmlType type) {
    GgufBytes b;
    b.header(3, 1, 0).tensor_info("w", ne, type, 0).pad(32).zeros(1024);
    return b.bytes();
  };
  expect_parse_error(one_tensor({255, 2}, GgmlType::kQ4_K), ErrorCode::kDataLoss,
                     "tensor 'w' [1 of 1] of type q4_K has rows of 255 elements, not a multiple of the block size 256");
  expect_parse_error(one_tensor({1, 1, 1, 1, 1}, GgmlType::kF32), ErrorCode::kDataLoss,
                     "tensor 'w' [1 of 1] has 5 dimensions at byte 33 (GGUF allows 1 to 4)");
  expect_parse_error(one_tensor({}, GgmlType::kF32), ErrorCode::kDataLoss, "has 0 dimensions");
  expect_parse_error(one_tensor({4, 0}, GgmlType::kF32), ErrorCode::kUnsupported,
                     "tensor 'w' [1 of 1] has dimension 1 = 0 (empty tensor)");
  expect_parse_error(one_tensor({1ull << 32, 1ull << 32}, GgmlType::kF32), ErrorCode::kDataLoss,
                     "has shape {4294967296, 4294967296} whose element count does not fit in int64");
  expect_parse_error(one_tensor({kHuge}, GgmlType::kI8), ErrorCode::kDataLoss, "does not fit in int64");
  expect_parse_error(one_tensor({uint64_t{1} << 62}, GgmlType::kF64), ErrorCode::kDataLoss,
                     "of type f64 and shape {4611686018427387904} has a byte size that does not fit in 64 bits");
}

TEST(GgufCorrupt, TensorPastEndOfFile) {
  GgufBytes b;
  b.header(3, 2, 0)
      .tensor_info("a", {8}, GgmlType::kF32, 0)
      .tensor_info("blk.0.attn_q.weight", {64}, GgmlType::kF32, 32);
  b.pad(32).zeros(100);
  const uint64_t data_offset = b.size() - 100;
  expect_parse_error(b.bytes(), ErrorCode::kDataLoss,
                     "tensor 'blk.0.attn_q.weight' [2 of 2] ends at byte " + std::to_string(data_offset + 32 + 256) +
                         " but the file has " + std::to_string(b.size()) + " bytes");
  GgufBytes o;
  o.header(3, 1, 0).tensor_info("far", {8}, GgmlType::kF32, ~uint64_t{0} - 31).pad(32).zeros(32);
  expect_parse_error(o.bytes(), ErrorCode::kDataLoss, "tensor 'far' [1 of 1] ends at byte 2^64 or beyond");
}

TEST(GgufCorrupt, DataSectionPastEndOfFile) {
  GgufBytes b;
  b.header(3, 1, 0).tensor_info("a", {8}, GgmlType::kI8, 0);  // infos end at byte 57; data would start at 64
  expect_parse_error(b.bytes(), ErrorCode::kDataLoss,
                     "truncated: the data section starts at byte 64 (tensor-info table ends at byte 57, alignment 32) "
                     "but the file has 57 bytes");
}

TEST(GgufCorrupt, OverlappingTensors) {
  GgufBytes b;
  b.header(3, 3, 0)
      .tensor_info("c", {8}, GgmlType::kF32, 128)
      .tensor_info("a", {16}, GgmlType::kF32, 0)
      .tensor_info("b", {8}, GgmlType::kF32, 32)
      .pad(32)
      .zeros(160);
  expect_parse_error(b.bytes(), ErrorCode::kDataLoss,
                     "tensor 'a' [2 of 3] (data bytes 0..64) overlaps tensor 'b' [3 of 3] (from data byte 32)");
  GgufBytes same;
  same.header(3, 2, 0).tensor_info("x", {8}, GgmlType::kF32, 0).tensor_info("y", {8}, GgmlType::kF32, 0).pad(32);
  same.zeros(32);
  expect_parse_error(same.bytes(), ErrorCode::kDataLoss, "tensor 'x' [1 of 2] (data bytes 0..32) overlaps tensor 'y'");
}

TEST(GgufCorrupt, MisalignedOffset) {
  GgufBytes b;
  b.header(3, 1, 0).tensor_info("blk.3.ffn_gate.weight", {4}, GgmlType::kF32, 16).pad(32).zeros(64);
  expect_parse_error(b.bytes(), ErrorCode::kDataLoss,
                     "tensor 'blk.3.ffn_gate.weight' [1 of 1] has offset 16, not a multiple of the alignment 32");
  GgufBytes c;  // fine with a custom alignment of 16
  c.header(3, 1, 1).kv_u32("general.alignment", 16).tensor_info("t", {4}, GgmlType::kF32, 16).pad(16).zeros(32);
  EXPECT_TRUE(GgufFile::from_bytes(c.bytes()));
}

TEST(GgufCorrupt, DuplicateTensorName) {
  GgufBytes b;
  b.header(3, 2, 0).tensor_info("w", {8}, GgmlType::kF32, 0).tensor_info("w", {8}, GgmlType::kF32, 32).pad(32);
  b.zeros(64);
  expect_parse_error(b.bytes(), ErrorCode::kDataLoss, "duplicate tensor name 'w' (tensors 1 and 2 of 2)");
}

TEST(GgufCorrupt, NamesWithControlBytesAreEscapedInMessages) {
  GgufBytes b;
  b.header(3, 1, 0).tensor_info_raw(std::string("bad\nname\x01", 9), {32}, 99, 0).pad(32).zeros(32);
  expect_parse_error(b.bytes(), ErrorCode::kUnsupported, "tensor 'bad\\x0aname\\x01' [1 of 1]");
}

TEST(GgufOpen, MissingFileIsNotFound) {
  auto f = GgufFile::open("/nonexistent-kestrel/model.gguf");
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, ErrorCode::kNotFound);
  EXPECT_NE(f.error().message.find("'/nonexistent-kestrel/model.gguf'"), std::string::npos) << f.error().message;
}

TEST(GgufOpen, DirectoryIsIoError) {
  TempPath dir("dir");
  ASSERT_EQ(::mkdir(dir.str().c_str(), 0700), 0);
  auto f = GgufFile::open(dir.str());
  ::rmdir(dir.str().c_str());
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, ErrorCode::kIo);
  EXPECT_NE(f.error().message.find("'" + dir.str() + "' is a directory"), std::string::npos) << f.error().message;
}

TEST(GgufOpen, EmptyAndCorruptFilesNameThePath) {
  TempPath empty("empty");
  testing::write_file_bytes(empty.str(), {});
  auto e = GgufFile::open(empty.str());
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, ErrorCode::kDataLoss);
  EXPECT_NE(e.error().message.find(empty.str() + ": the file is empty"), std::string::npos);

  TempPath bad("bad");
  testing::write_file_bytes(bad.str(), GgufBytes().header(1, 0, 0).bytes());
  auto b = GgufFile::open(bad.str());
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code, ErrorCode::kUnsupported);
  EXPECT_EQ(b.error().message.rfind(bad.str() + ": GGUF version 1", 0), 0u) << b.error().message;
}

}  // namespace
}  // namespace kestrel
