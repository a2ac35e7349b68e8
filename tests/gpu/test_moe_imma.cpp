// gpu/moe_imma (the MoE layer on GEMV v4) against ref::moe_forward, in Q4_0 and Q4_K, with and without a shared
// expert, at 1, 3, 8 and 32 tokens: the 35B-A3B shape (H 2048, 256 experts top-8, expert and shared ff 512), odd
// small shapes (E 24 top-3, H 256 / 512, ff 128 / 256; H 192 with ff 64 and k = E = 5, so every expert takes all
// 32 tokens in 4 chunks of 8; k = 1; a Q8_0 router, which takes the gemv + separate preparation path; H 4096), the
// launch count, and the argument checks.
//
// Routing must match exactly (the inputs are drawn so that the k+1 largest router logits of every token are more
// than 1e-4 apart, so a last-ulp difference between the device router GEMV and the reference cannot flip a choice).
// Outputs: |gpu − ref| <= 3e-5 · max|ref| over the token's row, the bound of tests/gpu/test_moe.cpp: GEMV v4's
// products are exact integer sums scaled per 32-element block in f32, and its digit representation of each
// activation loses < 2^-27 of its 256-group's largest |x| (gemv_imma.h), so what remains is f32 summation order
// (~1e-6 of the row scale at these sizes), as in the raw-block version. Repeated runs are bit-identical, with and
// without programmatic dependent launches, and a token's output does not depend on the batch it is in.
// Device tests skip without a GPU; gemv_imma_segments must be linked in (gpu/kernels/gemv_imma.cu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/reference/moe.h"
#include "gpu/kernels/gemm_imma.h"
#include "gpu/kernels/gemv_imma.h"  // kImmaSegmentVectors
#include "gpu/kernels/moe_imma.h"
#include "gpu/kernels/moe_imma_prompt.h"
#include "gpu/memory/tiled_matrix.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;
using test::random_weights;

constexpr double kOutTol = 3e-5;
// gemm_imma at two digits (gemm_imma.h): each activation rounded to 2^-13 of its group's power-of-two bound, an rms
// error of ~2e-4 of the group's spread for Gaussian-like rows; two roundings (x, then the SwiGLU output) give ~3e-4 of
// an output's typical size, and the worst of a row's 2048 outputs over 512 tokens ~5 times that, ~4e-4 of the row's
// largest output. The bound leaves a factor ~5 and stays far below a wrong vector or digit (O(1) of the row).
constexpr double kOutTolTwoDigits = 2e-3;

struct Shape {
  std::string name;
  int h, e, k, ff;
  bool shared;
  GgmlType type;
  GgmlType router = GgmlType::kF32;   // ffn_gate_inp (f32: the router-and-prepare kernel; else gemv + a preparation)
  std::optional<GgmlType> down = {};  // the down matrices' type, when not `type` (Q4_K_M files: Q6_K in some layers)
  GgmlType down_type() const { return down.value_or(type); }
};

std::string describe(const Shape& s, int n_tok) {
  std::ostringstream os;
  os << s.name << " H " << s.h << " E " << s.e << " k " << s.k << " ff " << s.ff << (s.shared ? " +shared" : "") << " "
     << ggml_type_name(s.type) << (s.down ? " down " : "") << (s.down ? ggml_type_name(*s.down) : "")
     << (s.router != GgmlType::kF32 ? " router " : "") << (s.router != GgmlType::kF32 ? ggml_type_name(s.router) : "")
     << " n_tok " << n_tok;
  return os.str();
}

struct HostMoe {
  Shape s;
  std::vector<unsigned char> router, gate, up, down, sh_inp, sh_gate, sh_up, sh_down;
  ref::MoeWeights ref;
};

