// gpu/attention_decode against ref::attn_forward for one decode token per session: several sessions at different
// positions (0, 1, mid, the last position a slot holds), GQA groups of 1..8, batches up to 8, head_dim 16, 18 (not a
// multiple of 4: scalar loads), 40 (not a multiple of 32), 64, 256 and 512, n_rot 0/6/8/10/64, sessions in
// scattered slots of a table with unused slots, on paged caches: pages of 1, 2, 4, 8, 16 and 256 positions, each
// slot's pages shuffled through a pool with unused pages, so positions cross pages inside a tile and a slot's pages
// are in no order; both a test-built pool and the StateSlots pool (whose pages interleave two attention layers). The
// reference layer runs with F32 weights and an identity attn_output, so its output IS the gated attention (the GPU
// op's output); q/k/v for the GPU come from the same ref::matvec_batch. Chunk sizes 3..256 positions exercise the
// split over positions (one to five chunks per sequence, merged by the second kernel). The page of each session's
// new position is first set to a decoy in the device table and then written by kv_page_publish, as the forward pass
// does. Every byte of the pool that the call must not write starts as NaN or prefilled rows: a read of a wrong page
// poisons the output. Checked: the gated attention output, the appended K row (normed, roped) and V row, every other
// byte of the pool unchanged, a second run bit-identical, each session alone bit-identical to the same session in
// the batch, argument errors refused.
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
#include "gpu/kernels/gemv_imma.h"
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
  int chunk = 256;      // positions per attention block (AttnDecodeDims::chunk)
  int page_size = 256;  // positions per KV page
};

