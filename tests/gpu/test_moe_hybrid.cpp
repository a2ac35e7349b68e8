// The hybrid MoE layer (gpu/kernels/moe_hybrid.h): moe_forward_hybrid (raw blocks) and moe_imma_forward_hybrid
// (GEMV v4) with a part of the routed experts resident in compact stacks and the rest computed on the host, against
// ref::moe_forward, on the tiny presets' MoE shape (H 64, 16 experts top-4, expert ff 64, shared ff 256; Q8_0 and
// F16), an odd shape without a shared expert (E 24 top-3), and for moe_imma a Q4_0 / Q4_K shape (H 256, E 24 top-3,
// ff 128, shared ff 128) and the 35B-A3B shape (H 2048, 256 experts top-8, ff 512), at 1, 5 and 32 tokens, under
// resident sets: every expert, none, the even ids, one expert, and a random half.
//
// The host half is this test's own oracle, run synchronously inside the after_route hook: the device's host_choices
// and x are copied back, each token's host experts are computed with the reference's SwiGLU (ref::swiglu_forward on
// the expert's slices) and summed by ascending expert id from 0 — ExpertBackend's contract — and the sums are
// uploaded as host_y. Checks:
//   - host_choices hold, per token, exactly the routing's selections of host experts with their weights, in the
//     routing's order, and kExpertNotHere for the resident ones (against the all-resident layer's routing);
//   - the output is within test_moe's bound (3e-5 · the row's max|ref|) of ref::moe_forward; the workspace starts
//     as NaN bytes, so a read of a host entry's unwritten rows fails;
//   - with every expert resident the output equals moe_forward's / moe_imma_forward's (host_y is zero rows: y + 0);
//   - repeated runs are bit-identical; a token's output is the same alone and in a batch of 32;
//   - with nothing resident and no shared expert the layer launches no expert kernel; the checks refuse bad input.
// Device tests skip without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/engine/expert_backend.h"
#include "core/reference/ffn.h"
#include "core/reference/matvec.h"
#include "core/reference/moe.h"
#include "gpu/kernels/moe_experts.h"
#include "gpu/kernels/moe_hybrid.h"
#include "gpu/kernels/moe_imma.h"
#include "gpu/memory/tiled_matrix.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/moe_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;
using test::random_weights;

constexpr double kOutTol = 3e-5;

struct Shape {
  std::string name;
  int h, e, k, ff, ff_shared;  // ff_shared 0: no shared expert
  GgmlType gate_up, down;
  bool imma;  // moe_imma_forward_hybrid (ff_shared == ff, GEMV v4 types), else moe_forward_hybrid
};

struct HostMoe {
  Shape s;
  std::vector<unsigned char> router, gate, up, down, sh_inp, sh_gate, sh_up, sh_down;
  ref::MoeWeights ref;
};

void make_moe(const Shape& s, HostMoe& m) {
  m.s = s;
  const uint64_t seed = static_cast<uint64_t>(s.h * 131 + s.e * 7 + s.k + static_cast<int>(s.gate_up) * 5);
  const float x_scale_in = 1.0f / std::sqrt(static_cast<float>(s.h));
  m.router = random_weights(GgmlType::kF32, s.h, s.e, 1, 2.0f * x_scale_in, seed + 1);
  m.gate = random_weights(s.gate_up, s.h, s.ff, s.e, 0.02f, seed + 2);
  m.up = random_weights(s.gate_up, s.h, s.ff, s.e, 0.02f, seed + 3);
  m.down = random_weights(s.down, s.ff, s.h, s.e, 0.02f, seed + 4);
  const uint64_t H = static_cast<uint64_t>(s.h), E = static_cast<uint64_t>(s.e), I = static_cast<uint64_t>(s.ff);
  m.ref.n_expert_used = s.k;
  m.ref.router = {GgmlType::kF32, m.router.data(), H, E};
  m.ref.gate_exps = {s.gate_up, m.gate.data(), H, I, E};
  m.ref.up_exps = {s.gate_up, m.up.data(), H, I, E};
  m.ref.down_exps = {s.down, m.down.data(), I, H, E};
  if (s.ff_shared > 0) {
    const uint64_t Is = static_cast<uint64_t>(s.ff_shared);
    m.sh_inp = random_weights(GgmlType::kF32, s.h, 1, 1, x_scale_in, seed + 5);
    m.sh_gate = random_weights(s.gate_up, s.h, s.ff_shared, 1, 0.02f, seed + 6);
    m.sh_up = random_weights(s.gate_up, s.h, s.ff_shared, 1, 0.02f, seed + 7);
    m.sh_down = random_weights(s.down, s.ff_shared, s.h, 1, 0.02f, seed + 8);
    m.ref.shared_gate_inp = {GgmlType::kF32, m.sh_inp.data(), H, 1};
    m.ref.gate_shexp = {s.gate_up, m.sh_gate.data(), H, Is};
    m.ref.up_shexp = {s.gate_up, m.sh_up.data(), H, Is};
    m.ref.down_shexp = {s.down, m.sh_down.data(), Is, H};
  }
}

