// gpu/moe_router + gpu/moe_experts against core/reference's ref::moe_route / ref::moe_forward, on the tiny presets'
// MoE shapes (H 64, 16 experts top-4, expert ff 64, shared ff 256) and a 35B-A3B-like shape (H 2048, 256 experts
// top-8, expert ff 512, shared ff 512) with 1, 8 and 32 tokens, in Q8_0, Q4_0, F16, Q4_K (+ Q6_K down) and Q4_0.
//
// Routing must match exactly: the device's expert ids equal ref::moe_route's on the same (device) logits and
// ref::moe_forward's selection (the inputs are drawn so that no token has its k-th and (k+1)-th probabilities within
// 1e-4 relative of each other, so a last-ulp difference in the router GEMV cannot legitimately flip a choice); the
// weights agree to 1e-6 relative; the per-expert token lists and each token's entries are checked against a host
// grouping of the device ids. Outputs: |gpu − ref| <= 3e-5 · max|ref| over the token's row (the kernels differ from
// the reference only in summation order, ~1e-6 of the row scale at these sizes). Repeated runs are bit-identical.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/quant/blocks.h"
#include "core/quant/quant.h"
#include "core/reference/moe.h"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/moe_experts.h"
#include "gpu/kernels/moe_router.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;
using test::random_weights;

constexpr double kOutTol = 3e-5;
constexpr double kWeightTol = 2e-6;

struct Shape {
  std::string name;
  int h, e, k, ff, ff_shared;
  GgmlType gate_up, down, shared, router;
};

std::string describe(const Shape& s, int n_tok) {
  std::ostringstream os;
  os << s.name << " H " << s.h << " E " << s.e << " k " << s.k << " ff " << s.ff << " ff_sh " << s.ff_shared
     << " gate/up " << ggml_type_name(s.gate_up) << " down " << ggml_type_name(s.down) << " shared "
     << ggml_type_name(s.shared) << " router " << ggml_type_name(s.router) << " n_tok " << n_tok;
  return os.str();
}

struct HostMoe {
  Shape s;
  std::vector<unsigned char> router, gate, up, down, sh_inp, sh_gate, sh_up, sh_down;
  ref::MoeWeights ref;
};

void make_moe(const Shape& s, HostMoe& m) {
  m.s = s;
  const uint64_t seed = static_cast<uint64_t>(s.h * 131 + s.e * 7 + s.k);
  const float x_scale_in = 1.0f / std::sqrt(static_cast<float>(s.h));
  m.router = random_weights(s.router, s.h, s.e, 1, 2.0f * x_scale_in, seed + 1);
  m.gate = random_weights(s.gate_up, s.h, s.ff, s.e, 0.02f, seed + 2);
  m.up = random_weights(s.gate_up, s.h, s.ff, s.e, 0.02f, seed + 3);
  m.down = random_weights(s.down, s.ff, s.h, s.e, 0.02f, seed + 4);
  m.sh_inp = random_weights(GgmlType::kF32, s.h, 1, 1, x_scale_in, seed + 5);
  m.sh_gate = random_weights(s.shared, s.h, s.ff_shared, 1, 0.02f, seed + 6);
  m.sh_up = random_weights(s.shared, s.h, s.ff_shared, 1, 0.02f, seed + 7);
  m.sh_down = random_weights(s.shared, s.ff_shared, s.h, 1, 0.02f, seed + 8);
  const uint64_t H = static_cast<uint64_t>(s.h), E = static_cast<uint64_t>(s.e);
  const uint64_t I = static_cast<uint64_t>(s.ff), Is = static_cast<uint64_t>(s.ff_shared);
  m.ref.n_expert_used = s.k;
  m.ref.router = {s.router, m.router.data(), H, E};
  m.ref.gate_exps = {s.gate_up, m.gate.data(), H, I, E};
  m.ref.up_exps = {s.gate_up, m.up.data(), H, I, E};
  m.ref.down_exps = {s.down, m.down.data(), I, H, E};
  m.ref.shared_gate_inp = {GgmlType::kF32, m.sh_inp.data(), H, 1};
  m.ref.gate_shexp = {s.shared, m.sh_gate.data(), H, Is};
  m.ref.up_shexp = {s.shared, m.sh_up.data(), H, Is};
  m.ref.down_shexp = {s.shared, m.sh_down.data(), Is, H};
}

// Device copies of the weights.
struct DeviceMoe : test::DeviceUploads {
  MoeDeviceWeights w;
};

