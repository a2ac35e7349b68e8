// Reference causal conv1d + SiLU over the GDN channels (see gdn_conv.h).
#include "core/reference/gdn_conv.h"

#include <vector>

#include "core/reference/activations.h"

namespace kestrel::ref {

void gdn_conv_step(const float* w, int n_ch, int kernel, const float* x, float* conv_state, float* u) {
  const int hist = kernel - 1;
  for (int c = 0; c < n_ch; ++c) {
    const float* wc = w + static_cast<size_t>(c) * kernel;
    float* sc = conv_state + static_cast<size_t>(c) * hist;
    float y = 0.0f;
    for (int i = 0; i < hist; ++i) y += wc[i] * sc[i];  // older inputs
    y += wc[hist] * x[c];                               // current token
    u[c] = silu(y);
    for (int i = 0; i + 1 < hist; ++i) sc[i] = sc[i + 1];  // drop the oldest, append x
    if (hist > 0) sc[hist - 1] = x[c];
  }
}

void gdn_conv_prefill(const float* w, int n_ch, int kernel, const float* x, int n_tok, float* conv_state, float* u) {
  const int hist = kernel - 1;
  std::vector<float> window(static_cast<size_t>(hist + n_tok));  // f32 [K−1 + T]: one channel's inputs
  for (int c = 0; c < n_ch; ++c) {
    const float* wc = w + static_cast<size_t>(c) * kernel;
    float* sc = conv_state + static_cast<size_t>(c) * hist;
    for (int i = 0; i < hist; ++i) window[static_cast<size_t>(i)] = sc[i];
    for (int t = 0; t < n_tok; ++t) window[static_cast<size_t>(hist + t)] = x[static_cast<size_t>(t) * n_ch + c];
    for (int t = 0; t < n_tok; ++t) {
      float y = 0.0f;
      for (int i = 0; i < kernel; ++i) y += wc[i] * window[static_cast<size_t>(t + i)];
      u[static_cast<size_t>(t) * n_ch + c] = silu(y);
    }
    for (int i = 0; i < hist; ++i) sc[i] = window[static_cast<size_t>(n_tok + i)];  // last K−1 columns
  }
}

}  // namespace kestrel::ref