// The slices of `stack` (n_mat matrices of `one` bytes) for the experts `ids`, back to back.
std::vector<unsigned char> gather(const std::vector<unsigned char>& stack, uint64_t one,
                                  const std::vector<int32_t>& ids) {
  std::vector<unsigned char> out;
  for (int32_t e : ids) {
    const auto* p = stack.data() + one * static_cast<uint64_t>(e);
    out.insert(out.end(), p, p + one);
  }
  return out;
}

std::vector<unsigned char> tiled(GgmlType t, const std::vector<unsigned char>& raw, int64_t cols, int64_t rows,
                                 int64_t n) {
  std::vector<unsigned char> out(tiled_bytes(t, cols, rows) * static_cast<uint64_t>(n));
  EXPECT_TRUE(moe_imma_tile_experts(t, raw.data(), cols, rows, n, out));
  return out;
}

// A layer on the device for one resident set: the full layer (every expert) and the hybrid one (compact stacks, the
// resident map), raw or tiled.
struct DeviceLayer : test::DeviceUploads {
  MoeDeviceWeights full_raw, hybrid_raw;
  MoeImmaWeights full_imma, hybrid_imma;
  std::vector<int32_t> resident;  // host copy of the map
  int32_t n_resident = 0;
  const int32_t* resident_dev = nullptr;
};

void build(const HostMoe& m, const std::vector<uint8_t>& here, DeviceLayer& d) {
  const Shape& s = m.s;
  const int64_t H = s.h, I = s.ff, E = s.e;
  std::vector<int32_t> ids;
  d.resident.assign(static_cast<size_t>(E), kExpertNotHere);
  for (int32_t e = 0; e < E; ++e) {
    if (here[static_cast<size_t>(e)] == 0) continue;
    d.resident[static_cast<size_t>(e)] = static_cast<int32_t>(ids.size());
    ids.push_back(e);
  }
  d.n_resident = static_cast<int32_t>(ids.size());
  std::vector<unsigned char> map(d.resident.size() * 4);
  std::memcpy(map.data(), d.resident.data(), map.size());
  d.resident_dev = static_cast<const int32_t*>(d.put(map));
  const uint64_t gu_one = *ggml_row_bytes(s.gate_up, static_cast<uint64_t>(H)) * static_cast<uint64_t>(I);
  const uint64_t dn_one = *ggml_row_bytes(s.down, static_cast<uint64_t>(I)) * static_cast<uint64_t>(H);
  const DeviceMatrixView router{GgmlType::kF32, d.put(m.router), H, E};
  DeviceMatrixView sh_inp;
  if (s.ff_shared > 0) sh_inp = {GgmlType::kF32, d.put(m.sh_inp), H, 1};
  const int64_t Is = s.ff_shared;
  if (!s.imma) {
    for (MoeDeviceWeights* w : {&d.full_raw, &d.hybrid_raw}) {
      w->n_expert_used = s.k;
      w->router = router;
      if (s.ff_shared > 0) {
        w->shared_gate_inp = sh_inp;
        w->gate_shexp = {s.gate_up, d.put(m.sh_gate), H, Is};
        w->up_shexp = {s.gate_up, d.put(m.sh_up), H, Is};
        w->down_shexp = {s.down, d.put(m.sh_down), Is, H};
      }
    }
    d.full_raw.gate_exps = {s.gate_up, d.put(m.gate), H, I, E};
    d.full_raw.up_exps = {s.gate_up, d.put(m.up), H, I, E};
    d.full_raw.down_exps = {s.down, d.put(m.down), I, H, E};
    const int64_t n = d.n_resident;
    auto stack = [&](const std::vector<unsigned char>& v, uint64_t one) -> const void* {
      return n > 0 ? d.put(gather(v, one, ids)) : nullptr;
    };
    d.hybrid_raw.gate_exps = {s.gate_up, stack(m.gate, gu_one), H, I, n};
    d.hybrid_raw.up_exps = {s.gate_up, stack(m.up, gu_one), H, I, n};
    d.hybrid_raw.down_exps = {s.down, stack(m.down, dn_one), I, H, n};
    return;
  }
  for (MoeImmaWeights* w : {&d.full_imma, &d.hybrid_imma}) {
    w->gate_up_type = s.gate_up;
    w->down_type = s.down;
    w->n_expert_used = s.k;
    w->n_embd = H;
    w->n_ff = I;
    w->n_expert = E;
    w->router = router;
    if (s.ff_shared > 0) {
      w->shared_gate_inp = sh_inp;
      w->gate_shexp = d.put(tiled(s.gate_up, m.sh_gate, H, I, 1));
      w->up_shexp = d.put(tiled(s.gate_up, m.sh_up, H, I, 1));
      w->down_shexp = d.put(tiled(s.down, m.sh_down, I, H, 1));
    }
  }
  d.full_imma.gate_exps = d.put(tiled(s.gate_up, m.gate, H, I, E));
  d.full_imma.up_exps = d.put(tiled(s.gate_up, m.up, H, I, E));
  d.full_imma.down_exps = d.put(tiled(s.down, m.down, I, H, E));
  if (d.n_resident > 0) {
    d.hybrid_imma.gate_exps = d.put(tiled(s.gate_up, gather(m.gate, gu_one, ids), H, I, d.n_resident));
    d.hybrid_imma.up_exps = d.put(tiled(s.gate_up, gather(m.up, gu_one, ids), H, I, d.n_resident));
    d.hybrid_imma.down_exps = d.put(tiled(s.down, gather(m.down, dn_one, ids), I, H, d.n_resident));
  }
}