void make_moe(const Shape& s, HostMoe& m) {
  m.s = s;
  const uint64_t seed = static_cast<uint64_t>(s.h * 131 + s.e * 7 + s.k + static_cast<int>(s.type) * 5 +
                                              static_cast<int>(s.down_type()) * 3);
  const float x_scale_in = 1.0f / std::sqrt(static_cast<float>(s.h));
  m.router = random_weights(s.router, s.h, s.e, 1, 2.0f * x_scale_in, seed + 1);
  m.gate = random_weights(s.type, s.h, s.ff, s.e, 0.02f, seed + 2);
  m.up = random_weights(s.type, s.h, s.ff, s.e, 0.02f, seed + 3);
  m.down = random_weights(s.down_type(), s.ff, s.h, s.e, 0.02f, seed + 4);
  const uint64_t H = static_cast<uint64_t>(s.h), E = static_cast<uint64_t>(s.e), I = static_cast<uint64_t>(s.ff);
  m.ref.n_expert_used = s.k;
  m.ref.router = {s.router, m.router.data(), H, E};
  m.ref.gate_exps = {s.type, m.gate.data(), H, I, E};
  m.ref.up_exps = {s.type, m.up.data(), H, I, E};
  m.ref.down_exps = {s.down_type(), m.down.data(), I, H, E};
  if (s.shared) {
    m.sh_inp = random_weights(GgmlType::kF32, s.h, 1, 1, x_scale_in, seed + 5);
    m.sh_gate = random_weights(s.type, s.h, s.ff, 1, 0.02f, seed + 6);
    m.sh_up = random_weights(s.type, s.h, s.ff, 1, 0.02f, seed + 7);
    m.sh_down = random_weights(s.down_type(), s.ff, s.h, 1, 0.02f, seed + 8);
    m.ref.shared_gate_inp = {GgmlType::kF32, m.sh_inp.data(), H, 1};
    m.ref.gate_shexp = {s.type, m.sh_gate.data(), H, I};
    m.ref.up_shexp = {s.type, m.sh_up.data(), H, I};
    m.ref.down_shexp = {s.down_type(), m.sh_down.data(), I, H};
  }
}

// Raw device copies of the weights (MoeDeviceWeights), from which MoeImmaLayer builds the tiled ones.
struct DeviceMoe : test::DeviceUploads {
  MoeDeviceWeights raw;
  std::unique_ptr<MoeImmaLayer> layer;
};

void upload_moe(const HostMoe& m, DeviceMoe& d) {
  const Shape& s = m.s;
  d.raw.n_expert_used = s.k;
  d.raw.router = {s.router, d.put(m.router), s.h, s.e};
  d.raw.gate_exps = {s.type, d.put(m.gate), s.h, s.ff, s.e};
  d.raw.up_exps = {s.type, d.put(m.up), s.h, s.ff, s.e};
  d.raw.down_exps = {s.down_type(), d.put(m.down), s.ff, s.h, s.e};
  if (s.shared) {
    d.raw.shared_gate_inp = {GgmlType::kF32, d.put(m.sh_inp), s.h, 1};
    d.raw.gate_shexp = {s.type, d.put(m.sh_gate), s.h, s.ff};
    d.raw.up_shexp = {s.type, d.put(m.sh_up), s.h, s.ff};
    d.raw.down_shexp = {s.down_type(), d.put(m.sh_down), s.ff, s.h};
  }
}

std::vector<float> draw_x(const HostMoe& m, int n_tok, unsigned seed) {
  return test::draw_routable_x(m.ref.router, m.s.h, m.s.e, m.s.k, n_tok, seed);
}

struct DeviceRun {
  std::vector<float> out;
  std::vector<int32_t> ids;
  int n_active = -1;
  int launches = 0;
};

