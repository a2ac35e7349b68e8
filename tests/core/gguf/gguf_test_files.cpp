// GGUF test helpers: see gguf_test_files.h.
#include "tests/core/gguf/gguf_test_files.h"

#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/gguf/gguf_value.h"
#include "core/gguf/gguf_writer.h"

namespace kestrel::testing {
namespace {

int g_temp_counter = 0;

std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  return (t != nullptr && *t != '\0') ? std::string(t) : std::string("/tmp");
}

// Deterministic bytes for tensor data (xorshift64).
std::vector<uint8_t> pattern_bytes(uint64_t n, uint64_t seed) {
  std::vector<uint8_t> out(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

Status write_variant(GgufWriter& w, int variant) {
  if (variant == 0) {
    KESTREL_TRY(w.add_metadata("general.architecture", GgufValue::string("qwen35moe")));
    KESTREL_TRY(w.add_metadata("general.name", GgufValue::string("Tiny \xc3\xa9t\xc3\xa9 model")));
    KESTREL_TRY(w.add_metadata("t.u8", GgufValue::u8(200)));
    KESTREL_TRY(w.add_metadata("t.i8", GgufValue::i8(-7)));
    KESTREL_TRY(w.add_metadata("t.u16", GgufValue::u16(65535)));
    KESTREL_TRY(w.add_metadata("t.i16", GgufValue::i16(-32768)));
    KESTREL_TRY(w.add_metadata("t.u32", GgufValue::u32(4000000000u)));
    KESTREL_TRY(w.add_metadata("t.i32", GgufValue::i32(-123456)));
    KESTREL_TRY(w.add_metadata("t.u64", GgufValue::u64(std::numeric_limits<uint64_t>::max())));
    KESTREL_TRY(w.add_metadata("t.i64", GgufValue::i64(std::numeric_limits<int64_t>::min())));
    KESTREL_TRY(w.add_metadata("t.f32", GgufValue::f32(1e-6f)));
    KESTREL_TRY(w.add_metadata("t.f64", GgufValue::f64(-2.5)));
    KESTREL_TRY(w.add_metadata("t.bool", GgufValue::boolean(true)));
    KESTREL_TRY(w.add_metadata("t.empty", GgufValue::string("")));
    KESTREL_TRY(w.add_metadata("t.sections", GgufValue::i32_array({11, 11, 10, 0})));
    KESTREL_TRY(w.add_metadata(
        "t.nested",
        GgufValue::array(GgufValueType::kArray, {GgufValue::i32_array({1, 2}), GgufValue::string_array({"a", "bc"}),
                                                 GgufValue::array(GgufValueType::kUint8, {})})));
    KESTREL_TRY(w.add_tensor("token_embd.weight", {8, 3}, GgmlType::kF32));                  // 96 bytes
    KESTREL_TRY(w.add_tensor("blk.0.ffn_down.weight", {64, 2}, GgmlType::kQ8_0));            // 136 bytes
    KESTREL_TRY(w.add_tensor("blk.0.attn_norm.weight", {5}, GgmlType::kF16));                // 10 bytes
    KESTREL_TRY(w.add_tensor("blk.0.ffn_up_exps.weight", {256, 1, 1, 2}, GgmlType::kQ4_K));  // 288 bytes
  } else if (variant == 1) {
    KESTREL_TRY(w.add_metadata("general.alignment", GgufValue::u32(64)));
    KESTREL_TRY(w.add_metadata("tokenizer.ggml.model", GgufValue::string("gpt2")));
    KESTREL_TRY(w.add_metadata("tokenizer.ggml.tokens",
                               GgufValue::string_array({"!", "\"", "#", "\xc4\xa0the", "<|im_end|>"})));
    KESTREL_TRY(w.add_metadata("tokenizer.ggml.token_type", GgufValue::i32_array({1, 1, 1, 1, 3})));
    KESTREL_TRY(w.add_metadata("tokenizer.ggml.scores", GgufValue::f32_array({0.0f, -1.5f, -0.0f, 2.0f, 3.0f})));
    KESTREL_TRY(w.add_metadata("tokenizer.ggml.merges", GgufValue::string_array({"\xc4\xa0 t", "h e"})));
    KESTREL_TRY(w.add_tensor("output_norm.weight", {16}, GgmlType::kF32));  // 64 bytes
    KESTREL_TRY(w.add_tensor("output.weight", {32, 2}, GgmlType::kQ4_0));   // 36 bytes
    KESTREL_TRY(w.add_tensor("blk.0.ssm_a", {4, 8}, GgmlType::kBF16));      // 64 bytes
  } else {
    KESTREL_TRY(w.add_metadata("general.architecture", GgufValue::string("qwen3next")));
    KESTREL_TRY(w.add_metadata("qwen3next.block_count", GgufValue::u32(2)));
  }
  KESTREL_TRY(w.write_header());
  uint64_t seed = 1;
  for (const auto& t : std::vector(w.tensors())) {
    KESTREL_TRY(w.write_tensor(t.name, pattern_bytes(t.n_bytes, seed++)));
  }
  return w.finish();
}

}  // namespace

TempPath::TempPath(std::string_view stem) {
  path_ = temp_dir() + "/kestrel-" + std::string(stem) + "-" + std::to_string(::getpid()) + "-" +
          std::to_string(g_temp_counter++);
}

TempPath::~TempPath() { std::remove(path_.c_str()); }

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

Expected<std::vector<uint8_t>> make_sample_gguf(int variant) {
  TempPath path("sample");
  KESTREL_TRY_ASSIGN(GgufWriter w, GgufWriter::create(path.str()));
  KESTREL_TRY(write_variant(w, variant));
  return read_file_bytes(path.str());
}

GgufBytes& GgufBytes::u8(uint8_t v) {
  bytes_.push_back(v);
  return *this;
}

GgufBytes& GgufBytes::u16(uint16_t v) {
  for (int i = 0; i < 2; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}

GgufBytes& GgufBytes::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}

GgufBytes& GgufBytes::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return *this;
}

GgufBytes& GgufBytes::str(std::string_view s) {
  u64(s.size());
  return raw(s);
}

GgufBytes& GgufBytes::raw(std::string_view s) {
  bytes_.insert(bytes_.end(), s.begin(), s.end());
  return *this;
}

GgufBytes& GgufBytes::zeros(size_t n) {
  bytes_.insert(bytes_.end(), n, 0);
  return *this;
}

GgufBytes& GgufBytes::pad(uint64_t alignment) {
  while (bytes_.size() % alignment != 0) bytes_.push_back(0);
  return *this;
}

GgufBytes& GgufBytes::header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
}

GgufBytes& GgufBytes::kv_u32(std::string_view key, uint32_t v) {
  return str(key).u32(static_cast<uint32_t>(GgufValueType::kUint32)).u32(v);
}

GgufBytes& GgufBytes::kv_str(std::string_view key, std::string_view v) {
  return str(key).u32(static_cast<uint32_t>(GgufValueType::kString)).str(v);
}

GgufBytes& GgufBytes::tensor_info(std::string_view name, const std::vector<uint64_t>& ne, GgmlType type,
                                  uint64_t offset) {
  return tensor_info_raw(name, ne, static_cast<uint32_t>(type), offset);
}

GgufBytes& GgufBytes::tensor_info_raw(std::string_view name, const std::vector<uint64_t>& ne, uint32_t type,
                                      uint64_t offset) {
  str(name).u32(static_cast<uint32_t>(ne.size()));
  for (uint64_t d : ne) u64(d);
  return u32(type).u64(offset);
}

}  // namespace kestrel::testing