struct Run {
  std::vector<float> out;
  std::vector<ExpertChoice> choices;
  std::vector<int32_t> ids;  // the routing's selections
  std::vector<float> weights;
  int launches = 0;
};

// The ExpertBackend's oracle: y_t = 0, then for t's host choices by ascending id, y_t += expert_e(x_t) · w.
std::vector<float> host_experts(const HostMoe& m, const std::vector<float>& x, const std::vector<ExpertChoice>& c,
                                int n_tok) {
  const Shape& s = m.s;
  std::vector<float> y(static_cast<size_t>(n_tok) * static_cast<size_t>(s.h), 0.0f), e_out(static_cast<size_t>(s.h));
  for (int t = 0; t < n_tok; ++t) {
    std::vector<ExpertChoice> mine(c.begin() + t * s.k, c.begin() + (t + 1) * s.k);
    std::sort(mine.begin(), mine.end(),
              [](const ExpertChoice& a, const ExpertChoice& b) { return a.expert < b.expert; });
    for (const ExpertChoice& ch : mine) {
      if (ch.expert == kExpertNotHere) continue;
      const uint64_t e = static_cast<uint64_t>(ch.expert);
      auto g = ref::expert_matrix(m.ref.gate_exps, e), u = ref::expert_matrix(m.ref.up_exps, e),
           dn = ref::expert_matrix(m.ref.down_exps, e);
      EXPECT_TRUE(g && u && dn);
      if (!g || !u || !dn) return y;
      EXPECT_TRUE(ref::swiglu_forward(*g, *u, *dn, x.data() + static_cast<size_t>(t * s.h), 1, e_out.data()));
      for (int i = 0; i < s.h; ++i) y[static_cast<size_t>(t * s.h + i)] += e_out[static_cast<size_t>(i)] * ch.weight;
    }
  }
  return y;
}

