// WeightPool (see weight_pool.h): one device allocation, bump placement of GGUF tensors (raw, or Q4 re-tiled),
// all-or-nothing batches.
#include "gpu/memory/weight_pool.h"

#include <string>
#include <unordered_set>
#include <utility>

#include "gpu/cuda_check.h"

namespace kestrel::gpu {
namespace {

uint64_t align_up(uint64_t v) { return (v + kPoolAlignment - 1) / kPoolAlignment * kPoolAlignment; }

std::string shape_str(const std::vector<uint64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

// ne with trailing 1-sized dims dropped (at least one dim kept).
std::vector<uint64_t> trimmed(const std::vector<uint64_t>& ne) {
  std::vector<uint64_t> t = ne;
  while (t.size() > 1 && t.back() == 1) t.pop_back();
  return t;
}

uint64_t rows_of(const std::vector<uint64_t>& ne) {
  uint64_t r = 1;
  for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
  return r;
}

}  // namespace

uint64_t PoolEntry::rows() const { return rows_of(ne); }

Expected<WeightPool> WeightPool::create(uint64_t budget_bytes) {
  if (budget_bytes == 0) return make_error(ErrorCode::kInvalidArgument, "weight pool: budget must be > 0 bytes");
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, budget_bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation) {
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      return make_error(ErrorCode::kResourceExhausted,
                        "weight pool: cannot allocate a budget of " + std::to_string(budget_bytes) +
                            " bytes on the device (" + std::to_string(free_b) + " of " + std::to_string(total_b) +
                            " bytes free); lower the weight budget or place fewer tensors on the GPU");
    }
    return cuda_error(err, "cudaMalloc(weight pool)", __FILE__, __LINE__);
  }
  WeightPool pool;
  pool.base_ = static_cast<uint8_t*>(p);
  pool.budget_ = budget_bytes;
  return pool;
}

WeightPool::WeightPool(WeightPool&& other) noexcept { *this = std::move(other); }

WeightPool& WeightPool::operator=(WeightPool&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    budget_ = std::exchange(other.budget_, 0);
    used_ = std::exchange(other.used_, 0);
    padding_ = std::exchange(other.padding_, 0);
    generation_ = other.generation_;
    other.generation_ += 1;  // refs into the moved-from pool stay refused
    class_bytes_ = std::exchange(other.class_bytes_, {});
    entries_ = std::move(other.entries_);
    other.entries_.clear();
    index_ = std::move(other.index_);
    other.index_.clear();
  }
  return *this;
}

WeightPool::~WeightPool() { release(); }

void WeightPool::release() {
  if (base_ != nullptr) (void)cudaFree(base_);
  base_ = nullptr;
}

