// scratch_carve: lays out a caller's device scratch as consecutive 16-byte-aligned pieces (moe_experts, moe_imma). With
// a null base only the sizes add up, so one function gives both a workspace's size and its pieces. Host code; pure.
#pragma once

#include <cstddef>

namespace kestrel::gpu {

inline constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }

class ScratchCarve {
 public:
  explicit ScratchCarve(void* base) : base_(static_cast<unsigned char*>(base)) {}

  // The next piece of `bytes` (null when the base is null), as T*.
  template <class T = unsigned char>
  T* take(size_t bytes) {
    unsigned char* q = base_ == nullptr ? nullptr : base_ + at_;
    at_ += align16(bytes);
    return reinterpret_cast<T*>(q);
  }

  // Bytes taken so far (each piece rounded up to 16).
  size_t bytes() const { return at_; }

 private:
  unsigned char* base_;
  size_t at_ = 0;
};

}  // namespace kestrel::gpu