// One layer call. hybrid: the hybrid form with the oracle in the after_route hook; else the all-resident form.
Run run(const HostMoe& m, const DeviceLayer& d, const std::vector<float>& x, int n_tok, bool hybrid) {
  const Shape& s = m.s;
  Run r;
  const size_t rows = static_cast<size_t>(n_tok) * static_cast<size_t>(s.h);
  const size_t ws_bytes =
      s.imma ? moe_imma_workspace_bytes(d.full_imma, n_tok) : moe_workspace_bytes(d.full_raw, n_tok);
  DeviceBuffer dx(rows * 4), dout(rows * 4), ws(ws_bytes), dy(rows * 4),
      dch(static_cast<size_t>(n_tok * s.k) * sizeof(ExpertChoice));
  if (dx.as() == nullptr || dout.as() == nullptr || ws.as() == nullptr || dy.as() == nullptr || dch.as() == nullptr) {
    ADD_FAILURE() << "cudaMalloc failed";
    return r;
  }
  EXPECT_EQ(memcpy_synced(dx.as(), x.data(), rows * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(memset_synced(dout.as(), 0xFF, rows * 4), cudaSuccess);
  EXPECT_EQ(memset_synced(ws.as(), 0xFF, ws_bytes), cudaSuccess);  // NaN: a read of an unwritten row shows
  if (s.imma) {
    EXPECT_TRUE(moe_imma_workspace_init(d.full_imma, ws.as(), nullptr));
  }
  MoeHybrid h;
  h.resident = d.resident_dev;
  h.n_resident = d.n_resident;
  h.host_choices = dch.as<ExpertChoice>();
  h.host_y = dy.as<float>();
  MoePhaseHooks hooks;
  hooks.after_route = [&]() -> Status {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    r.choices = test::download<ExpertChoice>(dch.as(), static_cast<size_t>(n_tok * s.k));
    const std::vector<float> xd = test::download<float>(dx.as(), rows);
    const std::vector<float> y = host_experts(m, xd, r.choices, n_tok);
    EXPECT_EQ(memcpy_synced(dy.as(), y.data(), rows * 4, cudaMemcpyHostToDevice), cudaSuccess);
    return ok_status();
  };
  bool joined = false;
  hooks.before_combine = [&]() -> Status {
    joined = true;
    return ok_status();
  };
  MoeLaunchInfo info;
  Status st = ok_status();
  float* out = dout.as<float>();
  const float* xin = dx.as<float>();
  if (s.imma) {
    st = hybrid ? moe_imma_forward_hybrid(d.hybrid_imma, h, xin, n_tok, out, ws.as(), nullptr, hooks, {}, &info)
                : moe_imma_forward(d.full_imma, xin, n_tok, out, ws.as(), nullptr, {}, &info);
  } else {
    st = hybrid ? moe_forward_hybrid(d.hybrid_raw, h, xin, n_tok, out, ws.as(), nullptr, hooks, &info)
                : moe_forward(d.full_raw, xin, n_tok, out, ws.as(), nullptr, &info);
  }
  EXPECT_TRUE(st) << st.error().to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  if (hybrid) {
    EXPECT_TRUE(joined) << "before_combine was not called";
  }
  r.launches = info.launches;
  r.out = test::download<float>(dout.as(), rows);
  if (st) {
    r.ids = test::download<int32_t>(info.routing.ids, static_cast<size_t>(n_tok * s.k));
    r.weights = test::download<float>(info.routing.weights, static_cast<size_t>(n_tok * s.k));
  }
  return r;
}

std::string describe(const Shape& s, const std::string& set, int n_tok) {
  std::ostringstream os;
  os << s.name << " H " << s.h << " E " << s.e << " k " << s.k << " ff " << s.ff << " ff_sh " << s.ff_shared << " "
     << ggml_type_name(s.gate_up) << (s.imma ? " imma" : " raw") << ", resident: " << set << ", n_tok " << n_tok;
  return os.str();
}

// The resident sets a shape is tried under.
std::vector<std::pair<std::string, std::vector<uint8_t>>> resident_sets(int E) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> sets;
  sets.emplace_back("all", std::vector<uint8_t>(static_cast<size_t>(E), 1));
  sets.emplace_back("none", std::vector<uint8_t>(static_cast<size_t>(E), 0));
  std::vector<uint8_t> even(static_cast<size_t>(E)), one(static_cast<size_t>(E), 0), half(static_cast<size_t>(E), 0);
  for (int e = 0; e < E; ++e) even[static_cast<size_t>(e)] = e % 2 == 0 ? 1 : 0;
  one[static_cast<size_t>(E / 3)] = 1;
  std::vector<int> perm(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = e;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<unsigned>(E)));
  for (int i = 0; i < E / 2; ++i) half[static_cast<size_t>(perm[static_cast<size_t>(i)])] = 1;
  sets.emplace_back("even ids", even);
  sets.emplace_back("one", one);
  sets.emplace_back("random half", half);
  return sets;
}

