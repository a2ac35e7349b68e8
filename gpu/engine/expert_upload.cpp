// ExpertUpload (expert_upload.h).
#include "gpu/engine/expert_upload.h"

#include <algorithm>
#include <cstring>
#include <map>
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

uint64_t ExpertUpload::device_bytes_for(const PlannerModel& model) {
  // A staging buffer holds a layer's stacks each from a kPoolAlignment boundary, as create() lays them out.
  std::map<int32_t, uint64_t> by_layer;
  for (const PlannerTensor& t : model.tensors) {
    if (t.placement == PlacementClass::kRoutedExperts) by_layer[t.layer] += align_up(t.bytes, kPoolAlignment);
  }
  uint64_t largest = 0;
  for (const auto& [layer, bytes] : by_layer) largest = std::max(largest, bytes);
  return 3 * largest;
}

Expected<std::unique_ptr<ExpertUpload>> ExpertUpload::create(const DeviceModel& model, int copy_threads) {
  if (copy_threads < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "expert upload: " + std::to_string(copy_threads) + " copy threads (at least 1)");
  }
  std::unique_ptr<ExpertUpload> u(new ExpertUpload());
  for (size_t l = 0; l < model.layers().size(); ++l) {
    const DeviceFfnLayer& f = model.layers()[l].ffn;
    if (!f.hybrid() || !f.moe_tiled) continue;
    Layer layer;
    layer.index = l;
    u->direct_ = u->direct_ && f.host_pinned;
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
  KESTREL_CUDA_TRY(cudaGetDevice(&u->device_id_));
  KESTREL_CUDA_TRY(cudaMalloc(&u->device_, 3 * u->raw_bytes_));
  auto* d = static_cast<uint8_t*>(u->device_);
  u->raw_ = {d, d + u->raw_bytes_};
  u->tiled_ = d + 2 * u->raw_bytes_;
  if (!u->direct_) {
    KESTREL_CUDA_TRY(cudaMallocHost(&u->pinned_base_, 2 * u->raw_bytes_));
    auto* h = static_cast<uint8_t*>(u->pinned_base_);
    u->pinned_ = {h, h + u->raw_bytes_};
  }
  KESTREL_CUDA_TRY(cudaStreamCreateWithFlags(&u->copy_stream_, cudaStreamNonBlocking));
  for (size_t b = 0; b < 2; ++b) {
    KESTREL_CUDA_TRY(cudaEventCreateWithFlags(&u->moved_[b], cudaEventDisableTiming));
    KESTREL_CUDA_TRY(cudaEventCreateWithFlags(&u->freed_[b], cudaEventDisableTiming));
  }
  KESTREL_CUDA_TRY(cudaEventCreateWithFlags(&u->start_, cudaEventDisableTiming));
  for (Layer& layer : u->layers_) {
    layer.weights.gate_exps = u->tiled_ + layer.stacks[0].offset;
    layer.weights.up_exps = u->tiled_ + layer.stacks[1].offset;
    layer.weights.down_exps = u->tiled_ + layer.stacks[2].offset;
    KESTREL_TRY(moe_imma_check_weights(layer.weights));
  }
  u->copy_threads_ = u->direct_ ? 1 : copy_threads;
  for (int i = 1; i < u->copy_threads_; ++i) u->copiers_.emplace_back(&ExpertUpload::copy_worker, u.get(), i);
  u->filler_ = std::thread(&ExpertUpload::fill_loop, u.get());
  return u;
}

ExpertUpload::~ExpertUpload() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (filler_.joinable()) filler_.join();
  {
    std::lock_guard<std::mutex> lk(copy_mu_);
    copy_quit_ = true;
  }
  copy_cv_.notify_all();
  for (std::thread& t : copiers_) t.join();
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  for (size_t b = 0; b < 2; ++b) {
    if (moved_[b] != nullptr) cudaEventDestroy(moved_[b]);
    if (freed_[b] != nullptr) cudaEventDestroy(freed_[b]);
  }
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (device_ != nullptr) cudaFree(device_);
  if (pinned_base_ != nullptr) cudaFreeHost(pinned_base_);
}

void ExpertUpload::copy_worker(int index) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(copy_mu_);
  for (;;) {
    copy_cv_.wait(lk, [&] { return copy_quit_ || copy_round_ != seen; });
    if (copy_quit_) return;
    seen = copy_round_;
    const auto t = static_cast<uint64_t>(copy_threads_), i = static_cast<uint64_t>(index);
    uint8_t* dst = copy_dst_;
    const uint8_t* src = copy_src_;
    const uint64_t n = copy_n_;
    lk.unlock();
    std::memcpy(dst + n * i / t, src + n * i / t, n * (i + 1) / t - n * i / t);
    lk.lock();
    if (--copy_pending_ == 0) copy_cv_.notify_all();
  }
}

