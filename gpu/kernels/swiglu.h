// swiglu: act = silu(gate) ⊙ up element-wise, silu(g) = g · (1 / (1 + e^−g)) in f32 as ref::swiglu_forward (device
// expf, which differs from the host's by at most an ulp or two), for the dense FFN's raw-block path (the tiled path
// folds it into gemv_imma_prepare_swiglu).
// Enqueues one kernel on `stream` and returns without waiting; argument errors are found before the launch.
// Thread-safe (no shared state).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"

namespace kestrel::gpu {

// gate, up, act: device f32 [n]; act may equal gate or up.
Status swiglu(const float* gate, const float* up, int64_t n, float* act, cudaStream_t stream);

}  // namespace kestrel::gpu