void check_shape(const Shape& s, std::initializer_list<int> n_toks) {
  HostMoe m;
  make_moe(s, m);
  for (const auto& [set_name, here] : resident_sets(s.e)) {
    DeviceLayer d;
    build(m, here, d);
    for (int n_tok : n_toks) {
      const std::string what = describe(s, set_name, n_tok);
      SCOPED_TRACE(what);
      const std::vector<float> x =
          test::draw_routable_x(m.ref.router, s.h, s.e, s.k, n_tok, 7u + static_cast<unsigned>(n_tok));
      std::vector<float> want(x.size());
      ASSERT_TRUE(ref::moe_forward(m.ref, x.data(), n_tok, want.data()));
      const Run full = run(m, d, x, n_tok, false);
      const Run got = run(m, d, x, n_tok, true);
      ASSERT_EQ(got.out.size(), want.size());
      ASSERT_EQ(got.choices.size(), static_cast<size_t>(n_tok * s.k));
      ASSERT_EQ(full.ids.size(), got.choices.size());
      // The split: the routing's selections, in its order, host experts with their weights.
      EXPECT_EQ(got.ids, full.ids) << "the hybrid routing differs from the all-resident one";
      for (size_t i = 0; i < got.choices.size(); ++i) {
        const int32_t id = full.ids[i];
        const bool host = here[static_cast<size_t>(id)] == 0;
        EXPECT_EQ(got.choices[i].expert, host ? id : kExpertNotHere) << "choice " << i;
        EXPECT_EQ(got.choices[i].weight, host ? full.weights[i] : 0.0f) << "choice " << i;
      }
      EXPECT_EQ(test::count_out_of_tolerance(got.out, want, n_tok, s.h, kOutTol, what, got.launches, d.n_resident), 0);
      if (set_name == "all") {
        EXPECT_EQ(got.out, full.out) << "with every expert resident the hybrid layer is the plain one";
      }
      const Run again = run(m, d, x, n_tok, true);
      EXPECT_EQ(std::memcmp(again.out.data(), got.out.data(), got.out.size() * 4), 0) << "repeated run differs";
      if (n_tok > 1) {  // the last token alone
        const std::vector<float> last(x.end() - s.h, x.end());
        const Run alone = run(m, d, last, 1, true);
        ASSERT_EQ(alone.out.size(), static_cast<size_t>(s.h));
        EXPECT_EQ(std::memcmp(alone.out.data(), got.out.data() + got.out.size() - static_cast<size_t>(s.h),
                              static_cast<size_t>(s.h) * 4),
                  0)
            << "a token's output depends on its batch";
      }
      if (set_name == "none" && s.ff_shared == 0) {
        // router, routing (with the split in moe_imma's), [the split kernel], combine: no expert kernel.
        EXPECT_EQ(got.launches, s.imma ? 3 : 4);
      }
    }
  }
}

TEST(MoeHybrid, RawTinyShapes) {
  if (!test::have_device()) GTEST_SKIP() << "no CUDA device";
  check_shape({"tiny", 64, 16, 4, 64, 256, GgmlType::kQ8_0, GgmlType::kQ8_0, false}, {1, 5, 32});
  check_shape({"tiny f16", 64, 16, 4, 64, 256, GgmlType::kF16, GgmlType::kF16, false}, {1, 5});
  check_shape({"odd, no shared", 96, 24, 3, 32, 0, GgmlType::kQ4_0, GgmlType::kQ8_0, false}, {1, 5, 32});
}

TEST(MoeHybrid, ImmaShapes) {
  if (!test::have_device()) GTEST_SKIP() << "no CUDA device";
  check_shape({"small q4_0", 256, 24, 3, 128, 128, GgmlType::kQ4_0, GgmlType::kQ4_0, true}, {1, 5, 32});
  check_shape({"small q4_k", 256, 24, 3, 256, 256, GgmlType::kQ4_K, GgmlType::kQ6_K, true}, {1, 5});
  check_shape({"no shared", 256, 24, 3, 128, 0, GgmlType::kQ4_0, GgmlType::kQ4_0, true}, {1, 5});
  check_shape({"35b-a3b", 2048, 256, 8, 512, 512, GgmlType::kQ4_0, GgmlType::kQ4_0, true}, {1, 32});
}

TEST(MoeHybrid, ChecksRefuseBadInput) {
  MoeHybrid h;
  EXPECT_EQ(moe_hybrid_check(h, 16).error().code, ErrorCode::kInvalidArgument) << "null buffers";
  int32_t map[16] = {};
  ExpertChoice choices[4];
  float y[4] = {};
  h.resident = map;
  h.host_choices = choices;
  h.host_y = y;
  h.n_resident = 17;
  EXPECT_EQ(moe_hybrid_check(h, 16).error().code, ErrorCode::kInvalidArgument) << "more resident than experts";
  h.n_resident = -1;
  EXPECT_EQ(moe_hybrid_check(h, 16).error().code, ErrorCode::kInvalidArgument);
  h.n_resident = 16;
  EXPECT_TRUE(moe_hybrid_check(h, 16));
  MoeHybridCombine c;
  EXPECT_EQ(moe_hybrid_combine(c, nullptr).error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel::gpu
