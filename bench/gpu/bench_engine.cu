// bench_engine: decode tokens/s of the whole CUDA engine (gpu/engine/cuda_engine.h) on a GGUF file, at several
// session counts, each beside its roofline: the bytes one decode step reads ÷ the plain read bandwidth measured in
// the same run (docs/benchmarking.md). Then one profiled run per session count splits the step's time by section
// (GDN, attention, MoE, dense FFN, lm_head with the logits copy, the rest), so the next speed work is chosen by it.
//
//   bench_engine --model M.gguf [--sessions 1,8,32] [--steps 64] [--prompt 32] [--pp 512,4096] [--ttft 2000]
//                [--no-pdl] [--no-prompt-gemm] [--prompt-digits 4|2] [--no-prompt-chunked] [--prompt-segment C]
//                [--prompt-chunk N] [--kernels N]
//                [--gpu-memory BYTES|auto]
//                [--n-cpu-moe N] [--expert-upload N] [--side-read PCT] [--routing-calibration N]
//                [--override-tensor REGEX=cpu|gpu]... [--threads N]
//
// --no-prompt-gemm: prompt passes on GEMV v4 instead of gemm_imma (GemvImmaTuning::prompt_gemm), for an A/B.
// --prompt-digits: the activation digits gemm_imma multiplies in prompt passes (GemvImmaTuning::prompt_digits).
// --no-prompt-chunked: prompt passes' GDN layers on gdn_runs instead of gdn_chunked (GdnDecodeTuning::prompt_chunked).
// --prompt-segment: tokens per segment of the prompt passes' MoE GEMVs (MoeImmaTuning::prompt_segment_vectors).
// --kernels N: after each profiled run, the same prompt (or 8 decode steps) once more under a CUPTI kernel trace
// (bench/gpu/kernel_trace.h): the N kernels that took the most GPU time, their calls and time, for choosing what to
// work on inside a section; needs a toolkit with CUPTI.
// --expert-upload N: prompt passes of at least N tokens copy the host experts to the GPU (GpuTuning::
// expert_upload_min_tokens; 0: never, the host computes its experts' rows; -1, the default: the placed engine's cost
// model chooses), for an A/B with a placement flag.
// --side-read PCT: decode steps have the GPU read PCT% of each token's host experts over the bus (GpuTuning::
// expert_side_read; 0: never; -1, the default: the placed engine's cost model chooses), for an A/B with a placement
// flag.
// --routing-calibration N: a budget that splits the routed experts fills the GPU hottest first, by counts from an
// N-token calibration prompt through the CPU engine (PlacedEngineOptions::routing_calibration; default 256, 0: every
// expert equally likely), for an A/B under --gpu-memory. The bench keeps no counts between runs.
// --prompt-chunk N: --pp feeds prompts N tokens a step (at most max_tokens_per_item; 32 gives the passes of 32 rows
// that prompts took before prompt passes), for an A/B in one run.
//
// With a placement flag the engine is built as kestreld builds it (hybrid/placed_cuda_engine.h): the routed experts
// the plan leaves on the host run on --threads CPU workers (0: one per physical core but two), the plan is printed, and
// the roofline becomes GPU bytes ÷ the GPU read + host bytes ÷ the host read (measured in the same run with the same
// thread count; bench/common/decode_bytes.h decode_step_split). Without one every weight is on the GPU.
//
// A step is one Engine::step() of one token for each of B sessions, timed on the host around the call (what a
// caller waits for: the graph launch, the kernels, the copy back). Tokens are fixed ids, every session at its own
// position; the items ask for argmax_only (a greedy request: 4 bytes per session come back), and the last column
// repeats the run with the full logits copied back (a sampling request). Bytes per step: bench/common/decode_bytes.h.
// After the table: the step's time by section (a profiled replay; with host experts, also the CPU's time on them and
// how much of it the GPU spent waiting, so the rest overlapped) and the kernels a pass launches (the captured graph's
// kernel nodes) with the step's time per kernel — at one session the launch count, not bytes, sets the step.
//
// Prefill (--pp): one session's prompt of N tokens fed as the Service feeds it, a step of the engine's
// max_tokens_per_item tokens at a time, timed from the first step to the greedy token after the last; beside it the
// roofline of those passes (prompt_pass_bytes per pass ÷ the read bandwidth) and their tensor-core limit (the
// multiply-adds of the passes, prompt_pass_macs, ÷ the int8 MMA rate measured in the same run, bench/gpu/mma_rate.cuh;
// the kernels multiply 4-digit activations, so their own ceiling is a quarter of it). A warm-up prompt of the same
// length comes first (its passes capture the graphs). --ttft: a prompt of N tokens fed as the Service feeds it beside 8
// other sessions that decode a token each step (a step's prompt chunk is what they leave of max_tokens_per_tick, at
// most the engine's prompt_tokens_beside_decode share, core/engine/engine.h): the
// time to its first token, and the 8 sessions' time per token (mean and worst step) against the same steps without the
// prompt.
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
#include "bench/gpu/kernel_trace.h"
#include "bench/gpu/mma_rate.cuh"
#include "core/engine/engine.h"
#include "core/engine/placement_planner.h"
#include "core/model/model.h"
#include "gpu/engine/cuda_engine.h"
#include "hybrid/placed_cuda_engine.h"

