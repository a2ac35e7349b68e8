// GgufFile: maps (or copies) a GGUF v2/v3 image and parses and validates it in one pass.
//
// Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv; n_kv × (string key, u32 type, value);
// n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset); padding to the alignment; the
// data section. A string is u64 length + bytes; an array is u32 element type + u64 count + elements, where an
// element of an array of arrays is itself (u32 type, u64 count, elements). Every read goes through Cursor, which
// refuses to step past the end; every count is checked against the bytes left before it sizes anything.
#include "core/gguf/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>

namespace kestrel {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

// Owns the bytes a GgufFile views: a read-only private mapping of a file, or an aligned copy of a caller's buffer.
struct GgufFile::Mapping {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  void* map_addr = nullptr;  // from mmap, or nullptr
  uint8_t* owned = nullptr;  // from aligned new, or nullptr

  static constexpr std::align_val_t kCopyAlign{64};

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (map_addr != nullptr) ::munmap(map_addr, static_cast<size_t>(size));
    if (owned != nullptr) ::operator delete[](owned, kCopyAlign);
  }
};

namespace {

// Bounds-checked little-endian reader over [data, data + size).
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - pos_; }

  // Pointer to the next n bytes, advancing past them; nullptr (and no advance) when fewer than n remain.
  const uint8_t* take(uint64_t n) {
    if (n > remaining()) return nullptr;
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  template <class T>
  bool read(T& out) {
    const uint8_t* p = take(sizeof(T));
    if (p == nullptr) return false;
    std::memcpy(&out, p, sizeof(T));
    return true;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

// A name from the file, safe to print: printable ASCII and UTF-8 kept, control bytes escaped, cut at 80 bytes.
std::string printable(std::string_view s) {
  std::string out;
  const size_t n = std::min<size_t>(s.size(), 80);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (n < s.size()) out += "...";
  return out;
}

// Built with append: GCC 12 at -O3 reports a false -Wrestrict for `"literal" + std::string&&` (GCC PR 105329).
std::string of(uint64_t i, uint64_t n) {
  std::string s = "[";
  s.append(std::to_string(i + 1)).append(" of ").append(std::to_string(n)).append("]");
  return s;
}

Error data_loss(std::string msg) { return make_error(ErrorCode::kDataLoss, std::move(msg)); }
Error unsupported(std::string msg) { return make_error(ErrorCode::kUnsupported, std::move(msg)); }

// Smallest on-disk size of one element of `type`: what a count must be checked against before it sizes anything.
uint64_t min_element_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString: return 8;  // u64 length
    case GgufValueType::kArray: return 12;  // u32 type + u64 count
  }
  return 1;
}

constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, one byte of value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, one ne, type, offset

struct Parsed {
  uint32_t version = 0;
  uint64_t alignment = kGgufDefaultAlignment;
  uint64_t data_offset = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata;
  std::vector<GgufTensorInfo> tensors;
};

class Parser {
 public:
  Parser(const uint8_t* data, uint64_t size) : c_(data, size) {}

  Expected<Parsed> run() {
    Parsed p;
    KESTREL_TRY(read_header(p));
    KESTREL_TRY(read_metadata(p));
    KESTREL_TRY(check_duplicate_keys(p));
    KESTREL_TRY(read_alignment(p));
    KESTREL_TRY(read_tensor_infos(p));
    KESTREL_TRY(place_tensors(p));
    return p;
  }

 private:
  // `what` and `detail` are joined only when an error is built, so the hot path does not allocate.
  Error truncated(uint64_t need, std::string_view what, std::string_view detail) const {
    return data_loss("truncated: " + std::string(what) + std::string(detail) + " needs " + std::to_string(need) +
                     " bytes at byte " + std::to_string(c_.pos()) + " but the file has " + std::to_string(c_.size()) +
                     " bytes");
  }

  template <class T>
  Status read_scalar(T& out, std::string_view what, std::string_view detail = {}) {
    if (!c_.read(out)) return truncated(sizeof(T), what, detail);
    return ok_status();
  }

