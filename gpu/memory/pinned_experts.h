// PinnedExperts: a page-locked host copy of chosen MoE layers' routed-expert stacks (gate, up and down, every expert
// of the layer, the raw GGUF blocks byte for byte as the file holds them).
//
// The hybrid engine's host experts live here rather than in the file mapping when prompt passes upload them to the
// GPU (gpu/engine/expert_upload.h): the GPU's copy engines read page-locked memory directly at the link's rate. From a
// file mapping the upload bounces through a pinned buffer, which costs the host a read and a write of every byte
// besides the transfer's read; on the lent H100 box that bounce moved 18 GB in 650 ms (28 GB/s) with the host's
// memory busy. The CPU expert backend reads the same copy for decode steps, so the experts are held once.
//
// The hybrid layers' side read (gpu/kernels/moe_hybrid.h step 3b) has GPU kernels read some of each token's host
// experts from this copy in place over the bus, through its mapped device addresses (device_layer()).
//
// Memory: one anonymous mapping (transparent huge pages asked for, as the CPU kernels read it), filled by `threads`
// copy threads, then registered (mapped) with cudaHostRegister. The file mapping itself is never registered: over the
// 35B file that did not finish in minutes (one core busy in the driver), while registering anonymous memory that is
// already faulted in only pins it.
//
// Ownership: owns its memory; borrows nothing after create(). Thread-safe for reading.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model.h"

namespace kestrel::gpu {

// Host memory create() leaves to everything else (MemAvailable must exceed the copy by this much).
inline constexpr uint64_t kPinnedHeadroomBytes = uint64_t{4} << 30;

class PinnedExperts {
 public:
  // A layer's three stacks (n_expert matrices each, expert-major, as the file holds them); null when not held.
  struct Layer {
    const uint8_t* gate = nullptr;
    const uint8_t* up = nullptr;
    const uint8_t* down = nullptr;
  };

  // Copies the expert stacks of every MoE layer l with layers[l] set ([n_layer]) with `threads` copy threads (at
  // least 1). kInvalidArgument: layers not [n_layer], a chosen layer without routed experts, threads < 1;
  // kResourceExhausted: the copy would leave less than kPinnedHeadroomBytes of the host's available memory (the
  // message names both); kInternal: the mapping or the registration failed (the CUDA error named).
  static Expected<std::unique_ptr<PinnedExperts>> create(const Model& model, const std::vector<bool>& layers,
                                                         int threads);
  ~PinnedExperts();
  PinnedExperts(const PinnedExperts&) = delete;
  PinnedExperts& operator=(const PinnedExperts&) = delete;

  // Layer l's stacks (l < n_layer).
  const Layer& layer(size_t l) const { return layers_[l]; }
  // The same stacks at their mapped device addresses, for kernels (l < n_layer).
  const Layer& device_layer(size_t l) const { return device_layers_[l]; }
  size_t n_layer() const { return layers_.size(); }
  // Bytes held, and seconds create() took (copy and registration).
  uint64_t bytes() const { return bytes_; }
  double seconds() const { return seconds_; }

 private:
  PinnedExperts() = default;
  std::vector<Layer> layers_;
  std::vector<Layer> device_layers_;
  void* base_ = nullptr;
  uint64_t mapped_ = 0;
  uint64_t bytes_ = 0;
  bool registered_ = false;
  double seconds_ = 0;
};

}  // namespace kestrel::gpu
