// WeightPool: the resident weights of a model on the device, in one allocation made once (design.md §2, issue 5).
//
// The pool owns one cudaMalloc of `budget` bytes. Tensors are registered under keys (the GGUF name, e.g.
// "blk.3.attn_q.weight") with their exact ggml shape {ne0, ne1, ...} and type; their raw GGUF blocks are copied
// byte for byte (no widening: the bytes at view().data are exactly the file's bytes, rows back to back), or, for a
// Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 matrix registered with PoolLayout::kTiled, re-tiled on the host by tile_matrix
// (gpu/memory/tiled_matrix.h: the same bytes reordered for GEMV v4, each 2-D slice of a 3-D stack on its own) and read
// through tiled_view(). Each tensor starts at a kPoolAlignment-byte boundary inside the allocation.
//
// Registration is all-or-nothing: a batch is checked first (known type, ne0 a multiple of the block, byte count
// equal to the shape's, no duplicate or empty key, and the whole batch — with alignment padding — within the free
// bytes); any problem is reported before a single byte is copied and leaves the pool unchanged. The error names the
// tensor, its bytes and the free bytes. A CUDA failure during the copies also leaves the bookkeeping unchanged.
//
// clear() drops every tensor (the allocation is kept) and bumps generation(): PoolRefs taken before it are refused
// by view() (kFailedPrecondition), and their keys are no longer found until registered again.
// Byte accounting is kept per PlacementClass (core/model/tensor_layout.h) plus the alignment padding.
//
// Ownership and threads: a WeightPool is move-only and frees its allocation when destroyed (the caller makes sure
// no kernel still reads it). Not thread-safe to mutate; const lookups may run concurrently with each other.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/model/tensor_layout.h"
#include "core/model/weight_catalog.h"
#include "gpu/kernels/get_rows.h"     // DeviceMatrixView
#include "gpu/memory/tiled_matrix.h"  // TiledView, tile_matrix

namespace kestrel::gpu {

// Every tensor starts at a multiple of this many bytes from the pool's base (cudaMalloc returns 256-aligned).
inline constexpr uint64_t kPoolAlignment = 256;

// How a tensor's bytes sit on the device.
enum class PoolLayout : uint8_t {
  kRaw,    // the GGUF blocks as in the file (every kernel of gpu/ that takes a DeviceMatrixView)
  kTiled,  // Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 matrices (or stacks) re-tiled by tile_matrix for gemv_imma; the same
           // bytes
};

// One tensor to register: raw GGUF blocks in host memory (pageable or pinned), borrowed for the call only.
struct PoolTensorDesc {
  std::string key;
  GgmlType type = GgmlType::kF32;
  std::vector<uint64_t> ne;  // ggml order, 1..4 dims
  PlacementClass placement = PlacementClass::kDense;
  std::span<const uint8_t> data;         // exactly ggml_row_bytes(type, ne0) · (ne1 · ne2 · ne3) bytes
  PoolLayout layout = PoolLayout::kRaw;  // kTiled: tiled_supports(type, ne0, ne1) and ne3 == 1
};

// A registered tensor as the pool keeps it.
struct PoolEntry {
  std::string key;
  GgmlType type = GgmlType::kF32;
  std::vector<uint64_t> ne;
  PlacementClass placement = PlacementClass::kDense;
  uint64_t offset = 0;  // from the pool's base, a multiple of kPoolAlignment
  uint64_t bytes = 0;   // raw bytes (no padding)
  uint64_t row_bytes = 0;
  PoolLayout layout = PoolLayout::kRaw;
  uint64_t rows() const;  // ne1 · ne2 · ne3
};

// A handle to a registered tensor; valid while the pool's generation is unchanged.
struct PoolRef {
  uint32_t index = 0;
  uint64_t generation = 0;
};

class WeightPool {
 public:
  // cudaMalloc of budget_bytes (> 0). kResourceExhausted (naming the budget and the device's free memory) when the
  // device cannot hold it, kFailedPrecondition when there is no device.
  static Expected<WeightPool> create(uint64_t budget_bytes);

