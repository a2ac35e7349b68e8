// Small helpers shared by the gpu tests (gemv, gemv_imma, get_rows and the gpu-pool tests: weight pool, state slots,
// rms_norm, argmax, attention decode): device detection with a clean GTEST_SKIP, an owning device buffer and stream,
// host<->device copies of vectors and the first-mismatch report every numeric comparison prints. Single-threaded test
// code.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu/cuda_check.h"

namespace kestrel::gpu::test {

inline bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls start clean
    return false;
  }
  return n > 0;
}

#define KESTREL_REQUIRE_DEVICE()                                                        \
  do {                                                                                  \
    if (!::kestrel::gpu::test::have_device()) GTEST_SKIP() << "no CUDA device present"; \
  } while (0)

#define KESTREL_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

// Owns one device allocation of `bytes` bytes (at least 1).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owns one non-blocking stream (get() is null when it could not be created: check it before use).
class DeviceStream {
 public:
  DeviceStream() {
    if (cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking) != cudaSuccess) s_ = nullptr;
  }
  ~DeviceStream() {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
  }
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

template <class T>
bool upload(DeviceBuffer& d, const std::vector<T>& h) {
  return d.as() != nullptr && d.bytes() >= h.size() * sizeof(T) &&
         memcpy_synced(d.as(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
}

template <class T>
std::vector<T> download(const void* d, size_t n) {
  std::vector<T> h(n);
  if (n > 0 && memcpy_synced(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) h.clear();
  return h;
}

// %.9g: enough digits to tell two f32 values apart.
inline std::string fmt(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// Compares got to want element-wise: |got - want| <= rel_tol · bound[i] where bound is |want| (or a caller's
// per-element scale). Returns "" when all pass, else a line with the count, the max error ratio and the first
// mismatch (index, values).
inline std::string compare_close(const std::vector<float>& got, const std::vector<float>& want,
                                 const std::vector<float>& bound, double rel_tol) {
  if (got.size() != want.size()) {
    return "size mismatch: got " + std::to_string(got.size()) + " want " + std::to_string(want.size());
  }
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double b = bound.empty() ? std::fabs(static_cast<double>(want[i])) : static_cast<double>(bound[i]);
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    const double ratio = b > 0 ? err / b : (err > 0 ? INFINITY : 0.0);
    const bool ok = err <= rel_tol * b && !std::isnan(got[i]);
    if (ratio > worst || std::isnan(got[i])) worst = std::isnan(got[i]) ? INFINITY : ratio;
    if (!ok) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(got.size()) + " elements out of tolerance " + fmt(rel_tol) +
         " (max err/bound " + fmt(worst) + "); first at index " + std::to_string(first) + ": got " + fmt(got[first]) +
         " want " + fmt(want[first]);
}

}  // namespace kestrel::gpu::test