DeviceRun run_device(const MoeImmaWeights& w, const std::vector<float>& x, int n_tok,
                     const MoeImmaTuning& tuning = {}) {
  DeviceRun r;
  DeviceBuffer dx(x.size() * 4), dout(x.size() * 4), ws(moe_imma_workspace_bytes(w, n_tok));
  if (dx.as() == nullptr || dout.as() == nullptr || ws.as() == nullptr) {
    ADD_FAILURE() << "cudaMalloc failed";
    return r;
  }
  EXPECT_EQ(memcpy_synced(dx.as(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(memset_synced(dout.as(), 0xFF, x.size() * 4), cudaSuccess);  // NaN: an unwritten element fails
  EXPECT_EQ(memset_synced(ws.as(), 0xA5, ws.bytes()), cudaSuccess);      // garbage: nothing may rely on zeroed scratch
  EXPECT_TRUE(moe_imma_workspace_init(w, ws.as(), nullptr));             // but the counters, zeroed once
  MoeLaunchInfo info;
  const Status s = moe_imma_forward(w, dx.as<float>(), n_tok, dout.as<float>(), ws.as(), nullptr, tuning, &info);
  EXPECT_TRUE(s) << s.error().to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  r.launches = info.launches;
  r.out = test::download<float>(dout.as(), x.size());
  if (s) {
    r.ids = test::download<int32_t>(info.routing.ids, static_cast<size_t>(n_tok * w.n_expert_used));
    EXPECT_EQ(memcpy_synced(&r.n_active, info.routing.n_active, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return r;
}

// Launches moe_imma_forward enqueues: router logits with x's preparation (an f32 router; else the router gemv and
// the preparation apart), route + tables, gate+up, the SwiGLU activations' preparation, down, combine.
int expected_launches(const Shape& s) { return s.router == GgmlType::kF32 ? 6 : 7; }

void check_case(const Shape& s, const HostMoe& m, const DeviceMoe& d, int n_tok) {
  const std::string what = describe(s, n_tok);
  SCOPED_TRACE(what);
  const std::vector<float> x = draw_x(m, n_tok, 91u + static_cast<unsigned>(n_tok));
  std::vector<float> want(x.size());
  std::vector<int32_t> want_sel(static_cast<size_t>(n_tok * s.k));
  const Status rs = ref::moe_forward(m.ref, x.data(), n_tok, want.data(), want_sel.data());
  ASSERT_TRUE(rs) << rs.error().to_string();
  const MoeImmaWeights& w = d.layer->weights();
  const DeviceRun got = run_device(w, x, n_tok);
  ASSERT_EQ(got.out.size(), want.size());
  ASSERT_EQ(got.ids.size(), want_sel.size());
  for (size_t i = 0; i < want_sel.size(); ++i) {
    ASSERT_EQ(got.ids[i], want_sel[i]) << "token " << i / static_cast<size_t>(s.k) << " slot "
                                       << i % static_cast<size_t>(s.k);
  }
  EXPECT_EQ(got.launches, expected_launches(s));

  EXPECT_EQ(test::count_out_of_tolerance(got.out, want, n_tok, s.h, kOutTol, what, got.launches, got.n_active), 0);
  const DeviceRun again = run_device(w, x, n_tok);
  ASSERT_EQ(again.out.size(), got.out.size());
  EXPECT_EQ(std::memcmp(again.out.data(), got.out.data(), got.out.size() * 4), 0) << "repeated run differs";
  // Tunings that must not change a bit, each in one more run: plain and programmatic launches at every size; segments
  // of at most 1, 3 and 8 vectors (the default: 2; experts with more tokens are read in several chunks, the GEMV kernel
  // picked for the largest — each vector's sums do not depend on its segment); the routing kernels.
  const auto expect_same_bits = [&](const std::string& setting, const MoeImmaTuning& tuning) {
    const DeviceRun other = run_device(w, x, n_tok, tuning);
    ASSERT_EQ(other.out.size(), got.out.size());
    size_t n_diff = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < got.out.size(); ++i) {
      if (std::memcmp(&other.out[i], &got.out[i], 4) == 0) continue;
      if (n_diff++ == 0) first = i;
      const double dif = std::fabs(static_cast<double>(other.out[i]) - static_cast<double>(got.out[i]));
      worst = std::isnan(dif) || dif > worst ? dif : worst;
    }
    EXPECT_EQ(n_diff, 0u) << setting << ": the output differs in " << n_diff << " of " << got.out.size()
                          << " elements (first: token " << first / static_cast<size_t>(s.h) << " element "
                          << first % static_cast<size_t>(s.h) << ", " << other.out[first] << " vs " << got.out[first]
                          << "; largest |difference| " << worst << ")";
  };
  const MoeImmaTuning defaults;
  for (const int pdl_max : {0, kMoeMaxTokens}) {
    MoeImmaTuning t;
    t.programmatic_max_tokens = pdl_max;
    expect_same_bits("programmatic launches up to " + std::to_string(pdl_max) + " tokens", t);
  }
  {  // up to 32 entries: the grouping by one warp (the default) against the one-block kernel
    MoeImmaTuning t;
    t.route_by_warp = false;
    expect_same_bits("the chain with the routing of a small call in one block", t);
  }
  for (const int spread_min : {1, kMoeMaxTokens + 1}) {
    MoeImmaTuning t;
    t.route_spread_min_tokens = spread_min;
    expect_same_bits(
        spread_min == 1 ? "the routing in a block per token at every size" : "the routing in one block at every size",
        t);
  }
  for (const int chunk : {1, 3, 8}) {
    for (const int pdl_max : {defaults.programmatic_max_tokens, kMoeMaxTokens}) {
      MoeImmaTuning t;
      t.segment_vectors = chunk;
      t.programmatic_max_tokens = pdl_max;
      expect_same_bits("segments of at most " + std::to_string(chunk) + " vectors, programmatic launches up to " +
                           std::to_string(pdl_max) + " tokens",
                       t);
    }
  }
}

// Host weights of shape s (m) and their device copies, raw and tiled (d.layer).
void build_layer(const Shape& s, HostMoe& m, DeviceMoe& d) {
  make_moe(s, m);
  upload_moe(m, d);
  const Status c = moe_imma_check_raw(d.raw);
  ASSERT_TRUE(c) << c.error().to_string();
  auto layer = MoeImmaLayer::from_raw_device(d.raw);
  ASSERT_TRUE(layer) << layer.error().to_string();
  d.layer = std::move(*layer);
}

void run_shape(const Shape& s, std::initializer_list<int> n_toks) {
  HostMoe m;
  DeviceMoe d;
  ASSERT_NO_FATAL_FAILURE(build_layer(s, m, d));
  for (int n : n_toks) check_case(s, m, d, n);
}

TEST(MoeImma, TileExpertsIsTiledMatrixPerExpert) {
  const int64_t H = 256, I = 64, E = 3;
  for (const GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_K}) {
    const std::vector<unsigned char> raw = random_weights(t, H, I, E, 0.02f, 3);
    const uint64_t one = tiled_bytes(t, H, I);
    std::vector<uint8_t> all(one * E);
    const Status s = moe_imma_tile_experts(t, raw.data(), H, I, E, all);
    ASSERT_TRUE(s) << s.error().to_string();
    std::vector<uint8_t> single(one);
    for (int64_t e = 0; e < E; ++e) {
      ASSERT_TRUE(tile_matrix(t, raw.data() + one * static_cast<uint64_t>(e), H, I, single));
      EXPECT_EQ(std::memcmp(single.data(), all.data() + one * static_cast<uint64_t>(e), one), 0) << "expert " << e;
    }
    std::vector<uint8_t> short_out(one * E - 16);
    EXPECT_FALSE(moe_imma_tile_experts(t, raw.data(), H, I, E, short_out));
  }
}

TEST(MoeImma, Qwen35Moe35BShapeQ4_0) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"35B-A3B-like", 2048, 256, 8, 512, true, GgmlType::kQ4_0}, {1, 3, 8, 32});
}

TEST(MoeImma, Qwen35Moe35BShapeQ4_K) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"35B-A3B-like", 2048, 256, 8, 512, true, GgmlType::kQ4_K}, {1, 3, 8, 32});
}