  WeightPool(WeightPool&& other) noexcept;
  WeightPool& operator=(WeightPool&& other) noexcept;
  WeightPool(const WeightPool&) = delete;
  WeightPool& operator=(const WeightPool&) = delete;
  ~WeightPool();

  // Checks the whole batch, then copies it (cudaMemcpyAsync on `stream`, then waits for the stream, so the host
  // buffers may be released when this returns). Errors: kInvalidArgument (shape/type/size/key), kResourceExhausted
  // (does not fit), CUDA errors. On any error the pool is unchanged.
  Status register_tensors(std::span<const PoolTensorDesc> batch, cudaStream_t stream);

  // Registers every used tensor of `catalog` (GDN, attention, norms, FFN/experts, embedding, lm_head; skipped MTP
  // tensors excluded; a tied output is the token_embd tensor, registered once) under its GGUF name with the
  // catalog's placement class, as one all-or-nothing batch. `file` is the GgufFile the catalog was built from.
  // tile: every Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 matrix or expert stack whose shape tiled_supports is registered
  // kTiled, except token_embd.weight (the embedding lookup reads raw rows; a tied lm_head then stays raw too).
  Status register_catalog(const WeightCatalog& catalog, const GgufFile& file, cudaStream_t stream, bool tile = false);

  // Drops every tensor and invalidates every PoolRef (generation + 1). The device memory is not touched.
  void clear();

  // kNotFound naming the key when it is not registered (in this generation).
  Expected<PoolRef> find(std::string_view key) const;
  // The tensor as a matrix: n_cols = ne0, n_rows = ne1 · ne2 · ne3. kFailedPrecondition for a ref of an older
  // generation (the pool was cleared since) or a kTiled tensor (its bytes are not rows), kOutOfRange for a bad
  // index.
  Expected<DeviceMatrixView> view(const PoolRef& ref) const;
  // A kTiled matrix (2-D) or slice i2 of a kTiled stack (3-D) for gemv_imma. kFailedPrecondition for a raw
  // tensor or an old ref, kInvalidArgument for the wrong number of dims, kOutOfRange for i2.
  Expected<TiledView> tiled_view(const PoolRef& ref) const;
  Expected<TiledView> tiled_slice(const PoolRef& ref, uint64_t i2) const;
  // find() + view().
  Expected<DeviceMatrixView> matrix(std::string_view key) const;
  // Slice i2 of a 3-D tensor {ne0, ne1, ne2} (e.g. expert e of ffn_up_exps): n_cols = ne0, n_rows = ne1.
  // kInvalidArgument unless the tensor has exactly 3 dims (trailing 1s ignored), kOutOfRange for i2 >= ne2.
  Expected<DeviceMatrixView> slice(const PoolRef& ref, uint64_t i2) const;
  Expected<const PoolEntry*> entry(const PoolRef& ref) const;

  uint64_t generation() const { return generation_; }
  uint64_t budget_bytes() const { return budget_; }
  uint64_t used_bytes() const { return used_; }  // including alignment padding
  uint64_t free_bytes() const { return budget_ - used_; }
  uint64_t padding_bytes() const { return padding_; }
  uint64_t bytes_in(PlacementClass c) const { return class_bytes_[static_cast<size_t>(c)]; }
  size_t n_tensors() const { return entries_.size(); }
  const std::vector<PoolEntry>& entries() const { return entries_; }
  const void* base() const { return base_; }  // device

 private:
  WeightPool() = default;
  void release();

  uint8_t* base_ = nullptr;  // device, budget_ bytes
  uint64_t budget_ = 0;
  uint64_t used_ = 0;
  uint64_t padding_ = 0;
  uint64_t generation_ = 1;
  std::array<uint64_t, kNumPlacementClasses> class_bytes_{};
  std::vector<PoolEntry> entries_;
  std::unordered_map<std::string, uint32_t> index_;
};

}  // namespace kestrel::gpu
