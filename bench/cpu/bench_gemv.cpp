// CPU GEMV bandwidth at the 35B-A3B expert and projection shapes, as a ratio to a plain read of the same bytes, same
// threads, same run. The weights are one stack of 256 MiB (8× this machine's L3 or more), walked in full per
// iteration, so every byte comes from DRAM:
//
//   BM_Gemv/<type>/<shape>/<batch>/<threads>/<act>   y = W x over the whole stack (MatmulRunner on a WorkerPool)
//
// shape 0: ffn_gate/up_exps rows (n_in 2048: also attn_qkv, attn_gate, attn_q/k/v, the shared expert, lm_head);
// shape 1: ffn_down_exps rows (n_in 512); shape 2: ssm_out / attn_output rows (n_in 4096); shape 3: the stack as
// 512 × 2048 expert matrices (590 KB in Q4_0) visited in a shuffled order, one task each in one job (a MoE layer's
// access pattern), the read visiting the same regions in the same order. act 0: f32 activations,
// 1: int8 activations (the engine's default; the same as 0 for a type the level has no int8 kernel for).
// Every iteration times the GEMV and then a plain read of the same stack by the same pool in the same 16 KiB items
// (uint64 words summed), so a shared machine's drift hits both: counters are the medians over iterations of GB/s
// (weight bytes per second), read GB/s and read_ratio (the GEMV's GB/s over the read's, pair by pair), and
// cpu_ratio, the same ratio of the process's CPU time — on a machine shared with other work, where a wall-clock
// interval also holds other processes' time slices, the figure that says whether the kernel keeps up with the
// memory (the pool's spinning counts in both). Blocks hold random quants with a fixed, normal scale (no denormals).
//
// Build and run (Release, your own build directory):
//   cmake -S . -B build/<dir> -G Ninja -DCMAKE_BUILD_TYPE=Release -DKESTREL_BENCH=ON -DKESTREL_CUDA=OFF
//   cmake --build build/<dir> --target bench_cpu_gemv && build/<dir>/bin/bench_cpu_gemv
//
//   BM_GemvInCache/<type>/<n_in>/<batch>   the kernel alone (no pool, no items) on 256 KiB of the same random rows,
//                                          which stay in L2, one thread: its compute rate, counter GB/s = weight
//                                          bytes per second of the thread's CPU time (median of the iterations)
//   BM_GemvInCacheAll/<type>/<n_in>/<batch>/<threads>   the same kernel on every pool thread at once, each on its
//                                          own 256 KiB copy: counter GB/s = all threads' weight bytes per second of
//                                          wall time. Against BM_Gemv at the same threads it says whether the
//                                          many-thread GEMV is bound by memory (in-cache rate far above) or by
//                                          compute with every core busy (frequency licences: rate near it)
//
// KESTREL_CPU_ISA=scalar|avx2|avxvnni lowers the instruction set.
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "bench/cpu/bench_cpu_util.h"
#include "core/gguf/ggml_type.h"
#include "cpu/act_q8.h"
#include "cpu/gemv.h"
#include "cpu/isa.h"
#include "cpu/matmul.h"
#include "cpu/tick.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {
namespace {

using bench::cpu_seconds;
using bench::median;
using bench::pool_for;

constexpr uint64_t kStackBytes = 256ull << 20;
constexpr GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K,
                               GgmlType::kQ6_K, GgmlType::kQ8_0, GgmlType::kBF16};
constexpr int64_t kShapeNIn[] = {2048, 512, 4096};
constexpr int64_t kExpertShape = 3;  // 512 × 2048 matrices of the stack in a shuffled order

// Byte offsets of the f16 scales inside one block, and the block's bytes and elements.
struct BlockShape {
  uint64_t bytes, elems;
  std::vector<uint64_t> scale_offsets;
};

