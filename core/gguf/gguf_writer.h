// GgufWriter: writes a GGUF v3 file in one streaming pass with bounded memory.
//
// Usage: create() → add metadata and tensor infos (any order) → write_header() → append each tensor's bytes in the
// order the infos were added, in as many pieces as you like (append_tensor_data) → finish(). Memory use is the
// metadata plus the tensor-info table; tensor data goes straight to the file. The writer pads tensor data to the
// alignment (`general.alignment` if set as metadata, else 32). finish() fails if any tensor was short; a writer
// destroyed before finish() removes its partial file.
//
// Not thread-safe: one thread drives a writer. Move-only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_value.h"

namespace kestrel {

class GgufWriter {
 public:
  static Expected<GgufWriter> create(const std::string& path);

  GgufWriter(GgufWriter&&) noexcept;
  GgufWriter& operator=(GgufWriter&&) noexcept;
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;
  ~GgufWriter();

  // Before write_header(). Duplicate keys/names are kInvalidArgument.
  Status add_metadata(std::string key, GgufValue value);
  Status add_tensor(std::string name, std::vector<uint64_t> ne, GgmlType type);

  Status write_header();
  // Appends bytes to the current tensor (the first one not yet complete); moves on when it is full.
  Status append_tensor_data(std::span<const uint8_t> bytes);
  // Convenience: the whole tensor at once; `name` must be the current tensor.
  Status write_tensor(std::string_view name, std::span<const uint8_t> bytes);
  Status finish();

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  uint64_t bytes_written() const { return written_; }
  uint64_t total_bytes() const;  // file size once finished (known after write_header)

 private:
  GgufWriter() = default;
  Status write_raw(const void* data, size_t n);
  Status pad_to(uint64_t alignment);

  std::string path_;
  std::FILE* file_ = nullptr;
  bool header_written_ = false;
  bool finished_ = false;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t written_ = 0;
  uint64_t data_start_ = 0;
  size_t current_ = 0;           // index of the tensor being written
  uint64_t current_filled_ = 0;  // bytes of it written so far
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace kestrel