// A token's output is the same bits whichever batch it runs in (the router's token groups, the routing per token, the
// grouped GEMVs' segments of two and the shape-only split make the layer batch-invariant): the first 1, 3 and 8
// tokens of a 32-token batch, run alone, against the 32-token run.
TEST(MoeImma, TokenBitsDoNotDependOnTheBatch) {
  KESTREL_REQUIRE_DEVICE();
  for (const GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_K}) {
    const Shape s{"35B-A3B-like", 2048, 256, 8, 512, true, type};
    SCOPED_TRACE(describe(s, 32));
    HostMoe m;
    DeviceMoe d;
    ASSERT_NO_FATAL_FAILURE(build_layer(s, m, d));
    const MoeImmaWeights& w = d.layer->weights();
    const std::vector<float> x = draw_x(m, 32, 77u);
    const DeviceRun all = run_device(w, x, 32);
    ASSERT_EQ(all.out.size(), x.size());
    for (const int n : {1, 3, 8}) {
      const size_t len = static_cast<size_t>(n) * static_cast<size_t>(s.h);
      const DeviceRun part =
          run_device(w, std::vector<float>(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(len)), n);
      ASSERT_EQ(part.out.size(), len);
      EXPECT_EQ(std::memcmp(part.out.data(), all.out.data(), len * 4), 0)
          << "the first " << n << " tokens alone differ from the same tokens in a batch of 32";
    }
  }
}

