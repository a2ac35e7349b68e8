// GgufWriter: writes a GGUF v3 file in one streaming pass with bounded memory.
//
// Usage: create() → add metadata and tensor infos (any order) → write_header() → append each tensor's bytes in the
// order the infos were added, in as many pieces as you like (append_tensor_data) → finish(). Memory use is the
// metadata plus the tensor-info table; tensor data goes straight to the file. The writer pads tensor data to the
// alignment (`general.alignment` if set as metadata, else 32), after every tensor including the last, as llama.cpp
// and gguf-py do. finish() fails if any tensor was short; a writer destroyed before finish() removes its partial file.
// Every write is checked; after a failed write the writer refuses further calls (kFailedPrecondition) and its file
// is removed on destruction. The file written is one llama.cpp loads: tensor names shorter than 64 bytes, 1..4
// nonzero dimensions, rows of whole blocks, metadata arrays whose items all have the declared element type.
//
// Not thread-safe: one thread drives a writer. Move-only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
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

  // Before write_header() (kFailedPrecondition after). Duplicate keys/names and malformed values or shapes are
  // kInvalidArgument; `general.alignment` must be a u32 power of two.
  Status add_metadata(std::string key, GgufValue value);
  Status add_tensor(std::string name, std::vector<uint64_t> ne, GgmlType type);

  // Writes header, metadata and tensor infos (offsets are assigned here, in add order) and the padding before the
  // data section; after it tensors() carry their offsets and total_bytes() is known.
  Status write_header();
  // Appends bytes to the current tensor (the first one not yet complete); moves on when it is full. Bytes beyond the
  // last tensor are kInvalidArgument (those before them are written).
  Status append_tensor_data(std::span<const uint8_t> bytes);
  // Convenience: the whole tensor at once; `name` must be the current tensor.
  Status write_tensor(std::string_view name, std::span<const uint8_t> bytes);
  // Checks every tensor is complete (kFailedPrecondition naming the short one), flushes, fsyncs (regular files)
  // and closes the file.
  Status finish();

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  uint64_t bytes_written() const { return written_; }
  uint64_t total_bytes() const;  // file size once finished (known after write_header; 0 before)
  uint64_t alignment() const { return alignment_; }

 private:
  GgufWriter() = default;
  Status write_raw(const void* data, size_t n);
  Status pad_to(uint64_t alignment);
  Status write_string(std::string_view s);
  Status write_value(const GgufValue& v);
  Status check_usable() const;
  void abandon();  // closes the file and removes it unless finished (regular files only)

  static constexpr size_t kBufferBytes = size_t{1} << 20;

  std::string path_;
  std::FILE* file_ = nullptr;
  bool header_written_ = false;
  bool finished_ = false;
  bool failed_ = false;
  bool is_regular_ = false;         // only a regular file is removed when abandoned (never /dev/full or a pipe)
  std::unique_ptr<char[]> buffer_;  // stdio buffer of kBufferBytes for file_
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t written_ = 0;
  uint64_t data_start_ = 0;
  uint64_t total_ = 0;
  size_t current_ = 0;           // index of the tensor being written
  uint64_t current_filled_ = 0;  // bytes of it written so far
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace kestrel
