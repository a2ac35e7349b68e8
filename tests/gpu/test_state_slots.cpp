// gpu/StateSlots: slots start zeroed; a ref::SessionState filled with random GDN state and a partly filled KV cache
// round-trips through a slot bit for bit (upload then download, compared with SessionState::operator==), and the
// slot's device buffers hold exactly the reference layout; reset zeroes; clone copies one slot into another and
// leaves the rest alone; the per-layer device pointer tables point at each slot's buffers; errors (wrong layer
// kind, bad slot, too many tokens, out of device memory) are refused. Tests that need a device skip without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/reference/session_state.h"
#include "gpu/memory/state_slots.h"
#include "tests/core/model/model_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

constexpr int kCtx = 20;

// A session with random S and conv history in every GDN layer and n_tok random K/V rows in every attention layer.
ref::SessionState random_state(const ModelHparams& hp, int n_ctx, int n_tok, uint32_t seed) {
  auto st = ref::SessionState::create(hp, n_ctx);
  EXPECT_TRUE(st) << st.error().to_string();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (hp.layer_kinds[l] == LayerKind::kGatedDeltaNet) {
      for (float& x : st->gdn(l).s) x = u(rng);
      for (float& x : st->gdn(l).conv) x = u(rng);
    } else {
      ref::KvCache& c = st->kv(l);
      std::vector<float> k(static_cast<size_t>(c.n_head_kv * c.head_dim)), v(k.size());
      for (int t = 0; t < n_tok; ++t) {
        for (float& x : k) x = u(rng);
        for (float& x : v) x = u(rng);
        EXPECT_TRUE(c.append(k.data(), v.data()));
      }
    }
  }
  return std::move(*st);
}

ref::SessionState fresh(const ModelHparams& hp, int n_ctx) { return std::move(*ref::SessionState::create(hp, n_ctx)); }

class StateSlotsTest : public ::testing::TestWithParam<Arch> {};

TEST_P(StateSlotsTest, SlotsStartZeroedAndRoundTripTheReferenceSession) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(GetParam());
  auto slots = StateSlots::create(hp, kCtx, 3);
  ASSERT_TRUE(slots) << slots.error().to_string();
  EXPECT_EQ(slots->n_slots(), 3);
  EXPECT_EQ(slots->n_layer(), hp.n_layer);

  // Fresh slots download as a fresh session.
  for (int s = 0; s < 3; ++s) {
    ref::SessionState got = random_state(hp, kCtx, 5, 99);  // overwritten by the download
    ASSERT_TRUE(slots->download(s, 0, got, nullptr));
    EXPECT_TRUE(got == fresh(hp, kCtx)) << "slot " << s << " does not start zeroed";
  }

  const int n_tok = 7;
  const ref::SessionState a = random_state(hp, kCtx, n_tok, 1);
  auto up = slots->upload(a, 1, nullptr);
  ASSERT_TRUE(up) << up.error().to_string();
  ref::SessionState back = fresh(hp, kCtx);
  auto down = slots->download(1, n_tok, back, nullptr);
  ASSERT_TRUE(down) << down.error().to_string();
  EXPECT_TRUE(back == a) << "upload + download did not round-trip the session bit for bit";

  // The device buffers hold the reference layout itself.
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (hp.layer_kinds[l] == LayerKind::kGatedDeltaNet) {
      const auto s = test::download<float>(*slots->gdn_s(1, l), a.gdn(l).s.size());
      const auto c = test::download<float>(*slots->gdn_conv(1, l), a.gdn(l).conv.size());
      EXPECT_TRUE(s == a.gdn(l).s) << "layer " << l << " S layout";
      EXPECT_TRUE(c == a.gdn(l).conv) << "layer " << l << " conv layout";
    } else {
      const size_t n = static_cast<size_t>(n_tok) * hp.n_head_kv * hp.head_dim;
      const auto k = test::download<float>(*slots->kv_k(1, l), n);
      const auto v = test::download<float>(*slots->kv_v(1, l), n);
      EXPECT_TRUE(std::equal(k.begin(), k.end(), a.kv(l).k.begin())) << "layer " << l << " K layout";
      EXPECT_TRUE(std::equal(v.begin(), v.end(), a.kv(l).v.begin())) << "layer " << l << " V layout";
    }
  }
  // The other slots are untouched.
  ref::SessionState other = fresh(hp, kCtx);
  ASSERT_TRUE(slots->download(0, n_tok, other, nullptr));
  ref::SessionState zeros = fresh(hp, kCtx);
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (hp.layer_kinds[l] == LayerKind::kFullAttention) zeros.kv(l).n_used = n_tok;  // n_tok zero rows
  }
  EXPECT_TRUE(other == zeros) << "slot 0 changed";
}

