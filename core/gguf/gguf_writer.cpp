// GgufWriter: streams a GGUF v3 file through a 1 MiB stdio buffer; only metadata and tensor infos stay in memory.
//
// File layout written (the reader's, gguf_reader.cpp): header, metadata, tensor infos, zero padding to the
// alignment, then each tensor's bytes followed by zero padding to the alignment. Offsets are assigned in add order.
#include "core/gguf/gguf_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

namespace kestrel {
namespace {

constexpr size_t kMaxTensorName = 63;  // llama.cpp refuses names of GGML_MAX_NAME (64) bytes or more

// strerror_r is the thread-safe strerror; glibc's GNU variant returns the text, the XSI one fills `buf`.
[[maybe_unused]] std::string strerror_text(const char* gnu_result, const char*) { return gnu_result; }
[[maybe_unused]] std::string strerror_text(int, const char* buf) { return buf; }
std::string errno_text(int err) {
  char buf[256] = {};
  return strerror_text(strerror_r(err, buf, sizeof(buf)), buf);
}

bool valid_value_type(GgufValueType t) { return gguf_value_type_is_valid(static_cast<uint32_t>(t)); }

// Checks that every array's items carry its declared element type, recursively, within the reader's depth limit.
Status check_value(const GgufValue& v, uint32_t depth, const std::string& where) {
  if (!valid_value_type(v.type())) return make_error(ErrorCode::kInvalidArgument, where + ": invalid value type");
  if (!v.is_array()) return ok_status();
  if (depth + 1 > kGgufMaxArrayDepth) {
    return make_error(ErrorCode::kInvalidArgument,
                      where + ": arrays nested deeper than " + std::to_string(kGgufMaxArrayDepth) + " levels");
  }
  if (!valid_value_type(v.array_type())) {
    return make_error(ErrorCode::kInvalidArgument, where + ": invalid array element type");
  }
  const auto& items = v.items();
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].type() != v.array_type()) {
      return make_error(ErrorCode::kInvalidArgument,
                        where + ": array of " + std::string(gguf_value_type_name(v.array_type())) + " holds a " +
                            std::string(gguf_value_type_name(items[i].type())) + " at index " + std::to_string(i));
    }
    KESTREL_TRY(check_value(items[i], depth + 1, where));
  }
  return ok_status();
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

size_t scalar_bytes(GgufValueType t) {
  switch (t) {
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
    case GgufValueType::kFloat64: return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray: return 0;
  }
  return 0;
}

}  // namespace

Expected<GgufWriter> GgufWriter::create(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    const ErrorCode code = (err == ENOENT || err == ENOTDIR) ? ErrorCode::kNotFound : ErrorCode::kIo;
    return make_error(code, "cannot create GGUF file '" + path + "': " + errno_text(err));
  }
  GgufWriter w;
  w.path_ = path;
  w.file_ = f;
  struct stat st {};
  w.is_regular_ = ::fstat(::fileno(f), &st) == 0 && S_ISREG(st.st_mode);
  w.buffer_ = std::make_unique<char[]>(kBufferBytes);
  if (std::setvbuf(f, w.buffer_.get(), _IOFBF, kBufferBytes) != 0) {
    return make_error(ErrorCode::kIo, "cannot set the write buffer of '" + path + "'");  // w removes the file
  }
  return w;
}

GgufWriter::GgufWriter(GgufWriter&& o) noexcept { *this = std::move(o); }

GgufWriter& GgufWriter::operator=(GgufWriter&& o) noexcept {
  if (this == &o) return *this;
  abandon();
  path_ = std::move(o.path_);
  file_ = std::exchange(o.file_, nullptr);
  header_written_ = o.header_written_;
  finished_ = o.finished_;
  failed_ = o.failed_;
  is_regular_ = o.is_regular_;
  buffer_ = std::move(o.buffer_);
  alignment_ = o.alignment_;
  written_ = o.written_;
  data_start_ = o.data_start_;
  total_ = o.total_;
  current_ = o.current_;
  current_filled_ = o.current_filled_;
  metadata_ = std::move(o.metadata_);
  tensors_ = std::move(o.tensors_);
  o.path_.clear();
  return *this;
}

