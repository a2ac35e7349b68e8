// gpu/attention_decode against ref::attn_forward for one decode token per session: several sessions at different
// positions (0, 1, mid, the last cache slot), GQA groups of 1..8, batches up to 8, head_dim 16, 40 (not a multiple
// of 32), 64, 256 and 512, n_rot 0/8/10/64, sessions in scattered slots of a table with unused slots, with the caches
// of the StateSlots pool and of plain buffers. The reference layer runs with F32 weights and an identity attn_output,
// so its output IS the gated attention (the GPU op's output); q/k/v for the GPU come from the same ref::matvec_batch.
// Chunk sizes 3..256 positions exercise the split over positions (one to five chunks per sequence, merged by the
// second kernel). Checked: the gated attention output, the appended K row (normed, roped) and V row, the cache
// rows before the position unchanged and other slots untouched, a second run bit-identical, each session alone
// bit-identical to the same session in the batch, argument errors refused.
//
// Tolerance (stated): |gpu - ref| <= 1e-5 · max|V| over the attended rows of that kv head for the output (the
// output is a convex combination of those V values times sigmoid(gate) <= 1; score errors of a few f32 ulps from
// the summation order, device expf/cosf/sinf within 2 ulps, and the online softmax move it by ~1e-6 of that),
// and |gpu - ref| <= 1e-5 · max|K row| for the appended K (RMSNorm sum order, cosf/sinf ulps). V is a plain copy:
// exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/reference/attention.h"
#include "core/reference/kv_cache.h"
#include "core/reference/matvec.h"
#include "core/reference/rope.h"
#include "gpu/kernels/attention_decode.h"
#include "gpu/memory/state_slots.h"
#include "tests/core/model/model_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

constexpr double kRelTol = 1e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Config {
  int n_head, n_kv, hd, n_rot;
  float freq_base;
  int n_ctx;
  std::vector<int> n_past;    // per session: tokens already in its cache (= the new token's position)
  std::vector<int> slot_ids;  // per session
  int n_slots;
  int chunk = 256;  // positions per attention block (AttnDecodeDims::chunk)
};

std::string describe(const Config& c) {
  std::string s = "n_head " + std::to_string(c.n_head) + " n_kv " + std::to_string(c.n_kv) + " hd " +
                  std::to_string(c.hd) + " n_rot " + std::to_string(c.n_rot) + " n_ctx " + std::to_string(c.n_ctx) +
                  " chunk " + std::to_string(c.chunk) + " positions";
  for (int p : c.n_past) s += " " + std::to_string(p);
  return s;
}

// The reference layer: F32 random q/k/v, identity o (so attn_forward's output is the gated attention itself).
struct RefLayer {
  ref::AttnDims dims;
  std::vector<float> wq, wk, wv, wo, q_norm, k_norm;
  ref::AttnWeights w;

  explicit RefLayer(const Config& c, std::mt19937& rng) {
    dims.n_head = c.n_head;
    dims.n_head_kv = c.n_kv;
    dims.head_dim = c.hd;
    dims.n_rot = c.n_rot;
    dims.n_embd = c.n_head * c.hd;
    dims.freq_base = c.freq_base;
    dims.eps = 1e-6f;
    const size_t H = static_cast<size_t>(dims.n_embd), hd = static_cast<size_t>(c.hd);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.5f, 1.5f);
    const float sc = 1.0f / std::sqrt(static_cast<float>(H));
    auto fill = [&](std::vector<float>& v, size_t n, float s) {
      v.resize(n);
      for (float& x : v) x = u(rng) * s;
    };
    fill(wq, H * static_cast<size_t>(c.n_head) * 2 * hd, sc);
    fill(wk, H * static_cast<size_t>(c.n_kv) * hd, sc);
    fill(wv, H * static_cast<size_t>(c.n_kv) * hd, 1.0f);
    wo.assign(H * H, 0.0f);
    for (size_t i = 0; i < H; ++i) wo[i * H + i] = 1.0f;
    q_norm.resize(hd);
    k_norm.resize(hd);
    for (float& x : q_norm) x = pos(rng);
    for (float& x : k_norm) x = pos(rng);
    w.dims = dims;
    w.q = ref::f32_matrix(wq.data(), H, static_cast<uint64_t>(c.n_head) * 2 * hd);
    w.k = ref::f32_matrix(wk.data(), H, static_cast<uint64_t>(c.n_kv) * hd);
    w.v = ref::f32_matrix(wv.data(), H, static_cast<uint64_t>(c.n_kv) * hd);
    w.o = ref::f32_matrix(wo.data(), H, H);
    w.q_norm = q_norm.data();
    w.k_norm = k_norm.data();
  }
};