BlockShape block_shape(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0: return {18, 32, {0}};
    case GgmlType::kQ8_0: return {34, 32, {0}};
    case GgmlType::kQ4_K: return {144, 256, {0, 2}};
    case GgmlType::kQ5_K: return {176, 256, {0, 2}};
    case GgmlType::kQ6_K: return {210, 256, {208}};
    default: return {2, 1, {}};  // BF16: random upper halves of f32, made normal below
  }
}

struct Stack {
  std::vector<uint8_t> bytes;
  ref::QuantMatrix view;
};

// Random blocks of type t over bytes [0, n): random quants with a fixed, normal scale (no denormals).
void fill_blocks(GgmlType t, uint8_t* p, uint64_t n) {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    std::memcpy(p + i, &s, 8);
  }
  const BlockShape b = block_shape(t);
  const uint16_t scale = 0x2C00;  // f16 0.0625
  for (uint64_t off = 0; off + b.bytes <= n; off += b.bytes) {
    if (t == GgmlType::kBF16) {
      p[off + 1] = static_cast<uint8_t>((p[off + 1] & 0x80) | 0x3E);  // |w| in [2^-3, 2^-2)
      continue;
    }
    for (uint64_t so : b.scale_offsets) std::memcpy(p + off + so, &scale, 2);
  }
}

// One stack of rows of n_in elements of type t filling kStackBytes.
const Stack& stack_for(GgmlType t, int64_t n_in) {
  static std::map<std::pair<int, int64_t>, std::unique_ptr<Stack>> cache;
  auto& slot = cache[{static_cast<int>(t), n_in}];
  if (slot) return *slot;
  slot = std::make_unique<Stack>();
  const uint64_t row_bytes = *ggml_row_bytes(t, static_cast<uint64_t>(n_in));
  const uint64_t rows = kStackBytes / row_bytes;
  slot->bytes.resize(rows * row_bytes);
  fill_blocks(t, slot->bytes.data(), slot->bytes.size());
  slot->view = ref::QuantMatrix{t, slot->bytes.data(), static_cast<uint64_t>(n_in), rows};
  return *slot;
}