GgufWriter::~GgufWriter() { abandon(); }

void GgufWriter::abandon() {
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
  if (!finished_ && is_regular_ && !path_.empty()) std::remove(path_.c_str());
  path_.clear();
}

Status GgufWriter::check_usable() const {
  if (failed_) return make_error(ErrorCode::kFailedPrecondition, "'" + path_ + "': an earlier write failed");
  if (file_ == nullptr) return make_error(ErrorCode::kFailedPrecondition, "GGUF writer is finished or moved from");
  return ok_status();
}

Status GgufWriter::add_metadata(std::string key, GgufValue value) {
  KESTREL_TRY(check_usable());
  if (header_written_) {
    return make_error(ErrorCode::kFailedPrecondition, "metadata key '" + key + "' added after write_header()");
  }
  for (const auto& [k, v] : metadata_) {
    if (k == key) return make_error(ErrorCode::kInvalidArgument, "duplicate metadata key '" + key + "'");
  }
  KESTREL_TRY(check_value(value, 0, "metadata key '" + key + "'"));
  if (key == "general.alignment") {
    const uint64_t a = value.raw_u64();
    if (value.type() != GgufValueType::kUint32 || a == 0 || (a & (a - 1)) != 0) {
      return make_error(ErrorCode::kInvalidArgument, "general.alignment must be a u32 power of two, got " +
                                                         value.describe() + " (" +
                                                         std::string(gguf_value_type_name(value.type())) + ")");
    }
    alignment_ = a;
  }
  metadata_.emplace_back(std::move(key), std::move(value));
  return ok_status();
}

Status GgufWriter::add_tensor(std::string name, std::vector<uint64_t> ne, GgmlType type) {
  KESTREL_TRY(check_usable());
  if (header_written_) {
    return make_error(ErrorCode::kFailedPrecondition, "tensor '" + name + "' added after write_header()");
  }
  if (name.size() > kMaxTensorName) {
    return make_error(ErrorCode::kInvalidArgument, "tensor name '" + name + "' is " + std::to_string(name.size()) +
                                                       " bytes; GGUF readers accept at most " +
                                                       std::to_string(kMaxTensorName));
  }
  for (const GgufTensorInfo& t : tensors_) {
    if (t.name == name) return make_error(ErrorCode::kInvalidArgument, "duplicate tensor name '" + name + "'");
  }
  const std::optional<GgmlTypeTraits> traits = ggml_type_traits(static_cast<uint32_t>(type));
  if (!traits) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tensor '" + name + "' has invalid type " + std::to_string(static_cast<uint32_t>(type)));
  }
  GgufTensorInfo t;
  t.name = std::move(name);
  t.ne = std::move(ne);
  t.type = type;
  if (t.ne.empty() || t.ne.size() > kGgufMaxDims) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tensor '" + t.name + "' has " + std::to_string(t.ne.size()) + " dimensions (1 to 4 allowed)");
  }
  uint64_t n = 1;
  for (uint64_t d : t.ne) {
    if (d == 0 || __builtin_mul_overflow(n, d, &n) || n > static_cast<uint64_t>(INT64_MAX)) {
      return make_error(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' has invalid shape " + t.shape_string() +
                                                         " (zero dimension or more than 2^63 elements)");
    }
  }
  t.n_elements = n;
  if (t.ne[0] % traits->block_elems != 0) {
    return make_error(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' of type " + std::string(traits->name) +
                                                       " has rows of " + std::to_string(t.ne[0]) +
                                                       " elements, not a multiple of the block size " +
                                                       std::to_string(traits->block_elems));
  }
  uint64_t row_bytes = 0;
  if (__builtin_mul_overflow(t.ne[0] / traits->block_elems, uint64_t{traits->block_bytes}, &row_bytes) ||
      __builtin_mul_overflow(row_bytes, t.rows(), &t.n_bytes)) {
    return make_error(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' is larger than 2^64 bytes");
  }
  tensors_.push_back(std::move(t));
  return ok_status();
}

