// ExpertUpload (expert_upload.h).
#include "gpu/engine/expert_upload.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <string>

#include "core/engine/expert_backend.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/tile_device.h"
#include "gpu/memory/tiled_matrix.h"
#include "gpu/memory/weight_pool.h"

namespace kestrel::gpu {
namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

Expected<std::unique_ptr<ExpertUpload>> ExpertUpload::create(const DeviceModel& model) {
  std::unique_ptr<ExpertUpload> u(new ExpertUpload());
  uintptr_t lo = std::numeric_limits<uintptr_t>::max(), hi = 0;
  for (size_t l = 0; l < model.layers().size(); ++l) {
    const DeviceFfnLayer& f = model.layers()[l].ffn;
    if (!f.hybrid() || !f.moe_tiled) continue;
    Layer layer;
    layer.index = l;
    layer.weights = f.moe_imma;
    const DeviceExpertsView host[3] = {f.host_gate_exps, f.host_up_exps, f.host_down_exps};
    const void* resident[3] = {f.moe_imma.gate_exps, f.moe_imma.up_exps, f.moe_imma.down_exps};
    uint64_t off = 0;
    for (int s = 0; s < 3; ++s) {
      Stack& st = layer.stacks[static_cast<size_t>(s)];
      st.host = host[s];
      st.resident = f.n_resident > 0 ? resident[s] : nullptr;
      st.slice = tiled_bytes(st.host.type, st.host.n_cols, st.host.n_rows);
      st.offset = off;
      off = align_up(off + st.slice * static_cast<uint64_t>(f.n_expert), kPoolAlignment);
      const auto p = reinterpret_cast<uintptr_t>(st.host.data);
      lo = std::min(lo, p);
      hi = std::max(hi, p + st.slice * static_cast<uint64_t>(f.n_expert));
    }
    u->raw_bytes_ = std::max(u->raw_bytes_, off);
    for (int32_t e = 0; e < f.n_expert;) {
      const bool here = f.resident_host[static_cast<size_t>(e)] != kExpertNotHere;
      int32_t end = e + 1;
      while (end < f.n_expert && (f.resident_host[static_cast<size_t>(end)] != kExpertNotHere) == here) ++end;
      if (here) {
        layer.resident_runs.push_back({e, end, f.resident_host[static_cast<size_t>(e)]});
      } else {
        layer.host_runs.push_back({e, end});
        for (const Stack& st : layer.stacks) u->host_bytes_ += st.slice * static_cast<uint64_t>(end - e);
      }
      e = end;
    }
    u->layers_.push_back(std::move(layer));
  }
  if (u->layers_.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "expert upload: no hybrid layer runs on moe_imma");
  }
  // The file pages under every host stack, pinned in place (one range: the stacks lie in one mapping).
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  lo = lo / page * page;
  hi = (hi + page - 1) / page * page;
  void* base = reinterpret_cast<void*>(lo);
  cudaError_t reg = cudaHostRegister(base, hi - lo, cudaHostRegisterReadOnly);
  if (reg != cudaSuccess) {
    (void)cudaGetLastError();
    reg = cudaHostRegister(base, hi - lo, cudaHostRegisterDefault);
  }
  if (reg != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::kUnavailable,
                      "expert upload: the host experts' " + std::to_string(hi - lo) +
                          " bytes could not be pinned (cudaHostRegister: " + cudaGetErrorString(reg) + ")");
  }
  u->registered_ = base;
  KESTREL_CUDA_TRY(cudaMalloc(&u->device_, 3 * u->raw_bytes_));
  auto* d = static_cast<uint8_t*>(u->device_);
  u->raw_ = {d, d + u->raw_bytes_};
  u->tiled_ = d + 2 * u->raw_bytes_;
  KESTREL_CUDA_TRY(cudaStreamCreateWithFlags(&u->copy_stream_, cudaStreamNonBlocking));
  for (int b = 0; b < 2; ++b) {
    KESTREL_CUDA_TRY(cudaEventCreateWithFlags(&u->copied_[static_cast<size_t>(b)], cudaEventDisableTiming));
    KESTREL_CUDA_TRY(cudaEventCreateWithFlags(&u->freed_[static_cast<size_t>(b)], cudaEventDisableTiming));
  }
  KESTREL_CUDA_TRY(cudaEventCreateWithFlags(&u->start_, cudaEventDisableTiming));
  for (Layer& layer : u->layers_) {
    for (int s = 0; s < 3; ++s) {
      const void* staged = u->tiled_ + layer.stacks[static_cast<size_t>(s)].offset;
      (s == 0 ? layer.weights.gate_exps : s == 1 ? layer.weights.up_exps : layer.weights.down_exps) = staged;
    }
    KESTREL_TRY(moe_imma_check_weights(layer.weights));
  }
  return u;
}

