// Reference per-layer KV cache (see kv_cache.h).
#include "core/reference/kv_cache.h"

#include <algorithm>
#include <string>

namespace kestrel::ref {

Expected<KvCache> KvCache::make(int n_ctx, int n_head_kv, int head_dim) {
  if (n_ctx <= 0 || n_head_kv <= 0 || head_dim <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "kv cache: n_ctx, n_head_kv and head_dim must be positive (got " +
                                                       std::to_string(n_ctx) + ", " + std::to_string(n_head_kv) + ", " +
                                                       std::to_string(head_dim) + ")");
  }
  KvCache c;
  c.n_ctx = n_ctx;
  c.n_head_kv = n_head_kv;
  c.head_dim = head_dim;
  const size_t n = static_cast<size_t>(n_ctx) * n_head_kv * head_dim;
  c.k.assign(n, 0.0f);
  c.v.assign(n, 0.0f);
  return c;
}

Status KvCache::append(const float* k_tok, const float* v_tok) {
  if (n_used >= n_ctx) {
    return make_error(ErrorCode::kOutOfRange,
                      "kv cache full: all " + std::to_string(n_ctx) + " positions are used (raise the context size)");
  }
  const size_t n = static_cast<size_t>(n_head_kv) * head_dim;
  std::copy(k_tok, k_tok + n, k.begin() + static_cast<std::ptrdiff_t>(offset(n_used, 0)));
  std::copy(v_tok, v_tok + n, v.begin() + static_cast<std::ptrdiff_t>(offset(n_used, 0)));
  ++n_used;
  return ok_status();
}

}  // namespace kestrel::ref