  Expected<std::string> read_string(std::string_view what) {
    uint64_t len = 0;
    KESTREL_TRY(read_scalar(len, what, " (string length)"));
    if (len > c_.remaining()) {
      return data_loss(std::string(what) + ": string length " + std::to_string(len) + " at byte " +
                       std::to_string(c_.pos() - 8) + " exceeds the " + std::to_string(c_.remaining()) +
                       " bytes left in the file");
    }
    const uint8_t* p = c_.take(len);
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
  }

  Status read_header(Parsed& p) {
    uint32_t magic = 0;
    KESTREL_TRY(read_scalar(magic, "the magic"));
    if (magic != kGgufMagic) {
      char text[5];
      std::memcpy(text, &magic, 4);
      text[4] = 0;
      for (int i = 0; i < 4; ++i) {
        if (text[i] < 0x20 || text[i] > 0x7E) text[i] = '?';
      }
      char hex[16];
      std::snprintf(hex, sizeof(hex), "0x%08x", magic);
      return data_loss("bad magic '" + std::string(text) + "' (" + hex + ") at byte 0: not a GGUF file");
    }
    KESTREL_TRY(read_scalar(p.version, "the version"));
    if (p.version == 1) {
      return unsupported(
          "GGUF version 1 is not supported (versions 2 and 3 are); re-convert the model with a "
          "current llama.cpp");
    }
    if (p.version != 2 && p.version != 3) {
      std::string hint = (p.version & 0xFFFF) == 0 ? " (a big-endian file?)" : "";
      return unsupported("GGUF version " + std::to_string(p.version) + " is not supported (versions 2 and 3 are)" +
                         hint);
    }
    KESTREL_TRY(read_scalar(n_tensors_, "the tensor count"));
    KESTREL_TRY(read_scalar(n_kv_, "the metadata count"));
    // Each entry needs at least a few bytes, so the counts are bounded by what is left (no overflow below).
    const uint64_t left = c_.remaining();
    if (n_kv_ > left / kMinKvBytes || n_tensors_ > left / kMinTensorInfoBytes ||
        n_kv_ * kMinKvBytes + n_tensors_ * kMinTensorInfoBytes > left) {
      return data_loss("header claims " + std::to_string(n_kv_) + " metadata entries and " +
                       std::to_string(n_tensors_) + " tensors, more than the " + std::to_string(left) +
                       " bytes after the header can hold");
    }
    return ok_status();
  }

  // Reads one value of `type`; `depth` is the array nesting of the value (0 for a scalar at top level).
  Expected<GgufValue> read_value(GgufValueType type, uint32_t depth, const std::string& where) {
    switch (type) {
      case GgufValueType::kUint8: return scalar<uint8_t>(where, GgufValue::u8);
      case GgufValueType::kInt8: return scalar<int8_t>(where, GgufValue::i8);
      case GgufValueType::kUint16: return scalar<uint16_t>(where, GgufValue::u16);
      case GgufValueType::kInt16: return scalar<int16_t>(where, GgufValue::i16);
      case GgufValueType::kUint32: return scalar<uint32_t>(where, GgufValue::u32);
      case GgufValueType::kInt32: return scalar<int32_t>(where, GgufValue::i32);
      case GgufValueType::kUint64: return scalar<uint64_t>(where, GgufValue::u64);
      case GgufValueType::kInt64: return scalar<int64_t>(where, GgufValue::i64);
      case GgufValueType::kFloat32: {
        uint32_t bits = 0;
        KESTREL_TRY(read_scalar(bits, where));
        return GgufValue::f32(std::bit_cast<float>(bits));
      }
      case GgufValueType::kFloat64: {
        uint64_t bits = 0;
        KESTREL_TRY(read_scalar(bits, where));
        return GgufValue::f64(std::bit_cast<double>(bits));
      }
      case GgufValueType::kBool: {
        uint8_t b = 0;
        KESTREL_TRY(read_scalar(b, where));
        if (b > 1) {
          return data_loss(where + ": bool value " + std::to_string(b) + " at byte " + std::to_string(c_.pos() - 1) +
                           " is neither 0 nor 1");
        }
        return GgufValue::boolean(b != 0);
      }
      case GgufValueType::kString: {
        KESTREL_TRY_ASSIGN(std::string s, read_string(where));
        return GgufValue::string(std::move(s));
      }
      case GgufValueType::kArray: return read_array(depth + 1, where);
    }
    return data_loss(where + ": invalid value type");  // unreachable: callers validate the type
  }