// Device caches: per slot a K and a V buffer f32 [n_ctx][n_kv][hd] (either plain buffers or a StateSlots pool).
struct Caches {
  KvSlotTable table;
  std::vector<float*> k, v;  // device, per slot
};

void run_case(const Config& c, const Caches& caches, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  RefLayer layer(c, rng);
  const int n_seq = static_cast<int>(c.n_past.size());
  const size_t H = static_cast<size_t>(layer.dims.n_embd), hd = static_cast<size_t>(c.hd);
  const size_t q_width = static_cast<size_t>(c.n_head) * 2 * hd, kv_width = static_cast<size_t>(c.n_kv) * hd;
  const size_t o_width = static_cast<size_t>(c.n_head) * hd, row_floats = kv_width;
  const size_t cache_floats = static_cast<size_t>(c.n_ctx) * row_floats;

  // Every slot starts as NaN: a read of an unused slot or of a row past the position poisons the output.
  const std::vector<float> nan_cache(cache_floats, kNaN);
  for (int s = 0; s < c.n_slots; ++s) {
    KESTREL_CUDA_OK(
        cudaMemcpy(caches.k[static_cast<size_t>(s)], nan_cache.data(), cache_floats * 4, cudaMemcpyHostToDevice));
    KESTREL_CUDA_OK(
        cudaMemcpy(caches.v[static_cast<size_t>(s)], nan_cache.data(), cache_floats * 4, cudaMemcpyHostToDevice));
  }

  // Prefill each session's reference cache, copy its filled rows to the session's slot.
  std::vector<ref::KvCache> ref_caches;
  for (int b = 0; b < n_seq; ++b) {
    auto cache = ref::KvCache::make(c.n_ctx, c.n_kv, c.hd);
    ASSERT_TRUE(cache);
    const int np = c.n_past[static_cast<size_t>(b)];
    if (np > 0) {
      std::vector<float> x(static_cast<size_t>(np) * H), out(static_cast<size_t>(np) * H);
      for (float& e : x) e = u(rng);
      const auto st = ref::attn_forward(layer.w, *cache, x.data(), np, 0, out.data());
      ASSERT_TRUE(st) << st.error().to_string();
      const size_t slot = static_cast<size_t>(c.slot_ids[static_cast<size_t>(b)]);
      KESTREL_CUDA_OK(cudaMemcpy(caches.k[slot], cache->k.data(), static_cast<size_t>(np) * row_floats * 4,
                                 cudaMemcpyHostToDevice));
      KESTREL_CUDA_OK(cudaMemcpy(caches.v[slot], cache->v.data(), static_cast<size_t>(np) * row_floats * 4,
                                 cudaMemcpyHostToDevice));
    }
    ref_caches.push_back(std::move(*cache));
  }
  // Slot contents before the step, to check what must not change.
  std::vector<std::vector<float>> k_before, v_before;
  for (int s = 0; s < c.n_slots; ++s) {
    k_before.push_back(test::download<float>(caches.k[static_cast<size_t>(s)], cache_floats));
    v_before.push_back(test::download<float>(caches.v[static_cast<size_t>(s)], cache_floats));
  }

  // The new token of each session: projections from the same reference matvec.
  std::vector<float> x(static_cast<size_t>(n_seq) * H);
  for (float& e : x) e = u(rng) * 2.0f;
  std::vector<float> qg(static_cast<size_t>(n_seq) * q_width), k(static_cast<size_t>(n_seq) * kv_width),
      v(static_cast<size_t>(n_seq) * kv_width);
  ASSERT_TRUE(ref::matvec_batch(layer.w.q, x.data(), n_seq, qg.data()));
  ASSERT_TRUE(ref::matvec_batch(layer.w.k, x.data(), n_seq, k.data()));
  ASSERT_TRUE(ref::matvec_batch(layer.w.v, x.data(), n_seq, v.data()));
  std::vector<float> want(static_cast<size_t>(n_seq) * o_width);
  for (int b = 0; b < n_seq; ++b) {
    const auto st =
        ref::attn_forward(layer.w, ref_caches[static_cast<size_t>(b)], x.data() + static_cast<size_t>(b) * H, 1,
                          c.n_past[static_cast<size_t>(b)], want.data() + static_cast<size_t>(b) * o_width);
    ASSERT_TRUE(st) << st.error().to_string();
  }

  // Device inputs.
  std::vector<float> inv_freq(static_cast<size_t>(std::max(1, c.n_rot / 2)));
  ref::rope_inv_freq(c.n_rot, c.freq_base, inv_freq.data());
  std::vector<int32_t> slots(c.slot_ids.begin(), c.slot_ids.end()), positions(c.n_past.begin(), c.n_past.end());
  DeviceBuffer d_qg(qg.size() * 4), d_k(k.size() * 4), d_v(v.size() * 4), d_qn(hd * 4), d_kn(hd * 4),
      d_freq(inv_freq.size() * 4), d_slots(slots.size() * 4), d_pos(positions.size() * 4), d_out(want.size() * 4);
  ASSERT_TRUE(test::upload(d_qg, qg));
  ASSERT_TRUE(test::upload(d_k, k));
  ASSERT_TRUE(test::upload(d_v, v));
  ASSERT_TRUE(test::upload(d_qn, layer.q_norm));
  ASSERT_TRUE(test::upload(d_kn, layer.k_norm));
  ASSERT_TRUE(test::upload(d_freq, inv_freq));
  ASSERT_TRUE(test::upload(d_slots, slots));
  ASSERT_TRUE(test::upload(d_pos, positions));
  AttnDecodeDims dims{c.n_head, c.n_kv, c.hd, c.n_rot, 1e-6f, c.chunk};
  const size_t ws_bytes = attention_decode_workspace_bytes(dims, n_seq, c.n_ctx);
  DeviceBuffer d_ws(ws_bytes);
  AttnDecodeArgs args;
  args.qg = d_qg.as<float>();
  args.k = d_k.as<float>();
  args.v = d_v.as<float>();
  args.q_norm = d_qn.as<float>();
  args.k_norm = d_kn.as<float>();
  args.rope_inv_freq = d_freq.as<float>();
  args.slot_ids = d_slots.as<int32_t>();
  args.positions = d_pos.as<int32_t>();
  args.out = d_out.as<float>();
  args.workspace = d_ws.as<float>();
  args.workspace_bytes = ws_bytes;
  const auto st = attention_decode(dims, caches.table, c.n_slots, args, slots, positions, nullptr);
  ASSERT_TRUE(st) << st.error().to_string();
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  const auto got = test::download<float>(d_out.as(), want.size());
  ASSERT_EQ(got.size(), want.size());

  // Output, per session and head, bounded by the largest |V| that head attends to.
  for (int b = 0; b < n_seq; ++b) {
    const ref::KvCache& rc = ref_caches[static_cast<size_t>(b)];
    const int pos = c.n_past[static_cast<size_t>(b)];
    for (int h = 0; h < c.n_head; ++h) {
      const int kvh = h / (c.n_head / c.n_kv);
      float vmax = 0.0f;
      for (int p = 0; p <= pos; ++p) {
        for (size_t i = 0; i < hd; ++i) vmax = std::max(vmax, std::fabs(rc.v_at(p, kvh)[i]));
      }
      const size_t off = static_cast<size_t>(b) * o_width + static_cast<size_t>(h) * hd;
      const std::vector<float> g(got.begin() + static_cast<std::ptrdiff_t>(off),
                                 got.begin() + static_cast<std::ptrdiff_t>(off + hd));
      const std::vector<float> w(want.begin() + static_cast<std::ptrdiff_t>(off),
                                 want.begin() + static_cast<std::ptrdiff_t>(off + hd));
      const std::string diff = test::compare_close(g, w, std::vector<float>(hd, vmax), kRelTol);
      EXPECT_TRUE(diff.empty()) << "output of session " << b << " (slot " << c.slot_ids[static_cast<size_t>(b)]
                                << ", position " << pos << ") head " << h << ": " << diff;
    }
  }

  // Caches: the appended row matches the reference; rows before it and every other slot are unchanged.
  std::vector<bool> used(static_cast<size_t>(c.n_slots), false);
  for (int b = 0; b < n_seq; ++b) {
    const size_t slot = static_cast<size_t>(c.slot_ids[static_cast<size_t>(b)]);
    used[slot] = true;
    const int pos = c.n_past[static_cast<size_t>(b)];
    const ref::KvCache& rc = ref_caches[static_cast<size_t>(b)];
    const auto kc = test::download<float>(caches.k[slot], cache_floats);
    const auto vc = test::download<float>(caches.v[slot], cache_floats);
    const size_t row = static_cast<size_t>(pos) * row_floats;
    for (int j = 0; j < c.n_kv; ++j) {
      const float* want_k = rc.k_at(pos, j);
      float kmax = 0.0f;
      for (size_t i = 0; i < hd; ++i) kmax = std::max(kmax, std::fabs(want_k[i]));
      const size_t off = row + static_cast<size_t>(j) * hd;
      const std::vector<float> g(kc.begin() + static_cast<std::ptrdiff_t>(off),
                                 kc.begin() + static_cast<std::ptrdiff_t>(off + hd));
      const std::vector<float> w(want_k, want_k + hd);
      const std::string diff = test::compare_close(g, w, std::vector<float>(hd, kmax), kRelTol);
      EXPECT_TRUE(diff.empty()) << "appended K of session " << b << " kv head " << j << ": " << diff;
      EXPECT_TRUE(std::equal(vc.begin() + static_cast<std::ptrdiff_t>(off),
                             vc.begin() + static_cast<std::ptrdiff_t>(off + hd), rc.v_at(pos, j)))
          << "appended V of session " << b << " kv head " << j << " is not the raw v";
    }
    const auto& kb = k_before[slot];
    const auto& vb = v_before[slot];
    auto same_bits = [](const float* a, const float* bb, size_t n) { return std::memcmp(a, bb, n * 4) == 0; };
    EXPECT_TRUE(same_bits(kc.data(), kb.data(), row) && same_bits(vc.data(), vb.data(), row))
        << "session " << b << ": rows before position " << pos << " changed";
    EXPECT_TRUE(same_bits(kc.data() + row + row_floats, kb.data() + row + row_floats, cache_floats - row - row_floats))
        << "session " << b << ": rows after position " << pos << " changed";
  }
  for (int s = 0; s < c.n_slots; ++s) {
    if (used[static_cast<size_t>(s)]) continue;
    const auto kc = test::download<float>(caches.k[static_cast<size_t>(s)], cache_floats);
    EXPECT_EQ(std::memcmp(kc.data(), k_before[static_cast<size_t>(s)].data(), cache_floats * 4), 0)
        << "slot " << s << " is not in the batch but changed";
  }

  // A second run (same inputs, same cache row rewritten) is bit-identical.
  ASSERT_TRUE(attention_decode(dims, caches.table, c.n_slots, args, slots, positions, nullptr));
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(std::memcmp(test::download<float>(d_out.as(), want.size()).data(), got.data(), got.size() * 4) == 0)
      << "second run differs";

  // Each session alone gives the same bits as in the batch (the chunking depends only on its own position).
  for (int b = 0; b < n_seq; ++b) {
    AttnDecodeArgs one = args;
    one.qg = args.qg + static_cast<size_t>(b) * q_width;
    one.k = args.k + static_cast<size_t>(b) * kv_width;
    one.v = args.v + static_cast<size_t>(b) * kv_width;
    one.slot_ids = args.slot_ids + b;
    one.positions = args.positions + b;
    DeviceBuffer d_one(o_width * 4);
    one.out = d_one.as<float>();
    const std::vector<int32_t> s1 = {slots[static_cast<size_t>(b)]}, p1 = {positions[static_cast<size_t>(b)]};
    const auto st1 = attention_decode(dims, caches.table, c.n_slots, one, s1, p1, nullptr);
    ASSERT_TRUE(st1) << st1.error().to_string();
    KESTREL_CUDA_OK(cudaDeviceSynchronize());
    const auto alone = test::download<float>(d_one.as(), o_width);
    EXPECT_EQ(std::memcmp(alone.data(), got.data() + static_cast<size_t>(b) * o_width, o_width * 4), 0)
        << "session " << b << " alone differs from the same session in the batch";
  }
}

