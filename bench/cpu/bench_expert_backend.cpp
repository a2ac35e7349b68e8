// The CPU ExpertBackend (cpu/expert_backend.h) at the 35B-A3B expert shapes — 256 experts, 8 used per token,
// H = 2048, I = 512 — with every expert on the host, as a ratio to a plain read of the bytes the batch's tokens touch,
// measured in the same run:
//
//   BM_ExpertBackend/<type>/<tokens>/<threads>/<act>/<warm>
//
// type 0: Q4_0, 1: Q4_K (gate, up and down alike; 453 MB of experts either way). tokens: 1, 8, 32 (a decode tick of
// that many sessions). act 1: int8 activations (the default), 0: f32. Each batch goes through run() on the calling
// thread, as the hybrid engine's hand-off thread calls it. warm 0: the backend's workers are asleep when the batch
// starts (a batch after an idle pause); warm 1: the timed batch follows another batch (other experts) by ~60 µs,
// the backend's workers still spinning, as a decode step's layers follow one another in the hybrid engine.
//
// Each iteration draws a fresh routing (8 distinct experts per token, uniform over the 256, positive weights summing
// to 1), evicts the caches (a 96 MiB read, three times L3 here), sleeps 5 ms (so every pool's workers are asleep, as
// neither phase then shares the cores with the other's spinning; with warm 1 it then runs an untimed batch of another
// routing) and times the batch; then evicts, sleeps and times
// a plain read of the touched experts' gate, up and down slices — the bytes the batch must read — by a pool of the
// same thread count in the same 16 KiB items (uint64 words summed). Counters are medians over 30 iterations:
// read_ratio (read time / batch time, pair by pair; 1.0 = the batch runs at the speed of reading its weights),
// cpu_ratio (the same in process CPU time: on a shared machine a wall interval also holds other processes' slices),
// GB/s (touched bytes / batch time), read_GB/s, us (batch time), touched_MB, experts (distinct experts touched).
// Weights are random blocks with a fixed normal scale (no denormals), built in memory.
//
// Build and run (Release):
//   cmake --preset release -DKESTREL_CUDA=OFF && cmake --build build/release --target bench_cpu_expert_backend
//   build/release/bin/bench_cpu_expert_backend
// KESTREL_CPU_ISA=scalar|avx2 lowers the instruction set.
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "bench/cpu/bench_cpu_util.h"
#include "core/engine/expert_backend.h"
#include "core/gguf/ggml_type.h"
#include "core/reference/moe.h"
#include "cpu/expert_backend.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {
namespace {

using bench::cpu_seconds;
using bench::median;
using bench::pool_for;

constexpr int32_t kExperts = 256, kUsed = 8, kHidden = 2048, kInter = 512;
constexpr GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_K};
constexpr uint64_t kItemBytes = 16 * 1024;
constexpr uint64_t kEvictBytes = 96ull << 20;

// One expert tensor {n_in, n_out, kExperts} of random blocks of `type`.
struct Stack {
  std::vector<uint8_t> bytes;
  ref::QuantExperts view;
  uint64_t expert_bytes = 0;  // one expert's slice
};

Stack make_stack(GgmlType type, uint64_t n_in, uint64_t n_out, uint64_t seed) {
  Stack s;
  const uint64_t row_bytes = *ggml_row_bytes(type, n_in);
  s.expert_bytes = row_bytes * n_out;
  s.bytes.resize(s.expert_bytes * kExperts);
  uint64_t x = seed;
  for (size_t i = 0; i + 8 <= s.bytes.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(s.bytes.data() + i, &x, 8);
  }
  // The f16 scales (Q4_0: d at 0 of 18 bytes; Q4_K: d and dmin at 0 and 2 of 144) set to 0.0625.
  const uint64_t block = type == GgmlType::kQ4_0 ? 18 : 144;
  const uint16_t scale = 0x2C00;
  for (uint64_t off = 0; off + block <= s.bytes.size(); off += block) {
    std::memcpy(s.bytes.data() + off, &scale, 2);
    if (type == GgmlType::kQ4_K) std::memcpy(s.bytes.data() + off + 2, &scale, 2);
  }
  s.view = ref::QuantExperts{type, s.bytes.data(), n_in, n_out, kExperts};
  return s;
}

