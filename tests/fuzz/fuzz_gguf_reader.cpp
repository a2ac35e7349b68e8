// Fuzz target for the GGUF reader: LLVMFuzzerTestOneInput parses the input with GgufFile::from_bytes and, when it
// parses, touches every metadata value (conversions, describe) and the first and last byte of every tensor span.
//
// Built two ways (tests/fuzz/CMakeLists.txt): with KESTREL_FUZZ=ON as `fuzz_gguf_reader`, a libFuzzer binary
// (-fsanitize=fuzzer,address,undefined; run `build/fuzz/bin/fuzz_gguf_reader -max_total_time=180 CORPUS_DIR`), and
// always as `fuzz_gguf_reader_smoke` with the deterministic mutation driver in fuzz_driver_main.cpp (ctest, unit).
// Any violated invariant aborts, which both drivers report as a crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "core/gguf/gguf_reader.h"

namespace {

volatile uint64_t g_sink = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_gguf_reader: invariant violated: %s\n", what);
    std::abort();
  }
}

void touch(const kestrel::GgufValue& v, int depth) {
  check(depth <= static_cast<int>(kestrel::kGgufMaxArrayDepth), "array depth within the limit");
  if (auto u = v.to_u64()) g_sink = g_sink + *u;
  if (auto i = v.to_i64()) g_sink = g_sink + static_cast<uint64_t>(*i);
  if (auto f = v.to_f64()) g_sink = g_sink + static_cast<uint64_t>(*f == *f);
  if (auto b = v.to_bool()) g_sink = g_sink + *b;
  if (auto s = v.to_string()) g_sink = g_sink + s->size();
  for (const kestrel::GgufValue& item : v.items()) {
    check(item.type() == v.array_type(), "array items have the element type");
    touch(item, depth + 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kestrel::GgufFile::from_bytes(std::span<const uint8_t>(data, size));
  if (!file) {
    check(!file.error().message.empty(), "errors carry a message");
    check(file.error().code == kestrel::ErrorCode::kDataLoss || file.error().code == kestrel::ErrorCode::kUnsupported,
          "parse errors are kDataLoss or kUnsupported");
    return 0;
  }
  const kestrel::GgufFile& f = *file;
  check(f.file_size() == size, "file_size is the input size");
  check(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0, "alignment is a power of two");
  for (const auto& [key, value] : f.metadata()) {
    touch(value, 0);
    g_sink = g_sink + value.describe().size();
    check(f.find(key) != nullptr, "find() locates every key");
    (void)f.get_u64(key);
    (void)f.get_string(key);
    (void)f.get_string_array(key);
    (void)f.get_int_array(key);
  }
  for (const kestrel::GgufTensorInfo& t : f.tensors()) {
    check(!t.ne.empty() && t.ne.size() <= kestrel::kGgufMaxDims, "1 to 4 dimensions");
    check(t.offset % f.alignment() == 0, "offsets are aligned");
    check(
        f.data_offset() <= size && t.offset <= size - f.data_offset() && t.n_bytes <= size - f.data_offset() - t.offset,
        "tensor lies inside the file");
    check(f.find_tensor(t.name) == &t, "find_tensor() locates every tensor");
    std::span<const uint8_t> span = f.tensor_data(t);
    check(span.size() == t.n_bytes && !span.empty(), "tensor_data() spans the whole tensor");
    g_sink = g_sink + span.front() + span.back();
    g_sink = g_sink + t.rows() + t.shape_string().size();
  }
  return 0;
}