// Plain device buffers for n_slots slots and their pointer tables.
struct PlainCaches {
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::unique_ptr<DeviceBuffer> k_tab, v_tab;
  Caches caches;
};

std::unique_ptr<PlainCaches> plain_caches(const Config& c) {
  auto pc = std::make_unique<PlainCaches>();
  const size_t bytes = static_cast<size_t>(c.n_ctx) * c.n_kv * c.hd * 4;
  for (int s = 0; s < c.n_slots; ++s) {
    pc->bufs.push_back(std::make_unique<DeviceBuffer>(bytes));
    pc->caches.k.push_back(pc->bufs.back()->as<float>());
    pc->bufs.push_back(std::make_unique<DeviceBuffer>(bytes));
    pc->caches.v.push_back(pc->bufs.back()->as<float>());
  }
  pc->k_tab = std::make_unique<DeviceBuffer>(static_cast<size_t>(c.n_slots) * sizeof(float*));
  pc->v_tab = std::make_unique<DeviceBuffer>(static_cast<size_t>(c.n_slots) * sizeof(float*));
  (void)test::upload(*pc->k_tab, pc->caches.k);
  (void)test::upload(*pc->v_tab, pc->caches.v);
  pc->caches.table = KvSlotTable{pc->k_tab->as<float*>(), pc->v_tab->as<float*>(), c.n_ctx, c.n_kv, c.hd};
  return pc;
}

