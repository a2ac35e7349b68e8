// HostExpertLink: the host half of a hybrid MoE layer's hand-off (gpu/kernels/expert_handoff.h holds the device
// half): the mapped pinned buffers and mailbox the device publishes each layer's batch into, and one thread that
// computes every published batch with the ExpertBackend and raises the mailbox's `done`.
//
// While a pass is in flight (between begin_pass() and end_pass()) the thread spins on the mailbox, so a layer's host
// experts start as soon as its routing reaches host memory — no CUDA host function, callback thread or futex wake
// between the device and the backend; outside passes it sleeps. It runs each batch with ExpertBackend::run(): it is
// the backend's calling thread, computing beside the backend's workers. A batch the backend refuses or fails still
// gets its `done` (the device never waits on an error); the error is kept and end_pass() returns it.
//
// Ownership: borrows the backend, which must outlive the link; owns the mapped memory, the device word of sequence
// numbers and the thread (joined by the destructor). Threading: begin_pass() and end_pass() from one thread at a
// time, one pass at a time; the device side is the stream's kernels.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "core/base/expected.h"
#include "core/engine/expert_backend.h"
#include "gpu/kernels/expert_handoff.h"

namespace kestrel::gpu {

class HostExpertLink {
 public:
  // How long a join waits for the host before it gives up (the pass then ends with an error): far beyond any batch a
  // backend computes, short enough that a wedged host surfaces as an error rather than a hung GPU.
  static constexpr uint64_t kJoinTimeoutNs = 60ull * 1000 * 1000 * 1000;

  // Buffers for up to max_rows rows of `hidden` columns with k choices each. kInvalidArgument for sizes < 1;
  // CUDA errors as Error (kResourceExhausted when pinned memory runs out).
  static Expected<std::unique_ptr<HostExpertLink>> create(ExpertBackend& backend, int max_rows, int hidden, int k);
  ~HostExpertLink();
  HostExpertLink(const HostExpertLink&) = delete;
  HostExpertLink& operator=(const HostExpertLink&) = delete;

  // The device pointers the hand-off kernels take.
  const ExpertHandoff& handoff() const { return dev_; }

  // Before a pass's work is enqueued or launched: the thread starts spinning on the mailbox.
  void begin_pass();
  // After the pass's stream has drained: the thread goes back to sleep, and the first error of the pass's batches
  // comes back — the backend's (naming the layer), or kDeadlineExceeded when a join timed out waiting for the host.
  Status end_pass();

  // Since the last take_times(): the batches served, the host's time inside ExpertBackend::run, and the time the
  // device's joins waited for the host (the part of the host's time the device did not cover with its own work).
  // Reads the device's counter: call it after the stream has drained.
  struct Times {
    uint64_t batches = 0;
    uint64_t host_ns = 0;
    uint64_t device_wait_ns = 0;
  };
  Expected<Times> take_times();

 private:
  HostExpertLink(ExpertBackend& backend, int max_rows, int hidden, int k)
      : backend_(backend), max_rows_(max_rows), hidden_(hidden), k_(k) {}
  Status allocate();
  void loop();
  // Computes the batch the mailbox describes and raises done = seq.
  void serve(uint32_t seq);
  void keep_error(Status s);

  ExpertBackend& backend_;
  const int max_rows_, hidden_, k_;

  // Mapped pinned host memory: the mailbox, then x, choices and y; dev_ holds their device pointers and seq.
  void* mapped_ = nullptr;
  ExpertHandoffMailbox* mailbox_ = nullptr;
  float* x_ = nullptr;
  ExpertChoice* choices_ = nullptr;
  float* y_ = nullptr;
  void* dev_words_ = nullptr;  // device memory: the sequence word, then the joins' wait counter
  ExpertHandoff dev_;

  std::thread thread_;
  std::atomic<uint32_t> armed_{0};  // 1 while a pass is in flight (the thread sleeps on it otherwise)
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> batches_{0}, host_ns_{0};
  std::mutex mu_;
  Status error_;  // the first error since the last end_pass()
};

}  // namespace kestrel::gpu