namespace kestrel::gpu::bench {
namespace {

struct Args {
  std::string model;
  std::vector<int> sessions = {1, 8, 32};
  int steps = 64;
  int prompt = 32;
  std::vector<int> pp = {512, 4096};
  int ttft = 2000;
  bool programmatic = true;
  bool placed = false;  // a placement flag was given
  PlacementFlags placement;
  int threads = 0;
  int prompt_segment = MoeImmaTuning{}.prompt_segment_vectors;
  bool prompt_gemm = true;
  GemmDigits prompt_digits = GemvImmaTuning{}.prompt_digits;
  bool prompt_chunked = true;
  int prompt_chunk = 0;  // 0: the engine's max_tokens_per_item
  int kernels = 0;       // --kernels N: the N largest kernels of a traced prompt and decode step (0: no trace)
  int expert_upload = GpuTuning{}.expert_upload_min_tokens;
  int side_read = -1;  // percent; -1: the cost model's
  int routing_calibration = kestrel::hybrid::PlacedEngineOptions{}.routing_calibration;
};

std::vector<int> int_list(const char* v) {
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
    } else if (k == "--no-prompt-gemm") {
      a->prompt_gemm = false;
    } else if (k == "--prompt-digits" && (v = val())) {
      const int d = std::atoi(v);
      if (d != 4 && d != 2) return false;
      a->prompt_digits = static_cast<GemmDigits>(d);
    } else if (k == "--no-prompt-chunked") {
      a->prompt_chunked = false;
    } else if (k == "--prompt-chunk" && (v = val())) {
      a->prompt_chunk = std::atoi(v);
    } else if (k == "--kernels" && (v = val())) {
      a->kernels = std::atoi(v);
    } else if (k == "--prompt-segment" && (v = val())) {
      a->prompt_segment = std::atoi(v);
    } else if (k == "--gpu-memory" && (v = val())) {
      a->placement.gpu_memory = v;
      a->placed = true;
    } else if (k == "--expert-upload" && (v = val())) {
      a->expert_upload = std::atoi(v);
    } else if (k == "--side-read" && (v = val())) {
      a->side_read = std::atoi(v);
      if (a->side_read < -1 || a->side_read > 100) return false;
    } else if (k == "--routing-calibration" && (v = val())) {
      a->routing_calibration = std::atoi(v);
    } else if (k == "--n-cpu-moe" && (v = val())) {
      a->placement.n_cpu_moe = std::atoi(v);
      a->placed = true;
    } else if ((k == "--override-tensor" || k == "-o") && (v = val())) {
      a->placement.overrides.emplace_back(v);
      a->placed = true;
    } else if (k == "--threads" && (v = val())) {
      a->threads = std::atoi(v);
    } else if (k == "--sessions" && (v = val())) {
      a->sessions = int_list(v);
    } else if (k == "--pp" && (v = val())) {
      a->pp = int_list(v);
      a->pp.erase(std::remove(a->pp.begin(), a->pp.end(), 0), a->pp.end());
    } else if (k == "--ttft" && (v = val())) {
      a->ttft = std::atoi(v);
    } else {
      return false;
    }
  }
  return !a->model.empty() && a->steps > 0 && a->prompt > 0 && !a->sessions.empty() && a->ttft >= 0 &&
         std::all_of(a->pp.begin(), a->pp.end(), [](int n) { return n > 0; });
}