TEST(AttentionDecode, MatchesReferenceOverShapesAndPositions) {
  KESTREL_REQUIRE_DEVICE();
  const std::vector<Config> configs = {
      {6, 2, 40, 10, 10000.0f, 70, {66, 1, 33, 7}, {4, 0, 2, 5}, 6, 16},  // hd not a multiple of 32, 1..5 chunks
      {3, 3, 256, 64, 1e7f, 300, {0, 257, 130}, {1, 2, 0}, 3, 256},       // the real head size, MHA, 2 chunks
      {5, 1, 64, 0, 10000.0f, 16, {15, 3}, {1, 3}, 4, 4},                 // no RoPE, group of 5, last slot
      {2, 1, 512, 64, 1e7f, 8, {2, 0, 7}, {0, 1, 2}, 3, 3},               // largest head_dim; chunks < 4 warps
      {8, 1, 256, 64, 1e7f, 21, {20, 0, 9, 3, 1, 12, 15, 5}, {7, 6, 5, 4, 3, 2, 1, 0}, 8, 256},  // GQA 8, batch 8
  };
  uint32_t seed = 100;
  for (const Config& c : configs) {
    auto pc = plain_caches(c);
    run_case(c, pc->caches, seed++);
  }
}

TEST(AttentionDecode, RunsOnStateSlotsCaches) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(Arch::kQwen35Moe);  // layer 3: 4 heads, 2 kv, hd 16, n_rot 8
  const int n_ctx = 24, n_slots = 4;
  auto slots = StateSlots::create(hp, n_ctx, n_slots);
  ASSERT_TRUE(slots) << slots.error().to_string();
  auto table = slots->kv_table(3);
  ASSERT_TRUE(table) << table.error().to_string();
  Caches caches;
  caches.table = *table;
  for (int s = 0; s < n_slots; ++s) {
    caches.k.push_back(*slots->kv_k(s, 3));
    caches.v.push_back(*slots->kv_v(s, 3));
  }
  const Config c{static_cast<int>(hp.n_head),
                 static_cast<int>(hp.n_head_kv),
                 static_cast<int>(hp.head_dim),
                 static_cast<int>(hp.n_rot),
                 hp.rope_freq_base,
                 n_ctx,
                 {0, 5, 23},
                 {3, 1, 0},
                 n_slots};
  run_case(c, caches, 7);
}