void upload_moe(const HostMoe& m, DeviceMoe& d) {
  const Shape& s = m.s;
  d.w.n_expert_used = s.k;
  d.w.router = {s.router, d.put(m.router), s.h, s.e};
  d.w.gate_exps = {s.gate_up, d.put(m.gate), s.h, s.ff, s.e};
  d.w.up_exps = {s.gate_up, d.put(m.up), s.h, s.ff, s.e};
  d.w.down_exps = {s.down, d.put(m.down), s.ff, s.h, s.e};
  d.w.shared_gate_inp = {GgmlType::kF32, d.put(m.sh_inp), s.h, 1};
  d.w.gate_shexp = {s.shared, d.put(m.sh_gate), s.h, s.ff_shared};
  d.w.up_shexp = {s.shared, d.put(m.sh_up), s.h, s.ff_shared};
  d.w.down_shexp = {s.shared, d.put(m.sh_down), s.ff_shared, s.h};
}

std::vector<float> draw_x(const HostMoe& m, int n_tok, unsigned seed) {
  return test::draw_routable_x(m.ref.router, m.s.h, m.s.e, m.s.k, n_tok, seed);
}

struct DeviceRun {
  std::vector<float> out, logits, weights, entry_weight;
  std::vector<int32_t> ids, active_expert, active_offset, entry_token, token_entry;
  int n_active = -1;
  int launches = 0;
};

// Copies n elements from the device into v (test::download, which returns nothing on a failed copy).
template <class T>
void get(std::vector<T>& v, const void* src, size_t n) {
  v = test::download<T>(src, n);
  EXPECT_EQ(v.size(), n) << "device-to-host copy failed";
  v.resize(n);  // zeros after a failed copy, as before: the checks that follow fail instead of reading past the end
}

