// RMSNorm kernels (see rms_norm.h): one block per row, the row by norm_row::residual_norm (strided per-thread partial
// sums, fixed block reduction).
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/norm_row.cuh"
#include "gpu/kernels/pdl.cuh"
#include "gpu/kernels/rms_norm.h"

namespace kestrel::gpu {
namespace {

constexpr int kThreads = 256;

// One block per row: with kFused, res += delta first (written back), then the norm of the row
// (norm_row::residual_norm); with kPrepare, then the prepared form of the row (norm_row::prepare_row: the bytes
// gemv_imma_prepare_x writes from y). In place (y == x) is safe for the plain form: every thread reads back only the
// elements it wrote. Launched programmatically where the caller asks (nothing is read before the wait; without the
// launch attribute the trigger and the wait do nothing).
template <bool kFused, bool kPrepare>
__global__ void rms_norm_kernel(float* x, const float* delta, const float* w, int64_t n, float eps, float* y,
                                imma_prep::XLayout lay, uint8_t* xprep) {
  pdl_trigger();
  pdl_wait();
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  const float* dr = kFused ? delta + row * n : nullptr;
  norm_row::residual_norm<kFused>(
      x + row * n, [&](int64_t i) { return ld_dep(dr + i); }, w, n, eps, y + row * n, scratch);
  if constexpr (kPrepare) {
    __syncthreads();
    norm_row::prepare_row(y, static_cast<int>(n), lay, xprep, static_cast<int>(row));
  }
}

using NormKernel = void (*)(float*, const float*, const float*, int64_t, float, float*, imma_prep::XLayout, uint8_t*);

// The one launch of every entry point: the form by whether there is a delta and a preparation.
Status launch_norm(float* x, const float* delta, const float* w, int64_t n_rows, int64_t n, float eps, float* y,
                   uint8_t* xprep, cudaStream_t stream, bool programmatic) {
  const NormKernel kernel = delta != nullptr
                                ? (xprep != nullptr ? rms_norm_kernel<true, true> : rms_norm_kernel<true, false>)
                                : (xprep != nullptr ? rms_norm_kernel<false, true> : rms_norm_kernel<false, false>);
  const imma_prep::XLayout lay = xprep != nullptr ? imma_prep::x_layout(n) : imma_prep::XLayout{};
  return launch_programmatic(programmatic, kernel, dim3(static_cast<unsigned>(n_rows)), dim3(kThreads), 0, stream, x,
                             delta, w, n, eps, y, lay, xprep);
}

Status check(const void* x, const void* w, const void* y, int64_t n_rows, int64_t n, const char* what) {
  if (n_rows < 0 || n < 1 || n_rows > 0x7FFFFFFF) {
    return make_error(ErrorCode::kInvalidArgument, std::string(what) + ": bad shape (" + std::to_string(n_rows) +
                                                       " rows of " + std::to_string(n) + ")");
  }
  if (x == nullptr || w == nullptr || y == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, std::string(what) + ": null pointer");
  }
  return ok_status();
}

}  // namespace

Status rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y, cudaStream_t stream) {
  KESTREL_TRY(check(x, w, y, n_rows, n, "rms_norm"));
  if (n_rows == 0) return ok_status();
  // The kernel only writes through y; x is read (the non-const pointer serves the fused form).
  return launch_norm(const_cast<float*>(x), nullptr, w, n_rows, n, eps, y, nullptr, stream, false);
}

Status residual_add_rms_norm(float* res, const float* delta, const float* w, int64_t n_rows, int64_t n, float eps,
                             float* y, cudaStream_t stream) {
  KESTREL_TRY(check(res, w, y, n_rows, n, "residual_add_rms_norm"));
  if (delta == nullptr) return make_error(ErrorCode::kInvalidArgument, "residual_add_rms_norm: null delta");
  if (y == res || y == delta) {
    return make_error(ErrorCode::kInvalidArgument, "residual_add_rms_norm: y must not alias res or delta");
  }
  if (n_rows == 0) return ok_status();
  return launch_norm(res, delta, w, n_rows, n, eps, y, nullptr, stream, false);
}

Status rms_norm_prepare(float* res, const float* delta, const float* w, int64_t n_rows, int64_t n, float eps, float* y,
                        void* xprep, cudaStream_t stream, bool programmatic) {
  KESTREL_TRY(check(res, w, y, n_rows, n, "rms_norm_prepare"));
  if (delta != nullptr && (y == res || y == delta)) {
    return make_error(ErrorCode::kInvalidArgument, "rms_norm_prepare: y must not alias res or delta");
  }
  if (n_rows == 0) return ok_status();
  if (xprep != nullptr) {
    if (n_rows > 65535 || imma_x_bytes(n, static_cast<int>(n_rows)) == 0) {
      return make_error(ErrorCode::kInvalidArgument, "rms_norm_prepare: n " + std::to_string(n) +
                                                         " (a multiple of 64 up to gemv_imma's widest row) or rows " +
                                                         std::to_string(n_rows) + " (1..65535) out of range");
    }
    const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (!aligned16(xprep) || !aligned16(y)) {
      return make_error(ErrorCode::kInvalidArgument, "rms_norm_prepare: xprep or y not 16-byte aligned");
    }
  }
  return launch_norm(res, delta, w, n_rows, n, eps, y, static_cast<uint8_t*>(xprep), stream, programmatic);
}

}  // namespace kestrel::gpu
