// ExpertUpload: for a long prompt pass, the routed experts that hybrid MoE layers keep in host memory are copied to
// the GPU layer by layer and tiled there (gpu/kernels/tile_device.h), and each such layer runs as an all-resident
// one (moe_imma_forward_prompt). A prompt pass of hundreds of tokens routes them to nearly every expert of a layer
// with many tokens each: the host would compute every (token, expert) pair, while the copy moves each expert once over
// PCIe and the GPU's tensor cores do the rest. Decode steps (a few tokens) keep the host experts on the host.
//
// The host stacks are the model's file mapping (DeviceFfnLayer::host_*_exps), registered with CUDA in place
// (cudaHostRegister, read-only: pinned, not copied) at create(), so copies run at the link's full rate and
// asynchronously. Two raw staging buffers take turns: a copy stream fills the buffer of the layer two ahead while the
// pass's stream tiles the current layer into one staging stack (its resident experts copied in from the pool), so
// the copies run back to back beside the pass's other work. The staged stacks are byte for byte what the pool holds
// for an all-resident layer, so a staged layer's results are bit-identical to a model with every expert on the GPU.
//
// Ownership: borrows the DeviceModel (and through it the file mapping); owns its staging memory, stream, events and
// the registration. One pass at a time, from the thread that runs the pass.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "gpu/engine/device_model.h"
#include "gpu/kernels/moe_imma.h"

namespace kestrel::gpu {

class ExpertUpload {
 public:
  // For the hybrid layers of `model` that run on moe_imma. kFailedPrecondition when it has none; CUDA errors (the
  // registration refused, staging memory not available) as Error — the caller then runs those layers' experts on the
  // host.
  static Expected<std::unique_ptr<ExpertUpload>> create(const DeviceModel& model);
  ~ExpertUpload();
  ExpertUpload(const ExpertUpload&) = delete;
  ExpertUpload& operator=(const ExpertUpload&) = delete;

  // Starts a pass on `stream`: the first two layers' copies begin once the stream's work so far is done.
  Status begin(cudaStream_t stream);
  // Layer l's weights with every expert staged, on `stream`: waits for its copy, tiles it, copies its resident
  // experts in and starts the copy of the layer two ahead. The layers come in ascending order after begin(), each once;
  // kInvalidArgument for a layer out of turn.
  Expected<MoeImmaWeights> stage(size_t l, cudaStream_t stream);

  // Host bytes copied per pass, device bytes of the staging, layers.
  uint64_t host_bytes_per_pass() const { return host_bytes_; }
  uint64_t device_bytes() const { return 2 * raw_bytes_ + raw_bytes_; }
  int layers() const { return static_cast<int>(layers_.size()); }

 private:
  ExpertUpload() = default;
  struct Stack {
    DeviceExpertsView host;  // every expert, raw (file mapping)
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
  Status enqueue_copy(size_t i);  // layers_[i] into raw_[i % 2] on copy_stream_

  std::vector<Layer> layers_;
  uint64_t raw_bytes_ = 0;  // one staging buffer (the largest layer's three stacks)
  uint64_t host_bytes_ = 0;
  void* device_ = nullptr;  // raw_[0], raw_[1], tiled_
  std::array<uint8_t*, 2> raw_{};
  uint8_t* tiled_ = nullptr;
  void* registered_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  std::array<cudaEvent_t, 2> copied_{}, freed_{};
  cudaEvent_t start_ = nullptr;
  size_t next_ = 0;  // the layer stage() takes next
};

}  // namespace kestrel::gpu