Status GgufWriter::write_raw(const void* data, size_t n) {
  if (n == 0) return ok_status();
  if (std::fwrite(data, 1, n, file_) != n) {
    const int err = errno;
    failed_ = true;
    return make_error(ErrorCode::kIo,
                      "writing '" + path_ + "' failed at byte " + std::to_string(written_) + ": " + errno_text(err));
  }
  written_ += n;
  return ok_status();
}

Status GgufWriter::pad_to(uint64_t alignment) {
  static constexpr uint8_t kZeros[256] = {};
  uint64_t pad = align_up(written_, alignment) - written_;
  while (pad > 0) {
    const size_t n = pad < sizeof(kZeros) ? static_cast<size_t>(pad) : sizeof(kZeros);
    KESTREL_TRY(write_raw(kZeros, n));
    pad -= n;
  }
  return ok_status();
}

Status GgufWriter::write_string(std::string_view s) {
  const uint64_t len = s.size();
  KESTREL_TRY(write_raw(&len, sizeof(len)));
  return write_raw(s.data(), s.size());
}

Status GgufWriter::write_value(const GgufValue& v) {
  switch (v.type()) {
    case GgufValueType::kString: return write_string(v.raw_string());
    case GgufValueType::kArray: {
      const uint32_t elem = static_cast<uint32_t>(v.array_type());
      const uint64_t count = v.items().size();
      KESTREL_TRY(write_raw(&elem, sizeof(elem)));
      KESTREL_TRY(write_raw(&count, sizeof(count)));
      for (const GgufValue& item : v.items()) KESTREL_TRY(write_value(item));
      return ok_status();
    }
    default: {
      const uint64_t bits = v.raw_u64();  // little-endian host: the low bytes are the narrow value
      return write_raw(&bits, scalar_bytes(v.type()));
    }
  }
}

Status GgufWriter::write_header() {
  KESTREL_TRY(check_usable());
  if (header_written_) return make_error(ErrorCode::kFailedPrecondition, "write_header() called twice");
  uint64_t offset = 0;
  for (GgufTensorInfo& t : tensors_) {
    t.offset = offset;
    const uint64_t padded = align_up(t.n_bytes, alignment_);
    if (padded < t.n_bytes || __builtin_add_overflow(offset, padded, &offset)) {
      return make_error(ErrorCode::kInvalidArgument, "the tensors add up to more than 2^64 bytes");
    }
  }
  const uint32_t magic = kGgufMagic;
  const uint32_t version = kGgufVersion;
  const uint64_t n_tensors = tensors_.size();
  const uint64_t n_kv = metadata_.size();
  KESTREL_TRY(write_raw(&magic, sizeof(magic)));
  KESTREL_TRY(write_raw(&version, sizeof(version)));
  KESTREL_TRY(write_raw(&n_tensors, sizeof(n_tensors)));
  KESTREL_TRY(write_raw(&n_kv, sizeof(n_kv)));
  for (const auto& [key, value] : metadata_) {
    KESTREL_TRY(write_string(key));
    const uint32_t type = static_cast<uint32_t>(value.type());
    KESTREL_TRY(write_raw(&type, sizeof(type)));
    KESTREL_TRY(write_value(value));
  }
  for (const GgufTensorInfo& t : tensors_) {
    KESTREL_TRY(write_string(t.name));
    const uint32_t n_dims = static_cast<uint32_t>(t.ne.size());
    KESTREL_TRY(write_raw(&n_dims, sizeof(n_dims)));
    KESTREL_TRY(write_raw(t.ne.data(), t.ne.size() * sizeof(uint64_t)));
    const uint32_t type = static_cast<uint32_t>(t.type);
    KESTREL_TRY(write_raw(&type, sizeof(type)));
    KESTREL_TRY(write_raw(&t.offset, sizeof(t.offset)));
  }
  KESTREL_TRY(pad_to(alignment_));
  data_start_ = written_;
  if (__builtin_add_overflow(data_start_, offset, &total_)) {
    return make_error(ErrorCode::kInvalidArgument, "the file would be larger than 2^64 bytes");
  }
  header_written_ = true;
  return ok_status();
}

