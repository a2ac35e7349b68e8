// gpu/attention_prompt against attention_decode_device (itself checked against ref::attn_forward in
// test_attention_decode): one session's prompt rows T = 1, 63, 64, 65 and 300 (and 2048 at the 35B-A3B head shape)
// from positions 0 and 37, head_dim 32 / 64 / 128 / 256, GQA groups 1, 4, 8 and 16, n_rot 0 / 16 / 64, on a paged
// cache (pages of 16 and 256 positions, a slot's pages shuffled in a pool with another slot's). The oracle appends and
// attends the rows 32 at a time (as a pass of 32 rows does); attention_prompt runs after attention_kv_append_device of
// every row. Checked: the appended cache bit-identical, the gated output within 1e-5 · max|V| (both are the same
// per-tile arithmetic; the positions are split into other tiles, so the online softmax rounds differently), the
// prepared output bytes (head_dim 256) equal to gemv_imma_prepare_x of the output, argument errors refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/reference/rope.h"
#include "gpu/kernels/attention_decode.h"
#include "gpu/kernels/attention_prompt.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/memory/state_slots.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

struct Case {
  int n_head, n_kv, hd, n_rot, page, n_rows, pos0;
};

std::vector<float> random_vec(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void run_case(const Case& c) {
  SCOPED_TRACE("heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_kv) + " hd " + std::to_string(c.hd) +
               " n_rot " + std::to_string(c.n_rot) + " page " + std::to_string(c.page) + " rows " +
               std::to_string(c.n_rows) + " from " + std::to_string(c.pos0));
  AttnDecodeDims d;
  d.n_head = c.n_head;
  d.n_head_kv = c.n_kv;
  d.head_dim = c.hd;
  d.n_rot = c.n_rot;
  ASSERT_TRUE(attention_prompt_supports(d));
  std::mt19937 rng(static_cast<uint32_t>(c.hd * 7 + c.n_rows + c.pos0));
  const int n_ctx = c.pos0 + c.n_rows;
  const int per_slot = (n_ctx + c.page - 1) / c.page;
  const int n_pages = 2 * per_slot + 1;
  const int64_t rows = int64_t{c.page} * c.n_kv * c.hd;
  const int64_t stride = 2 * rows;
  // Slot 1's pages, shuffled among slot 0's.
  std::vector<int32_t> order(static_cast<size_t>(n_pages));
  for (int i = 0; i < n_pages; ++i) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(2 * per_slot));
  for (int i = 0; i < 2 * per_slot; ++i) table[size_t(i)] = order[size_t(i)];
  const int slot = 1;
  DeviceBuffer pool(static_cast<size_t>(n_pages * stride) * 4), tab(table.size() * 4);
  ASSERT_TRUE(test::upload(tab, table));
  KvPageTable t;
  t.k = pool.as<float>();
  t.v = t.k + rows;
  t.pages = tab.as<int32_t>();
  t.page_stride = stride;
  t.page_size = c.page;
  t.max_pages = per_slot;
  t.n_head_kv = c.n_kv;
  t.head_dim = c.hd;

  // The prompt's positions before pos0 hold earlier tokens' K/V (random, already in the cache).
  std::vector<float> pool_init = random_vec(static_cast<size_t>(n_pages * stride), 1.0f, rng);
  const int64_t qg_w = int64_t{c.n_head} * 2 * c.hd, kv_w = int64_t{c.n_kv} * c.hd, out_w = int64_t{c.n_head} * c.hd;
  const std::vector<float> qg = random_vec(static_cast<size_t>(c.n_rows * qg_w), 1.0f, rng);
  const std::vector<float> k = random_vec(static_cast<size_t>(c.n_rows * kv_w), 1.0f, rng);
  const std::vector<float> v = random_vec(static_cast<size_t>(c.n_rows * kv_w), 1.0f, rng);
  const std::vector<float> qn = random_vec(size_t(c.hd), 0.3f, rng), kn = random_vec(size_t(c.hd), 0.3f, rng);
  std::vector<float> inv(static_cast<size_t>(std::max(c.n_rot / 2, 1)));
  if (c.n_rot > 0) ref::rope_inv_freq(c.n_rot, 10000.0f, inv.data());
  std::vector<int32_t> slots(size_t(c.n_rows), slot), positions(size_t(c.n_rows));
  for (int i = 0; i < c.n_rows; ++i) positions[size_t(i)] = c.pos0 + i;
  DeviceBuffer dqg(qg.size() * 4), dk(k.size() * 4), dv(v.size() * 4), dqn(qn.size() * 4), dkn(kn.size() * 4),
      dinv(inv.size() * 4), dslots(slots.size() * 4), dpos(positions.size() * 4),
      dout(static_cast<size_t>(c.n_rows * out_w) * 4), dprep(imma_x_bytes(out_w, c.n_rows) + 16),
      dprep2(imma_x_bytes(out_w, c.n_rows) + 16);
  ASSERT_TRUE(test::upload(dqg, qg) && test::upload(dk, k) && test::upload(dv, v) && test::upload(dqn, qn) &&
              test::upload(dkn, kn) && test::upload(dinv, inv) && test::upload(dslots, slots) &&
              test::upload(dpos, positions));
  const size_t ws_bytes = attention_decode_workspace_bytes(d, 32, n_ctx);
  DeviceBuffer ws(ws_bytes);
  AttnDecodeArgs a;
  a.qg = dqg.as<float>();
  a.k = dk.as<float>();
  a.v = dv.as<float>();
  a.q_norm = dqn.as<float>();
  a.k_norm = dkn.as<float>();
  a.rope_inv_freq = dinv.as<float>();
  a.workspace = ws.as<float>();
  a.workspace_bytes = ws_bytes;

  // The oracle: 32 rows a call.
  ASSERT_EQ(memcpy_synced(pool.as(), pool_init.data(), pool_init.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  for (int r0 = 0; r0 < c.n_rows; r0 += 32) {
    AttnDecodeArgs ca = a;
    ca.qg = a.qg + r0 * qg_w;
    ca.k = a.k + r0 * kv_w;
    ca.v = a.v + r0 * kv_w;
    ca.slot_ids = dslots.as<int32_t>() + r0;
    ca.positions = dpos.as<int32_t>() + r0;
    ca.out = dout.as<float>() + r0 * out_w;
    ASSERT_TRUE(attention_decode_device(d, t, ca, std::min(32, c.n_rows - r0), n_ctx - 1, nullptr));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> want = test::download<float>(dout.as(), size_t(c.n_rows * out_w));
  const std::vector<float> want_pool = test::download<float>(pool.as(), pool_init.size());

  // attention_prompt after the append of every row.
  ASSERT_EQ(memcpy_synced(pool.as(), pool_init.data(), pool_init.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(memset_synced(dout.as(), 0xFF, size_t(c.n_rows * out_w) * 4), cudaSuccess);
  a.slot_ids = dslots.as<int32_t>();
  a.positions = dpos.as<int32_t>();
  a.out = dout.as<float>();
  const bool prepared = attention_prepares_out(d);
  a.out_prepared = prepared ? dprep.as() : nullptr;
  ASSERT_TRUE(attention_kv_append_device(d, t, a, c.n_rows, nullptr));
  const Status st = attention_prompt(d, t, a, c.n_rows, slot, c.pos0, nullptr);
  ASSERT_TRUE(st) << st.error().to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  const std::vector<float> got = test::download<float>(dout.as(), want.size());
  EXPECT_EQ(test::download<float>(pool.as(), pool_init.size()), want_pool) << "the appended cache differs";

  // Tolerance per kv head: 1e-5 of the largest |V| that head's rows attend (every V value is from N(0, 1) or v).
  float vmax = 0.0f;
  for (float x : pool_init) vmax = std::max(vmax, std::fabs(x));
  for (float x : v) vmax = std::max(vmax, std::fabs(x));
  size_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    worst = std::isnan(diff) ? INFINITY : std::max(worst, diff);
    bad += !(diff <= 1e-5 * vmax) ? 1 : 0;
  }
  EXPECT_EQ(bad, 0u) << "largest |difference| " << worst << " (tolerance " << 1e-5 * vmax << ")";
  if (prepared) {
    ASSERT_TRUE(gemv_imma_prepare_x(dout.as<float>(), out_w, c.n_rows, dprep2.as(), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const size_t pb = imma_x_bytes(out_w, c.n_rows);
    EXPECT_EQ(test::download<uint8_t>(dprep.as(), pb), test::download<uint8_t>(dprep2.as(), pb))
        << "the prepared output is not gemv_imma_prepare_x's";
  }
}

TEST(AttentionPrompt, MatchesTheDecodeKernel) {
  KESTREL_REQUIRE_DEVICE();
  const std::vector<Case> cases = {
      {16, 2, 256, 64, 256, 1, 0},   {16, 2, 256, 64, 256, 63, 0}, {16, 2, 256, 64, 16, 64, 37},
      {16, 2, 256, 64, 256, 65, 37}, {16, 2, 256, 64, 16, 300, 0}, {16, 2, 256, 64, 256, 2048, 0},
      {8, 2, 64, 16, 16, 300, 37},   {4, 4, 128, 0, 16, 65, 0},    {16, 1, 32, 16, 256, 63, 37},
  };
  for (const Case& c : cases) run_case(c);
}

TEST(AttentionPrompt, RefusesWhatItDoesNotTake) {
  AttnDecodeDims d;
  d.n_head = 4;
  d.n_head_kv = 2;
  d.head_dim = 40;
  EXPECT_FALSE(attention_prompt_supports(d)) << "head_dim 40";
  d.head_dim = 512;
  EXPECT_FALSE(attention_prompt_supports(d)) << "head_dim 512";
  d.head_dim = 64;
  d.n_head = 66;
  d.n_head_kv = 2;
  EXPECT_FALSE(attention_prompt_supports(d)) << "a group of 33";
  d.n_head = 4;
  EXPECT_TRUE(attention_prompt_supports(d));
  const KvPageTable empty;
  AttnDecodeArgs a;
  EXPECT_EQ(attention_prompt(d, empty, a, 4, 0, 0, nullptr).error().code, ErrorCode::kInvalidArgument);
  d.head_dim = 40;
  EXPECT_EQ(attention_prompt(d, empty, a, 4, 0, 0, nullptr).error().code, ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace kestrel::gpu
