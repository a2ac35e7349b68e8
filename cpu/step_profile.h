// Where the CPU engine's steps spend their time, by section (CpuEngineOptions::profile): wall and process-CPU
// seconds (all threads, the pool's spinning included) summed over the steps since the last reset. Each section is
// timed on the engine thread around its pool jobs and its serial work, so the sections add up to the step.
// bench_cpu_engine --profile prints it.
//
// Threading: the engine thread only.
#pragma once

#include <cstdint>
#include <string>

namespace kestrel::cpu {

enum class StepSection : int {
  kEmbedding,   // token rows dequantized from token_embd
  kNorms,       // the layers' RMSNorms and residual adds
  kGdnIn,       // GDN layers: the input projections
  kGdnState,    // GDN layers: conv, gates, delta rule, gated norm
  kGdnOut,      // GDN layers: ssm_out
  kAttention,   // attention layers: projections, norms, RoPE, cache, attention, output projection
  kMoeRouter,   // router and shared-expert gate GEMVs, routing
  kMoeExperts,  // packing rows by expert, routed and shared experts' gate/up, SwiGLU, down
  kMoeCombine,  // each row's weighted sum of its experts and the gated shared expert
  kDenseFfn,    // dense SwiGLU FFN layers
  kOutput,      // output norm, lm_head, argmax and logits copies
  kCount,
};

struct StepProfile {
  static constexpr int kSections = static_cast<int>(StepSection::kCount);
  double wall[kSections] = {};
  double cpu[kSections] = {};
  int64_t steps = 0;

  // A Markdown table: per section ms per step (wall, CPU) and share of the step.
  std::string report() const;
};

// Adds the wall and CPU time between construction and destruction to `section` of `profile` (nullptr: nothing).
class SectionTimer {
 public:
  SectionTimer(StepProfile* profile, StepSection section);
  ~SectionTimer();
  SectionTimer(const SectionTimer&) = delete;
  SectionTimer& operator=(const SectionTimer&) = delete;

 private:
  StepProfile* profile_;
  int section_;
  double wall0_ = 0, cpu0_ = 0;
};

}  // namespace kestrel::cpu