// moe_imma_forward_prompt (one call for up to kMoePromptMaxTokens tokens, each expert read once for all its tokens)
// on GEMV v4 (GemvImmaTuning::prompt_gemm off) gives every token the bits moe_imma_forward gives it in calls of 32: 1,
// 33, 300 and 512 tokens, segments of 2 and 8 vectors, with and without a shared expert, an f32 and a quantized router,
// Q6_K and Q8_0 down stacks, Q5_K gate/up. On gemm_imma (the default, where it takes the type) each token is within the
// layer's tolerance of the reference (ref::moe_forward) and the bits repeat; at two digits within kOutTolTwoDigits.
TEST(MoeImma, PromptCallGivesTheBitsOfCallsOf32) {
  KESTREL_REQUIRE_DEVICE();
  const std::vector<Shape> shapes = {
      {"35B-A3B-like", 2048, 256, 8, 512, true, GgmlType::kQ4_0},
      {"35B-A3B-like", 2048, 256, 8, 512, true, GgmlType::kQ4_K, GgmlType::kF32, GgmlType::kQ6_K},
      {"small, no shared, q8_0 router", 256, 40, 3, 128, false, GgmlType::kQ4_0, GgmlType::kQ8_0},
      {"Q5_K gate/up, Q8_0 down", 512, 24, 3, 256, true, GgmlType::kQ5_K, GgmlType::kF32, GgmlType::kQ8_0},
  };
  for (const Shape& s : shapes) {
    HostMoe m;
    DeviceMoe d;
    ASSERT_NO_FATAL_FAILURE(build_layer(s, m, d));
    const MoeImmaWeights& w = d.layer->weights();
    for (const int n_tok : {1, 33, 300, kMoePromptMaxTokens}) {
      SCOPED_TRACE(describe(s, n_tok));
      const std::vector<float> x = draw_x(m, n_tok, 5u + static_cast<unsigned>(n_tok));
      std::vector<float> want;
      for (int t0 = 0; t0 < n_tok; t0 += kMoeMaxTokens) {
        const int n = std::min(kMoeMaxTokens, n_tok - t0);
        const auto b = x.begin() + static_cast<std::ptrdiff_t>(t0) * s.h;
        const DeviceRun part = run_device(w, std::vector<float>(b, b + static_cast<std::ptrdiff_t>(n) * s.h), n);
        ASSERT_EQ(part.out.size(), static_cast<size_t>(n) * static_cast<size_t>(s.h));
        want.insert(want.end(), part.out.begin(), part.out.end());
      }
      // One prompt call, NaN in the output and 0xA5 in the scratch first (an unwritten element or a read of stale
      // scratch fails).
      const auto prompt_call = [&](int width, bool gemm, GemmDigits digits = GemmDigits::kFour) {
        DeviceBuffer dx(x.size() * 4), dout(x.size() * 4), ws(moe_imma_prompt_workspace_bytes(w, n_tok));
        EXPECT_TRUE(dx.as() != nullptr && dout.as() != nullptr && ws.as() != nullptr);
        EXPECT_EQ(memcpy_synced(dx.as(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        EXPECT_EQ(memset_synced(dout.as(), 0xFF, x.size() * 4), cudaSuccess);
        EXPECT_EQ(memset_synced(ws.as(), 0xA5, ws.bytes()), cudaSuccess);
        GemvImmaTuning grouped;
        grouped.prompt_gemm = gemm;
        grouped.prompt_digits = digits;
        const Status st =
            moe_imma_forward_prompt(w, dx.as<float>(), n_tok, dout.as<float>(), ws.as(), nullptr, width, grouped);
        EXPECT_TRUE(st) << st.error().to_string();
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
        return test::download<float>(dout.as(), x.size());
      };
      {
        std::vector<float> ref_out(x.size());
        std::vector<int32_t> ref_sel(static_cast<size_t>(n_tok * s.k));
        ASSERT_TRUE(ref::moe_forward(m.ref, x.data(), n_tok, ref_out.data(), ref_sel.data()));
        const std::vector<float> got = prompt_call(8, true);
        EXPECT_EQ(test::count_out_of_tolerance(got, ref_out, n_tok, s.h, kOutTol, describe(s, n_tok) + " gemm", 0, 0),
                  0);
        const std::vector<float> again = prompt_call(8, true);
        EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0) << "gemm: a repeated call differs";
        const std::vector<float> two = prompt_call(8, true, GemmDigits::kTwo);
        EXPECT_EQ(test::count_out_of_tolerance(two, ref_out, n_tok, s.h, kOutTolTwoDigits,
                                               describe(s, n_tok) + " gemm, two digits", 0, 0),
                  0);
      }
      for (const int width : {2, 8}) {
        const std::vector<float> got = prompt_call(width, false);
        size_t n_diff = 0, first = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::memcmp(&got[i], &want[i], 4) != 0 && n_diff++ == 0) first = i;
        }
        EXPECT_EQ(n_diff, 0u) << "segments of " << width << ": " << n_diff << " of " << got.size()
                              << " elements differ from calls of 32 (first: token " << first / size_t(s.h) << ", "
                              << got[first] << " vs " << want[first] << ")";
      }
    }
  }
  const Shape s{"35B-A3B-like", 2048, 256, 8, 512, true, GgmlType::kQ4_0};
  HostMoe m;
  DeviceMoe d;
  ASSERT_NO_FATAL_FAILURE(build_layer(s, m, d));
  EXPECT_EQ(moe_imma_prompt_workspace_bytes(d.layer->weights(), kMoePromptMaxTokens + 1), 0u);
  DeviceBuffer ws(64);
  EXPECT_FALSE(moe_imma_forward_prompt(d.layer->weights(), ws.as<float>(), kMoePromptMaxTokens + 1, ws.as<float>(),
                                       ws.as(), nullptr, 2));
  EXPECT_FALSE(moe_imma_forward_prompt(d.layer->weights(), ws.as<float>(), 4, ws.as<float>(), ws.as(), nullptr, 9));
}