TEST_P(StateSlotsTest, ResetZeroesAndCloneCopiesOneSlot) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(GetParam());
  auto slots = StateSlots::create(hp, kCtx, 3);
  ASSERT_TRUE(slots) << slots.error().to_string();
  const int n_tok = 11;
  const ref::SessionState a = random_state(hp, kCtx, n_tok, 2);
  const ref::SessionState b = random_state(hp, kCtx, n_tok, 3);
  ASSERT_TRUE(slots->upload(a, 0, nullptr));
  ASSERT_TRUE(slots->upload(b, 1, nullptr));

  auto cl = slots->clone(0, 2, n_tok, nullptr);
  ASSERT_TRUE(cl) << cl.error().to_string();
  ref::SessionState got = fresh(hp, kCtx);
  ASSERT_TRUE(slots->download(2, n_tok, got, nullptr));
  EXPECT_TRUE(got == a) << "clone 0 -> 2 differs from slot 0's session";
  ASSERT_TRUE(slots->download(1, n_tok, got, nullptr));
  EXPECT_TRUE(got == b) << "clone 0 -> 2 changed slot 1";

  ASSERT_TRUE(slots->reset(0, nullptr));
  ASSERT_TRUE(slots->download(0, n_tok, got, nullptr));
  ref::SessionState zeros = fresh(hp, kCtx);
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (hp.layer_kinds[l] == LayerKind::kFullAttention) zeros.kv(l).n_used = n_tok;
  }
  EXPECT_TRUE(got == zeros) << "reset did not zero slot 0";
  ASSERT_TRUE(slots->download(2, n_tok, got, nullptr));
  EXPECT_TRUE(got == a) << "reset of slot 0 changed its clone";
}

TEST_P(StateSlotsTest, DevicePointerTablesAddressEverySlot) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(GetParam());
  const int n_slots = 5;
  auto slots = StateSlots::create(hp, kCtx, n_slots);
  ASSERT_TRUE(slots) << slots.error().to_string();
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (hp.layer_kinds[l] == LayerKind::kGatedDeltaNet) {
      auto t = slots->gdn_table(l);
      ASSERT_TRUE(t) << t.error().to_string();
      EXPECT_FALSE(slots->kv_table(l));
      const auto s = test::download<float*>(t->s, n_slots);
      const auto c = test::download<float*>(t->conv, n_slots);
      for (int i = 0; i < n_slots; ++i) {
        EXPECT_EQ(s[static_cast<size_t>(i)], *slots->gdn_s(i, l)) << "layer " << l << " slot " << i;
        EXPECT_EQ(c[static_cast<size_t>(i)], *slots->gdn_conv(i, l)) << "layer " << l << " slot " << i;
      }
    } else {
      auto t = slots->kv_table(l);
      ASSERT_TRUE(t) << t.error().to_string();
      EXPECT_FALSE(slots->gdn_table(l));
      EXPECT_EQ(t->n_ctx, kCtx);
      EXPECT_EQ(t->n_head_kv, static_cast<int>(hp.n_head_kv));
      EXPECT_EQ(t->head_dim, static_cast<int>(hp.head_dim));
      const auto k = test::download<float*>(t->k, n_slots);
      const auto v = test::download<float*>(t->v, n_slots);
      for (int i = 0; i < n_slots; ++i) {
        EXPECT_EQ(k[static_cast<size_t>(i)], *slots->kv_k(i, l)) << "layer " << l << " slot " << i;
        EXPECT_EQ(v[static_cast<size_t>(i)], *slots->kv_v(i, l)) << "layer " << l << " slot " << i;
      }
    }
  }
}

