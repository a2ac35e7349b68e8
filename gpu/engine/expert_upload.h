// ExpertUpload: for a long prompt pass, the routed experts that hybrid MoE layers keep in host memory are copied to
// the GPU layer by layer and tiled there (gpu/kernels/tile_device.h), and each such layer runs as an all-resident
// one (moe_imma_forward_prompt). A prompt pass of hundreds of tokens routes them to nearly every expert of a layer
// with many tokens each: the host would compute every (token, expert) pair, while the copy moves each expert once over
// PCIe and the GPU's tensor cores do the rest. Decode steps (a few tokens) keep the host experts on the host.
//
// The host stacks (DeviceFfnLayer::host_*_exps) are a page-locked copy (gpu/memory/pinned_experts.h) or the model's
// file mapping. A filler thread enqueues each layer's transfer on a copy stream into one of two raw staging buffers on
// the GPU — straight from page-locked stacks; from a file mapping (which is not registered: cudaHostRegister over a
// large file mapping did not finish in minutes on the lent H100 box) after a few memcpy threads copy the layer into
// one of two pinned bounce buffers. The pass's stream tiles the layer into one staging stack (its resident experts
// copied in from the pool). The filler runs two layers ahead, so the copies, the transfers and the pass's other work
// overlap. The staged stacks are byte for byte what the pool holds for an all-resident layer, so a staged layer's
// results are bit-identical to a model with every expert on the GPU.
//
// Ownership: borrows the DeviceModel (and through it the file mapping); owns its staging memory (pinned host and
// device), threads, stream and events. One pass at a time, from the thread that runs the pass: begin(), stage() per
// layer in order, end() on every path.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/expected.h"
#include "core/engine/placement_planner.h"
#include "gpu/engine/device_model.h"
#include "gpu/kernels/moe_imma.h"

namespace kestrel::gpu {

class ExpertUpload {
 public:
  // For the hybrid layers of `model` that run on moe_imma, copying with copy_threads host threads (at least 1).
  // kFailedPrecondition when it has none; CUDA errors (no pinned or device memory for the staging) as Error — the
  // caller then runs those layers' experts on the host.
  static Expected<std::unique_ptr<ExpertUpload>> create(const DeviceModel& model, int copy_threads);
  ~ExpertUpload();
  ExpertUpload(const ExpertUpload&) = delete;
  ExpertUpload& operator=(const ExpertUpload&) = delete;

  // Starts a pass on `stream`: the filler starts on the first layers; their transfers begin once the stream's work so
  // far is done.
  Status begin(cudaStream_t stream);
  // Layer l's weights with every expert staged, on `stream`: waits for its transfer, tiles it and copies its resident
  // experts in. The layers come in ascending order after begin(), each once; kInvalidArgument for a layer out of
  // turn; the filler's error (a CUDA call that failed) if it stopped.
  Expected<MoeImmaWeights> stage(size_t l, cudaStream_t stream);
  // Ends the pass (also after an error, before every layer was staged): stops the filler, waits for the transfers.
  Status end();

  // The device staging an upload over `model`'s MoE layers takes (the largest layer's three expert stacks, three
  // times), for memory budgets made before anything is loaded.
  static uint64_t device_bytes_for(const PlannerModel& model);

  // Host bytes copied per pass, device and pinned host bytes of the staging, layers.
  uint64_t host_bytes_per_pass() const { return host_bytes_; }
  uint64_t device_bytes() const { return 3 * raw_bytes_; }
  uint64_t pinned_bytes() const { return direct_ ? 0 : 2 * raw_bytes_; }
  // Whether every layer's stacks are page-locked (transfers without the bounce buffers).
  bool direct() const { return direct_; }
  int layers() const { return static_cast<int>(layers_.size()); }

 private:
  ExpertUpload() = default;
  struct Stack {
    DeviceExpertsView host;  // every expert, raw (page-locked copy or file mapping)
    const void* resident;    // the pool's compact tiled stack (slot s at s · slice), null when none is resident
    uint64_t offset = 0;     // of this stack in a staging buffer
    uint64_t slice = 0;      // bytes of one expert's matrix (raw = tiled)
  };
  struct Layer {
    size_t index = 0;  // model layer
    MoeImmaWeights weights;
    std::array<Stack, 3> stacks;                        // gate, up, down
    std::vector<std::array<int32_t, 2>> host_runs;      // [first, end) of consecutive host experts
    std::vector<std::array<int32_t, 3>> resident_runs;  // [first, end, first slot) of consecutive resident experts
  };
  // The filler thread: layer after layer, into pinned_[i % 2] (once the transfer from it two layers before is done
  // and the pass's stream has tiled that layer), then the transfer on copy_stream_.
  void fill_loop();
  Status fill(size_t i);
  // Copies n bytes with the memcpy threads.
  void parallel_copy(uint8_t* dst, const uint8_t* src, uint64_t n);
  void copy_worker(int index);

  std::vector<Layer> layers_;
  uint64_t raw_bytes_ = 0;  // one staging buffer (the largest layer's three stacks)
  bool direct_ = true;      // every layer's host stacks are page-locked: no bounce buffers, no memcpy threads
  uint64_t host_bytes_ = 0;
  void* device_ = nullptr;  // raw_[0], raw_[1], tiled_
  std::array<uint8_t*, 2> raw_{};
  uint8_t* tiled_ = nullptr;
  void* pinned_base_ = nullptr;
  std::array<uint8_t*, 2> pinned_{};
  cudaStream_t copy_stream_ = nullptr;
  std::array<cudaEvent_t, 2> moved_{};  // the transfer of the layer in pinned_[b] / raw_[b] is done
  std::array<cudaEvent_t, 2> freed_{};  // the pass's stream has tiled raw_[b]
  cudaEvent_t start_ = nullptr;
  int device_id_ = 0;                           // the filler thread makes it current before its CUDA calls
  cudaError_t set_device_error_ = cudaSuccess;  // written by the filler before its first pass, read by it alone

  // Pass state, shared by the pass's thread and the filler under mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  bool in_pass_ = false, stop_ = false, quit_ = false, filling_ = false;
  size_t next_ = 0;      // the layer stage() takes next
  size_t enqueued_ = 0;  // layers whose transfer the filler has enqueued
  size_t staged_ = 0;    // layers stage() has tiled (their freed_ event recorded)
  Status fill_error_ = ok_status();
  std::thread filler_;

  // The memcpy threads: a job is [dst, src, n) split in copy_threads_ equal parts.
  int copy_threads_ = 1;
  std::mutex copy_mu_;
  std::condition_variable copy_cv_;
  uint64_t copy_round_ = 0;
  int copy_pending_ = 0;
  bool copy_quit_ = false;
  uint8_t* copy_dst_ = nullptr;
  const uint8_t* copy_src_ = nullptr;
  uint64_t copy_n_ = 0;
  std::vector<std::thread> copiers_;
};

}  // namespace kestrel::gpu