// One workspace through calls of 32 tokens (the routing spread over a block per token) and of one token (the routing
// by a warp), in turns: every call leaves the workspace's counter zero for the next.
TEST(MoeImma, CountersSurviveCallsOfBothRoutingsAndReset) {
  KESTREL_REQUIRE_DEVICE();
  const Shape s{"35B-A3B-like", 2048, 256, 8, 512, true, GgmlType::kQ4_0};
  HostMoe m;
  DeviceMoe d;
  ASSERT_NO_FATAL_FAILURE(build_layer(s, m, d));
  const MoeImmaWeights& w = d.layer->weights();
  const std::vector<float> x = draw_x(m, 32, 5u);
  const DeviceRun alone = run_device(w, std::vector<float>(x.begin(), x.begin() + s.h), 1);
  DeviceBuffer dx(x.size() * 4), dout(x.size() * 4), ws(moe_imma_workspace_bytes(w, 32));
  ASSERT_EQ(memcpy_synced(dx.as(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(memset_synced(ws.as(), 0x5A, ws.bytes()), cudaSuccess);
  ASSERT_TRUE(moe_imma_workspace_init(w, ws.as(), nullptr));
  ASSERT_GE(kMoeMaxTokens, MoeImmaTuning{}.route_spread_min_tokens);  // 32-token calls spread their routing
  const size_t n_ctr = moe_imma_counter_bytes(w);
  for (int round = 0; round < 3; ++round) {
    for (const int n : {32, 1, 1}) {
      ASSERT_TRUE(moe_imma_forward(w, dx.as<float>(), n, dout.as<float>(), ws.as(), nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
      const std::vector<uint8_t> ctr = test::download<uint8_t>(ws.as(), n_ctr);
      EXPECT_EQ(std::count(ctr.begin(), ctr.end(), uint8_t{0}), static_cast<std::ptrdiff_t>(n_ctr))
          << "counters not zero after a call of " << n << " tokens, round " << round;
      if (n == 1) {
        const std::vector<float> out = test::download<float>(dout.as(), static_cast<size_t>(s.h));
        EXPECT_EQ(std::memcmp(out.data(), alone.out.data(), out.size() * 4), 0) << "round " << round;
      }
    }
  }
}

TEST(MoeImma, OddShapesQ4_0) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"odd", 256, 24, 3, 128, true, GgmlType::kQ4_0}, {1, 3, 8, 32});
  run_shape({"odd no shared", 256, 24, 3, 128, false, GgmlType::kQ4_0}, {1, 3, 8, 32});
  run_shape({"k=E (all experts, 4 chunks)", 192, 5, 5, 64, true, GgmlType::kQ4_0}, {1, 3, 32});
  run_shape({"k=1", 192, 7, 1, 64, false, GgmlType::kQ4_0}, {1, 8, 32});
  run_shape({"Q8_0 router", 256, 24, 3, 128, true, GgmlType::kQ4_0, GgmlType::kQ8_0}, {1, 8});
  // A longer row (H 4096: four of the router's 1024-column passes, 16 groups of x) and a partial router token group.
  run_shape({"H 4096", 4096, 16, 2, 64, true, GgmlType::kQ4_0}, {5});
}

TEST(MoeImma, OddShapesQ4_K) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"odd", 512, 24, 3, 256, true, GgmlType::kQ4_K}, {1, 3, 8, 32});
  run_shape({"odd no shared", 256, 24, 3, 256, false, GgmlType::kQ4_K}, {1, 3, 8, 32});
  run_shape({"k=E (all experts, 4 chunks)", 256, 5, 5, 256, true, GgmlType::kQ4_K}, {32});
}

