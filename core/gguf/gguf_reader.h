// GgufFile: a read-only, validated view of a GGUF v2/v3 file, memory-mapped.
//
// open() maps the file and parses the header, every metadata key/value (all value types, nested arrays), and every
// tensor info; it validates everything before returning: magic, version, known value and tensor types, string and
// array lengths against the bytes left, `general.alignment` (power of two), dimensions (product fits uint64, rows
// are whole blocks), tensor offsets aligned, inside the file and not overlapping. Any violation is an Error
// (kDataLoss for corrupt/truncated, kUnsupported for unknown types/versions) whose message names the problem and
// where it is. After a successful open every tensor_data() span lies inside the mapping: nothing reads out of bounds.
//
// Ownership: GgufFile owns its mapping (or, for from_bytes, its buffer); spans from tensor_data() live as long as
// the GgufFile. Move-only. Const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
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

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the fastest (row) dimension; 1..4 dims
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;       // from the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;

  uint64_t rows() const { return ne.empty() ? 0 : n_elements / ne[0]; }
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
};

}  // namespace kestrel