std::string describe(const Config& c) {
  std::string s = "n_head " + std::to_string(c.n_head) + " n_kv " + std::to_string(c.n_kv) + " hd " +
                  std::to_string(c.hd) + " n_rot " + std::to_string(c.n_rot) + " n_ctx " + std::to_string(c.n_ctx) +
                  " chunk " + std::to_string(c.chunk) + " page " + std::to_string(c.page_size) + " positions";
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

// A paged KV cache: the layer's table, the device bytes the pool spans (everything a call could touch) and each
// slot's pages (host copy, in position order; the device table lists the same).
struct Caches {
  KvPageTable table;
  float* pool = nullptr;  // device
  size_t pool_floats = 0;
  std::vector<std::vector<int32_t>> pages;  // per slot

  // Float offsets from `pool` of the K / V row of a slot's position (kv head 0).
  size_t row(const float* base, int slot, int p) const {
    const int32_t page = pages[static_cast<size_t>(slot)][static_cast<size_t>(p / table.page_size)];
    return static_cast<size_t>(base - pool) + static_cast<size_t>(page) * static_cast<size_t>(table.page_stride) +
           static_cast<size_t>(p % table.page_size) * static_cast<size_t>(table.n_head_kv * table.head_dim);
  }
  size_t k_row(int slot, int p) const { return row(table.k, slot, p); }
  size_t v_row(int slot, int p) const { return row(table.v, slot, p); }
  int32_t page_of(int slot, int p) const {
    return pages[static_cast<size_t>(slot)][static_cast<size_t>(p / table.page_size)];
  }
};

// Uploads the slots' page lists into the device table (rows of table.max_pages entries).
void upload_table(const Caches& caches, int n_slots) {
  std::vector<int32_t> host(static_cast<size_t>(n_slots) * static_cast<size_t>(caches.table.max_pages), 0);
  for (int s = 0; s < n_slots; ++s) {
    const std::vector<int32_t>& p = caches.pages[static_cast<size_t>(s)];
    std::copy(p.begin(), p.end(), host.begin() + static_cast<std::ptrdiff_t>(s) * caches.table.max_pages);
  }
  KESTREL_CUDA_OK(memcpy_synced(caches.table.pages, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
}

void run_case(const Config& c, const Caches& caches, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  RefLayer layer(c, rng);
  const int n_seq = static_cast<int>(c.n_past.size());
  const size_t H = static_cast<size_t>(layer.dims.n_embd), hd = static_cast<size_t>(c.hd);
  const size_t q_width = static_cast<size_t>(c.n_head) * 2 * hd, kv_width = static_cast<size_t>(c.n_kv) * hd;
  const size_t o_width = static_cast<size_t>(c.n_head) * hd, row_floats = kv_width;
  float* pool = caches.pool;

  // The whole pool starts as NaN: a read of an unused page, of another slot's page or of a row past the position
  // poisons the output.
  const std::vector<float> nan_pool(caches.pool_floats, kNaN);
  KESTREL_CUDA_OK(memcpy_synced(pool, nan_pool.data(), caches.pool_floats * 4, cudaMemcpyHostToDevice));

  // Prefill each session's reference cache, copy its filled rows into the session's pages.
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
      const int slot = c.slot_ids[static_cast<size_t>(b)];
      for (int p = 0; p < np; ++p) {
        KESTREL_CUDA_OK(memcpy_synced(pool + caches.k_row(slot, p),
                                      cache->k.data() + static_cast<size_t>(p) * row_floats, row_floats * 4,
                                      cudaMemcpyHostToDevice));
        KESTREL_CUDA_OK(memcpy_synced(pool + caches.v_row(slot, p),
                                      cache->v.data() + static_cast<size_t>(p) * row_floats, row_floats * 4,
                                      cudaMemcpyHostToDevice));
      }
    }
    ref_caches.push_back(std::move(*cache));
  }
  // The pool before the step, to check what must not change.
  const std::vector<float> pool_before = test::download<float>(pool, caches.pool_floats);

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
  std::vector<int32_t> new_pages, decoys;
  for (int b = 0; b < n_seq; ++b) {
    new_pages.push_back(caches.page_of(slots[static_cast<size_t>(b)], positions[static_cast<size_t>(b)]));
    decoys.push_back(static_cast<int32_t>((new_pages.back() + 1) % (caches.pool_floats / caches.table.page_stride)));
  }
  DeviceBuffer d_qg(qg.size() * 4), d_k(k.size() * 4), d_v(v.size() * 4), d_qn(hd * 4), d_kn(hd * 4),
      d_freq(inv_freq.size() * 4), d_slots(slots.size() * 4), d_pos(positions.size() * 4), d_out(want.size() * 4),
      d_pages(new_pages.size() * 4);
  ASSERT_TRUE(test::upload(d_qg, qg));
  ASSERT_TRUE(test::upload(d_k, k));
  ASSERT_TRUE(test::upload(d_v, v));
  ASSERT_TRUE(test::upload(d_qn, layer.q_norm));
  ASSERT_TRUE(test::upload(d_kn, layer.k_norm));
  ASSERT_TRUE(test::upload(d_freq, inv_freq));
  ASSERT_TRUE(test::upload(d_slots, slots));
  ASSERT_TRUE(test::upload(d_pos, positions));
  ASSERT_TRUE(test::upload(d_pages, new_pages));

  // The table as the slots hold it, but each new position's entry a decoy page (NaN-filled or another session's)
  // until kv_page_publish writes the right one.
  upload_table(caches, c.n_slots);
  for (int b = 0; b < n_seq; ++b) {
    const size_t entry = static_cast<size_t>(slots[static_cast<size_t>(b)]) * caches.table.max_pages +
                         static_cast<size_t>(positions[static_cast<size_t>(b)] / caches.table.page_size);
    KESTREL_CUDA_OK(
        memcpy_synced(caches.table.pages + entry, &decoys[static_cast<size_t>(b)], 4, cudaMemcpyHostToDevice));
  }
  const auto pub =
      kv_page_publish(caches.table, d_slots.as<int32_t>(), d_pos.as<int32_t>(), d_pages.as<int32_t>(), n_seq, nullptr);
  ASSERT_TRUE(pub) << pub.error().to_string();

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

  // The device table holds every slot's pages (the published entries among them).
  const auto table_after = test::download<int32_t>(
      caches.table.pages, static_cast<size_t>(c.n_slots) * static_cast<size_t>(caches.table.max_pages));
  for (int s = 0; s < c.n_slots; ++s) {
    const std::vector<int32_t>& p = caches.pages[static_cast<size_t>(s)];
    EXPECT_TRUE(
        std::equal(p.begin(), p.end(), table_after.begin() + static_cast<std::ptrdiff_t>(s) * caches.table.max_pages))
        << "slot " << s << "'s device page table after kv_page_publish";
  }

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

  // The pool: each session's appended K / V rows match the reference; every other float keeps its bits.
  const auto pool_after = test::download<float>(pool, caches.pool_floats);
  std::vector<bool> written(caches.pool_floats, false);
  for (int b = 0; b < n_seq; ++b) {
    const int slot = c.slot_ids[static_cast<size_t>(b)];
    const int pos = c.n_past[static_cast<size_t>(b)];
    const ref::KvCache& rc = ref_caches[static_cast<size_t>(b)];
    const size_t kr = caches.k_row(slot, pos), vr = caches.v_row(slot, pos);
    std::fill(written.begin() + static_cast<std::ptrdiff_t>(kr),
              written.begin() + static_cast<std::ptrdiff_t>(kr + row_floats), true);
    std::fill(written.begin() + static_cast<std::ptrdiff_t>(vr),
              written.begin() + static_cast<std::ptrdiff_t>(vr + row_floats), true);
    for (int j = 0; j < c.n_kv; ++j) {
      const float* want_k = rc.k_at(pos, j);
      float kmax = 0.0f;
      for (size_t i = 0; i < hd; ++i) kmax = std::max(kmax, std::fabs(want_k[i]));
      const size_t off = kr + static_cast<size_t>(j) * hd;
      const std::vector<float> g(pool_after.begin() + static_cast<std::ptrdiff_t>(off),
                                 pool_after.begin() + static_cast<std::ptrdiff_t>(off + hd));
      const std::vector<float> w(want_k, want_k + hd);
      const std::string diff = test::compare_close(g, w, std::vector<float>(hd, kmax), kRelTol);
      EXPECT_TRUE(diff.empty()) << "appended K of session " << b << " kv head " << j << ": " << diff;
      const size_t voff = vr + static_cast<size_t>(j) * hd;
      EXPECT_TRUE(std::equal(pool_after.begin() + static_cast<std::ptrdiff_t>(voff),
                             pool_after.begin() + static_cast<std::ptrdiff_t>(voff + hd), rc.v_at(pos, j)))
          << "appended V of session " << b << " kv head " << j << " is not the raw v";
    }
  }
  size_t changed = 0, first_changed = 0;
  for (size_t i = 0; i < caches.pool_floats; ++i) {
    if (written[i] || std::memcmp(&pool_after[i], &pool_before[i], 4) == 0) continue;
    if (changed++ == 0) first_changed = i;
  }
  EXPECT_EQ(changed, 0u) << "floats of the pool outside the appended rows changed, the first at " << first_changed;

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

  // The rows of a stacked projection (q|gate, k and v side by side in rows of `width`, with a few floats to spare, as
  // the engine's stacked GEMV writes them) give the same bits as the packed rows.
  const size_t width = q_width + 2 * kv_width + 8;
  std::vector<float> stacked(static_cast<size_t>(n_seq) * width, std::nanf(""));
  for (size_t b = 0; b < static_cast<size_t>(n_seq); ++b) {
    std::copy_n(qg.begin() + static_cast<std::ptrdiff_t>(b * q_width), q_width, stacked.begin() + b * width);
    std::copy_n(k.begin() + static_cast<std::ptrdiff_t>(b * kv_width), kv_width, stacked.begin() + b * width + q_width);
    std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(b * kv_width), kv_width,
                stacked.begin() + b * width + q_width + kv_width);
  }
  DeviceBuffer d_stacked(stacked.size() * 4), d_out2(want.size() * 4);
  ASSERT_TRUE(test::upload(d_stacked, stacked));
  AttnDecodeArgs strided = args;
  strided.qg = d_stacked.as<float>();
  strided.k = strided.qg + q_width;
  strided.v = strided.k + kv_width;
  strided.qg_stride = strided.kv_stride = static_cast<int64_t>(width);
  strided.out = d_out2.as<float>();
  const auto st2 = attention_decode(dims, caches.table, c.n_slots, strided, slots, positions, nullptr);
  ASSERT_TRUE(st2) << st2.error().to_string();
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(std::memcmp(test::download<float>(d_out2.as(), want.size()).data(), got.data(), got.size() * 4), 0)
      << "stacked projection rows differ from packed rows";
  strided.kv_stride = static_cast<int64_t>(kv_width) - 1;
  EXPECT_FALSE(attention_decode(dims, caches.table, c.n_slots, strided, slots, positions, nullptr))
      << "a k/v row stride narrower than the rows is refused";

  // out_prepared (head sizes that are whole groups): the prepared bytes are gemv_imma_prepare_x's of the output, and
  // the output keeps its bits; elsewhere the argument is refused.
  const uint64_t prep_bytes = imma_x_bytes(static_cast<int64_t>(o_width), n_seq);
  AttnDecodeArgs with_prep = args;
  DeviceBuffer d_out3(want.size() * 4), d_prep(std::max<uint64_t>(prep_bytes, 16)), d_prep_want(d_prep.bytes());
  with_prep.out = d_out3.as<float>();
  with_prep.out_prepared = d_prep.as();
  const auto st3 = attention_decode(dims, caches.table, c.n_slots, with_prep, slots, positions, nullptr);
  if (!attention_prepares_out(dims) || prep_bytes == 0) {
    EXPECT_FALSE(st3) << "out_prepared with head_dim " << c.hd << " is refused";
    return;
  }
  ASSERT_TRUE(st3) << st3.error().to_string();
  ASSERT_TRUE(gemv_imma_prepare_x(d_out3.as<float>(), static_cast<int64_t>(o_width), n_seq, d_prep_want.as(), nullptr));
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(std::memcmp(test::download<float>(d_out3.as(), want.size()).data(), got.data(), got.size() * 4), 0)
      << "the output changes with out_prepared";
  EXPECT_TRUE(test::download<uint8_t>(d_prep.as(), prep_bytes) == test::download<uint8_t>(d_prep_want.as(), prep_bytes))
      << "the prepared output differs from gemv_imma_prepare_x's";
}