  template <class T, class Make>
  Expected<GgufValue> scalar(const std::string& where, Make make) {
    T v{};
    KESTREL_TRY(read_scalar(v, where));
    return make(v);
  }

  // A value type, or with `element` the element type of an array.
  Expected<GgufValueType> read_type(const std::string& where, bool element) {
    uint32_t raw = 0;
    KESTREL_TRY(read_scalar(raw, where, element ? " (array element type)" : " (value type)"));
    if (!gguf_value_type_is_valid(raw)) {
      return unsupported(where + (element ? ": unknown array element type " : ": unknown value type ") +
                         std::to_string(raw) + " at byte " + std::to_string(c_.pos() - 4));
    }
    return static_cast<GgufValueType>(raw);
  }

  Expected<GgufValue> read_array(uint32_t depth, const std::string& where) {
    if (depth > kGgufMaxArrayDepth) {
      return unsupported(where + ": arrays nested deeper than " + std::to_string(kGgufMaxArrayDepth) +
                         " levels at byte " + std::to_string(c_.pos()));
    }
    KESTREL_TRY_ASSIGN(GgufValueType elem, read_type(where, true));
    uint64_t count = 0;
    KESTREL_TRY(read_scalar(count, where, " (array count)"));
    const uint64_t min_bytes = min_element_bytes(elem);
    if (count > c_.remaining() / min_bytes) {
      return data_loss(where + ": array of " + std::to_string(count) + " " + std::string(gguf_value_type_name(elem)) +
                       " at byte " + std::to_string(c_.pos() - 12) + " needs " +
                       (count > std::numeric_limits<uint64_t>::max() / min_bytes
                            ? std::string("more than 2^64")
                            : "at least " + std::to_string(count * min_bytes)) +
                       " bytes but only " + std::to_string(c_.remaining()) + " are left in the file");
    }
    if (count > values_left_) {
      return unsupported(where + ": the metadata holds more than " + std::to_string(kGgufMaxMetadataValues) +
                         " values in total (array of " + std::to_string(count) + " at byte " +
                         std::to_string(c_.pos() - 12) + ")");
    }
    values_left_ -= count;
    std::vector<GgufValue> items;
    items.reserve(static_cast<size_t>(count));  // bounded by the bytes left and the value budget
    for (uint64_t i = 0; i < count; ++i) {
      Expected<GgufValue> v =
          elem == GgufValueType::kArray ? read_array(depth + 1, where) : read_value(elem, depth, where);
      if (!v) {
        Error e = std::move(v).error();
        e.message += " (in element " + std::to_string(i) + " of " + std::to_string(count) + ")";
        return e;
      }
      items.push_back(std::move(v).value());
    }
    return GgufValue::array(elem, std::move(items));
  }

  Status read_metadata(Parsed& p) {
    for (uint64_t i = 0; i < n_kv_; ++i) {
      KESTREL_TRY_ASSIGN(std::string key,
                         read_string("metadata key #" + std::to_string(i + 1) + " of " + std::to_string(n_kv_)));
      const std::string where = "metadata key '" + printable(key) + "' " + of(i, n_kv_);
      KESTREL_TRY_ASSIGN(GgufValueType type, read_type(where, false));
      if (values_left_ == 0) {
        return unsupported(where + ": the metadata holds more than " + std::to_string(kGgufMaxMetadataValues) +
                           " values in total");
      }
      --values_left_;
      KESTREL_TRY_ASSIGN(GgufValue value, read_value(type, 0, where));
      p.metadata.emplace_back(std::move(key), std::move(value));
    }
    return ok_status();
  }

