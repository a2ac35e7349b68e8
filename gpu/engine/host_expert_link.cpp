// HostExpertLink (host_expert_link.h): one mapped pinned allocation, a device sequence word, and the serving thread.
#include "gpu/engine/host_expert_link.h"

#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "core/base/spin.h"
#include "gpu/cuda_check.h"
#include "gpu/memory/scratch_carve.h"

namespace kestrel::gpu {
namespace {

uint32_t load_acquire(uint32_t& word) { return std::atomic_ref<uint32_t>(word).load(std::memory_order_acquire); }

}  // namespace

Expected<std::unique_ptr<HostExpertLink>> HostExpertLink::create(ExpertBackend& backend, int max_rows, int hidden,
                                                                 int k) {
  if (max_rows < 1 || hidden < 4 || hidden % 4 != 0 || k < 1) {
    return make_error(ErrorCode::kInvalidArgument, "host expert link: " + std::to_string(max_rows) + " rows, " +
                                                       std::to_string(hidden) + " columns, k " + std::to_string(k));
  }
  std::unique_ptr<HostExpertLink> link(new HostExpertLink(backend, max_rows, hidden, k));
  KESTREL_TRY(link->allocate());
  link->thread_ = std::thread([p = link.get()] { p->loop(); });
  return link;
}

Status HostExpertLink::allocate() {
  // One mapped allocation: the mailbox, then x, choices and y, carved alike over its host and device addresses.
  const size_t rows_bytes = size_t(max_rows_) * size_t(hidden_) * sizeof(float);
  const size_t choices_bytes = size_t(max_rows_) * size_t(k_) * sizeof(ExpertChoice);
  const auto carve = [&](void* base, ExpertHandoffMailbox** mailbox, float** x, ExpertChoice** choices, float** y) {
    ScratchCarve c(base);
    *mailbox = c.take<ExpertHandoffMailbox>(sizeof(ExpertHandoffMailbox));
    *x = c.take<float>(rows_bytes);
    *choices = c.take<ExpertChoice>(choices_bytes);
    *y = c.take<float>(rows_bytes);
    return c.bytes();
  };
  ExpertHandoffMailbox* m = nullptr;
  float *x = nullptr, *y = nullptr;
  ExpertChoice* ch = nullptr;
  const size_t total = carve(nullptr, &m, &x, &ch, &y);
  KESTREL_CUDA_TRY(cudaHostAlloc(&mapped_, total, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(mapped_, 0, total);
  (void)carve(mapped_, &mailbox_, &x_, &choices_, &y_);
  mailbox_ = new (mailbox_) ExpertHandoffMailbox();
  void* dev = nullptr;
  KESTREL_CUDA_TRY(cudaHostGetDevicePointer(&dev, mapped_, 0));
  (void)carve(dev, &dev_.mailbox, &dev_.x, &dev_.choices, &y);
  dev_.y = y;
  KESTREL_CUDA_TRY(cudaMalloc(&dev_words_, 16));
  KESTREL_CUDA_TRY(memset_synced(dev_words_, 0, 16));
  dev_.seq = static_cast<uint32_t*>(dev_words_);
  dev_.wait_ns = reinterpret_cast<unsigned long long*>(static_cast<uint8_t*>(dev_words_) + 8);
  return ok_status();
}

HostExpertLink::~HostExpertLink() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    armed_.store(1, std::memory_order_release);
    armed_.notify_one();
    thread_.join();
  }
  if (mapped_ != nullptr) cudaFreeHost(mapped_);
  if (dev_words_ != nullptr) cudaFree(dev_words_);
}

void HostExpertLink::begin_pass() {
  armed_.store(1, std::memory_order_release);
  armed_.notify_one();
}

Status HostExpertLink::end_pass() {
  armed_.store(0, std::memory_order_release);
  Status s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s = std::exchange(error_, ok_status());
  }
  std::atomic_ref<uint32_t> timed_out(mailbox_->timed_out);
  if (timed_out.exchange(0, std::memory_order_acq_rel) != 0 && s) {
    s = make_error(ErrorCode::kDeadlineExceeded, "hybrid MoE: the host expert backend did not answer a layer within " +
                                                     std::to_string(kJoinTimeoutNs / 1000000000ull) +
                                                     " s; the pass's output is void");
  }
  return s;
}

Expected<HostExpertLink::Times> HostExpertLink::take_times() {
  Times t;
  unsigned long long wait = 0;
  KESTREL_CUDA_TRY(memcpy_synced(&wait, dev_.wait_ns, sizeof(wait), cudaMemcpyDeviceToHost));
  KESTREL_CUDA_TRY(memset_synced(dev_.wait_ns, 0, sizeof(wait)));
  t.device_wait_ns = wait;
  t.batches = batches_.exchange(0, std::memory_order_relaxed);
  t.host_ns = host_ns_.exchange(0, std::memory_order_relaxed);
  return t;
}

void HostExpertLink::keep_error(Status s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (error_) error_ = std::move(s);
}

void HostExpertLink::serve(uint32_t seq) {
  // The acquire load of `request` that returned seq makes the device's rows, choices, layer and n_tokens visible.
  const int32_t layer = mailbox_->layer;
  const int32_t n = mailbox_->n_tokens;
  if (n < 1 || n > max_rows_) {
    keep_error(make_error(ErrorCode::kInternal, "hybrid MoE: layer " + std::to_string(layer) + " published " +
                                                    std::to_string(n) + " rows (1.." + std::to_string(max_rows_) +
                                                    ")"));
  } else {
    ExpertBatch b;
    b.layer = layer;
    b.n_tokens = n;
    b.hidden = hidden_;
    b.k = k_;
    b.x = x_;
    b.choices = choices_;
    b.y = y_;
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = backend_.run(b);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
    host_ns_.fetch_add(static_cast<uint64_t>(ns.count()), std::memory_order_relaxed);
    batches_.fetch_add(1, std::memory_order_relaxed);
    if (!s) keep_error(s);
  }
  // run() returned: its workers' writes of y happen before this release, which the device's join acquires.
  std::atomic_ref<uint32_t>(mailbox_->done).store(seq, std::memory_order_release);
}

void HostExpertLink::loop() {
  uint32_t served = 0;
  for (;;) {
    armed_.wait(0, std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    while (armed_.load(std::memory_order_acquire) != 0 && !stop_.load(std::memory_order_relaxed)) {
      const uint32_t s = load_acquire(mailbox_->request);
      if (s != served) {
        serve(s);
        served = s;
      } else {
        cpu_relax();
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;
  }
}

}  // namespace kestrel::gpu