// The routing arrays (moe_route's output) into r.
void read_routing(const MoeRouting& rt, int n_tok, int E, int k, DeviceRun& r) {
  const size_t n_entries = static_cast<size_t>(n_tok * k);
  const size_t max_active = std::min(static_cast<size_t>(E), n_entries);
  get(r.ids, rt.ids, n_entries);
  get(r.weights, rt.weights, n_entries);
  EXPECT_EQ(memcpy_synced(&r.n_active, rt.n_active, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  get(r.active_expert, rt.active_expert, max_active);
  get(r.active_offset, rt.active_offset, max_active + 1);
  get(r.entry_token, rt.entry_token, n_entries);
  get(r.entry_weight, rt.entry_weight, n_entries);
  get(r.token_entry, rt.token_entry, n_entries);
}

DeviceRun run_device(const DeviceMoe& d, const std::vector<float>& x, int n_tok) {
  const MoeDeviceWeights& w = d.w;
  const int H = static_cast<int>(w.router.n_cols), E = static_cast<int>(w.router.n_rows), k = w.n_expert_used;
  DeviceRun r;
  DeviceBuffer dx(x.size() * 4), dout(x.size() * 4), dlog(static_cast<size_t>(n_tok * E) * 4);
  DeviceBuffer ws(moe_workspace_bytes(w, n_tok));
  if (dx.as() == nullptr || dout.as() == nullptr || ws.as() == nullptr || dlog.as() == nullptr) {
    ADD_FAILURE() << "cudaMalloc failed";
    return r;
  }
  EXPECT_EQ(memcpy_synced(dx.as(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(memset_synced(dout.as(), 0xFF, x.size() * 4), cudaSuccess);
  MoeLaunchInfo info;
  const Status s = moe_forward(w, dx.as<float>(), n_tok, dout.as<float>(), ws.as(), nullptr, &info);
  EXPECT_TRUE(s) << s.error().to_string();
  // The router logits as the layer computed them (gemv is deterministic and independent of the batch).
  const Status sl = gemv(w.router, dx.as<float>(), n_tok, dlog.as<float>(), nullptr);
  EXPECT_TRUE(sl) << sl.error().to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  r.launches = info.launches;
  get(r.out, dout.as(), x.size());
  get(r.logits, dlog.as(), static_cast<size_t>(n_tok * E));
  read_routing(info.routing, n_tok, E, k, r);
  (void)H;
  return r;
}

// Checks the grouping arrays against a host grouping of the device's own ids.
void check_grouping(const DeviceRun& r, int n_tok, int k, int E) {
  std::vector<int> active;
  std::vector<int> offset;
  std::vector<int> etok;
  std::vector<float> ew;
  std::vector<int> tok_entry(static_cast<size_t>(n_tok * k), -1);
  for (int e = 0; e < E; ++e) {
    const int first = static_cast<int>(etok.size());
    for (int t = 0; t < n_tok; ++t) {
      for (int j = 0; j < k; ++j) {
        if (r.ids[static_cast<size_t>(t * k + j)] != e) continue;
        int below = 0;
        for (int jj = 0; jj < k; ++jj) below += r.ids[static_cast<size_t>(t * k + jj)] < e ? 1 : 0;
        tok_entry[static_cast<size_t>(t * k + below)] = static_cast<int>(etok.size());
        etok.push_back(t);
        ew.push_back(r.weights[static_cast<size_t>(t * k + j)]);
      }
    }
    if (static_cast<int>(etok.size()) > first) {
      active.push_back(e);
      offset.push_back(first);
    }
  }
  offset.push_back(static_cast<int>(etok.size()));
  ASSERT_EQ(r.n_active, static_cast<int>(active.size()));
  for (size_t i = 0; i < active.size(); ++i) {
    ASSERT_EQ(r.active_expert[i], active[i]) << "active slot " << i;
    ASSERT_EQ(r.active_offset[i], offset[i]) << "active slot " << i;
  }
  ASSERT_EQ(r.active_offset[active.size()], offset.back());
  for (size_t i = 0; i < etok.size(); ++i) {
    ASSERT_EQ(r.entry_token[i], etok[i]) << "entry " << i;
    ASSERT_EQ(r.entry_weight[i], ew[i]) << "entry " << i;
  }
  for (size_t i = 0; i < tok_entry.size(); ++i) ASSERT_EQ(r.token_entry[i], tok_entry[i]) << "token slot " << i;
}

void check_case(const Shape& s, const HostMoe& m, const DeviceMoe& d, int n_tok) {
  const std::string what = describe(s, n_tok);
  SCOPED_TRACE(what);
  const std::vector<float> x = draw_x(m, n_tok, 77u + static_cast<unsigned>(n_tok));
  std::vector<float> want(x.size());
  std::vector<int32_t> want_sel(static_cast<size_t>(n_tok * s.k));
  const Status rs = ref::moe_forward(m.ref, x.data(), n_tok, want.data(), want_sel.data());
  ASSERT_TRUE(rs) << rs.error().to_string();
  const DeviceRun got = run_device(d, x, n_tok);
  ASSERT_EQ(got.out.size(), want.size());
  EXPECT_GT(got.launches, 0);

  // Routing on the device's logits: exact ids, weights to kWeightTol.
  for (int t = 0; t < n_tok; ++t) {
    std::vector<int32_t> ids(static_cast<size_t>(s.k));
    std::vector<float> wts(static_cast<size_t>(s.k));
    ref::moe_route(got.logits.data() + static_cast<size_t>(t * s.e), s.e, s.k, ids.data(), wts.data());
    for (int j = 0; j < s.k; ++j) {
      const size_t i = static_cast<size_t>(t * s.k + j);
      ASSERT_EQ(got.ids[i], ids[static_cast<size_t>(j)]) << "token " << t << " slot " << j << " (device logits)";
      ASSERT_EQ(got.ids[i], want_sel[i]) << "token " << t << " slot " << j << " (reference logits)";
      EXPECT_NEAR(got.weights[i], wts[static_cast<size_t>(j)], kWeightTol * std::fabs(wts[static_cast<size_t>(j)]))
          << "token " << t << " slot " << j << " expert " << ids[static_cast<size_t>(j)];
    }
  }
  check_grouping(got, n_tok, s.k, s.e);

  EXPECT_EQ(test::count_out_of_tolerance(got.out, want, n_tok, s.h, kOutTol, what, got.launches, got.n_active), 0);
  const DeviceRun again = run_device(d, x, n_tok);
  EXPECT_EQ(std::memcmp(again.out.data(), got.out.data(), got.out.size() * 4), 0) << "repeated run differs";
}

void run_shape(const Shape& s, std::initializer_list<int> n_toks) {
  HostMoe m;
  make_moe(s, m);
  DeviceMoe d;
  upload_moe(m, d);
  const Status c = moe_check_weights(d.w);
  ASSERT_TRUE(c) << c.error().to_string();
  for (int n : n_toks) check_case(s, m, d, n);
}

TEST(Moe, TinyQ8_0) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"tiny", 64, 16, 4, 64, 256, GgmlType::kQ8_0, GgmlType::kQ8_0, GgmlType::kQ8_0, GgmlType::kF32},
            {1, 3, 8, 32});
}

TEST(Moe, TinyQ4_0F16) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"tiny", 64, 16, 4, 64, 256, GgmlType::kQ4_0, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0},
            {1, 8, 32});
}

TEST(Moe, Qwen35Moe35BShapeQ4_K) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"35B-A3B-like", 2048, 256, 8, 512, 512, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ8_0, GgmlType::kF32},
            {1, 8, 32});
}

TEST(Moe, Qwen35Moe35BShapeQ4_0) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"35B-A3B-like", 2048, 256, 8, 512, 512, GgmlType::kQ4_0, GgmlType::kQ4_0, GgmlType::kQ4_0, GgmlType::kF32},
            {1, 8, 32});
}