// The other types gemv_imma takes, and a down type apart from gate/up's, as real files mix them (Q4_K_M: gate/up
// Q4_K, down Q6_K on some layers; Q5_K_M; Q8_0). The one-launch path takes one Q4 type only: these run the chain.
TEST(MoeImma, OtherAndMixedTypes) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"Q4_K_M-like", 512, 24, 3, 256, true, GgmlType::kQ4_K, GgmlType::kF32, GgmlType::kQ6_K}, {1, 3, 8, 32});
  run_shape({"Q5_K_M-like", 256, 24, 3, 256, true, GgmlType::kQ5_K, GgmlType::kF32, GgmlType::kQ6_K}, {1, 8, 32});
  run_shape({"Q8_0", 256, 24, 3, 128, true, GgmlType::kQ8_0}, {1, 8, 32});
  run_shape(
      {"Q4_0 gate/up, Q8_0 down, no shared", 192, 7, 2, 64, false, GgmlType::kQ4_0, GgmlType::kF32, GgmlType::kQ8_0},
      {1, 32});
}

TEST(MoeImma, RefusesBadWeightsAndArguments) {
  alignas(16) static float fake[64] = {};  // never dereferenced: the checks fail before any launch
  MoeDeviceWeights raw;
  raw.n_expert_used = 2;
  raw.router = {GgmlType::kF32, fake, 256, 8};
  raw.gate_exps = {GgmlType::kBF16, fake, 256, 64, 8};
  raw.up_exps = {GgmlType::kBF16, fake, 256, 64, 8};
  raw.down_exps = {GgmlType::kBF16, fake, 64, 256, 8};
  Status s = moe_imma_check_raw(raw);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(s.error().message.find("bf16"), std::string::npos) << s.error().message;
  raw.gate_exps.type = GgmlType::kQ4_0;  // gate and up must share a type
  raw.up_exps.type = GgmlType::kQ8_0;
  raw.down_exps.type = GgmlType::kQ4_0;
  s = moe_imma_check_raw(raw);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("must share a type"), std::string::npos) << s.error().message;

  raw.gate_exps.type = raw.up_exps.type = raw.down_exps.type = GgmlType::kQ4_0;
  EXPECT_TRUE(moe_imma_check_raw(raw));
  raw.gate_shexp = {GgmlType::kQ4_0, fake, 256, 128};  // shared ff 128 != 64
  raw.up_shexp = {GgmlType::kQ4_0, fake, 256, 128};
  raw.down_shexp = {GgmlType::kQ4_0, fake, 128, 256};
  raw.shared_gate_inp = {GgmlType::kF32, fake, 256, 1};
  s = moe_imma_check_raw(raw);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(s.error().message.find("shared expert ff"), std::string::npos) << s.error().message;

  MoeImmaWeights w;
  w.gate_up_type = w.down_type = GgmlType::kQ4_0;
  w.n_expert_used = 2;
  w.n_embd = 256;
  w.n_ff = 64;
  w.n_expert = 8;
  w.router = {GgmlType::kF32, fake, 256, 8};
  w.gate_exps = w.up_exps = w.down_exps = fake;
  EXPECT_TRUE(moe_imma_check_weights(w));
  s = moe_imma_forward(w, fake, kMoeMaxTokens + 1, fake, fake, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  for (const int bad_width : {0, kImmaSegmentVectors + 1}) {  // vectors per segment of the grouped GEMVs: 1..8
    MoeImmaTuning t;
    t.segment_vectors = bad_width;
    s = moe_imma_forward(w, fake, 1, fake, fake, nullptr, t);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(s.error().message.find("segment_vectors"), std::string::npos) << s.error().message;
  }
  EXPECT_EQ(moe_imma_workspace_bytes(w, 0), 0u);
  w.n_ff = 72;  // not a multiple of 64
  s = moe_imma_check_weights(w);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);
  w.n_ff = 64;
  w.down_type = GgmlType::kQ4_K;  // Q4_K needs n_cols % 256: the down matrix has 64
  EXPECT_FALSE(moe_imma_check_weights(w));
  w.down_type = GgmlType::kQ8_0;  // Q8_0 takes it
  EXPECT_TRUE(moe_imma_check_weights(w));
  w.down_type = GgmlType::kQ4_0;
  w.down_exps = reinterpret_cast<const unsigned char*>(fake) + 4;  // misaligned
  s = moe_imma_check_weights(w);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel::gpu