// The three expert tensors of one layer of a type, built once.
struct Layer {
  Stack gate, up, down;
};
const Layer& layer_for(GgmlType type) {
  static std::map<int, std::unique_ptr<Layer>> cache;
  auto& l = cache[static_cast<int>(type)];
  if (!l) {
    l = std::make_unique<Layer>();
    l->gate = make_stack(type, kHidden, kInter, 0x9E3779B97F4A7C15ull);
    l->up = make_stack(type, kHidden, kInter, 0xD1B54A32D192ED03ull);
    l->down = make_stack(type, kInter, kHidden, 0x8CB92BA72F3D8DD7ull);
  }
  return *l;
}

// Sums `regions` (each a whole number of kItemBytes) as uint64 words over the pool in kItemBytes items.
void read_regions(const std::vector<const uint8_t*>& regions, uint64_t region_bytes, WorkerPool& pool) {
  const uint64_t per_region = region_bytes / kItemBytes;
  const int64_t n_items = static_cast<int64_t>(regions.size() * per_region);
  static std::vector<uint64_t> sink;
  if (sink.size() < static_cast<size_t>(n_items)) sink.resize(static_cast<size_t>(n_items));
  auto body = [&](int64_t i) {
    const uint64_t u = static_cast<uint64_t>(i);
    const uint8_t* p = regions[u / per_region] + (u % per_region) * kItemBytes;
    uint64_t acc[4] = {0, 0, 0, 0};
    for (uint64_t o = 0; o < kItemBytes; o += 32) {
      for (int j = 0; j < 4; ++j) {
        uint64_t w;
        std::memcpy(&w, p + o + 8 * static_cast<uint64_t>(j), 8);
        acc[j] += w;
      }
    }
    sink[static_cast<size_t>(i)] = acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
  };
  pool.for_each(n_items, body);
  benchmark::DoNotOptimize(sink.data());
}

