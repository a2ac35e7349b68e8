// expert_handoff: the device side of a hybrid MoE layer's hand-off to a host ExpertBackend through mapped pinned
// memory, without CUDA host functions (gpu/engine/host_expert_link.h is the host side). Two kernels on the layer's
// stream, so a decode step with host experts stays one CUDA graph of kernels:
//
//   expert_handoff_publish: copies the layer's input rows and its host choices into the mapped buffers, then
//     publishes the batch: seq = *h.seq + 1 (device memory), the mailbox's layer and n_tokens, and last, with release
//     semantics at system scope, mailbox.request = seq. The host, polling `request`, sees the rows and choices
//     complete when it sees the new number.
//   expert_handoff_join: each block's first thread waits (acquire at system scope) until mailbox.done equals *h.seq,
//     the number this layer published; then the blocks copy the host's output rows from the mapped buffer into y
//     (device memory), where the combine reads them. Block 0 adds how long it waited to *h.wait_ns (the share of
//     the host's time the device did not cover with its own experts). A host that does not answer within timeout_ns
//     sets mailbox.timed_out and the rows become quiet NaNs, so the pass ends and its caller reports the error.
//
// Between the two the stream computes the resident experts and the shared expert, while the host computes its own.
// Both kernels are plain launches (not programmatic): each starts after everything before it on the stream.
// Sequence numbers come from device memory, so a captured graph publishes a fresh number on every replay.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/base/expected.h"
#include "core/engine/expert_backend.h"

namespace kestrel::gpu {

// The mailbox, in mapped pinned host memory. Each side writes its own cache line.
struct ExpertHandoffMailbox {
  alignas(64) uint32_t request = 0;    // device: the sequence number of the last batch published
  int32_t layer = -1;                  // device: that batch's layer
  int32_t n_tokens = 0;                // device: its rows
  alignas(64) uint32_t done = 0;       // host: the sequence number of the last batch whose rows are written
  alignas(64) uint32_t timed_out = 0;  // device: 1 once a join gave up waiting (the host clears it)
};

// What the kernels use: device pointers (of mapped host memory, except seq).
struct ExpertHandoff {
  ExpertHandoffMailbox* mailbox = nullptr;
  float* x = nullptr;                     // f32 [max rows, hidden]: the published input rows
  ExpertChoice* choices = nullptr;        // [max rows, k]: the published choices
  const float* y = nullptr;               // f32 [max rows, hidden]: the host's output rows
  uint32_t* seq = nullptr;                // device memory: the last sequence number published (zero at start)
  unsigned long long* wait_ns = nullptr;  // device memory: nanoseconds the joins waited for the host, summed
};

// Publishes layer `layer`'s batch: x device f32 [n_tok, hidden], choices device [n_tok, k]. kInvalidArgument for a
// null pointer, n_tok < 1, hidden not a positive multiple of 4, k < 1.
Status expert_handoff_publish(const ExpertHandoff& h, int32_t layer, const float* x, const ExpertChoice* choices,
                              int n_tok, int hidden, int k, cudaStream_t stream);

// Waits for the batch the last publish on this stream published, then copies its n_tok output rows into y (device
// f32 [n_tok, hidden]). timeout_ns >= 1. kInvalidArgument as above.
Status expert_handoff_join(const ExpertHandoff& h, int n_tok, int hidden, float* y, uint64_t timeout_ns,
                           cudaStream_t stream);

}  // namespace kestrel::gpu