// A pool built by the test: every slot holds pages for all n_ctx positions, taken in a shuffled order from a pool
// with three unused pages; a page holds K rows, V rows and 4 floats of padding.
struct PlainCaches {
  std::unique_ptr<DeviceBuffer> pool, table;
  Caches caches;
};

std::unique_ptr<PlainCaches> plain_caches(const Config& c, uint32_t seed) {
  auto pc = std::make_unique<PlainCaches>();
  const int per_slot = (c.n_ctx + c.page_size - 1) / c.page_size;
  const int n_pages = c.n_slots * per_slot + 3;
  const int64_t rows = static_cast<int64_t>(c.page_size) * c.n_kv * c.hd;
  const int64_t stride = 2 * rows + 4;
  std::vector<int32_t> order(static_cast<size_t>(n_pages));
  for (int i = 0; i < n_pages; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  pc->caches.pages.resize(static_cast<size_t>(c.n_slots));
  for (int s = 0; s < c.n_slots; ++s) {
    for (int i = 0; i < per_slot; ++i) {
      pc->caches.pages[static_cast<size_t>(s)].push_back(order[static_cast<size_t>(s * per_slot + i)]);
    }
  }
  pc->pool = std::make_unique<DeviceBuffer>(static_cast<size_t>(n_pages * stride) * 4);
  pc->table = std::make_unique<DeviceBuffer>(static_cast<size_t>(c.n_slots * per_slot) * 4);
  KvPageTable& t = pc->caches.table;
  t.k = pc->pool->as<float>();
  t.v = t.k + rows;
  t.pages = pc->table->as<int32_t>();
  t.page_stride = stride;
  t.page_size = c.page_size;
  t.max_pages = per_slot;
  t.n_head_kv = c.n_kv;
  t.head_dim = c.hd;
  pc->caches.pool = t.k;
  pc->caches.pool_floats = static_cast<size_t>(n_pages * stride);
  return pc;
}

TEST(AttentionDecode, MatchesReferenceOverShapesAndPositions) {
  KESTREL_REQUIRE_DEVICE();
  const std::vector<Config> configs = {
      {6, 2, 40, 10, 10000.0f, 70, {66, 1, 33, 7}, {4, 0, 2, 5}, 6, 16, 8},  // hd not a multiple of 32, 1..5 chunks
      {3, 3, 256, 64, 1e7f, 300, {0, 257, 130}, {1, 2, 0}, 3, 256, 256},     // the real head size, MHA, 2 chunks
      {5, 1, 64, 0, 10000.0f, 16, {15, 3}, {1, 3}, 4, 4, 1},                 // no RoPE, group of 5, a page a position
      {2, 1, 512, 64, 1e7f, 8, {2, 0, 7}, {0, 1, 2}, 3, 3, 2},               // largest head_dim; chunks < 4 warps
      {8, 1, 256, 64, 1e7f, 21, {20, 0, 9, 3, 1, 12, 15, 5}, {7, 6, 5, 4, 3, 2, 1, 0}, 8, 256, 16},  // GQA 8, batch 8
      {4, 2, 18, 6, 10000.0f, 37, {36, 0, 17}, {2, 0, 1}, 3, 5, 4},  // hd 18: scalar tile loads across pages
  };
  uint32_t seed = 100;
  for (const Config& c : configs) {
    auto pc = plain_caches(c, seed);
    run_case(c, pc->caches, seed++);
  }
}

TEST(AttentionDecode, RunsOnStateSlotsPages) {
  KESTREL_REQUIRE_DEVICE();
  // The tiny preset with a second attention layer (layer 1): a page holds layer 1's K and V, then layer 3's. Layer 3
  // (4 heads, 2 kv, hd 16, n_rot 8) runs, so its rows sit inside pages shared with layer 1.
  ModelHparams hp = kestrel::test::tiny_hparams(Arch::kQwen35Moe);
  hp.layer_kinds[1] = LayerKind::kFullAttention;
  const int n_ctx = 24, n_slots = 4, page = 4;
  auto slots = StateSlots::create(hp, n_ctx, n_slots, KvPoolConfig{page, 20});
  ASSERT_TRUE(slots) << slots.error().to_string();
  // Slots 3, 1 and 0 take the pages their positions need, interleaved with slot 2's, which it then gives back.
  const std::vector<int> n_past = {0, 5, 23};
  const std::vector<int> slot_ids = {3, 1, 0};
  for (int step = 1; step <= n_ctx; ++step) {
    for (size_t b = 0; b < slot_ids.size(); ++b) {
      ASSERT_TRUE(slots->reserve(slot_ids[b], std::min(step, n_past[b] + 1)));
    }
    if (step == 4) {
      ASSERT_TRUE(slots->reserve(2, 8));
    }
  }
  slots->release(2);
  auto table = slots->kv_table(3);
  ASSERT_TRUE(table) << table.error().to_string();
  Caches caches;
  caches.table = *table;
  caches.pool = *slots->kv_k(0, 1);  // the pool's first float: page 0, layer 1's K
  caches.pool_floats = static_cast<size_t>(slots->n_pages()) * slots->bytes_per_page() / sizeof(float);
  for (int s = 0; s < n_slots; ++s) {
    caches.pages.emplace_back(slots->pages(s).begin(), slots->pages(s).end());
  }
  EXPECT_NE(caches.pages[0], std::vector<int32_t>({0, 1, 2, 3, 4, 5})) << "slot 0's pages should be out of order";
  const Config c{static_cast<int>(hp.n_head),
                 static_cast<int>(hp.n_head_kv),
                 static_cast<int>(hp.head_dim),
                 static_cast<int>(hp.n_rot),
                 hp.rope_freq_base,
                 n_ctx,
                 n_past,
                 slot_ids,
                 n_slots,
                 8,
                 page};
  run_case(c, caches, 7);
}

TEST(AttentionDecode, ArgumentErrorsAreRefusedBeforeLaunch) {
  // Fake device pointers: every call below is refused on the host before anything could dereference them.
  float* f = reinterpret_cast<float*>(uintptr_t{1024});
  int32_t* tab = reinterpret_cast<int32_t*>(uintptr_t{2048});
  const int32_t* ids = reinterpret_cast<const int32_t*>(uintptr_t{4096});
  // Pages of 2 positions, 5 a slot: 10 positions.
  const auto paged = [&](int n_kv, int hd) {
    KvPageTable t;
    t.k = f;
    t.v = f + 2 * n_kv * hd;
    t.pages = tab;
    t.page_stride = 4 * n_kv * hd;
    t.page_size = 2;
    t.max_pages = 5;
    t.n_head_kv = n_kv;
    t.head_dim = hd;
    return t;
  };
  const KvPageTable table = paged(2, 16);
  const AttnDecodeDims dims{4, 2, 16, 8, 1e-6f};
  AttnDecodeArgs a;
  a.qg = a.k = a.v = a.q_norm = a.k_norm = a.rope_inv_freq = f;
  a.out = f;
  a.slot_ids = a.positions = ids;
  const std::vector<int32_t> two_slots = {0, 2}, two_pos = {3, 9};
  auto code = [&](const AttnDecodeDims& d, const KvPageTable& t, const std::vector<int32_t>& s,
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
  EXPECT_TRUE(starts(code(dims, paged(1, 16), two_slots, two_pos), invalid)) << "table kv heads";
  EXPECT_TRUE(starts(code(dims, paged(2, 32), two_slots, two_pos), invalid)) << "table hd";
  KvPageTable bad = table;
  bad.page_size = 3;
  EXPECT_TRUE(starts(code(dims, bad, two_slots, two_pos), invalid)) << "page of 3 positions";
  bad = table;
  bad.pages = nullptr;
  EXPECT_TRUE(starts(code(dims, bad, two_slots, two_pos), invalid)) << "no page table";
  bad = table;
  bad.page_stride = 2 * 2 * 16 - 4;
  EXPECT_TRUE(starts(code(dims, bad, two_slots, two_pos), invalid)) << "pages overlap";
  bad = table;
  bad.page_stride = table.page_stride + 2;
  EXPECT_TRUE(starts(code(dims, bad, two_slots, two_pos), invalid)) << "16-byte loads off alignment";
  bad = table;
  bad.max_pages = 0;
  EXPECT_TRUE(starts(code(dims, bad, two_slots, two_pos), invalid)) << "no entries";
  EXPECT_EQ(attention_decode_device(dims, bad, a, 2, 9, nullptr).error().code, ErrorCode::kInvalidArgument)
      << "the device form checks the table too";
  EXPECT_TRUE(starts(code(AttnDecodeDims{3, 2, 16, 8, 1e-6f}, table, two_slots, two_pos), invalid)) << "n_head % n_kv";
  EXPECT_TRUE(starts(code(AttnDecodeDims{4, 2, 16, 7, 1e-6f}, table, two_slots, two_pos), invalid)) << "odd n_rot";
  EXPECT_TRUE(starts(code(AttnDecodeDims{4, 2, 16, 18, 1e-6f}, table, two_slots, two_pos), invalid)) << "n_rot > hd";
  EXPECT_TRUE(starts(code(AttnDecodeDims{4, 2, 513, 8, 1e-6f}, paged(2, 513), two_slots, two_pos), invalid))
      << "head_dim too large";
  AttnDecodeDims small_chunk = dims;
  small_chunk.chunk = 4;  // position 9 spans 3 chunks: a workspace is required
  EXPECT_TRUE(starts(code(small_chunk, table, two_slots, two_pos), invalid)) << "missing workspace";
  small_chunk.chunk = 0;
  EXPECT_TRUE(starts(code(small_chunk, table, two_slots, two_pos), invalid)) << "chunk 0";
  EXPECT_EQ(code(dims, table, {}, {}), "ok") << "an empty batch launches nothing";
  // kv_page_publish: pointers and the table's geometry.
  EXPECT_EQ(kv_page_publish(table, ids, ids, nullptr, 2, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(kv_page_publish(table, ids, ids, ids, 0, nullptr).error().code, ErrorCode::kInvalidArgument);
  bad = table;
  bad.page_size = 6;
  EXPECT_EQ(kv_page_publish(bad, ids, ids, ids, 2, nullptr).error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel::gpu