Status GgufWriter::append_tensor_data(std::span<const uint8_t> bytes) {
  KESTREL_TRY(check_usable());
  if (!header_written_) return make_error(ErrorCode::kFailedPrecondition, "tensor data appended before write_header()");
  while (!bytes.empty()) {
    if (current_ >= tensors_.size()) {
      return make_error(ErrorCode::kInvalidArgument,
                        std::to_string(bytes.size()) + " bytes of tensor data past the end of the last tensor");
    }
    const GgufTensorInfo& t = tensors_[current_];
    const uint64_t room = t.n_bytes - current_filled_;
    const size_t n = bytes.size() < room ? bytes.size() : static_cast<size_t>(room);
    KESTREL_TRY(write_raw(bytes.data(), n));
    bytes = bytes.subspan(n);
    current_filled_ += n;
    if (current_filled_ == t.n_bytes) {
      KESTREL_TRY(pad_to(alignment_));
      ++current_;
      current_filled_ = 0;
    }
  }
  return ok_status();
}

Status GgufWriter::write_tensor(std::string_view name, std::span<const uint8_t> bytes) {
  KESTREL_TRY(check_usable());
  if (!header_written_) return make_error(ErrorCode::kFailedPrecondition, "write_tensor() before write_header()");
  if (current_ >= tensors_.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "write_tensor('" + std::string(name) + "'): all tensors are written");
  }
  const GgufTensorInfo& t = tensors_[current_];
  if (t.name != name || current_filled_ != 0) {
    return make_error(ErrorCode::kInvalidArgument, "write_tensor('" + std::string(name) + "'): the next tensor is '" +
                                                       t.name + "' (" + std::to_string(current_filled_) + " of " +
                                                       std::to_string(t.n_bytes) + " bytes written)");
  }
  if (bytes.size() != t.n_bytes) {
    return make_error(ErrorCode::kInvalidArgument, "write_tensor('" + t.name + "'): got " +
                                                       std::to_string(bytes.size()) + " bytes, the tensor has " +
                                                       std::to_string(t.n_bytes));
  }
  return append_tensor_data(bytes);
}

Status GgufWriter::finish() {
  KESTREL_TRY(check_usable());
  if (!header_written_) return make_error(ErrorCode::kFailedPrecondition, "finish() before write_header()");
  if (current_ < tensors_.size()) {
    const GgufTensorInfo& t = tensors_[current_];
    return make_error(ErrorCode::kFailedPrecondition,
                      "finish(): tensor '" + t.name + "' [" + std::to_string(current_ + 1) + " of " +
                          std::to_string(tensors_.size()) + "] has " + std::to_string(current_filled_) + " of " +
                          std::to_string(t.n_bytes) + " bytes");
  }
  const bool flushed = std::fflush(file_) == 0 && (!is_regular_ || ::fsync(::fileno(file_)) == 0);
  const int err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    failed_ = true;
    return make_error(ErrorCode::kIo, "finishing '" + path_ + "' failed: " + errno_text(flushed ? errno : err));
  }
  finished_ = true;
  return ok_status();
}

uint64_t GgufWriter::total_bytes() const { return header_written_ ? total_ : 0; }

}  // namespace kestrel
