// Greedy token choice on the device: the argmax of each sequence's logits row (docs/sampling.md §1).
//
// Same rule as core/sampler's argmax_lowest: the largest value, the lowest index among equal maxima, NaN never
// chosen (+inf is a value like any other), and index 0 when no logit is > -inf. One block per row; each thread
// keeps the first best of its strided elements, then a fixed tree combines (value, index) pairs by "larger value,
// then lower index" — a total order, so the result is exact (no tolerance) and identical from run to run.
// Enqueues one kernel on `stream` and returns without waiting; argument errors are found before the launch.
// Thread-safe (no shared state).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"

namespace kestrel::gpu {

// logits: device f32 [n_rows, n_vocab]; ids: device int32 [n_rows]. n_vocab in [1, 2^31 - 1025].
Status argmax_rows(const float* logits, int64_t n_rows, int64_t n_vocab, int32_t* ids, cudaStream_t stream);

}  // namespace kestrel::gpu
