// KernelTrace (see kernel_trace.h): CUPTI's concurrent-kernel activity records, gathered in buffers the callbacks
// hand over, summed by demangled name.
#include "bench/gpu/kernel_trace.h"

#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "gpu/cuda_check.h"

#if KESTREL_HAVE_CUPTI
#include <cupti.h>
#endif

namespace kestrel::gpu::bench {
namespace {

#if KESTREL_HAVE_CUPTI
// "void ns::f<...>(args)" → "f": the name before the template arguments and the parameter list, without namespaces.
std::string short_name(const char* mangled) {
  int st = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &st), std::free);
  std::string s = st == 0 && d ? std::string(d.get()) : std::string(mangled);
  // Cut at the first '<' or '(' that is not inside an "(anonymous namespace)".
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 21, "(anonymous namespace)") == 0) {
      out += "(anonymous namespace)";
      i += 20;
      continue;
    }
    if (s[i] == '<' || s[i] == '(') break;
    out += s[i];
  }
  if (const size_t sp = out.rfind(' '); sp != std::string::npos) out = out.substr(sp + 1);  // a return type
  if (const size_t c = out.rfind("::"); c != std::string::npos) out = out.substr(c + 2);
  return out;
}

struct Recorder {
  std::mutex mu;
  std::map<std::string, KernelTime> by_name;
  uint64_t first = UINT64_MAX, last = 0;
  std::map<const char*, std::string> names;  // CUPTI's name pointers are stable: demangle each once
};
Recorder* g_rec = nullptr;

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  if (g_rec != nullptr) {
    std::lock_guard<std::mutex> lock(g_rec->mu);
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      auto it = g_rec->names.find(k->name);
      if (it == g_rec->names.end()) it = g_rec->names.emplace(k->name, short_name(k->name)).first;
      KernelTime& t = g_rec->by_name[it->second];
      t.name = it->second;
      t.calls += 1;
      t.total_us += static_cast<double>(k->end - k->start) * 1e-3;
      g_rec->first = std::min<uint64_t>(g_rec->first, k->start);
      g_rec->last = std::max<uint64_t>(g_rec->last, k->end);
    }
  }
  std::free(buffer);
}

Status cupti_try(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return ok_status();
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  return make_error(ErrorCode::kInternal, std::string("kernel trace: ") + what + ": " + (msg ? msg : "?"));
}
#endif

}  // namespace

bool kernel_trace_available() { return KESTREL_HAVE_CUPTI != 0; }

Status kernel_trace_start() {
#if KESTREL_HAVE_CUPTI
  if (g_rec != nullptr) return make_error(ErrorCode::kInvalidArgument, "kernel trace: already on");
  g_rec = new Recorder();
  KESTREL_TRY(cupti_try(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks"));
  return cupti_try(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
#else
  return make_error(ErrorCode::kUnsupported, "kernel trace: built without CUPTI");
#endif
}

Expected<KernelTraceResult> kernel_trace_stop() {
#if KESTREL_HAVE_CUPTI
  if (g_rec == nullptr) return make_error(ErrorCode::kInvalidArgument, "kernel trace: not on");
  KESTREL_CUDA_TRY(cudaDeviceSynchronize());
  KESTREL_TRY(cupti_try(cuptiActivityFlushAll(1), "flush"));
  KESTREL_TRY(cupti_try(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable kernel records"));
  std::unique_ptr<Recorder> rec(g_rec);
  g_rec = nullptr;
  KernelTraceResult r;
  for (auto& [name, t] : rec->by_name) {
    r.sum_us += t.total_us;
    r.kernels.push_back(t);
  }
  std::sort(r.kernels.begin(), r.kernels.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.total_us > b.total_us; });
  r.span_us = rec->last > rec->first ? static_cast<double>(rec->last - rec->first) * 1e-3 : 0.0;
  return r;
#else
  return make_error(ErrorCode::kUnsupported, "kernel trace: built without CUPTI");
#endif
}

std::string kernel_trace_table(const KernelTraceResult& r, double per, int top) {
  if (r.kernels.empty() || per <= 0) return "no kernels recorded\n";
  std::string s = "| kernel | calls | ms | us a call | share |\n|---|---|---|---|---|\n";
  char buf[256];
  double rest_us = 0;
  int64_t rest_calls = 0;
  for (size_t i = 0; i < r.kernels.size(); ++i) {
    const KernelTime& k = r.kernels[i];
    if (static_cast<int>(i) >= top) {
      rest_us += k.total_us;
      rest_calls += k.calls;
      continue;
    }
    std::snprintf(buf, sizeof buf, "| %s | %.1f | %.3f | %.2f | %.1f%% |\n", k.name.c_str(), k.calls / per,
                  k.total_us / per * 1e-3, k.total_us / k.calls, 100.0 * k.total_us / r.sum_us);
    s += buf;
  }
  if (rest_calls > 0) {
    std::snprintf(buf, sizeof buf, "| (%zu others) | %.1f | %.3f | %.2f | %.1f%% |\n", r.kernels.size() - top,
                  rest_calls / per, rest_us / per * 1e-3, rest_us / rest_calls, 100.0 * rest_us / r.sum_us);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "kernels' sum %.3f ms, first start to last end %.3f ms (each divided by %g)\n",
                r.sum_us / per * 1e-3, r.span_us / per * 1e-3, per);
  s += buf;
  return s;
}

}  // namespace kestrel::gpu::bench
