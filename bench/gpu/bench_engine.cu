// bench_engine: decode tokens/s of the whole CUDA engine (gpu/engine/cuda_engine.h) on a GGUF file, at several
// session counts, each beside its roofline: the bytes one decode step reads ÷ the plain read bandwidth measured in
// the same run (docs/benchmarking.md). Then one profiled run per session count splits the step's time by section
// (GDN, attention, MoE, dense FFN, lm_head with the logits copy, the rest), so the next speed work is chosen by it.
//
//   bench_engine --model M.gguf [--sessions 1,8,32] [--steps 64] [--prompt 32] [--no-pdl]
//
// A step is one Engine::step() of one token for each of B sessions, timed on the host around the call (what a
// caller waits for: the graph launch, the kernels, the copy back). Tokens are fixed ids, every session at its own
// position; the items ask for argmax_only (a greedy request: 4 bytes per session come back), and the last column
// repeats the run with the full logits copied back (a sampling request). Bytes per step: bench/common/decode_bytes.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/common/decode_bytes.h"
#include "bench/gpu/device_timing.cuh"
#include "core/engine/engine.h"
#include "core/model/model.h"
#include "gpu/engine/cuda_engine.h"

namespace kestrel::gpu::bench {
namespace {

struct Args {
  std::string model;
  std::vector<int> sessions = {1, 8, 32};
  int steps = 64;
  int prompt = 32;
  bool programmatic = true;
};

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (k == "--model" && (v = val())) {
      a->model = v;
    } else if (k == "--steps" && (v = val())) {
      a->steps = std::atoi(v);
    } else if (k == "--prompt" && (v = val())) {
      a->prompt = std::atoi(v);
    } else if (k == "--no-pdl") {
      a->programmatic = false;
    } else if (k == "--sessions" && (v = val())) {
      a->sessions.clear();
      for (const char* p = v; *p;) {
        a->sessions.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      return false;
    }
  }
  return !a->model.empty() && a->steps > 0 && a->prompt > 0 && !a->sessions.empty();
}

Status run(const Args& a) {
  BenchSetup setup;
  KESTREL_TRY(setup.start());
  KESTREL_TRY_ASSIGN(std::unique_ptr<Model> model, Model::open(a.model));
  const ModelHparams& hp = model->hparams();
  const int max_b = *std::max_element(a.sessions.begin(), a.sessions.end());
  CudaEngineOptions o;
  o.max_slots = max_b;
  o.n_ctx = a.prompt + 3 * a.steps + 64;
  o.tuning.programmatic = a.programmatic;
  const auto t0 = std::chrono::steady_clock::now();
  KESTREL_TRY_ASSIGN(std::unique_ptr<CudaEngine> e, make_cuda_engine(*model, o));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("model %s: %s, %u layers, vocab %u; %.2f GB on the device, loaded in %.1f s\n", a.model.c_str(),
              std::string(arch_name(hp.arch)).c_str(), hp.n_layer, hp.n_vocab, e->weight_bytes() / 1e9, load_s);
  std::printf("layout: %s; programmatic launches %s\n", e->layout_summary().c_str(), a.programmatic ? "on" : "off");
  const double bw = setup.lim.peak_read_gbs * 1e9;

  std::printf(
      "\n| sessions | step ms | tokens/s | roofline tokens/s | of roofline | GB read per step | tokens/s with "
      "logits copied |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::vector<std::string> splits;
  std::vector<float> logits(size_t(max_b) * hp.n_vocab);
  for (int B : a.sessions) {
    std::vector<SlotId> slots;
    for (int i = 0; i < B; ++i) {
      KESTREL_TRY_ASSIGN(SlotId s, e->slot_alloc(o.n_ctx));
      slots.push_back(s);
    }
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
    std::vector<EngineStepItem> items(static_cast<size_t>(B));
    std::vector<EngineStepOutput> out(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) {
      out[size_t(i)].logits = std::span<float>(logits.data() + size_t(i) * hp.n_vocab, hp.n_vocab);
      // Sessions at different positions: session i's prompt is prompt - (i % 8) tokens long.
      const int len = std::max(1, a.prompt - (i % 8));
      for (int t = 0; t < len; ++t) prompts[size_t(i)].push_back((1000 + 17 * t + 131 * i) % int(hp.n_vocab));
      items[size_t(i)] = {slots[size_t(i)], prompts[size_t(i)]};
    }
    e->step(items, out);
    for (const EngineStepOutput& x : out) KESTREL_TRY(x.status);
    std::vector<int32_t> toks(static_cast<size_t>(B));
    // greedy: the items ask for argmax_only (what a greedy request without penalties does); else the logits come
    // back (what a sampling request needs).
    auto decode = [&](int n_steps, bool greedy = true) -> Expected<double> {
      const auto s0 = std::chrono::steady_clock::now();
      for (int s = 0; s < n_steps; ++s) {
        for (int i = 0; i < B; ++i) {
          toks[size_t(i)] = (7 + 29 * s + 53 * i) % int(hp.n_vocab);
          items[size_t(i)] = {slots[size_t(i)], std::span<const int32_t>(&toks[size_t(i)], 1), greedy};
        }
        e->step(items, out);
        for (const EngineStepOutput& x : out) KESTREL_TRY(x.status);
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count() / n_steps;
    };
    KESTREL_TRY_ASSIGN(const double warm_s, decode(4));
    (void)warm_s;
    KESTREL_TRY_ASSIGN(const double step_s, decode(a.steps));
    KESTREL_TRY_ASSIGN(const double sampled_s, decode(a.steps / 2, /*greedy=*/false));
    const double bytes = kestrel::bench::decode_step_bytes(*model, B, a.prompt + a.steps);
    const double roof = B / (bytes / bw);
    std::printf("| %d | %.3f | %.0f | %.0f | %.1f%% | %.2f | %.0f |\n", B, step_s * 1e3, B / step_s, roof,
                100.0 * (B / step_s) / roof, bytes / 1e9, B / sampled_s);

    KESTREL_TRY(e->set_profiling(true));
    e->clear_profile();
    KESTREL_TRY_ASSIGN(const double profiled_s, decode(std::min(a.steps, 16)));
    (void)profiled_s;
    KESTREL_TRY(e->set_profiling(false));
    int passes = 0;
    const auto prof = e->profile(&passes);
    double total = 0;
    for (const auto& p : prof) total += p.second;
    std::string line = "  " + std::to_string(B) + " sessions, ms per step (profiled):";
    char buf[96];
    for (const auto& p : prof) {
      if (p.second <= 0) continue;
      std::snprintf(buf, sizeof buf, " %s %.3f (%.0f%%);", p.first.c_str(), p.second / passes,
                    100.0 * p.second / total);
      line += buf;
    }
    splits.push_back(line);
    for (SlotId s : slots) e->slot_free(s);
  }
  std::printf(
      "\nstep time by section (event-record nodes between the sections of the replayed graph, one profiled run "
      "of each size):\n");
  for (const std::string& s : splits) std::printf("%s\n", s.c_str());
  return ok_status();
}

}  // namespace
}  // namespace kestrel::gpu::bench

int main(int argc, char** argv) {
  kestrel::gpu::bench::Args a;
  if (!kestrel::gpu::bench::parse(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: bench_engine --model M.gguf [--sessions 1,8,32] [--steps N] [--prompt N] [--no-pdl]\n");
    return 2;
  }
  return kestrel::gpu::bench::exit_status("bench_engine", kestrel::gpu::bench::run(a));
}