ExpertUpload::~ExpertUpload() {
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  for (cudaEvent_t e : copied_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : freed_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (device_ != nullptr) cudaFree(device_);
  if (registered_ != nullptr) cudaHostUnregister(registered_);
}

Status ExpertUpload::enqueue_copy(size_t i) {
  const Layer& layer = layers_[i];
  uint8_t* raw = raw_[i % 2];
  for (const Stack& st : layer.stacks) {
    for (const auto& [first, end] : layer.host_runs) {
      const uint64_t at = st.slice * static_cast<uint64_t>(first);
      KESTREL_CUDA_TRY(cudaMemcpyAsync(raw + st.offset + at, static_cast<const uint8_t*>(st.host.data) + at,
                                       st.slice * static_cast<uint64_t>(end - first), cudaMemcpyHostToDevice,
                                       copy_stream_));
    }
  }
  KESTREL_CUDA_TRY(cudaEventRecord(copied_[i % 2], copy_stream_));
  return ok_status();
}

Status ExpertUpload::begin(cudaStream_t stream) {
  next_ = 0;
  KESTREL_CUDA_TRY(cudaEventRecord(start_, stream));
  KESTREL_CUDA_TRY(cudaStreamWaitEvent(copy_stream_, start_));
  for (size_t i = 0; i < std::min<size_t>(2, layers_.size()); ++i) KESTREL_TRY(enqueue_copy(i));
  return ok_status();
}

Expected<MoeImmaWeights> ExpertUpload::stage(size_t l, cudaStream_t stream) {
  if (next_ >= layers_.size() || layers_[next_].index != l) {
    return make_error(ErrorCode::kInvalidArgument, "expert upload: layer " + std::to_string(l) + " staged out of turn");
  }
  const size_t i = next_++;
  const Layer& layer = layers_[i];
  const size_t b = i % 2;
  KESTREL_CUDA_TRY(cudaStreamWaitEvent(stream, copied_[b]));
  for (const Stack& st : layer.stacks) {
    for (const auto& [first, end] : layer.host_runs) {
      KESTREL_TRY(tile_stack_device(st.host.type, raw_[b] + st.offset, st.host.n_cols, st.host.n_rows, first,
                                    end - first, tiled_ + st.offset, stream));
    }
    for (const auto& [first, end, slot] : layer.resident_runs) {
      KESTREL_CUDA_TRY(
          cudaMemcpyAsync(tiled_ + st.offset + st.slice * static_cast<uint64_t>(first),
                          static_cast<const uint8_t*>(st.resident) + st.slice * static_cast<uint64_t>(slot),
                          st.slice * static_cast<uint64_t>(end - first), cudaMemcpyDeviceToDevice, stream));
    }
  }
  KESTREL_CUDA_TRY(cudaEventRecord(freed_[b], stream));
  if (i + 2 < layers_.size()) {
    KESTREL_CUDA_TRY(cudaStreamWaitEvent(copy_stream_, freed_[b]));
    KESTREL_TRY(enqueue_copy(i + 2));
  }
  return layer.weights;
}

}  // namespace kestrel::gpu
