// Helpers shared by the fuzz targets: FuzzInput reads fixed-width little-endian fields from the fuzzer's bytes
// (zeros once they run out, so every input is usable), and fuzz_check aborts with the target's name and the
// violated invariant, which both libFuzzer and the smoke driver report as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace kestrel::fuzz {

inline void fuzz_check(bool ok, const char* target, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s: invariant violated: %s\n", target, what);
    std::abort();
  }
}

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <class T>
  T take() {
    T v{};
    const size_t n = std::min(sizeof(T), size_ - pos_);
    std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  uint8_t u8() { return take<uint8_t>(); }
  uint16_t u16() { return take<uint16_t>(); }
  uint32_t u32() { return take<uint32_t>(); }
  uint64_t u64() { return take<uint64_t>(); }
  // The next `n` bytes (fewer when the input runs out).
  std::string_view bytes(size_t n) {
    n = std::min(n, size_ - pos_);
    std::string_view v(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return v;
  }
  std::string_view rest() { return bytes(size_ - pos_); }
  bool empty() const { return pos_ == size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace kestrel::fuzz
