// WorkerPool (worker_pool.h): a job counter, a cursor per share, an item counter and a done counter, std::atomics.
#include "cpu/worker_pool.h"

#include <pthread.h>
#include <sched.h>

#include <fstream>
#include <set>
#include <string>

#include "core/base/spin.h"

namespace kestrel::cpu {
namespace {

// The lowest CPU listed in a sysfs list such as "0,64" or "0-1".
int first_cpu_of(const std::string& list) { return std::stoi(list); }

// The allowed CPUs (ascending) and each one's core representative: its first sibling when that is allowed, else
// itself. core_of is empty when the topology cannot be read.
void topology(std::vector<int>* allowed, std::vector<int>* core_of) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) allowed->push_back(c);
    }
  }
  for (int c : *allowed) {
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/thread_siblings_list");
    std::string list;
    if (!(f >> list)) {
      core_of->clear();
      return;
    }
    const int first = first_cpu_of(list);
    core_of->push_back(CPU_ISSET(first, &set) ? first : c);
  }
}

}  // namespace

std::vector<int> physical_core_cpus() {
  std::vector<int> allowed, core_of;
  topology(&allowed, &core_of);
  if (core_of.empty()) return allowed;
  const std::set<int> firsts(core_of.begin(), core_of.end());
  return std::vector<int>(firsts.begin(), firsts.end());
}

std::vector<int> pin_order_of(const std::vector<int>& allowed, const std::vector<int>& core_of) {
  if (core_of.size() != allowed.size()) return allowed;
  std::vector<int> order, rest;
  for (size_t i = 0; i < allowed.size(); ++i) (allowed[i] == core_of[i] ? order : rest).push_back(allowed[i]);
  order.insert(order.end(), rest.begin(), rest.end());
  return order;
}

std::vector<int> pin_order() {
  std::vector<int> allowed, core_of;
  topology(&allowed, &core_of);
  return pin_order_of(allowed, core_of);
}

Expected<std::unique_ptr<WorkerPool>> WorkerPool::create(int n_threads, bool pin) {
  if (n_threads < 0) {
    return make_error(ErrorCode::kInvalidArgument, "worker pool: negative thread count " + std::to_string(n_threads));
  }
  std::unique_ptr<WorkerPool> pool(new WorkerPool(static_cast<size_t>(n_threads) + 1));
  const std::vector<int> cpus = pin ? pin_order() : std::vector<int>();
  for (int i = 0; i < n_threads; ++i) {
    pool->threads_.emplace_back([p = pool.get(), i] { p->worker_loop(i); });
    if (!cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[static_cast<size_t>(i + 1) % cpus.size()], &set);  // the first core is the caller's
      (void)pthread_setaffinity_np(pool->threads_.back().native_handle(), sizeof(set), &set);
    }
  }
  return pool;
}

WorkerPool::~WorkerPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool WorkerPool::claim(uint32_t gen, size_t s, int64_t* item) {
  std::atomic<uint64_t>& cursor = shares_[s].cursor;
  uint64_t v = cursor.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(v >> 32) != gen) return false;  // a later job: this one has no items left
    const int64_t i = static_cast<int64_t>(v & 0xFFFFFFFFu);
    if (i >= share_begin(s + 1, n_items_.load(std::memory_order_acquire))) return false;
    if (cursor.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      *item = i;
      return true;
    }
  }
}

void WorkerPool::take_items(uint32_t gen, size_t own) {
  int64_t item = 0;
  int64_t done = 0;
  int64_t n = 0;
  for (size_t k = 0; k < shares_.size(); ++k) {
    const size_t s = (own + k) % shares_.size();
    while (claim(gen, s, &item)) {
      // A claimed item keeps job `gen` unfinished, so job_ cannot be replaced while it runs.
      n = job_.n_items;
      job_.fn(job_.ctx, item);
      ++done;
    }
  }
  if (done > 0 && items_done_.fetch_add(done, std::memory_order_acq_rel) + done == n) {
    finished_.store(1, std::memory_order_release);
    finished_.notify_all();
  }
}

void WorkerPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
      cpu_relax();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    take_items(static_cast<uint32_t>(g), static_cast<size_t>(index) + 1);
  }
}

void WorkerPool::submit(const Job& job) {
  const uint64_t g = generation_.load(std::memory_order_relaxed) + 1;
  // The cursors move to the new generation first, closing the finished job: a late worker of that job may still be
  // inside claim() with the old generation, and must not pair an old cursor with the new n_items_ (it would claim
  // an item of the new job under the old generation, running it twice and before job_ is published). n_items_ is
  // stored with release after this, so a claim that reads the new count also sees the new cursors and fails.
  for (size_t s = 0; s < shares_.size(); ++s) {
    shares_[s].cursor.store((g << 32) | static_cast<uint64_t>(share_begin(s, job.n_items)), std::memory_order_relaxed);
  }
  job_ = job;
  items_done_.store(0, std::memory_order_relaxed);
  finished_.store(job.n_items > 0 ? 0 : 1, std::memory_order_relaxed);
  n_items_.store(job.n_items, std::memory_order_release);
  generation_.store(g, std::memory_order_release);  // publishes job_ to the workers that wake for generation g
  generation_.notify_all();
}

void WorkerPool::wait() {
  for (int spin = 0; spin < kSpinIterations; ++spin) {
    if (finished_.load(std::memory_order_acquire) != 0) return;
    cpu_relax();
  }
  while (finished_.load(std::memory_order_acquire) == 0) finished_.wait(0, std::memory_order_acquire);
}

void WorkerPool::run(const Job& job) {
  submit(job);
  take_items(static_cast<uint32_t>(generation_.load(std::memory_order_relaxed)), 0);
  wait();
}

}  // namespace kestrel::cpu