Status WeightPool::register_tensors(std::span<const PoolTensorDesc> batch, cudaStream_t stream) {
  if (base_ == nullptr) return make_error(ErrorCode::kFailedPrecondition, "weight pool: not allocated (moved from)");
  // 1. Check everything and plan the placement; nothing is modified yet.
  std::vector<PoolEntry> planned;
  planned.reserve(batch.size());
  std::unordered_set<std::string_view> batch_keys;
  uint64_t offset = used_;
  uint64_t padding = 0;
  for (const PoolTensorDesc& d : batch) {
    const std::string who = "weight pool: tensor '" + d.key + "'";
    if (d.key.empty()) return make_error(ErrorCode::kInvalidArgument, "weight pool: a tensor has an empty key");
    if (index_.count(d.key) != 0 || !batch_keys.insert(d.key).second) {
      return make_error(ErrorCode::kInvalidArgument, who + " is already registered");
    }
    if (d.ne.empty() || d.ne.size() > 4) {
      return make_error(ErrorCode::kInvalidArgument, who + " has " + std::to_string(d.ne.size()) + " dims (1..4)");
    }
    for (uint64_t n : d.ne) {
      if (n == 0) return make_error(ErrorCode::kInvalidArgument, who + " has an empty dim: " + shape_str(d.ne));
    }
    if (!get_rows_supports(d.type)) {
      return make_error(ErrorCode::kUnsupported, who + " has type " + std::string(ggml_type_name(d.type)) +
                                                     ", which the GPU kernels cannot read");
    }
    auto row_bytes = ggml_row_bytes(d.type, d.ne[0]);
    if (!row_bytes) {
      return make_error(ErrorCode::kInvalidArgument, who + " " + shape_str(d.ne) + ": " + row_bytes.error().message);
    }
    const uint64_t bytes = *row_bytes * rows_of(d.ne);
    if (d.data.size() != bytes) {
      return make_error(ErrorCode::kInvalidArgument,
                        who + " " + shape_str(d.ne) + " " + std::string(ggml_type_name(d.type)) + " needs " +
                            std::to_string(bytes) + " bytes, the buffer has " + std::to_string(d.data.size()));
    }
    if (d.data.data() == nullptr) return make_error(ErrorCode::kInvalidArgument, who + " has no data");
    if (d.layout == PoolLayout::kTiled) {
      const std::vector<uint64_t> ne = trimmed(d.ne);
      if (ne.size() < 2 || ne.size() > 3 ||
          !tiled_supports(d.type, static_cast<int64_t>(ne[0]), static_cast<int64_t>(ne[1]))) {
        return make_error(
            ErrorCode::kInvalidArgument,
            who + " " + shape_str(d.ne) + " " + std::string(ggml_type_name(d.type)) +
                " cannot be tiled (q4_0 / q4_K / q5_K / q6_K / q8_0 matrices or 3-D stacks; see tiled_supports)");
      }
    }
    const uint64_t start = align_up(offset);
    if (start > budget_ || bytes > budget_ - start) {
      const uint64_t free_now = budget_ - used_;
      return make_error(ErrorCode::kResourceExhausted,
                        who + " (" + std::to_string(bytes) + " bytes) does not fit the weight pool: the batch needs " +
                            std::to_string(start - used_ + bytes) + " bytes up to and including it, " +
                            std::to_string(free_now) + " of " + std::to_string(budget_) +
                            " bytes are free; raise the budget or register fewer tensors");
    }
    padding += start - offset;
    PoolEntry e;
    e.key = d.key;
    e.type = d.type;
    e.ne = d.ne;
    e.placement = d.placement;
    e.offset = start;
    e.bytes = bytes;
    e.row_bytes = *row_bytes;
    e.layout = d.layout;
    planned.push_back(std::move(e));
    offset = start + bytes;
  }
  // 2. Copy (tiled tensors through a host buffer, one tensor at a time); on a failure the bookkeeping stays as it
  // was.
  std::vector<uint8_t> tiled;
  for (size_t i = 0; i < planned.size(); ++i) {
    const PoolEntry& e = planned[i];
    if (e.layout == PoolLayout::kRaw) {
      KESTREL_CUDA_TRY(
          cudaMemcpyAsync(base_ + e.offset, batch[i].data.data(), e.bytes, cudaMemcpyHostToDevice, stream));
      continue;
    }
    KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));  // the previous tiled buffer may be reused now
    const std::vector<uint64_t> ne = trimmed(e.ne);
    const uint64_t slices = ne.size() == 3 ? ne[2] : 1;
    tiled.resize(e.bytes);
    KESTREL_TRY(tile_matrix_stack(e.type, batch[i].data.data(), static_cast<int64_t>(ne[0]),
                                  static_cast<int64_t>(ne[1]), static_cast<int64_t>(slices), tiled));
    KESTREL_CUDA_TRY(cudaMemcpyAsync(base_ + e.offset, tiled.data(), e.bytes, cudaMemcpyHostToDevice, stream));
  }
  KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));
  // 3. Commit.
  for (PoolEntry& e : planned) {
    class_bytes_[static_cast<size_t>(e.placement)] += e.bytes;
    index_.emplace(e.key, static_cast<uint32_t>(entries_.size()));
    entries_.push_back(std::move(e));
  }
  used_ = offset;
  padding_ += padding;
  return ok_status();
}

Status WeightPool::register_catalog(const WeightCatalog& catalog, const GgufFile& file, cudaStream_t stream,
                                    bool tile) {
  std::vector<PoolTensorDesc> batch;
  batch.reserve(catalog.entries().size());
  for (const CatalogEntry& ce : catalog.entries()) {
    if (ce.skipped || ce.info == nullptr) continue;
    PoolTensorDesc d;
    d.key = ce.info->name;
    d.type = ce.info->type;
    d.ne = ce.info->ne;
    d.placement = ce.placement;
    d.data = file.tensor_data(*ce.info);
    const std::vector<uint64_t> ne = trimmed(d.ne);
    if (tile && d.key != "token_embd.weight" && ne.size() >= 2 && ne.size() <= 3 &&
        tiled_supports(d.type, static_cast<int64_t>(ne[0]), static_cast<int64_t>(ne[1]))) {
      d.layout = PoolLayout::kTiled;
    }
    batch.push_back(std::move(d));
  }
  return register_tensors(batch, stream);
}

void WeightPool::clear() {
  entries_.clear();
  index_.clear();
  class_bytes_ = {};
  used_ = 0;
  padding_ = 0;
  ++generation_;
}

