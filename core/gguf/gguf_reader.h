// GgufFile: a read-only, validated view of a GGUF v2/v3 file, memory-mapped.
//
// open() maps the file and parses the header, every metadata key/value (all value types, nested arrays), and every
// tensor info; it validates everything before returning: magic, version, known value and tensor types, string and
// array lengths against the bytes left, `general.alignment` (power of two), dimensions (product fits uint64, rows
// are whole blocks), tensor offsets aligned, inside the file and not overlapping. Any violation is an Error
// (kDataLoss for corrupt/truncated, kUnsupported for unknown types/versions) whose message names the problem and
// where it is. After a successful open every tensor_data() span lies inside the mapping: nothing reads out of bounds.
// The data section starts at the end of the tensor-info table rounded up to the alignment; tensor offsets are
// relative to it and may come in any order (llama.cpp writes them ascending), but must not overlap. Every count read
// from the file is checked against the bytes left before anything is allocated from it, and every size or offset
// computation is overflow-checked, so a corrupt or hostile file yields an Error, never a crash or a huge allocation.
// Errors from open() start with the path.
//
// Ownership: GgufFile owns its mapping (or, for from_bytes, its buffer); spans from tensor_data() live as long as
// the GgufFile. Move-only. Const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/gguf/gguf_value.h"

namespace kestrel {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint64_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxDims = 4;
// Limits on what the reader accepts (kUnsupported beyond them): arrays nested deeper than this (an array of arrays
// is depth 2), and more metadata values in total (array items included; a 150k-token vocabulary with merges and
// token types uses ~0.5M). Each value costs ~80 bytes in memory, so the budget also bounds the parse to ~350 MB.
inline constexpr uint32_t kGgufMaxArrayDepth = 8;
inline constexpr uint64_t kGgufMaxMetadataValues = uint64_t{1} << 22;

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the fastest (row) dimension; 1..4 dims
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;

  // Product of ne[1..]: the number of rows of ne[0] elements.
  uint64_t rows() const {
    uint64_t r = ne.empty() ? 0 : 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
  }
  std::string shape_string() const;  // "{2048, 151936}"
};

class GgufFile {
 public:
  static Expected<GgufFile> open(const std::string& path);
  // Parses an in-memory image (copied); used by tests and the fuzzer.
  static Expected<GgufFile> from_bytes(std::span<const uint8_t> bytes);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }  // empty for from_bytes
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;  // nullptr when absent
  // Typed getters; kNotFound when absent, kInvalidArgument (naming key and types) on a type mismatch.
  Expected<uint64_t> get_u64(std::string_view key) const;
  Expected<int64_t> get_i64(std::string_view key) const;
  Expected<double> get_f64(std::string_view key) const;
  Expected<bool> get_bool(std::string_view key) const;
  Expected<std::string> get_string(std::string_view key) const;
  Expected<std::vector<std::string>> get_string_array(std::string_view key) const;
  Expected<std::vector<int64_t>> get_int_array(std::string_view key) const;

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent
  // The bytes of a tensor of this file (info from tensors() or find_tensor()); empty for an info whose span would
  // not lie inside this file.
  std::span<const uint8_t> tensor_data(const GgufTensorInfo& info) const;

 private:
  GgufFile() = default;
  struct Mapping;
  static Expected<GgufFile> parse(std::unique_ptr<Mapping> mapping, std::string path);

  std::unique_ptr<Mapping> mapping_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;  // name (viewing tensors_[i].name) → i
};

}  // namespace kestrel