TEST(AttentionDecode, ArgumentErrorsAreRefusedBeforeLaunch) {
  // Fake device pointers: every call below is refused on the host before anything could dereference them.
  float* f = reinterpret_cast<float*>(uintptr_t{1024});
  float* const* tab = reinterpret_cast<float* const*>(uintptr_t{2048});
  const int32_t* ids = reinterpret_cast<const int32_t*>(uintptr_t{4096});
  const KvSlotTable table{tab, tab, 10, 2, 16};
  const AttnDecodeDims dims{4, 2, 16, 8, 1e-6f};
  AttnDecodeArgs a;
  a.qg = a.k = a.v = a.q_norm = a.k_norm = a.rope_inv_freq = f;
  a.out = f;
  a.slot_ids = a.positions = ids;
  const std::vector<int32_t> two_slots = {0, 2}, two_pos = {3, 9};
  auto code = [&](const AttnDecodeDims& d, const KvSlotTable& t, const std::vector<int32_t>& s,
                  const std::vector<int32_t>& p) {
    const auto st = attention_decode(d, t, 3, a, s, p, nullptr);
    return st ? std::string("ok") : std::string(error_code_name(st.error().code)) + ": " + st.error().message;
  };
  auto starts = [](const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; };
  const std::string oob_pos = code(dims, table, two_slots, {3, 10});
  EXPECT_TRUE(starts(oob_pos, error_code_name(ErrorCode::kOutOfRange))) << oob_pos;
  const std::string oob_slot = code(dims, table, {0, 3}, two_pos);
  EXPECT_TRUE(starts(oob_slot, error_code_name(ErrorCode::kOutOfRange))) << oob_slot;
  const char* invalid = error_code_name(ErrorCode::kInvalidArgument);
  EXPECT_TRUE(starts(code(dims, table, {1, 1}, two_pos), invalid)) << "duplicate slot";
  EXPECT_TRUE(starts(code(dims, table, {1}, two_pos), invalid)) << "span sizes differ";
  EXPECT_TRUE(starts(code(dims, KvSlotTable{tab, tab, 10, 1, 16}, two_slots, two_pos), invalid)) << "table kv heads";
  EXPECT_TRUE(starts(code(dims, KvSlotTable{tab, tab, 10, 2, 32}, two_slots, two_pos), invalid)) << "table hd";
  EXPECT_TRUE(starts(code(AttnDecodeDims{3, 2, 16, 8, 1e-6f}, table, two_slots, two_pos), invalid)) << "n_head % n_kv";
  EXPECT_TRUE(starts(code(AttnDecodeDims{4, 2, 16, 7, 1e-6f}, table, two_slots, two_pos), invalid)) << "odd n_rot";
  EXPECT_TRUE(starts(code(AttnDecodeDims{4, 2, 16, 18, 1e-6f}, table, two_slots, two_pos), invalid)) << "n_rot > hd";
  EXPECT_TRUE(
      starts(code(AttnDecodeDims{4, 2, 513, 8, 1e-6f}, KvSlotTable{tab, tab, 10, 2, 513}, two_slots, two_pos), invalid))
      << "head_dim too large";
  AttnDecodeDims small_chunk = dims;
  small_chunk.chunk = 4;  // position 9 spans 3 chunks: a workspace is required
  EXPECT_TRUE(starts(code(small_chunk, table, two_slots, two_pos), invalid)) << "missing workspace";
  small_chunk.chunk = 0;
  EXPECT_TRUE(starts(code(small_chunk, table, two_slots, two_pos), invalid)) << "chunk 0";
  EXPECT_EQ(code(dims, table, {}, {}), "ok") << "an empty batch launches nothing";
}

}  // namespace
}  // namespace kestrel::gpu