Expected<PoolRef> WeightPool::find(std::string_view key) const {
  const auto it = index_.find(std::string(key));
  if (it == index_.end()) {
    return make_error(ErrorCode::kNotFound, "weight pool: no tensor '" + std::string(key) + "' is registered" +
                                                (entries_.empty() ? " (the pool is empty)" : ""));
  }
  return PoolRef{it->second, generation_};
}

Expected<const PoolEntry*> WeightPool::entry(const PoolRef& ref) const {
  if (ref.generation != generation_) {
    return make_error(ErrorCode::kFailedPrecondition, "weight pool: a tensor reference from generation " +
                                                          std::to_string(ref.generation) +
                                                          " was used after the pool was rebuilt (now generation " +
                                                          std::to_string(generation_) + "); look the key up again");
  }
  if (ref.index >= entries_.size()) {
    return make_error(ErrorCode::kOutOfRange, "weight pool: tensor index " + std::to_string(ref.index) +
                                                  " out of range (" + std::to_string(entries_.size()) + " tensors)");
  }
  return &entries_[ref.index];
}

Expected<DeviceMatrixView> WeightPool::view(const PoolRef& ref) const {
  KESTREL_TRY_ASSIGN(const PoolEntry* e, entry(ref));
  if (e->layout != PoolLayout::kRaw) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "weight pool: tensor '" + e->key + "' is stored tiled for GEMV v4; use tiled_view()");
  }
  DeviceMatrixView v;
  v.type = e->type;
  v.data = base_ + e->offset;
  v.n_cols = static_cast<int64_t>(e->ne[0]);
  v.n_rows = static_cast<int64_t>(e->rows());
  return v;
}

Expected<DeviceMatrixView> WeightPool::matrix(std::string_view key) const {
  KESTREL_TRY_ASSIGN(const PoolRef ref, find(key));
  return view(ref);
}

Expected<DeviceMatrixView> WeightPool::slice(const PoolRef& ref, uint64_t i2) const {
  KESTREL_TRY_ASSIGN(const PoolEntry* e, entry(ref));
  if (e->layout != PoolLayout::kRaw) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "weight pool: tensor '" + e->key + "' is stored tiled for GEMV v4; use tiled_slice()");
  }
  const std::vector<uint64_t> ne = trimmed(e->ne);
  if (ne.size() != 3) {
    return make_error(ErrorCode::kInvalidArgument,
                      "weight pool: tensor '" + e->key + "' " + shape_str(e->ne) + " is not 3-D; cannot slice it");
  }
  if (i2 >= ne[2]) {
    return make_error(ErrorCode::kOutOfRange, "weight pool: slice " + std::to_string(i2) + " of tensor '" + e->key +
                                                  "' " + shape_str(e->ne) + " is out of range");
  }
  DeviceMatrixView v;
  v.type = e->type;
  v.data = base_ + e->offset + i2 * ne[1] * e->row_bytes;
  v.n_cols = static_cast<int64_t>(ne[0]);
  v.n_rows = static_cast<int64_t>(ne[1]);
  return v;
}

Expected<TiledView> WeightPool::tiled_view(const PoolRef& ref) const {
  KESTREL_TRY_ASSIGN(const PoolEntry* e, entry(ref));
  if (e->layout != PoolLayout::kTiled) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "weight pool: tensor '" + e->key + "' is stored raw; use view() or slice()");
  }
  if (trimmed(e->ne).size() != 2) {
    return make_error(ErrorCode::kInvalidArgument, "weight pool: tensor '" + e->key + "' " + shape_str(e->ne) +
                                                       " is not a matrix; use tiled_slice()");
  }
  return tiled_slice(ref, 0);
}

Expected<TiledView> WeightPool::tiled_slice(const PoolRef& ref, uint64_t i2) const {
  KESTREL_TRY_ASSIGN(const PoolEntry* e, entry(ref));
  if (e->layout != PoolLayout::kTiled) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "weight pool: tensor '" + e->key + "' is stored raw; use view() or slice()");
  }
  const std::vector<uint64_t> ne = trimmed(e->ne);
  const uint64_t slices = ne.size() == 3 ? ne[2] : 1;
  if (i2 >= slices) {
    return make_error(ErrorCode::kOutOfRange, "weight pool: slice " + std::to_string(i2) + " of tensor '" + e->key +
                                                  "' " + shape_str(e->ne) + " is out of range");
  }
  TiledView v;
  v.type = e->type;
  v.data = base_ + e->offset + i2 * (e->bytes / slices);
  v.n_cols = static_cast<int64_t>(ne[0]);
  v.n_rows = static_cast<int64_t>(ne[1]);
  return v;
}

}  // namespace kestrel::gpu