// Sums the bytes of `s` as uint64 words over the pool, in the same 16 KiB blocks the GEMV items use — region after
// region of `region` bytes in the order `order` (empty: the stack front to back); returns seconds.
double read_seconds(const Stack& s, WorkerPool& pool, const std::vector<uint64_t>& order = {}, uint64_t region = 0) {
  const uint64_t block = 16 * 1024;
  const uint64_t per_region = order.empty() ? 0 : region / block;
  const int64_t n_items =
      order.empty() ? static_cast<int64_t>(s.bytes.size() / block) : static_cast<int64_t>(order.size() * per_region);
  static std::vector<uint64_t> sink;
  if (sink.size() < static_cast<size_t>(n_items)) sink.resize(static_cast<size_t>(n_items));
  auto body = [&](int64_t i) {
    const uint64_t u = static_cast<uint64_t>(i);
    const uint8_t* p = order.empty() ? s.bytes.data() + u * block
                                     : s.bytes.data() + order[u / per_region] * region + (u % per_region) * block;
    uint64_t acc[4] = {0, 0, 0, 0};
    for (uint64_t o = 0; o < block; o += 32) {
      for (int j = 0; j < 4; ++j) {
        uint64_t w;
        std::memcpy(&w, p + o + 8 * static_cast<uint64_t>(j), 8);
        acc[j] += w;
      }
    }
    sink[static_cast<size_t>(i)] = acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
  };
  const auto t0 = std::chrono::steady_clock::now();
  pool.for_each(n_items, body);
  benchmark::DoNotOptimize(sink.data());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_Gemv(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const bool experts = state.range(1) == kExpertShape;
  const int64_t n_in = experts ? 2048 : kShapeNIn[state.range(1)];
  const int64_t batch = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const GemvInput act = state.range(4) == 1 ? GemvInput::kQ8 : GemvInput::kF32;
  const Stack& s = stack_for(type, n_in);
  std::vector<float> x(static_cast<size_t>(batch * n_in));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) / 500.0f - 1.0f;
  std::vector<float> y(static_cast<size_t>(batch) * s.view.n_out);
  WorkerPool& pool = pool_for(threads);
  MatmulRunner mm(pool, isa_selected(), act);
  // The whole stack as one matrix, or (the expert shape) as matrices of 512 rows in a shuffled order, one task each,
  // all in one job — what a MoE layer's job looks like, each expert somewhere else in memory.
  std::vector<GemvTask> t;
  std::vector<uint64_t> order;
  uint64_t region = 0;
  if (experts) {
    constexpr uint64_t kRows = 512;
    region = kRows * *ggml_row_bytes(type, s.view.n_in);
    for (uint64_t e = 0; e < s.view.n_out / kRows; ++e) order.push_back(e);
    std::mt19937_64 rng(29);
    std::shuffle(order.begin(), order.end(), rng);
    for (uint64_t e : order) {
      const ref::QuantMatrix m{type, s.view.data + e * region, s.view.n_in, kRows};
      t.push_back(task_of(m, x.data(), batch, y.data() + static_cast<size_t>(e * kRows * batch)));
    }
  } else {
    t.push_back(task_of(s.view, x.data(), batch, y.data()));
  }
  mm.run(t);  // warm-up: pages, scratch
  read_seconds(s, pool, order, region);
  const double bytes = experts ? static_cast<double>(order.size() * region) : static_cast<double>(s.bytes.size());
  std::vector<double> gemv_gbps, read_gbps, ratio, cpu_ratio;
  for (auto _ : state) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    mm.run(t);
    benchmark::DoNotOptimize(y.data());
    const double g = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double c1 = cpu_seconds();
    state.SetIterationTime(g);
    const double r = read_seconds(s, pool, order, region);
    const double c2 = cpu_seconds();
    gemv_gbps.push_back(bytes / g / 1e9);
    read_gbps.push_back(bytes / r / 1e9);
    ratio.push_back(r / g);
    cpu_ratio.push_back((c2 - c1) / (c1 - c0));
  }
  state.counters["GB/s"] = median(gemv_gbps);
  state.counters["read_GB/s"] = median(read_gbps);
  state.counters["read_ratio"] = median(ratio);
  state.counters["cpu_ratio"] = median(cpu_ratio);
  const bool int8 = gemv_kernel(isa_selected(), type, act).input != GemvInput::kF32;
  state.SetLabel(std::string(ggml_type_name(type)) + (experts ? " experts 512 x " : " n_in ") + std::to_string(n_in) +
                 " batch " + std::to_string(batch) + " " + std::string(isa_name(isa_selected())) +
                 (int8 ? " int8" : " f32"));
}

void gemv_args(benchmark::internal::Benchmark* b) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> sweep = {1};
  for (int t = 2; t < hw; t *= 2) sweep.push_back(t);
  if (hw > 1) sweep.push_back(hw);
  for (int64_t type = 0; type < static_cast<int64_t>(std::size(kTypes)); ++type) {
    for (int64_t shape = 0; shape <= kExpertShape; ++shape) {
      for (int64_t batch : {1, 8}) {
        for (int t : sweep) {
          for (int64_t act : {1, 0}) b->Args({type, shape, batch, t, act});
        }
      }
    }
  }
  b->ArgNames({"type", "shape", "batch", "threads", "act"});
}

BENCHMARK(BM_Gemv)->Apply(gemv_args)->Unit(benchmark::kMillisecond)->UseManualTime()->MinTime(0.5);

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// One in-cache GEMV of the int8 kernel for `type`: 256 KiB of random rows of n_in elements, `batch` fixed vectors
// quantized as the kernel reads them, and the output.
struct InCacheGemv {
  GemvKernel kernel;
  int64_t rows = 0;
  uint64_t row_bytes = 0;
  std::vector<uint8_t> w;
  std::vector<float> x, y;
  ActQ8Buffer buf;
  GemvTask task;