// Feeds `prompt` to `slot` in steps of the engine's max_tokens_per_item tokens, or of max_chunk when smaller, and
// returns the seconds from the first step to the last one's return; *passes receives the passes it took. The steps
// ask for the greedy token only, or, when `logits` is given, for the logits into it.
Expected<double> feed_prompt(Engine& e, SlotId slot, const std::vector<int32_t>& prompt, int* passes, int max_chunk = 0,
                             std::span<float> logits = {}) {
  size_t chunk = static_cast<size_t>(std::max(e.capabilities().max_tokens_per_item, 1));
  if (max_chunk > 0) chunk = std::min(chunk, static_cast<size_t>(max_chunk));
  std::vector<EngineStepOutput> out(1);
  out[0].logits = logits;
  const auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    const size_t len = std::min(chunk, prompt.size() - at);
    std::vector<EngineStepItem> item = {{slot, std::span<const int32_t>(prompt.data() + at, len), logits.empty()}};
    e.step(item, out);
    KESTREL_TRY(out[0].status);
    ++n;  // a step of one item is one pass (a prompt pass above max_items_per_pass tokens)
  }
  if (passes != nullptr) *passes = n;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int32_t> prompt_tokens(int n, int seed, uint32_t n_vocab) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) p[size_t(t)] = (1000 + 17 * t + 131 * seed) % int(n_vocab);
  return p;
}

Status prefill(CudaEngine& e, const Model& model, const Args& a, double bw, double mma_rate) {
  const int chunk = a.prompt_chunk > 0 ? std::min(a.prompt_chunk, e.capabilities().max_tokens_per_item)
                                       : e.capabilities().max_tokens_per_item;
  std::printf("\nprefill: one session, steps of %d prompt tokens (the engine's max_tokens_per_item: %d)\n\n", chunk,
              e.capabilities().max_tokens_per_item);
  std::printf(
      "| prompt tokens | ms | tokens/s | passes | roofline tokens/s | of roofline | tensor-core limit tokens/s | of "
      "limit |\n|---|---|---|---|---|---|---|---|\n");
  KESTREL_TRY_ASSIGN(SlotId slot, e.slot_alloc(e.capabilities().max_slot_ctx));
  std::vector<std::string> profiles;
  std::vector<std::string> agreement;
  std::vector<std::string> traces;
  for (const int n : a.pp) {
    const std::vector<int32_t> prompt = prompt_tokens(n, 1, model.hparams().n_vocab);
    int passes = 0;
    KESTREL_TRY(feed_prompt(e, slot, prompt, &passes, chunk));  // warm-up: the passes' graphs are captured here
    e.slot_reset(slot);
    KESTREL_TRY_ASSIGN(const double s, feed_prompt(e, slot, prompt, &passes, chunk));
    e.slot_reset(slot);
    double bytes = 0, macs = 0;
    for (int at = 0; at < n; at += chunk) {
      bytes += kestrel::bench::prompt_pass_bytes(model, std::min(chunk, n - at), at);
      macs += kestrel::bench::prompt_pass_macs(model, std::min(chunk, n - at), at);
    }
    const double roof = n / (bytes / bw);
    const double mma_roof = n / (macs / mma_rate);
    std::printf("| %d | %.1f | %.0f | %d | %.0f | %.1f%% | %.0f | %.1f%% |\n", n, s * 1e3, n / s, passes, roof,
                100.0 * (n / s) / roof, mma_roof, 100.0 * (n / s) / mma_roof);
    // Where the prompt's time goes: the same prompt again with event records between the sections.
    KESTREL_TRY(e.set_profiling(true));
    e.clear_profile();
    KESTREL_TRY(feed_prompt(e, slot, prompt, nullptr, chunk));
    KESTREL_TRY(e.set_profiling(false));
    e.slot_reset(slot);
    int prof_passes = 0;
    std::string line = "  " + std::to_string(n) + " tokens:";
    char buf[96];
    for (const auto& p : e.profile(&prof_passes)) {
      if (p.second <= 0) continue;
      std::snprintf(buf, sizeof buf, " %s %.1f;", p.first.c_str(), p.second);
      line += buf;
    }
    profiles.push_back(line + " (" + std::to_string(prof_passes) + " passes)");
    if (a.kernels > 0) {  // the same prompt again, each kernel's time from CUPTI's records
      KESTREL_TRY(kernel_trace_start());
      KESTREL_TRY(feed_prompt(e, slot, prompt, nullptr, chunk));
      KESTREL_TRY_ASSIGN(const KernelTraceResult tr, kernel_trace_stop());
      e.slot_reset(slot);
      traces.push_back("\nkernels of a " + std::to_string(n) + "-token prompt (ms a prompt):\n" +
                       kernel_trace_table(tr, 1.0, a.kernels));
    }
    // The prompt passes' last logits against passes of 32 rows (the decode path's arithmetic).
    std::vector<float> lp(model.hparams().n_vocab), ls(model.hparams().n_vocab);
    KESTREL_TRY(feed_prompt(e, slot, prompt, nullptr, chunk, lp));
    e.slot_reset(slot);
    KESTREL_TRY(feed_prompt(e, slot, prompt, nullptr, 32, ls));
    e.slot_reset(slot);
    double diff = 0, scale = 1;
    for (size_t i = 0; i < lp.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(lp[i] - ls[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(ls[i])));
    }
    const bool same =
        std::max_element(lp.begin(), lp.end()) - lp.begin() == std::max_element(ls.begin(), ls.end()) - ls.begin();
    char buf2[160];
    std::snprintf(buf2, sizeof buf2, "  %d tokens: max |diff| %.3g of max |logit| %.3g (%.2e); greedy token %s", n,
                  diff, scale, diff / scale, same ? "the same" : "DIFFERENT");
    agreement.push_back(buf2);
  }
  std::printf("\nprompt passes' last logits against passes of 32 rows:\n");
  for (const std::string& l : agreement) std::printf("%s\n", l.c_str());
  std::printf("\nprefill time by section, ms per prompt (event records between the sections, one profiled run):\n");
  for (const std::string& p : profiles) std::printf("%s\n", p.c_str());
  for (const std::string& t : traces) std::printf("%s", t.c_str());
  e.slot_free(slot);
  return ok_status();
}

