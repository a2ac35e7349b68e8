// BlockGenerator: writes a tensor's raw GGUF bytes (quant blocks or plain elements) directly from a counter-based
// PRNG, without going through f32 + quantize_row, so a 20 GB file is generated at disk speed.
//
// Determinism: the bytes of block b of a tensor depend only on (seed, tensor name, b), never on how the tensor is cut
// into chunks or which thread generates which chunk. Zero mean after dequantization: every block format is filled with
// a construction whose dequantized values are symmetric around 0 (a plain uniform Q4_0 nibble has mean -0.5*d; see
// docs/mkmodel.md "Zero-mean blocks" for each format). Supported output types: F32, F16, BF16, Q8_0, Q4_0, Q4_K,
// Q5_K, Q6_K.
//
// A BlockGenerator is immutable after create(): generate() is const and may run on many threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "tools/mkmodel/weight_init.h"

namespace kestrel::mkmodel {

// The stream key of one tensor: a hash of (seed, name).
uint64_t tensor_stream_key(uint64_t seed, std::string_view tensor_name);

bool block_generator_supports(GgmlType type);

class BlockGenerator {
 public:
  // kUnsupported for a type outside the list above; kInvalidArgument for a non-zero-mean init with a quantized type
  // or a non-finite / non-positive std.
  static Expected<BlockGenerator> create(GgmlType type, const WeightInit& init, uint64_t key);

  GgmlType type() const { return type_; }
  uint32_t block_elems() const { return block_elems_; }
  uint32_t block_bytes() const { return block_bytes_; }

  // dst: count * block_bytes() bytes receiving blocks [first_block, first_block + count) of the tensor.
  void generate(uint64_t first_block, uint64_t count, uint8_t* dst) const;

 private:
  static constexpr int kScaleTableSize = 8;

  BlockGenerator() = default;
  void generate_float(uint64_t first, uint64_t count, uint8_t* dst) const;
  void generate_q8_0(uint64_t block, uint8_t* dst) const;
  void generate_q4_0(uint64_t block, uint8_t* dst) const;
  void generate_q4_k(uint64_t block, uint8_t* dst) const;
  void generate_q5_k(uint64_t block, uint8_t* dst) const;
  void generate_q6_k(uint64_t block, uint8_t* dst) const;

  GgmlType type_ = GgmlType::kF32;
  WeightInit init_;
  uint64_t key_ = 0;
  uint32_t block_elems_ = 1;
  uint32_t block_bytes_ = 4;
  // Per-block super-scales (fp16 bit patterns), picked at random per block: d_table_[i] ~ d0 * (0.75 .. 1.25).
  // For Q4_K/Q5_K dmin_table_[i] is exactly kRatio * d_table_[i] (see the .cpp), which makes each sub-block symmetric.
  std::array<uint16_t, kScaleTableSize> d_table_{};
  std::array<uint16_t, kScaleTableSize> dmin_table_{};
};

}  // namespace kestrel::mkmodel
