// moe_route (see moe_router.h): one block; the routing itself is gpu/kernels/moe_route.cuh.
#include <algorithm>
#include <cmath>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/moe_route.cuh"
#include "gpu/kernels/moe_router.h"

namespace kestrel::gpu {
namespace {

using moe_route_dev::kThreads;

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

template <int kPer>
__global__ void __launch_bounds__(kThreads)
    moe_route_kernel(const float* __restrict__ logits, int n_tok, int n_expert, int k, MoeRouting r) {
  moe_route_dev::route_block<kPer>(logits, n_tok, n_expert, k, r);
}

}  // namespace

size_t moe_routing_bytes(int n_tok, int n_expert, int k) {
  const size_t e = static_cast<size_t>(n_tok) * static_cast<size_t>(k);
  const size_t act = std::min(static_cast<size_t>(n_expert), e);
  return 2 * align16(e * 4) + align16(4) + align16(act * 4) + align16((act + 1) * 4) + 3 * align16(e * 4);
}

MoeRouting moe_routing_carve(void* base, int n_tok, int n_expert, int k) {
  const size_t e = static_cast<size_t>(n_tok) * static_cast<size_t>(k);
  const size_t act = std::min(static_cast<size_t>(n_expert), e);
  auto* p = static_cast<unsigned char*>(base);
  auto take = [&p](size_t bytes) {
    unsigned char* at = p;
    p += align16(bytes);
    return at;
  };
  MoeRouting r;
  r.ids = reinterpret_cast<int32_t*>(take(e * 4));
  r.weights = reinterpret_cast<float*>(take(e * 4));
  r.n_active = reinterpret_cast<int32_t*>(take(4));
  r.active_expert = reinterpret_cast<int32_t*>(take(act * 4));
  r.active_offset = reinterpret_cast<int32_t*>(take((act + 1) * 4));
  r.entry_token = reinterpret_cast<int32_t*>(take(e * 4));
  r.entry_weight = reinterpret_cast<float*>(take(e * 4));
  r.token_entry = reinterpret_cast<int32_t*>(take(e * 4));
  return r;
}

Status moe_route(const float* logits, int n_tok, int n_expert, int k, const MoeRouting& r, cudaStream_t stream) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, "moe_route: " + m); };
  if (n_tok < 1 || n_tok > kMoeMaxTokens) {
    return bad("n_tok " + std::to_string(n_tok) + " outside [1, " + std::to_string(kMoeMaxTokens) + "]");
  }
  if (n_expert < 1 || n_expert > kMoeMaxExperts) {
    return bad("n_expert " + std::to_string(n_expert) + " outside [1, " + std::to_string(kMoeMaxExperts) + "]");
  }
  if (k < 1 || k > n_expert || k > kMoeMaxUsed) {
    return bad("k " + std::to_string(k) + " outside [1, min(n_expert, " + std::to_string(kMoeMaxUsed) + ")]");
  }
  if (logits == nullptr || r.ids == nullptr || r.weights == nullptr || r.n_active == nullptr ||
      r.active_expert == nullptr || r.active_offset == nullptr || r.entry_token == nullptr ||
      r.entry_weight == nullptr || r.token_entry == nullptr) {
    return bad("a null pointer (logits or a MoeRouting field)");
  }
  moe_route_dev::with_route_per_lane(n_expert, [&](auto per) {
    moe_route_kernel<decltype(per)::value><<<1, kThreads, 0, stream>>>(logits, n_tok, n_expert, k, r);
  });
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