// Evicts the caches (a read of kEvictBytes), then lets every pool's workers fall asleep.
void evict_and_settle(WorkerPool& pool) {
  static std::vector<uint8_t> junk(kEvictBytes, 1);
  read_regions({junk.data()}, kEvictBytes, pool);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void BM_ExpertBackend(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int32_t tokens = static_cast<int32_t>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  const CpuActivations act = state.range(3) == 1 ? CpuActivations::kInt8 : CpuActivations::kF32;
  const bool warm = state.range(4) == 1;
  const Layer& layer = layer_for(type);

  ref::MoeWeights w;
  w.n_expert_used = kUsed;
  w.gate_exps = layer.gate.view;
  w.up_exps = layer.up.view;
  w.down_exps = layer.down.view;
  ExpertSet set;
  set.held = {std::vector<uint8_t>(kExperts, 1)};
  CpuExpertBackendOptions o;
  o.threads = threads;
  o.activations = act;
  o.populate = false;  // the stacks are in memory already
  auto made = make_cpu_expert_backend({w}, set, o);
  if (!made) {
    state.SkipWithError(made.error().to_string().c_str());
    return;
  }
  CpuExpertBackend& be = **made;
  WorkerPool& pool = pool_for(threads);

  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens) * kHidden), y(x.size());
  for (float& v : x) v = normal(rng);
  std::vector<ExpertChoice> choices(static_cast<size_t>(tokens * kUsed));
  std::vector<int32_t> ids(kExperts);
  std::vector<uint8_t> touched(kExperts);
  std::vector<const uint8_t*> regions;
  const ExpertBatch batch{0, tokens, kHidden, kUsed, x.data(), choices.data(), y.data()};
  auto route = [&] {  // a fresh routing, and the slices it touches
    std::fill(touched.begin(), touched.end(), 0);
    for (int32_t t = 0; t < tokens; ++t) {
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      float sum = 0.0f;
      for (int32_t j = 0; j < kUsed; ++j) {
        choices[static_cast<size_t>(t * kUsed + j)] = ExpertChoice{ids[static_cast<size_t>(j)], uniform(rng)};
        sum += choices[static_cast<size_t>(t * kUsed + j)].weight;
        touched[static_cast<size_t>(ids[static_cast<size_t>(j)])] = 1;
      }
      for (int32_t j = 0; j < kUsed; ++j) choices[static_cast<size_t>(t * kUsed + j)].weight /= sum;
    }
    regions.clear();
    for (int32_t e = 0; e < kExperts; ++e) {
      if (touched[static_cast<size_t>(e)] == 0) continue;
      for (const Stack* s : {&layer.gate, &layer.up, &layer.down}) {
        regions.push_back(s->bytes.data() + static_cast<uint64_t>(e) * s->expert_bytes);
      }
    }
  };
  auto compute = [&] { return static_cast<bool>(be.run(batch)); };
  // Warm-up: the backend's scratch grows to this batch size, the pools start.
  route();
  if (!compute()) {
    state.SkipWithError("the batch was refused");
    return;
  }
  read_regions(regions, layer.gate.expert_bytes, pool);

  const uint64_t slice = layer.gate.expert_bytes;  // gate, up and down slices are the same size here
  std::vector<double> ratio, cpu_ratio, gbps, read_gbps, us, mb, experts;
  for (auto _ : state) {
    route();
    evict_and_settle(pool);
    if (warm) {
      compute();  // wakes the workers; the timed batch below reads other experts
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(60);
      route();
      while (std::chrono::steady_clock::now() < spin_until) {
      }
    }
    const double bytes = static_cast<double>(regions.size() * slice);
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    compute();
    const double g = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double c1 = cpu_seconds();
    benchmark::DoNotOptimize(y.data());
    state.SetIterationTime(g);
    evict_and_settle(pool);
    const double c2 = cpu_seconds();
    const auto t1 = std::chrono::steady_clock::now();
    read_regions(regions, slice, pool);
    const double r = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const double c3 = cpu_seconds();
    ratio.push_back(r / g);
    cpu_ratio.push_back((c3 - c2) / (c1 - c0));
    gbps.push_back(bytes / g / 1e9);
    read_gbps.push_back(bytes / r / 1e9);
    us.push_back(g * 1e6);
    mb.push_back(bytes / 1e6);
    experts.push_back(static_cast<double>(regions.size() / 3));
  }
  state.counters["read_ratio"] = median(ratio);
  state.counters["cpu_ratio"] = median(cpu_ratio);
  state.counters["GB/s"] = median(gbps);
  state.counters["read_GB/s"] = median(read_gbps);
  state.counters["us"] = median(us);
  state.counters["touched_MB"] = median(mb);
  state.counters["experts"] = median(experts);
  state.SetLabel(std::string(ggml_type_name(type)) + " " + std::to_string(tokens) + " tokens, " + be.summary());
}

void backend_args(benchmark::internal::Benchmark* b) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> sweep = {1};
  for (int t = 2; t < hw; t *= 2) sweep.push_back(t);
  if (hw > 1) sweep.push_back(hw);
  for (int64_t type = 0; type < static_cast<int64_t>(std::size(kTypes)); ++type) {
    for (int64_t tokens : {1, 8, 32}) {
      for (int t : sweep) {
        b->Args({type, tokens, t, 1, 0});
        if (t == hw) b->Args({type, tokens, t, 0, 0});
      }
      for (int t : {hw - 2, hw}) {  // the hybrid engine's backend leaves two cores to the engine and hand-off threads
        if (t > 0) b->Args({type, tokens, t, 1, 1});
      }
    }
  }
  b->ArgNames({"type", "tokens", "threads", "act", "warm"});
}

BENCHMARK(BM_ExpertBackend)->Apply(backend_args)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(30);

}  // namespace
}  // namespace kestrel::cpu

BENCHMARK_MAIN();
