// StepProfile and SectionTimer (step_profile.h).
#include "cpu/step_profile.h"

#include <time.h>

#include <cstdio>

namespace kestrel::cpu {
namespace {

double clock_s(clockid_t id) {
  timespec t;
  clock_gettime(id, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

constexpr const char* kNames[StepProfile::kSections] = {
    "embedding",   "norms + residual", "GDN input projections", "GDN conv, delta rule, gated norm",
    "GDN ssm_out", "attention layers", "MoE router + routing",  "MoE experts",
    "MoE combine", "dense FFN",        "output norm + lm_head"};

}  // namespace

SectionTimer::SectionTimer(StepProfile* profile, StepSection section)
    : profile_(profile), section_(static_cast<int>(section)) {
  if (profile_ == nullptr) return;
  wall0_ = clock_s(CLOCK_MONOTONIC);
  cpu0_ = clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

SectionTimer::~SectionTimer() {
  if (profile_ == nullptr) return;
  profile_->wall[section_] += clock_s(CLOCK_MONOTONIC) - wall0_;
  profile_->cpu[section_] += clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0_;
}

std::string StepProfile::report() const {
  double total_wall = 0, total_cpu = 0;
  for (int i = 0; i < kSections; ++i) {
    total_wall += wall[i];
    total_cpu += cpu[i];
  }
  const double n = steps > 0 ? static_cast<double>(steps) : 1.0;
  std::string out = "| section | wall ms per step | share | CPU ms per step | share |\n|---|---|---|---|---|\n";
  char line[160];
  for (int i = 0; i < kSections; ++i) {
    if (wall[i] == 0 && cpu[i] == 0) continue;
    std::snprintf(line, sizeof(line), "| %s | %.2f | %.1f%% | %.2f | %.1f%% |\n", kNames[i], 1e3 * wall[i] / n,
                  total_wall > 0 ? 100.0 * wall[i] / total_wall : 0.0, 1e3 * cpu[i] / n,
                  total_cpu > 0 ? 100.0 * cpu[i] / total_cpu : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof(line), "| step | %.2f | | %.2f | |\n", 1e3 * total_wall / n, 1e3 * total_cpu / n);
  out += line;
  return out;
}

}  // namespace kestrel::cpu