  Status check_duplicate_keys(const Parsed& p) {
    std::vector<size_t> order(p.metadata.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return p.metadata[a].first < p.metadata[b].first; });
    for (size_t i = 1; i < order.size(); ++i) {
      if (p.metadata[order[i - 1]].first == p.metadata[order[i]].first) {
        return data_loss("duplicate metadata key '" + printable(p.metadata[order[i]].first) + "' (entries " +
                         std::to_string(order[i - 1] + 1) + " and " + std::to_string(order[i] + 1) + " of " +
                         std::to_string(p.metadata.size()) + ")");
      }
    }
    return ok_status();
  }

  Status read_alignment(Parsed& p) {
    for (const auto& [key, value] : p.metadata) {
      if (key != "general.alignment") continue;
      if (value.type() != GgufValueType::kUint32) {
        return data_loss("metadata key 'general.alignment' is " + std::string(gguf_value_type_name(value.type())) +
                         ", expected u32");
      }
      const uint64_t a = value.raw_u64();
      if (a == 0 || (a & (a - 1)) != 0) {
        return data_loss("metadata key 'general.alignment' is " + std::to_string(a) +
                         ", expected a nonzero power of two");
      }
      p.alignment = a;
    }
    return ok_status();
  }

  Status read_tensor_infos(Parsed& p) {
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      GgufTensorInfo t;
      KESTREL_TRY_ASSIGN(
          t.name, read_string("tensor #" + std::to_string(i + 1) + " of " + std::to_string(n_tensors_) + " (name)"));
      const std::string where = "tensor '" + printable(t.name) + "' " + of(i, n_tensors_);
      uint32_t n_dims = 0;
      KESTREL_TRY(read_scalar(n_dims, where, " (dimension count)"));
      if (n_dims == 0 || n_dims > kGgufMaxDims) {
        return data_loss(where + " has " + std::to_string(n_dims) + " dimensions at byte " +
                         std::to_string(c_.pos() - 4) + " (GGUF allows 1 to 4)");
      }
      t.ne.resize(n_dims);
      uint64_t n_elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        KESTREL_TRY(read_scalar(t.ne[d], where + " (dimension " + std::to_string(d) + ")"));
        if (t.ne[d] == 0) return unsupported(where + " has dimension " + std::to_string(d) + " = 0 (empty tensor)");
        if (!checked_mul(n_elements, t.ne[d], &n_elements) ||
            n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return data_loss(where + " has shape " + t.shape_string() + " whose element count does not fit in int64");
        }
      }
      t.n_elements = n_elements;
      uint32_t raw_type = 0;
      KESTREL_TRY(read_scalar(raw_type, where, " (type)"));
      const std::optional<GgmlTypeTraits> traits = ggml_type_traits(raw_type);
      if (!traits) {
        return unsupported(where + " has unknown tensor type " + std::to_string(raw_type) + " at byte " +
                           std::to_string(c_.pos() - 4));
      }
      t.type = static_cast<GgmlType>(raw_type);
      if (t.ne[0] % traits->block_elems != 0) {
        return data_loss(where + " of type " + std::string(traits->name) + " has rows of " + std::to_string(t.ne[0]) +
                         " elements, not a multiple of the block size " + std::to_string(traits->block_elems));
      }
      uint64_t row_bytes = 0;
      if (!checked_mul(t.ne[0] / traits->block_elems, traits->block_bytes, &row_bytes) ||
          !checked_mul(row_bytes, t.rows(), &t.n_bytes)) {
        return data_loss(where + " of type " + std::string(traits->name) + " and shape " + t.shape_string() +
                         " has a byte size that does not fit in 64 bits");
      }
      KESTREL_TRY(read_scalar(t.offset, where, " (offset)"));
      if (t.offset % p.alignment != 0) {
        return data_loss(where + " has offset " + std::to_string(t.offset) + ", not a multiple of the alignment " +
                         std::to_string(p.alignment));
      }
      p.tensors.push_back(std::move(t));
    }
    return ok_status();
  }

  Status place_tensors(Parsed& p) {
    const uint64_t info_end = c_.pos();
    const uint64_t file_size = c_.size();
    // info_end <= file_size < 2^63 and alignment <= 2^31, so this cannot overflow.
    p.data_offset = (info_end + p.alignment - 1) / p.alignment * p.alignment;
    if (p.tensors.empty()) return ok_status();
    if (p.data_offset > file_size) {
      return data_loss("truncated: the data section starts at byte " + std::to_string(p.data_offset) +
                       " (tensor-info table ends at byte " + std::to_string(info_end) + ", alignment " +
                       std::to_string(p.alignment) + ") but the file has " + std::to_string(file_size) + " bytes");
    }
    const uint64_t n = p.tensors.size();
    for (uint64_t i = 0; i < n; ++i) {
      const GgufTensorInfo& t = p.tensors[i];
      uint64_t start = 0;
      uint64_t end = 0;
      const bool fits = checked_add(p.data_offset, t.offset, &start) && checked_add(start, t.n_bytes, &end);
      if (!fits || end > file_size) {
        return data_loss("tensor '" + printable(t.name) + "' " + of(i, n) + " ends at byte " +
                         (fits ? std::to_string(end) : std::string("2^64 or beyond")) + " but the file has " +
                         std::to_string(file_size) + " bytes");
      }
    }
    std::vector<size_t> order(n);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return p.tensors[a].offset < p.tensors[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensorInfo& a = p.tensors[order[k - 1]];
      const GgufTensorInfo& b = p.tensors[order[k]];
      if (a.offset + a.n_bytes > b.offset) {  // both ends checked above
        return data_loss("tensor '" + printable(a.name) + "' " + of(order[k - 1], n) + " (data bytes " +
                         std::to_string(a.offset) + ".." + std::to_string(a.offset + a.n_bytes) +
                         ") overlaps tensor '" + printable(b.name) + "' " + of(order[k], n) + " (from data byte " +
                         std::to_string(b.offset) + ")");
      }
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return p.tensors[a].name < p.tensors[b].name; });
    for (size_t k = 1; k < order.size(); ++k) {
      if (p.tensors[order[k - 1]].name == p.tensors[order[k]].name) {
        const size_t lo = std::min(order[k - 1], order[k]);
        const size_t hi = std::max(order[k - 1], order[k]);
        return data_loss("duplicate tensor name '" + printable(p.tensors[lo].name) + "' (tensors " +
                         std::to_string(lo + 1) + " and " + std::to_string(hi + 1) + " of " + std::to_string(n) + ")");
      }
    }
    return ok_status();
  }

  Cursor c_;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  uint64_t values_left_ = kGgufMaxMetadataValues;
};

