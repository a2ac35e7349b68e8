// kestrel-engine-run: one prompt through an Engine in this process — no daemon, no gRPC — for machines that have
// CUDA and CMake alone (the lent GPU machine) and for comparing engines on a file:
//
//   kestrel-engine-run --model M.gguf --engine cuda --prompt "Hello" -n 32 [--temp 0 --seed 1] [--ctx 4096]
//   kestrel-engine-run --model M.gguf --engine cuda --gpu-memory 12G [--n-cpu-moe 20] [--override-tensor RE=cpu]...
//   kestrel-engine-run --model M.gguf --engine cpu --threads 16 ...   (KESTREL_CPU_ISA=scalar|avx2|avxvnni lowers the ISA)
//
// The CUDA engine is placed as kestreld places it (hybrid/placed_cuda_engine.h): the routed experts that the GPU
// budget (--gpu-memory, default auto), --n-cpu-moe and --override-tensor leave on the host run on --threads CPU
// workers; the plan goes to stderr. Prints the prompt and the generated text as it streams, then prefill and decode
// tokens/s on stderr. Greedy by default. Exit status 0, 1 on an error (one line naming it), 2 on a bad command line.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/engine/placement_planner.h"
#include "core/engine/reference_engine.h"
#include "core/model/model.h"
#include "core/sampler/sampler.h"
#include "cpu/cpu_engine.h"
#ifdef KESTREL_WITH_CUDA
#include "gpu/engine/cuda_engine.h"
#include "hybrid/placed_cuda_engine.h"
#endif

namespace {

using namespace kestrel;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int fail(const std::string& what) {
  std::fprintf(stderr, "kestrel-engine-run: %s\n", what.c_str());
  return 1;
}

Expected<std::unique_ptr<Engine>> make(const std::string& name, const Model& m, int ctx, int threads,
                                       const PlacementFlags& placement) {
  if (name == "reference") return make_reference_engine(m, 1);
  if (name == "cpu") {
    cpu::CpuEngineOptions o;
    o.max_slots = 1;
    o.threads = threads;
    o.max_ctx = ctx;
    KESTREL_TRY_ASSIGN(std::unique_ptr<cpu::CpuEngine> e, cpu::make_cpu_engine(m, o));
    std::fprintf(stderr, "cpu: %s\n", e->summary().c_str());
    return std::unique_ptr<Engine>(std::move(e));
  }
#ifdef KESTREL_WITH_CUDA
  hybrid::PlacedEngineOptions o;
  o.cuda.max_slots = 1;
  o.cuda.n_ctx = ctx;
  o.placement = placement;
  o.cpu_threads = threads;
  KESTREL_TRY_ASSIGN(hybrid::PlacedEngine placed, hybrid::make_placed_cuda_engine(m, o));
  for (const std::string& line : placed.plan) std::fprintf(stderr, "%s\n", line.c_str());
  std::unique_ptr<gpu::CudaEngine> e = std::move(placed.engine);
  std::fprintf(stderr, "cuda: %.2f GB weights; %s\n", static_cast<double>(e->weight_bytes()) / 1e9,
               e->layout_summary().c_str());
  return std::unique_ptr<Engine>(std::move(e));
#else
  (void)ctx;
  (void)placement;
  return make_error(ErrorCode::kFailedPrecondition, "this build has no CUDA engine");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One prompt through a Kestrel engine in this process (no daemon)"};
  std::string model_path, engine_name = "cuda", prompt = "Hello";
  int n_predict = 32, ctx = 4096, threads = 0;
  SamplingParams sp;
  sp.temperature = 0.0f;
  uint64_t seed = 1;
  app.add_option("--model", model_path, "GGUF model")->required();
  app.add_option("--engine", engine_name, "cuda, cpu or reference")->check(CLI::IsMember({"cuda", "cpu", "reference"}));
  app.add_option("--threads", threads,
                 "cpu engine, and the cuda engine's routed experts on the CPU: compute threads (0: one per physical "
                 "core)")
      ->check(CLI::Range(0, 4096));
  PlacementFlags placement;
  app.add_option("--gpu-memory", placement.gpu_memory,
                 "cuda engine: GPU memory for weights (12G, 512MiB, bytes, or auto: free memory less state, scratch "
                 "and headroom); routed experts that do not fit run on the CPU");
  app.add_option("--n-cpu-moe", placement.n_cpu_moe,
                 "cuda engine: keep the routed experts of the first N MoE layers on the CPU")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--override-tensor,-o", placement.overrides,
                 "cuda engine: REGEX=cpu|gpu puts the routed experts of the layers whose expert tensors match on that "
                 "device (repeatable, the last match wins)");
  app.add_option("--prompt", prompt, "prompt text (special tokens such as <|im_start|> are parsed)");
  app.add_option("-n,--n-predict", n_predict, "tokens to generate")->check(CLI::Range(0, 1 << 20));
  app.add_option("--ctx", ctx, "the session's context")->check(CLI::Range(1, 1 << 24));
  app.add_option("--temp", sp.temperature, "temperature (0: greedy)");
  app.add_option("--seed", seed, "sampler seed");
  CLI11_PARSE(app, argc, argv);
  sp.seed = seed;

  auto model = Model::open(model_path);
  if (!model) return fail(model.error().to_string());
  const Model& m = **model;
  auto engine = make(engine_name, m, ctx, threads, placement);
  if (!engine) return fail(engine.error().to_string());
  Engine& e = **engine;
  auto slot = e.slot_alloc(ctx);
  if (!slot) return fail(slot.error().to_string());
  auto sampler = Sampler::create(sp, static_cast<int32_t>(m.hparams().n_vocab));
  if (!sampler) return fail(sampler.error().to_string());
  std::vector<int32_t> tokens = m.tokenizer().encode(prompt, /*parse_special=*/true);
  if (tokens.empty()) return fail("the prompt has no tokens");
  const int32_t eos = m.tokenizer().vocab().eos_id;

  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  std::vector<float> logits(m.hparams().n_vocab);
  auto feed = [&](std::span<const int32_t> t) -> Status {
    EngineStepItem item{*slot, t};
    EngineStepOutput out;
    out.logits = logits;
    e.step(std::span<const EngineStepItem>(&item, 1), std::span<EngineStepOutput>(&out, 1));
    return out.status;
  };
  auto t0 = std::chrono::steady_clock::now();
  if (Status st = feed(tokens); !st) return fail(st.error().to_string());
  const double t_prefill = seconds_since(t0);
  std::vector<int32_t> history = tokens;  // the slot's tokens, for the sampler's penalties
  int n = 0;
  t0 = std::chrono::steady_clock::now();
  for (; n < n_predict && e.slot_n_past(*slot) < ctx; ++n) {
    auto next = sampler->sample_checked(logits, history, nullptr);
    if (!next) return fail(next.error().to_string());
    if (*next == eos) break;
    if (auto bytes = m.tokenizer().token_bytes(*next); bytes) {
      std::fwrite(bytes->data(), 1, bytes->size(), stdout);
      std::fflush(stdout);
    }
    const int32_t t[1] = {*next};
    if (Status st = feed(t); !st) return fail(st.error().to_string());
    history.push_back(*next);
  }
  const double t_decode = seconds_since(t0);
  std::printf("\n");
  std::fprintf(stderr, "%s: prefill %zu tokens in %.3f s (%.1f tokens/s), decode %d tokens in %.3f s (%.1f tokens/s)\n",
               e.name().c_str(), tokens.size(), t_prefill, static_cast<double>(tokens.size()) / t_prefill, n, t_decode,
               n / (t_decode > 0 ? t_decode : 1e-9));
  return 0;
}