// Time to first token of an a.ttft-token prompt while 8 sessions decode, and their time per token meanwhile.
Status ttft_beside_decode(CudaEngine& e, const Model& model, const Args& a) {
  constexpr int kDecoders = 8;
  const uint32_t n_vocab = model.hparams().n_vocab;
  std::vector<SlotId> dec;
  for (int i = 0; i < kDecoders; ++i) {
    KESTREL_TRY_ASSIGN(SlotId s, e.slot_alloc(e.capabilities().max_slot_ctx));
    dec.push_back(s);
    KESTREL_TRY(feed_prompt(e, s, prompt_tokens(a.prompt, 10 + i, n_vocab), nullptr));
  }
  KESTREL_TRY_ASSIGN(SlotId p, e.slot_alloc(e.capabilities().max_slot_ctx));
  const std::vector<int32_t> prompt = prompt_tokens(a.ttft, 3, n_vocab);
  KESTREL_TRY_ASSIGN(const double alone_s, feed_prompt(e, p, prompt, nullptr));
  e.slot_reset(p);
  std::vector<int32_t> toks(kDecoders);
  std::vector<EngineStepOutput> out(kDecoders + 1);
  // One tick: a token for each decoder, and the next chunk of the prompt when `chunk` > 0. Returns its seconds.
  auto tick = [&](int step, const int32_t* chunk, size_t len) -> Expected<double> {
    std::vector<EngineStepItem> items;
    for (int i = 0; i < kDecoders; ++i) {
      toks[size_t(i)] = (7 + 29 * step + 53 * i) % int(n_vocab);
      items.push_back({dec[size_t(i)], std::span<const int32_t>(&toks[size_t(i)], 1), true});
    }
    if (len > 0) items.push_back({p, std::span<const int32_t>(chunk, len), true});
    const auto t0 = std::chrono::steady_clock::now();
    e.step(items, std::span<EngineStepOutput>(out.data(), items.size()));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < items.size(); ++i) KESTREL_TRY(out[i].status);
    return s;
  };
  // The prompt's share of a tick as the Service gives it: what the decoders leave of max_tokens_per_tick, at most
  // prompt_tokens_beside_decode's share.
  const EngineCapabilities caps = e.capabilities();
  size_t chunk = static_cast<size_t>(std::max(caps.max_tokens_per_item, 1));
  if (caps.max_tokens_per_tick > 0) {
    chunk = std::min(chunk, static_cast<size_t>(std::max(caps.max_tokens_per_tick - kDecoders, 1)));
  }
  chunk = std::min(chunk, prompt_tokens_beside_decode(caps, kDecoders));
  // The prompt's ticks once untimed (graph captures), then the decoders alone, then the prompt beside them.
  int step = 0;
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    KESTREL_TRY(tick(step++, prompt.data() + at, std::min(chunk, prompt.size() - at)));
  }
  e.slot_reset(p);
  double base_sum = 0;
  const int base_steps = 32;
  for (int s = 0; s < base_steps; ++s) {
    KESTREL_TRY_ASSIGN(const double t, tick(step++, nullptr, 0));
    base_sum += t;
  }
  double sum = 0, worst = 0;
  int ticks = 0;
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    KESTREL_TRY_ASSIGN(const double t, tick(step++, prompt.data() + at, std::min(chunk, prompt.size() - at)));
    sum += t;
    worst = std::max(worst, t);
    ++ticks;
  }
  std::printf(
      "\ntime to first token, %d-token prompt beside %d decoding sessions: %.1f ms (%d steps; alone %.1f ms)\n"
      "their time per token meanwhile: mean %.2f ms, worst %.2f ms; without the prompt: %.2f ms (%.2fx)\n",
      a.ttft, kDecoders, sum * 1e3, ticks, alone_s * 1e3, sum / ticks * 1e3, worst * 1e3, base_sum / base_steps * 1e3,
      (sum / ticks) / (base_sum / base_steps));
  for (SlotId s : dec) e.slot_free(s);
  e.slot_free(p);
  return ok_status();
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
  for (const int n : a.pp) o.n_ctx = std::max(o.n_ctx, n + 64);
  o.n_ctx = std::max(o.n_ctx, a.ttft + a.prompt + 3 * a.steps + 64);
  o.tuning.programmatic = a.programmatic;
  o.tuning.moe_imma.prompt_segment_vectors = a.prompt_segment;
  o.tuning.gemv_imma.prompt_gemm = a.prompt_gemm;
  o.tuning.moe_imma.grouped_gemv.prompt_gemm = a.prompt_gemm;
  o.tuning.gemv_imma.prompt_digits = a.prompt_digits;
  o.tuning.moe_imma.grouped_gemv.prompt_digits = a.prompt_digits;
  o.tuning.gdn_decode.prompt_chunked = a.prompt_chunked;
  o.tuning.expert_upload_min_tokens = a.expert_upload;
  o.tuning.expert_side_read = a.side_read < 0 ? kSideReadAuto : static_cast<float>(a.side_read) / 100.0f;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<CudaEngine> e;
  std::vector<std::vector<uint8_t>> on_gpu;  // empty: every expert on the GPU
  double host_bw = 0;
  if (a.placed) {
    hybrid::PlacedEngineOptions po;
    po.cuda = o;
    po.placement = a.placement;
    po.cpu_threads = a.threads;
    po.routing_calibration = a.routing_calibration;
    KESTREL_TRY_ASSIGN(hybrid::PlacedEngine placed, hybrid::make_placed_cuda_engine(*model, po));
    for (const std::string& line : placed.plan) std::printf("%s\n", line.c_str());
    e = std::move(placed.engine);
    on_gpu = placed.decision.expert_on_gpu;
    host_bw = placed.decision.host_read_bytes_per_s;
  } else {
    KESTREL_TRY_ASSIGN(e, make_cuda_engine(*model, o));
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("model %s: %s, %u layers, vocab %u; %.2f GB on the device, loaded in %.1f s\n", a.model.c_str(),
              std::string(arch_name(hp.arch)).c_str(), hp.n_layer, hp.n_vocab, e->weight_bytes() / 1e9, load_s);
  std::printf("layout: %s; programmatic launches %s\n", e->layout_summary().c_str(), a.programmatic ? "on" : "off");
  const double bw = setup.lim.peak_read_gbs * 1e9;

  std::printf(
      "\n| sessions | step ms | tokens/s | roofline tokens/s | of roofline | GB read per step (GPU / host) | tokens/s "
      "with logits copied |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::vector<std::string> splits;
  std::vector<std::string> traces;    // --kernels
  std::vector<std::string> launches;  // kernels a pass, and the step's time per kernel
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
    const kestrel::bench::StepBytes bytes = kestrel::bench::decode_step_split(*model, B, a.prompt + a.steps, on_gpu);
    const double roof = B / (bytes.gpu / bw + (bytes.host > 0 ? bytes.host / host_bw : 0.0));
    std::printf("| %d | %.3f | %.0f | %.0f | %.1f%% | %.2f / %.2f | %.0f |\n", B, step_s * 1e3, B / step_s, roof,
                100.0 * (B / step_s) / roof, bytes.gpu / 1e9, bytes.host / 1e9, B / sampled_s);

    if (const int k = e->kernels_per_pass(B); k > 0) {
      char kb[160];
      std::snprintf(kb, sizeof kb, "  %d sessions: %d kernels a pass, %.2f us of the step a kernel", B, k,
                    step_s * 1e6 / k);
      launches.push_back(kb);
    }
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
    if (a.kernels > 0) {  // the step again, each kernel's time from CUPTI's records
      constexpr int kTraced = 8;
      KESTREL_TRY(kernel_trace_start());
      KESTREL_TRY_ASSIGN(const double traced_s, decode(kTraced));
      (void)traced_s;
      KESTREL_TRY_ASSIGN(const KernelTraceResult tr, kernel_trace_stop());
      traces.push_back("\nkernels of a " + std::to_string(B) + "-session decode step (ms a step, " +
                       std::to_string(kTraced) + " steps traced):\n" + kernel_trace_table(tr, kTraced, a.kernels));
    }
    if (const CudaEngine::HostExpertProfile hx = e->host_expert_profile(); hx.batches > 0 && passes > 0) {
      // The host's time that the device did not wait for ran beside the device's own work.
      char hb[200];
      std::snprintf(
          hb, sizeof hb,
          "    host experts: %.3f ms a step on the CPU (%.1f batches), the GPU waited %.3f ms on them: %.0f%% "
          "of the CPU time overlapped the GPU's own work",
          hx.host_ms / passes, double(hx.batches) / passes, hx.device_wait_ms / passes,
          100.0 * std::max(0.0, hx.host_ms - hx.device_wait_ms) / hx.host_ms);
      splits.push_back(hb);
    }
    for (SlotId s : slots) e->slot_free(s);
  }
  std::printf(
      "\nstep time by section (event-record nodes between the sections of the replayed graph, one profiled run "
      "of each size):\n");
  for (const std::string& s : splits) std::printf("%s\n", s.c_str());
  std::printf("\nkernel launches (the captured graph's kernel nodes):\n");
  for (const std::string& s : launches) std::printf("%s\n", s.c_str());
  for (const std::string& t : traces) std::printf("%s", t.c_str());
  if (!a.pp.empty()) {
    KESTREL_TRY_ASSIGN(const double mma_rate, measure_mma_macs_per_s(setup.sm_count, setup.stream));
    std::printf("\ntensor cores: %.0f T int8 multiply-adds/s (mma.sync m16n8k32 u8 x s8, measured)\n",
                mma_rate * 1e-12);
    KESTREL_TRY(prefill(*e, *model, a, bw, mma_rate));
  }
  if (a.ttft > 0) KESTREL_TRY(ttft_beside_decode(*e, *model, a));
  return ok_status();
}

}  // namespace
}  // namespace kestrel::gpu::bench

int main(int argc, char** argv) {
  kestrel::gpu::bench::Args a;
  if (!kestrel::gpu::bench::parse(argc, argv, &a)) {
    std::fprintf(
        stderr,
        "usage: bench_engine --model M.gguf [--sessions 1,8,32] [--steps N] [--prompt N] [--pp 512,4096] "
        "[--ttft N] [--no-pdl] [--no-prompt-gemm] [--prompt-digits 4|2] [--no-prompt-chunked] [--prompt-segment C] "
        "[--prompt-chunk N] [--kernels N]\n"
        "                    [--gpu-memory BYTES|auto] [--n-cpu-moe N] [--expert-upload N] [--side-read PCT]\n"
        "                    [--routing-calibration N]\n"
        "                    [--override-tensor REGEX=cpu|gpu]...\n"
        "                    [--threads N]\n");
    return 2;
  }
  return kestrel::gpu::bench::exit_status("bench_engine", kestrel::gpu::bench::run(a));
}