TEST(Moe, OddShapeTopOneAndAllExperts) {
  KESTREL_REQUIRE_DEVICE();
  run_shape({"odd k=1", 96, 5, 1, 40, 24, GgmlType::kQ8_0, GgmlType::kF32, GgmlType::kF16, GgmlType::kF32}, {1, 7});
  run_shape({"odd k=E", 96, 5, 5, 40, 24, GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kF16, GgmlType::kF32}, {2});
}

// moe_route alone on crafted logits, against ref::moe_route on the same logits (ids exact, weights to kWeightTol)
// and the host grouping of its ids: logits from {−1, 0, 0.5} (many bit-equal p: the lower expert id must win, in
// every round), E not a multiple of 32, E = 512 (16 logits a lane) and E = kMoeMaxExperts with k = kMoeMaxUsed
// (32 a lane), 1 to 32 tokens; repeated runs bit-identical.
TEST(Moe, RouteTiesAndExpertCounts) {
  KESTREL_REQUIRE_DEVICE();
  struct Case {
    int e, k, n_tok;
    bool ties;
  };
  std::mt19937 rng(2024);
  for (const Case c : {Case{300, 7, 32, false}, Case{300, 7, 5, true}, Case{33, 32, 2, true}, Case{512, 10, 32, false},
                       Case{512, 10, 3, true}, Case{kMoeMaxExperts, kMoeMaxUsed, 3, true},
                       Case{kMoeMaxExperts, 8, 32, false}, Case{256, 8, 1, true}}) {
    SCOPED_TRACE("E " + std::to_string(c.e) + " k " + std::to_string(c.k) + " n_tok " + std::to_string(c.n_tok) +
                 (c.ties ? " ties" : ""));
    std::vector<float> logits(static_cast<size_t>(c.n_tok * c.e));
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::uniform_int_distribution<int> pick(0, 2);
    constexpr float kLevels[3] = {-1.0f, 0.0f, 0.5f};
    for (auto& v : logits) v = c.ties ? kLevels[pick(rng)] : normal(rng);
    DeviceBuffer dlog(logits.size() * 4);
    DeviceBuffer dr(moe_routing_bytes(c.n_tok, c.e, c.k));
    ASSERT_EQ(memcpy_synced(dlog.as(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    const MoeRouting rt = moe_routing_carve(dr.as(), c.n_tok, c.e, c.k);
    DeviceRun runs[2];
    for (DeviceRun& run : runs) {
      const Status st = moe_route(dlog.as<float>(), c.n_tok, c.e, c.k, rt, nullptr);
      ASSERT_TRUE(st) << st.error().to_string();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      read_routing(rt, c.n_tok, c.e, c.k, run);
    }
    const DeviceRun& got = runs[0];
    for (int t = 0; t < c.n_tok; ++t) {
      std::vector<int32_t> ids(static_cast<size_t>(c.k));
      std::vector<float> wts(static_cast<size_t>(c.k));
      ref::moe_route(logits.data() + static_cast<size_t>(t * c.e), c.e, c.k, ids.data(), wts.data());
      for (int j = 0; j < c.k; ++j) {
        const size_t i = static_cast<size_t>(t * c.k + j);
        ASSERT_EQ(got.ids[i], ids[static_cast<size_t>(j)]) << "token " << t << " slot " << j;
        EXPECT_NEAR(got.weights[i], wts[static_cast<size_t>(j)], kWeightTol * std::fabs(wts[static_cast<size_t>(j)]))
            << "token " << t << " slot " << j;
      }
    }
    check_grouping(got, c.n_tok, c.k, c.e);
    EXPECT_EQ(runs[1].ids, got.ids);
    EXPECT_EQ(std::memcmp(runs[1].weights.data(), got.weights.data(), got.weights.size() * 4), 0);
  }
}

TEST(Moe, RefusesBadArguments) {
  MoeDeviceWeights w;  // empty
  alignas(16) float dummy[4] = {};
  Status s = moe_forward(w, dummy, 1, dummy, dummy, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.error().message.find("ffn_gate_inp"), std::string::npos) << s.error().message;
  MoeRouting r;
  s = moe_route(dummy, 1, 16, 4, r, nullptr);
  EXPECT_FALSE(s);
  s = moe_route(dummy, kMoeMaxTokens + 1, 16, 4, moe_routing_carve(dummy, 1, 16, 4), nullptr);
  EXPECT_FALSE(s);
  s = moe_route(dummy, 1, 16, 17, moe_routing_carve(dummy, 1, 16, 4), nullptr);
  EXPECT_FALSE(s);
}

}  // namespace
}  // namespace kestrel::gpu
