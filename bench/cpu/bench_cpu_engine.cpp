// bench_cpu_engine: the whole CPU engine (cpu/cpu_engine.h) on a GGUF file — decode tokens/s at several session
// counts and prompt tokens/s — each beside its roofline: the bytes the step reads (bench/common/decode_bytes.h) ÷ a
// plain read of a buffer far larger than L3 by the same number of pinned threads, measured in the same run.
//
//   bench_cpu_engine --model M.gguf [--threads N] [--sessions 1,8] [--steps 16] [--prompt 32] [--pp 512]
//                    [--activations int8|f32] [--profile] [--drop-cache]
//
// Decode: B sessions, each first fed a prompt of about `prompt` tokens (session i's is prompt − (i % 8) long, so
// they sit at different positions), then `steps` ticks of one token each, timed around Engine::step() with
// argmax_only items (a greedy request). Prompt: one session's pp-token prompt in one step() (the engine cuts it into
// passes of max_tokens_per_item tokens, each reading the weights once), after one untimed warm-up prompt.
// Every figure is given in wall time and in the process's CPU time: on a machine shared with other work a wall
// interval also holds other processes' time slices, and the CPU-time ratio (the step's CPU seconds against the
// read's for the same bytes, pool threads' spinning included in both) says how close the engine runs to the
// memory when it has its cores. The load average is printed at the start and the end. --profile adds the engine's
// own split of the timed decode steps and of the timed prompt by section (cpu/step_profile.h).
// The engine line says how much of the weights the page cache holds in 2 MiB pages (cpu/populate.h): a file written
// or copied since boot is often cached in 4 KiB pages, which slows the experts several-fold on a VM. --drop-cache
// drops the file's cached pages first (fdatasync, posix_fadvise DONTNEED; pages another process maps stay), so the
// engine reads it from disk into 2 MiB pages — the state of a daemon started on a file not yet cached.
// KESTREL_CPU_ISA=scalar|avx2|avxvnni lowers the instruction set.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/decode_bytes.h"
#include "core/engine/engine.h"
#include "core/model/model.h"
#include "cpu/cpu_engine.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu::bench {
namespace {

struct Args {
  std::string model;
  int threads = 0;
  std::vector<int> sessions = {1, 8};
  int steps = 16;
  int prompt = 32;
  int pp = 512;
  CpuActivations activations = CpuActivations::kInt8;
  bool profile = false;
  bool drop_cache = false;
};

std::vector<int> parse_list(const char* v) {
  std::vector<int> out;
  for (const char* p = v; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--profile" || k == "--drop-cache") {
      (k == "--profile" ? a->profile : a->drop_cache) = true;
      continue;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) return false;
    ++i;
    if (k == "--model") {
      a->model = v;
    } else if (k == "--threads") {
      a->threads = std::atoi(v);
    } else if (k == "--sessions") {
      a->sessions = parse_list(v);
    } else if (k == "--steps") {
      a->steps = std::atoi(v);
    } else if (k == "--prompt") {
      a->prompt = std::atoi(v);
    } else if (k == "--pp") {
      a->pp = std::atoi(v);
    } else if (k == "--activations" && (std::string(v) == "int8" || std::string(v) == "f32")) {
      a->activations = std::string(v) == "int8" ? CpuActivations::kInt8 : CpuActivations::kF32;
    } else {
      return false;
    }
  }
  return !a->model.empty() && a->threads >= 0 && a->steps > 0 && a->prompt > 0 && a->pp >= 0 && !a->sessions.empty() &&
         *std::min_element(a->sessions.begin(), a->sessions.end()) > 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Wall and process CPU seconds of an interval.
struct Interval {
  std::chrono::steady_clock::time_point w0 = std::chrono::steady_clock::now();
  double c0 = cpu_now();
  double wall() const { return seconds_since(w0); }
  double cpu() const { return cpu_now() - c0; }
};

std::string loadavg() {
  char buf[128] = {0};
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string s(buf, n);
  return s.substr(0, s.find(' ', s.find(' ', s.find(' ') + 1) + 1));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct ReadRate {
  double gbps;            // wall
  double cpu_s_per_byte;  // process CPU seconds per byte read
};

// Summing a 256 MiB buffer (8× this VM's L3) as uint64 words, in 16 KiB items over `threads` pinned threads (the
// caller's included): the medians of 7 passes after one that touches the pages.
Expected<ReadRate> plain_read(int threads) {
  constexpr uint64_t kBytes = 256ull << 20, kBlock = 16 * 1024;
  KESTREL_TRY_ASSIGN(std::unique_ptr<WorkerPool> pool, WorkerPool::create(std::max(threads, 1) - 1, true));
  std::vector<uint64_t> words(kBytes / 8);
  for (size_t i = 0; i < words.size(); ++i) words[i] = i * 0x9E3779B97F4A7C15ull;
  const int64_t n_items = static_cast<int64_t>(kBytes / kBlock);
  std::vector<uint64_t> sink(static_cast<size_t>(n_items));
  auto body = [&](int64_t i) {
    const uint64_t* p = words.data() + static_cast<uint64_t>(i) * (kBlock / 8);
    uint64_t acc[4] = {0, 0, 0, 0};
    for (uint64_t o = 0; o < kBlock / 8; o += 4) {
      for (int j = 0; j < 4; ++j) acc[j] += p[o + static_cast<uint64_t>(j)];
    }
    sink[static_cast<size_t>(i)] = acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
  };
  std::vector<double> gbps, cpu;
  for (int pass = 0; pass < 8; ++pass) {
    const Interval t;
    pool->for_each(n_items, body);
    if (pass == 0) continue;
    gbps.push_back(static_cast<double>(kBytes) / t.wall() / 1e9);
    cpu.push_back(t.cpu() / static_cast<double>(kBytes));
  }
  uint64_t x = 0;
  for (uint64_t v : sink) x ^= v;
  if (x == 1) std::printf(" ");  // keeps the sums alive
  return ReadRate{median(gbps), median(cpu)};
}

Status run(const Args& a) {
  if (a.drop_cache) {
    const int fd = open(a.model.c_str(), O_RDONLY);
    // Dirty pages are not dropped: write them back first.
    if (fd < 0 || fdatasync(fd) != 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) {
      if (fd >= 0) close(fd);
      return make_error(ErrorCode::kIo, "--drop-cache: cannot drop " + a.model + "'s cached pages");
    }
    close(fd);
  }
  KESTREL_TRY_ASSIGN(std::unique_ptr<Model> model, Model::open(a.model));
  const ModelHparams& hp = model->hparams();
  const int max_b = *std::max_element(a.sessions.begin(), a.sessions.end());
  CpuEngineOptions o;
  o.max_slots = max_b;
  o.threads = a.threads;
  o.max_ctx = std::max(a.prompt + a.steps + 16, a.pp + 16);
  o.activations = a.activations;
  o.profile = a.profile;
  const auto t0 = std::chrono::steady_clock::now();
  KESTREL_TRY_ASSIGN(std::unique_ptr<CpuEngine> e, make_cpu_engine(*model, o));
  std::printf("model %s: %s, %u layers, vocab %u, %.2f GB; engine %s (made in %.2f s)\n", a.model.c_str(),
              std::string(arch_name(hp.arch)).c_str(), hp.n_layer, hp.n_vocab,
              static_cast<double>(model->catalog().total_bytes()) / 1e9, e->summary().c_str(), seconds_since(t0));
  const int threads = a.threads > 0 ? a.threads : static_cast<int>(physical_core_cpus().size());
  std::printf("load average at start: %s\n", loadavg().c_str());
  KESTREL_TRY_ASSIGN(const ReadRate read, plain_read(threads));
  std::printf("plain read, %d threads: %.1f GB/s (wall), %.1f GB/s per thread-second of CPU\n", threads, read.gbps,
              1e-9 / read.cpu_s_per_byte / threads);
  const double bw = read.gbps * 1e9;

  std::vector<float> logits(static_cast<size_t>(max_b) * hp.n_vocab);
  auto outputs = [&](int n) {
    std::vector<EngineStepOutput> out(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      out[size_t(i)].logits = std::span<float>(logits.data() + size_t(i) * hp.n_vocab, hp.n_vocab);
    }
    return out;
  };
  auto token = [&](int i, int t) { return (1000 + 17 * t + 131 * i) % static_cast<int>(hp.n_vocab); };

  std::printf(
      "\n| sessions | step ms | tokens/s | roofline tokens/s | of roofline | CPU ms per step | of roofline, CPU time "
      "| GB read per step |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int B : a.sessions) {
    std::vector<SlotId> slots;
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
    std::vector<EngineStepItem> items(static_cast<size_t>(B));
    std::vector<EngineStepOutput> out = outputs(B);
    for (int i = 0; i < B; ++i) {
      KESTREL_TRY_ASSIGN(SlotId s, e->slot_alloc(o.max_ctx));
      slots.push_back(s);
      const int len = std::max(1, a.prompt - (i % 8));
      for (int t = 0; t < len; ++t) prompts[size_t(i)].push_back(token(i, t));
      items[size_t(i)] = {s, prompts[size_t(i)], true};
    }
    e->step(items, out);
    for (const EngineStepOutput& x : out) KESTREL_TRY(x.status);
    std::vector<int32_t> toks(static_cast<size_t>(B));
    double step_cpu = 0;
    auto decode = [&](int n_steps) -> Expected<double> {
      const Interval t;
      for (int s = 0; s < n_steps; ++s) {
        for (int i = 0; i < B; ++i) {
          toks[size_t(i)] = (7 + 29 * s + 53 * i) % static_cast<int>(hp.n_vocab);
          items[size_t(i)] = {slots[size_t(i)], std::span<const int32_t>(&toks[size_t(i)], 1), true};
        }
        e->step(items, out);
        for (const EngineStepOutput& x : out) KESTREL_TRY(x.status);
      }
      step_cpu = t.cpu() / n_steps;
      return t.wall() / n_steps;
    };
    KESTREL_TRY_ASSIGN(const double warm_s, decode(2));
    (void)warm_s;
    e->profile_reset();
    KESTREL_TRY_ASSIGN(const double step_s, decode(a.steps));
    const std::string profile = e->profile_report();
    const double bytes = kestrel::bench::decode_step_bytes(*model, B, a.prompt + a.steps);
    const double roof = B / (bytes / bw);
    std::printf("| %d | %.2f | %.2f | %.2f | %.1f%% | %.1f | %.1f%% | %.2f |\n", B, step_s * 1e3, B / step_s, roof,
                100.0 * (B / step_s) / roof, step_cpu * 1e3, 100.0 * bytes * read.cpu_s_per_byte / step_cpu,
                bytes / 1e9);
    if (!profile.empty()) std::printf("\nwhere a step of %d sessions goes:\n%s\n", B, profile.c_str());
    for (SlotId s : slots) e->slot_free(s);
  }

  if (a.pp > 0) {
    const int pass_tokens = e->capabilities().max_tokens_per_item;
    std::vector<int32_t> prompt(static_cast<size_t>(a.pp));
    for (int t = 0; t < a.pp; ++t) prompt[size_t(t)] = token(3, t);
    std::vector<EngineStepOutput> out = outputs(1);
    double best_s = 0, cpu_s = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first run warms the pages and the scratch
      KESTREL_TRY_ASSIGN(SlotId s, e->slot_alloc(o.max_ctx));
      std::vector<EngineStepItem> items = {{s, prompt, true}};
      e->profile_reset();
      const Interval t;
      e->step(items, out);
      best_s = t.wall();
      cpu_s = t.cpu();
      KESTREL_TRY(out[0].status);
      e->slot_free(s);
    }
    const int passes = (a.pp + pass_tokens - 1) / pass_tokens;
    double bytes = 0;
    for (int p = 0; p < passes; ++p) {
      bytes += kestrel::bench::prompt_pass_bytes(*model, std::min(pass_tokens, a.pp - p * pass_tokens));
    }
    std::printf(
        "\nprompt: %d tokens in %.2f s = %.1f tokens/s (%.1f tokens per thread-second of CPU); %d passes of <= %d "
        "tokens read >= %.2f GB, %.2f s at the plain read (%.1f%% of that bound)\n",
        a.pp, best_s, a.pp / best_s, a.pp / (cpu_s / threads), passes, pass_tokens, bytes / 1e9, bytes / bw,
        100.0 * (bytes / bw) / best_s);
    const std::string profile = e->profile_report();
    if (!profile.empty()) std::printf("\nwhere the prompt goes:\n%s", profile.c_str());
  }
  std::printf("load average at the end: %s\n", loadavg().c_str());
  return ok_status();
}

}  // namespace
}  // namespace kestrel::cpu::bench

int main(int argc, char** argv) {
  kestrel::cpu::bench::Args a;
  if (!kestrel::cpu::bench::parse(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: bench_cpu_engine --model M.gguf [--threads N] [--sessions 1,8] [--steps N] [--prompt N] "
                 "[--pp N] [--activations int8|f32] [--profile] [--drop-cache]\n");
    return 2;
  }
  const kestrel::Status st = kestrel::cpu::bench::run(a);
  if (st) return 0;
  std::fprintf(stderr, "bench_cpu_engine: %s\n", st.error().to_string().c_str());
  return 1;
}
