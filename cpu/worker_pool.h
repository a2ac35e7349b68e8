// WorkerPool: a fixed set of pinned threads that run one job at a time, a job being n work items of a fixed
// partition (a range of output rows, an expert, ...), each item run entirely by one thread. Which thread takes an
// item varies from run to run; what an item computes does not, so results do not depend on the thread count as long
// as items write disjoint outputs with their own fixed reduction order.
//
// The items are split into one contiguous share per participant (the caller of run() and each worker), each share
// with its own cursor on its own cache line: a participant takes its own share's items in order, then items still
// left in the others' shares. Consecutive items are usually neighbouring bytes of one matrix, so a thread streams
// one long range, and claiming an item touches a cache line no other thread writes until the shares run out.
//
// Between jobs each worker spins on the job counter for a short while, then sleeps on it (std::atomic wait, a
// futex), so back-to-back jobs of one step start within microseconds and an idle engine costs no CPU. Nothing is
// allocated per job: a Job is a function pointer and a context pointer.
//
// Threading: submit() and wait() may be called from any one thread at a time (a caller that is not a worker, such
// as a GPU stream's host callback); run() is submit() + the calling thread taking items too + wait(). Only one job
// is in flight: submit() must not be called again before wait() has returned. The destructor joins the workers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "core/base/expected.h"

namespace kestrel::cpu {

struct Job {
  void (*fn)(void* ctx, int64_t item) = nullptr;  // runs item `item` of the job
  void* ctx = nullptr;
  int64_t n_items = 0;
};

class WorkerPool {
 public:
  // n_threads >= 0 workers (0: run() uses the calling thread alone). With `pin`, worker i is bound to CPU i + 1
  // (mod their count) of pin_order(), leaving the first to the caller of run() (a failure to pin is ignored: the
  // thread runs unbound). kInvalidArgument for n < 0.
  static Expected<std::unique_ptr<WorkerPool>> create(int n_threads, bool pin);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int n_threads() const { return static_cast<int>(threads_.size()); }

  void submit(const Job& job);
  void wait();
  void run(const Job& job);

  // Convenience over run(): fn(item) for item in [0, n_items), fn a callable borrowed for the call.
  template <class F>
  void for_each(int64_t n_items, F& fn) {
    Job job;
    job.fn = [](void* ctx, int64_t item) { (*static_cast<F*>(ctx))(item); };
    job.ctx = &fn;
    job.n_items = n_items;
    run(job);
  }

 private:
  explicit WorkerPool(size_t n_shares) : shares_(n_shares) {}
  // A participant's share of a job: one cursor on its own cache line, (job generation << 32) | next unclaimed item
  // of the share [range_begin, range_end).
  struct alignas(64) Share {
    std::atomic<uint64_t> cursor{0};
  };

  void worker_loop(int index);
  // Claims the next item of share `s` for job `gen`; false once that share has none left (or a later job began).
  bool claim(uint32_t gen, size_t s, int64_t* item);
  // Runs items of job `gen`: share `own` first, then what is left of the others', until none is left.
  void take_items(uint32_t gen, size_t own);
  int64_t share_begin(size_t s, int64_t n) const {
    return static_cast<int64_t>(static_cast<uint64_t>(n) * s / shares_.size());
  }

  std::vector<std::thread> threads_;
  Job job_;
  std::atomic<uint64_t> generation_{0};  // bumped by submit(); workers wait for a change
  std::vector<Share> shares_;            // one per participant: the caller of run() (0), then each worker
  std::atomic<int64_t> n_items_{0};
  std::atomic<int64_t> items_done_{0};
  std::atomic<uint32_t> finished_{0};  // 1 once items_done_ reaches n_items (wait() sleeps on it)
  std::atomic<bool> stop_{false};
};

// The logical CPUs this process may run on, one per physical core (the first hyper-thread sibling of each core,
// read from /sys), in ascending order; every allowed CPU when the topology cannot be read.
std::vector<int> physical_core_cpus();

// Every logical CPU this process may run on, in the order threads are pinned: one per physical core first
// (physical_core_cpus()), then the cores' other hyper-threads, so that threads beyond the core count take idle
// hardware threads before two threads share one CPU.
std::vector<int> pin_order();

// pin_order() for a given topology: allowed CPUs (ascending) and, for each, the CPU that stands for its core (the
// first allowed sibling; itself when alone). Pure.
std::vector<int> pin_order_of(const std::vector<int>& allowed, const std::vector<int>& core_of);

}  // namespace kestrel::cpu