// bytes_for (the auto GPU budget's state term) is what create() allocates, for several contexts and slot counts.
TEST_P(StateSlotsTest, BytesForIsWhatCreateAllocates) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(GetParam());
  for (const int ctx : {1, kCtx, 1000}) {
    for (const int n : {1, 3}) {
      auto slots = StateSlots::create(hp, ctx, n);
      ASSERT_TRUE(slots) << slots.error().to_string();
      EXPECT_EQ(StateSlots::bytes_for(hp, ctx, n), slots->bytes_per_slot() * static_cast<uint64_t>(n))
          << "n_ctx " << ctx << ", " << n << " slots";
    }
  }
  EXPECT_EQ(StateSlots::bytes_for(hp, kCtx, 0), 0u);
  EXPECT_EQ(StateSlots::bytes_for(hp, 0, 1), 0u);
}

TEST_P(StateSlotsTest, ErrorsAreRefused) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(GetParam());
  EXPECT_EQ(StateSlots::create(hp, 0, 1).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(StateSlots::create(hp, kCtx, 0).error().code, ErrorCode::kInvalidArgument);
  auto slots = StateSlots::create(hp, kCtx, 2);
  ASSERT_TRUE(slots) << slots.error().to_string();
  EXPECT_EQ(slots->reset(2, nullptr).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(slots->clone(0, -1, 0, nullptr).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(slots->clone(0, 1, kCtx + 1, nullptr).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(slots->gdn_s(0, 3).error().code, ErrorCode::kInvalidArgument);  // layer 3 is attention
  EXPECT_EQ(slots->kv_k(0, 0).error().code, ErrorCode::kInvalidArgument);   // layer 0 is GDN
  EXPECT_EQ(slots->kv_k(0, 9).error().code, ErrorCode::kOutOfRange);
  // A longer session than the slots hold.
  const ref::SessionState big = random_state(hp, 2 * kCtx, kCtx + 3, 4);
  const auto up = slots->upload(big, 0, nullptr);
  ASSERT_FALSE(up);
  EXPECT_EQ(up.error().code, ErrorCode::kOutOfRange) << up.error().to_string();
  // Another model's session.
  ModelHparams other = hp;
  other.head_dim = hp.head_dim * 2;
  const ref::SessionState wrong = random_state(other, kCtx, 2, 5);
  EXPECT_EQ(slots->upload(wrong, 0, nullptr).error().code, ErrorCode::kInvalidArgument);
}

TEST_P(StateSlotsTest, MoreThanTheDeviceHoldsIsResourceExhausted) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(GetParam());
  auto one = StateSlots::create(hp, kCtx, 1);
  ASSERT_TRUE(one) << one.error().to_string();
  size_t free_b = 0, total_b = 0;
  KESTREL_CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t want = 2 * static_cast<uint64_t>(total_b) / one->bytes_per_slot() + 1;
  ASSERT_LT(want, 0x7FFFFFFFu) << "slot too small for this test";
  auto many = StateSlots::create(hp, kCtx, static_cast<int>(want));
  ASSERT_FALSE(many) << "allocated " << want << " slots of " << one->bytes_per_slot() << " bytes";
  EXPECT_EQ(many.error().code, ErrorCode::kResourceExhausted) << many.error().to_string();
  // The device still works afterwards.
  auto again = StateSlots::create(hp, kCtx, 2);
  EXPECT_TRUE(again) << again.error().to_string();
}

INSTANTIATE_TEST_SUITE_P(Archs, StateSlotsTest, ::testing::Values(Arch::kQwen35Moe, Arch::kQwen35, Arch::kQwen3Next),
                         [](const ::testing::TestParamInfo<Arch>& i) { return std::string(arch_name(i.param)); });

}  // namespace
}  // namespace kestrel::gpu
