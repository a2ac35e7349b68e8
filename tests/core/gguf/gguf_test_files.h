// Helpers for the GGUF tests and the GGUF fuzz driver: temporary paths, small valid GGUF images made with
// GgufWriter, and GgufBytes, a raw little-endian byte builder for hand-made (corrupt) files.
//
// Not thread-safe (temporary names come from a process-wide counter); test code only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"

namespace kestrel::testing {

// A fresh path in the temporary directory ($TMPDIR or /tmp) with the pid and a counter in its name; the file (if
// any) is removed when the TempPath is destroyed.
class TempPath {
 public:
  explicit TempPath(std::string_view stem);
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  ~TempPath();
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

std::vector<uint8_t> read_file_bytes(const std::string& path);
void write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

// A small valid GGUF image made with GgufWriter. variant 0: every scalar type, strings, arrays (incl. nested), four
// tensors (f32, q8_0, f16, q4_K; 1-D to 4-D), alignment 32, and the last tensor's size a multiple of the alignment,
// so the file ends exactly where the last tensor does (every shorter prefix is invalid). variant 1: a tokenizer-like
// file (string array, i32 array, f32 array) with custom alignment 64. variant 2: metadata only, no tensors.
// Tensor bytes are a deterministic pseudo-random pattern. Errors (writer failures) are returned.
Expected<std::vector<uint8_t>> make_sample_gguf(int variant);
inline constexpr int kSampleVariants = 3;

// Little-endian builder for hand-made GGUF images.
class GgufBytes {
 public:
  GgufBytes& u8(uint8_t v);
  GgufBytes& u16(uint16_t v);
  GgufBytes& u32(uint32_t v);
  GgufBytes& u64(uint64_t v);
  GgufBytes& str(std::string_view s);  // u64 length + bytes
  GgufBytes& raw(std::string_view s);
  GgufBytes& zeros(size_t n);
  GgufBytes& pad(uint64_t alignment);  // zeros up to the next multiple of alignment
  // magic "GGUF", version, n_tensors, n_kv
  GgufBytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv);
  GgufBytes& kv_u32(std::string_view key, uint32_t v);
  GgufBytes& kv_str(std::string_view key, std::string_view v);
  GgufBytes& tensor_info(std::string_view name, const std::vector<uint64_t>& ne, GgmlType type, uint64_t offset);
  GgufBytes& tensor_info_raw(std::string_view name, const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset);

  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace kestrel::testing