// strerror_r is the thread-safe strerror; glibc's GNU variant returns the text, the XSI one fills `buf`.
[[maybe_unused]] std::string strerror_text(const char* gnu_result, const char*) { return gnu_result; }
[[maybe_unused]] std::string strerror_text(int, const char* buf) { return buf; }
std::string errno_text(int err) {
  char buf[256] = {};
  return strerror_text(strerror_r(err, buf, sizeof(buf)), buf);
}

Error with_path(Error e, const std::string& path) {
  if (!path.empty()) e.message = path + ": " + e.message;
  return e;
}

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string GgufTensorInfo::shape_string() const {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "}";
}

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

Expected<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const ErrorCode code = (err == ENOENT || err == ENOTDIR) ? ErrorCode::kNotFound : ErrorCode::kIo;
    return make_error(code, "cannot open GGUF file '" + path + "': " + errno_text(err));
  }
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return make_error(ErrorCode::kIo, "cannot stat '" + path + "': " + errno_text(err));
  }
  if (S_ISDIR(st.st_mode)) return make_error(ErrorCode::kIo, "'" + path + "' is a directory, not a GGUF file");
  if (!S_ISREG(st.st_mode)) return make_error(ErrorCode::kIo, "'" + path + "' is not a regular file");
  if (st.st_size == 0) return make_error(ErrorCode::kDataLoss, path + ": the file is empty (0 bytes), not a GGUF file");
  auto mapping = std::make_unique<Mapping>();
  const size_t size = static_cast<size_t>(st.st_size);
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    return make_error(ErrorCode::kIo,
                      "cannot map '" + path + "' (" + std::to_string(size) + " bytes): " + errno_text(err));
  }
  mapping->map_addr = addr;
  mapping->data = static_cast<const uint8_t*>(addr);
  mapping->size = size;
  return parse(std::move(mapping), path);
}

Expected<GgufFile> GgufFile::from_bytes(std::span<const uint8_t> bytes) {
  auto mapping = std::make_unique<Mapping>();
  if (!bytes.empty()) {
    mapping->owned = static_cast<uint8_t*>(::operator new[](bytes.size(), Mapping::kCopyAlign));
    std::memcpy(mapping->owned, bytes.data(), bytes.size());
  }
  mapping->data = mapping->owned;
  mapping->size = bytes.size();
  return parse(std::move(mapping), std::string());
}