void ExpertUpload::parallel_copy(uint8_t* dst, const uint8_t* src, uint64_t n) {
  const auto t = static_cast<uint64_t>(copy_threads_);
  if (t == 1) {
    std::memcpy(dst, src, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(copy_mu_);
    copy_dst_ = dst;
    copy_src_ = src;
    copy_n_ = n;
    copy_pending_ = copy_threads_ - 1;
    ++copy_round_;
  }
  copy_cv_.notify_all();
  std::memcpy(dst, src, n / t);  // part 0
  std::unique_lock<std::mutex> lk(copy_mu_);
  copy_cv_.wait(lk, [&] { return copy_pending_ == 0; });
}

Status ExpertUpload::fill(size_t i) {
  if (set_device_error_ != cudaSuccess) {
    return make_error(ErrorCode::kInternal,
                      std::string("expert upload: cudaSetDevice: ") + cudaGetErrorString(set_device_error_));
  }
  const Layer& layer = layers_[i];
  const size_t b = i % 2;
  // Bounced: pinned_[b] and raw_[b] last held layer i − 2, whose transfer must be done before the buffer is
  // overwritten. Either way raw_[b] must have been tiled by the pass's stream (stage() recorded freed_[b] before this
  // layer was let through).
  if (!direct_) {
    if (i >= 2) KESTREL_CUDA_TRY(cudaEventSynchronize(moved_[b]));
    for (const Stack& st : layer.stacks) {
      for (const auto& [first, end] : layer.host_runs) {
        const uint64_t at = st.offset + st.slice * static_cast<uint64_t>(first);
        parallel_copy(pinned_[b] + at,
                      static_cast<const uint8_t*>(st.host.data) + st.slice * static_cast<uint64_t>(first),
                      st.slice * static_cast<uint64_t>(end - first));
      }
    }
  }
  if (i >= 2) KESTREL_CUDA_TRY(cudaStreamWaitEvent(copy_stream_, freed_[b]));
  for (const Stack& st : layer.stacks) {
    for (const auto& [first, end] : layer.host_runs) {
      const uint64_t at = st.offset + st.slice * static_cast<uint64_t>(first);
      const uint8_t* from = direct_
                                ? static_cast<const uint8_t*>(st.host.data) + st.slice * static_cast<uint64_t>(first)
                                : pinned_[b] + at;
      KESTREL_CUDA_TRY(cudaMemcpyAsync(raw_[b] + at, from, st.slice * static_cast<uint64_t>(end - first),
                                       cudaMemcpyHostToDevice, copy_stream_));
    }
  }
  KESTREL_CUDA_TRY(cudaEventRecord(moved_[b], copy_stream_));
  return ok_status();
}

void ExpertUpload::fill_loop() {
  set_device_error_ = cudaSetDevice(device_id_);  // fill() reports a failure in every pass
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    // Layer i = enqueued_ may go once layer i − 2 is staged (its buffers free).
    cv_.wait(lk, [&] {
      return quit_ || (in_pass_ && !stop_ && enqueued_ < layers_.size() && (enqueued_ < 2 || staged_ + 1 >= enqueued_));
    });
    if (quit_) return;
    const size_t i = enqueued_;
    filling_ = true;
    lk.unlock();
    Status s = fill(i);
    lk.lock();
    filling_ = false;
    if (s) {
      enqueued_ = i + 1;
    } else {
      fill_error_ = std::move(s);
      stop_ = true;
    }
    cv_.notify_all();
  }
}

Status ExpertUpload::begin(cudaStream_t stream) {
  KESTREL_CUDA_TRY(cudaEventRecord(start_, stream));
  KESTREL_CUDA_TRY(cudaStreamWaitEvent(copy_stream_, start_));
  {
    std::lock_guard<std::mutex> lk(mu_);
    next_ = enqueued_ = staged_ = 0;
    stop_ = false;
    fill_error_ = ok_status();
    in_pass_ = true;
  }
  cv_.notify_all();
  return ok_status();
}

Expected<MoeImmaWeights> ExpertUpload::stage(size_t l, cudaStream_t stream) {
  size_t i = 0;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!in_pass_ || next_ >= layers_.size() || layers_[next_].index != l) {
      return make_error(ErrorCode::kInvalidArgument,
                        "expert upload: layer " + std::to_string(l) + " staged out of turn");
    }
    i = next_;
    cv_.wait(lk, [&] { return enqueued_ > i || stop_; });
    if (enqueued_ <= i) {
      if (!fill_error_) return fill_error_.error();
      return make_error(ErrorCode::kCancelled, "expert upload: the pass was ended");
    }
    ++next_;
  }
  const Layer& layer = layers_[i];
  const size_t b = i % 2;
  KESTREL_CUDA_TRY(cudaStreamWaitEvent(stream, moved_[b]));
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    staged_ = i + 1;
  }
  cv_.notify_all();
  return layer.weights;
}

Status ExpertUpload::end() {
  Status err = ok_status();
  {
    std::unique_lock<std::mutex> lk(mu_);
    stop_ = true;
    cv_.wait(lk, [&] { return !filling_; });
    in_pass_ = false;
    err = std::exchange(fill_error_, ok_status());
  }
  KESTREL_CUDA_TRY(cudaStreamSynchronize(copy_stream_));
  return err;
}

}  // namespace kestrel::gpu
