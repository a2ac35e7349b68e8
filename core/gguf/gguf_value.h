// GgufValue: one GGUF metadata value with its exact on-disk type, including (nested) arrays.
//
// Integers are held widened (int64/uint64) and floats as double, but `type()` keeps the on-disk type so a value
// read and written back is byte-identical: a float also keeps its exact bit pattern (raw_u64), so NaN payloads and
// -0.0 survive a round trip (an f32 signalling NaN would be quieted by a float→double conversion).
// Plain value type; not thread-safe for mutation, safe to share const.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"

namespace kestrel {

// GGUF's `enum gguf_type` (values are what the file stores).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view gguf_value_type_name(GgufValueType type);
bool gguf_value_type_is_valid(uint32_t raw);

class GgufValue {
 public:
  GgufValue() = default;  // uint8 0

  static GgufValue u8(uint8_t v);
  static GgufValue i8(int8_t v);
  static GgufValue u16(uint16_t v);
  static GgufValue i16(int16_t v);
  static GgufValue u32(uint32_t v);
  static GgufValue i32(int32_t v);
  static GgufValue u64(uint64_t v);
  static GgufValue i64(int64_t v);
  static GgufValue f32(float v);
  static GgufValue f64(double v);
  static GgufValue boolean(bool v);
  static GgufValue string(std::string v);
  // An array whose elements all have `element_type` (an array of arrays may mix inner element types, as GGUF allows).
  static GgufValue array(GgufValueType element_type, std::vector<GgufValue> items);
  static GgufValue string_array(const std::vector<std::string>& items);
  static GgufValue i32_array(const std::vector<int32_t>& items);
  static GgufValue f32_array(const std::vector<float>& items);

  GgufValueType type() const { return type_; }
  bool is_integer() const;  // any of the 8 integer types
  bool is_float() const { return type_ == GgufValueType::kFloat32 || type_ == GgufValueType::kFloat64; }
  bool is_string() const { return type_ == GgufValueType::kString; }
  bool is_array() const { return type_ == GgufValueType::kArray; }

  // Checked conversions: an error names the actual type, or the value that does not fit.
  Expected<uint64_t> to_u64() const;  // integer >= 0 (or bool)
  Expected<int64_t> to_i64() const;   // integer that fits in int64
  Expected<double> to_f64() const;    // float or integer
  Expected<bool> to_bool() const;
  Expected<std::string_view> to_string() const;

  // Arrays: element type and items (empty for non-arrays).
  GgufValueType array_type() const { return array_type_; }
  const std::vector<GgufValue>& items() const;

  // Raw accessors without checks, for code that already checked type(). raw_u64 is the value for unsigned integers
  // and bool, the two's-complement bits for signed integers, and the on-disk bit pattern for f32/f64.
  uint64_t raw_u64() const { return u_; }
  int64_t raw_i64() const { return i_; }
  double raw_f64() const { return f_; }
  const std::string& raw_string() const { return s_; }

  // Short human-readable rendering: scalars in full, arrays as "[type x N]" plus the first few items.
  // Strings are quoted, escaped and truncated to ~60 bytes: `"Qwen3.5 35B"`, `[string x 151936] ['!', '"', ...]`.
  std::string describe(size_t max_items = 4) const;

  // Exact equality: same type, same array element type, same bits (floats compared bit for bit, so NaN == NaN
  // when the payloads match and 0.0 != -0.0), same string bytes, equal items.
  bool operator==(const GgufValue& other) const;

 private:
  GgufValue retype(GgufValueType type) &&;  // same bits, narrower on-disk type (used by the factories)

  GgufValueType type_ = GgufValueType::kUint8;
  GgufValueType array_type_ = GgufValueType::kUint8;
  uint64_t u_ = 0;
  int64_t i_ = 0;
  double f_ = 0.0;
  std::string s_;
  std::shared_ptr<const std::vector<GgufValue>> items_;  // arrays; shared so copies of big vocab arrays are cheap
};

}  // namespace kestrel