  InCacheGemv(GgmlType type, int64_t n_in, int64_t batch) : kernel(gemv_kernel(isa_selected(), type, GemvInput::kQ8)) {
    row_bytes = *ggml_row_bytes(type, static_cast<uint64_t>(n_in));
    const uint64_t n_out = (256 * 1024 / row_bytes) / 4 * 4;
    rows = static_cast<int64_t>(n_out);
    w.resize(n_out * row_bytes);
    fill_blocks(type, w.data(), w.size());
    x.resize(static_cast<size_t>(batch * n_in));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) / 500.0f - 1.0f;
    y.resize(static_cast<size_t>(batch) * n_out);
    task = task_of(ref::QuantMatrix{type, w.data(), static_cast<uint64_t>(n_in), n_out}, x.data(), batch, y.data());
    const GemvInput in = kernel.input;
    task.xq = buf.reserve(batch, n_in, ActQ8Forms{in == GemvInput::kQ8, in == GemvInput::kQ8K});
    if (in == GemvInput::kQ8) act_q8_quantize(x.data(), n_in, 0, batch, buf);
    if (in == GemvInput::kQ8K) act_q8k_quantize(x.data(), n_in, 0, batch, buf);
  }
  InCacheGemv(const InCacheGemv&) = delete;
  InCacheGemv& operator=(const InCacheGemv&) = delete;

  void run(int times) {
    for (int i = 0; i < times; ++i) kernel.fn(task, 0, rows);
    benchmark::DoNotOptimize(y.data());
  }
  double bytes() const { return static_cast<double>(rows) * static_cast<double>(row_bytes); }
  std::string label(GgmlType type, int64_t n_in, int64_t batch) const {
    return std::string(ggml_type_name(type)) + " n_in " + std::to_string(n_in) + " batch " + std::to_string(batch) +
           " " + std::string(isa_name(isa_selected())) + (kernel.input != GemvInput::kF32 ? " int8" : " f32");
  }
};

void BM_GemvInCache(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int64_t n_in = state.range(1), batch = state.range(2);
  InCacheGemv g(type, n_in, batch);
  g.run(10);  // into L1/L2
  std::vector<double> gbps;
  for (auto _ : state) {
    const double c0 = thread_cpu_seconds();
    g.run(20);
    gbps.push_back(20.0 * g.bytes() / (thread_cpu_seconds() - c0) / 1e9);
  }
  state.counters["GB/s"] = median(gbps);
  state.SetLabel(g.label(type, n_in, batch));
}

BENCHMARK(BM_GemvInCache)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {512, 2048}, {1, 2, 3, 8}})
    ->ArgNames({"type", "n_in", "batch"})
    ->Unit(benchmark::kMillisecond);

void BM_GemvInCacheAll(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int64_t n_in = state.range(1), batch = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  std::vector<std::unique_ptr<InCacheGemv>> copies;  // one per thread
  for (int i = 0; i < threads; ++i) copies.push_back(std::make_unique<InCacheGemv>(type, n_in, batch));
  int reps = 10;
  auto body = [&](int64_t i) { copies[static_cast<size_t>(i)]->run(reps); };
  WorkerPool& pool = pool_for(threads);
  pool.for_each(threads, body);  // into each core's L2
  reps = 20;
  std::vector<double> gbps;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.for_each(threads, body);
    const double g = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gbps.push_back(static_cast<double>(threads) * reps * copies[0]->bytes() / g / 1e9);
  }
  state.counters["GB/s"] = median(gbps);
  state.SetLabel(copies[0]->label(type, n_in, batch) + ", " + std::to_string(threads) + " threads");
}

void in_cache_all_args(benchmark::internal::Benchmark* b) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int64_t type : {0, 1, 4}) {
    for (int64_t batch : {1, 8}) {
      for (int t : {1, hw}) b->Args({type, 2048, batch, t});
    }
  }
  b->ArgNames({"type", "n_in", "batch", "threads"});
}

BENCHMARK(BM_GemvInCacheAll)->Apply(in_cache_all_args)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kestrel::cpu

BENCHMARK_MAIN();