Expected<GgufFile> GgufFile::parse(std::unique_ptr<Mapping> mapping, std::string path) {
  Parser parser(mapping->data, mapping->size);
  Expected<Parsed> parsed = parser.run();
  if (!parsed) return with_path(std::move(parsed).error(), path);
  GgufFile f;
  f.base_ = mapping->data;
  f.size_ = mapping->size;
  f.mapping_ = std::move(mapping);
  f.path_ = std::move(path);
  f.version_ = parsed->version;
  f.alignment_ = parsed->alignment;
  f.data_offset_ = parsed->data_offset;
  f.metadata_ = std::move(parsed->metadata);
  f.tensors_ = std::move(parsed->tensors);
  f.tensor_index_.reserve(f.tensors_.size());
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.tensor_index_.emplace(f.tensors_[i].name, i);
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

Error key_not_found(std::string_view key, const std::string& path) {
  return make_error(ErrorCode::kNotFound, "metadata key '" + std::string(key) + "' not found" +
                                              (path.empty() ? std::string() : " in '" + path + "'"));
}

Error key_error(std::string_view key, const Error& e) {
  return make_error(e.code, "metadata key '" + std::string(key) + "': " + e.message);
}

bool is_integer_type(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64: return true;
    default: return false;
  }
}

std::string type_text(const GgufValue& v) {
  if (!v.is_array()) return std::string(gguf_value_type_name(v.type()));
  return "an array of " + std::string(gguf_value_type_name(v.array_type()));
}

template <class T, class Conv>
Expected<T> get_as(const GgufFile& f, std::string_view key, Conv conv) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return key_not_found(key, f.path());
  auto r = conv(*v);
  if (!r) return key_error(key, r.error());
  return T(*r);
}

}  // namespace

Expected<uint64_t> GgufFile::get_u64(std::string_view key) const {
  return get_as<uint64_t>(*this, key, [](const GgufValue& v) { return v.to_u64(); });
}
Expected<int64_t> GgufFile::get_i64(std::string_view key) const {
  return get_as<int64_t>(*this, key, [](const GgufValue& v) { return v.to_i64(); });
}
Expected<double> GgufFile::get_f64(std::string_view key) const {
  return get_as<double>(*this, key, [](const GgufValue& v) { return v.to_f64(); });
}
Expected<bool> GgufFile::get_bool(std::string_view key) const {
  return get_as<bool>(*this, key, [](const GgufValue& v) { return v.to_bool(); });
}
Expected<std::string> GgufFile::get_string(std::string_view key) const {
  return get_as<std::string>(*this, key, [](const GgufValue& v) { return v.to_string(); });
}

Expected<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return key_not_found(key, path_);
  if (!v->is_array() || v->array_type() != GgufValueType::kString) {
    return make_error(ErrorCode::kInvalidArgument,
                      "metadata key '" + std::string(key) + "' is " + type_text(*v) + ", expected an array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->items().size());
  for (const GgufValue& item : v->items()) out.push_back(item.raw_string());
  return out;
}

Expected<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return key_not_found(key, path_);
  const bool int_elems = v->is_array() && is_integer_type(v->array_type());
  if (!int_elems) {
    return make_error(ErrorCode::kInvalidArgument, "metadata key '" + std::string(key) + "' is " + type_text(*v) +
                                                       ", expected an array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(v->items().size());
  for (size_t i = 0; i < v->items().size(); ++i) {
    Expected<int64_t> x = v->items()[i].to_i64();
    if (!x) {
      return make_error(ErrorCode::kInvalidArgument, "metadata key '" + std::string(key) + "' element " +
                                                         std::to_string(i) + ": " + x.error().message);
    }
    out.push_back(*x);
  }
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::tensor_data(const GgufTensorInfo& info) const {
  uint64_t start = 0;
  uint64_t end = 0;
  if (!checked_add(data_offset_, info.offset, &start) || !checked_add(start, info.n_bytes, &end) || end > size_) {
    return {};
  }
  return {base_ + start, static_cast<size_t>(info.n_bytes)};
}

}  // namespace kestrel
