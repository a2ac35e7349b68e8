// gpu/StateSlots: the GDN state starts zeroed and slots start with no KV pages; a ref::SessionState filled with random
// GDN state and a partly filled KV cache round-trips through a slot bit for bit (upload then download, compared with
// SessionState::operator==), with the slot's pages taken out of order from a pool other slots use too, and the
// device buffers hold exactly the reference layout (the GDN buffers, and each page's K / V rows of every attention
// layer); the slot's device page table lists its pages; reset zeroes the GDN state and returns the pages; clone
// copies one slot into another (growing or shrinking the destination's pages) and leaves the rest alone; clone and
// upload on an exhausted pool are refused with the destination unchanged; the per-layer device tables address every
// slot and page; errors (wrong layer kind, bad slot or page, too many tokens, a bad page size, out of device memory)
// are refused. The models have two attention layers (layers 1 and 3), so the per-layer offsets inside a page are
// exercised. Tests that need a device skip without one.
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
constexpr int kPage = 4;  // positions per page: 20 tokens span 5 pages

// The tiny preset of `arch` with a second attention layer (layer 1), so a page holds two layers' K and V.
ModelHparams hparams(Arch arch) {
  ModelHparams hp = kestrel::test::tiny_hparams(arch);
  hp.layer_kinds[1] = LayerKind::kFullAttention;
  return hp;
}

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

// The state's first n_tok tokens: its GDN state and KV rows [0, n_tok).
ref::SessionState truncated(const ref::SessionState& s, const ModelHparams& hp, int n_tok) {
  ref::SessionState t = s;
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (hp.layer_kinds[l] == LayerKind::kFullAttention) t.kv(l).n_used = n_tok;
  }
  return t;
}

std::vector<int32_t> as_vector(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

Expected<StateSlots> make_slots(const ModelHparams& hp, int n_slots, int64_t n_pages) {
  return StateSlots::create(hp, kCtx, n_slots, KvPoolConfig{kPage, n_pages});
}

// The slot's entries of the device page table.
std::vector<int32_t> device_pages(const StateSlots& slots, int slot, size_t n) {
  const KvPageTable t = *slots.page_table();
  return test::download<int32_t>(t.pages + static_cast<size_t>(slot) * static_cast<size_t>(t.max_pages), n);
}

class StateSlotsTest : public ::testing::TestWithParam<Arch> {};

TEST_P(StateSlotsTest, SlotsStartEmptyAndRoundTripTheReferenceSession) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = hparams(GetParam());
  auto slots = make_slots(hp, 3, 16);
  ASSERT_TRUE(slots) << slots.error().to_string();
  EXPECT_EQ(slots->n_slots(), 3);
  EXPECT_EQ(slots->n_layer(), hp.n_layer);
  EXPECT_EQ(slots->n_pages(), 16);
  EXPECT_EQ(slots->free_pages(), 16);
  EXPECT_EQ(slots->page_size(), kPage);
  EXPECT_EQ(slots->bytes_per_page(), StateSlots::kv_bytes_per_page(hp, kPage));
  EXPECT_EQ(slots->bytes_per_page(), 2u * 2 * kPage * hp.n_head_kv * hp.head_dim * sizeof(float));

  // Fresh slots hold no pages and download as a fresh session.
  for (int s = 0; s < 3; ++s) {
    EXPECT_TRUE(slots->pages(s).empty());
    ref::SessionState got = random_state(hp, kCtx, 5, 99);  // overwritten by the download
    ASSERT_TRUE(slots->download(s, 0, got, nullptr));
    EXPECT_TRUE(got == fresh(hp, kCtx)) << "slot " << s << " does not start zeroed";
  }

  // Other slots take pages 0..2 and give page 0 back: slot 1's pages come out of order (0, then 3).
  ASSERT_TRUE(slots->reserve(0, kPage));
  ASSERT_TRUE(slots->reserve(2, 2 * kPage));
  slots->release(0);
  const int n_tok = 7;
  const ref::SessionState a = random_state(hp, kCtx, n_tok, 1);
  auto up = slots->upload(a, 1, nullptr);
  ASSERT_TRUE(up) << up.error().to_string();
  EXPECT_EQ(as_vector(slots->pages(1)), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(slots->free_pages(), 16 - 4);
  EXPECT_EQ(device_pages(*slots, 1, 2), (std::vector<int32_t>{0, 3})) << "the device page table";
  ref::SessionState back = fresh(hp, kCtx);
  auto down = slots->download(1, n_tok, back, nullptr);
  ASSERT_TRUE(down) << down.error().to_string();
  EXPECT_TRUE(back == a) << "upload + download did not round-trip the session bit for bit";

  // The device buffers hold the reference layout itself: GDN buffers per slot, K / V rows per page and layer.
  const size_t row = static_cast<size_t>(hp.n_head_kv) * hp.head_dim;
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (hp.layer_kinds[l] == LayerKind::kGatedDeltaNet) {
      const auto s = test::download<float>(*slots->gdn_s(1, l), a.gdn(l).s.size());
      const auto c = test::download<float>(*slots->gdn_conv(1, l), a.gdn(l).conv.size());
      EXPECT_TRUE(s == a.gdn(l).s) << "layer " << l << " S layout";
      EXPECT_TRUE(c == a.gdn(l).conv) << "layer " << l << " conv layout";
      continue;
    }
    for (int t = 0; t < n_tok; ++t) {
      const int32_t page = slots->pages(1)[static_cast<size_t>(t / kPage)];
      const size_t at = static_cast<size_t>(t % kPage) * row;
      const auto k = test::download<float>(*slots->kv_k(page, l) + at, row);
      const auto v = test::download<float>(*slots->kv_v(page, l) + at, row);
      EXPECT_TRUE(std::equal(k.begin(), k.end(), a.kv(l).k.begin() + static_cast<std::ptrdiff_t>(t * row)))
          << "layer " << l << " K row " << t;
      EXPECT_TRUE(std::equal(v.begin(), v.end(), a.kv(l).v.begin() + static_cast<std::ptrdiff_t>(t * row)))
          << "layer " << l << " V row " << t;
    }
  }
  // Slot 0 (no pages) still downloads as a fresh session and holds no tokens to download.
  ref::SessionState other = fresh(hp, kCtx);
  ASSERT_TRUE(slots->download(0, 0, other, nullptr));
  EXPECT_TRUE(other == fresh(hp, kCtx)) << "slot 0 changed";
  EXPECT_EQ(slots->download(0, 1, other, nullptr).error().code, ErrorCode::kOutOfRange) << "slot 0 holds no pages";
  EXPECT_EQ(slots->download(1, 9, other, nullptr).error().code, ErrorCode::kOutOfRange) << "slot 1 holds 8 positions";

  // Uploading a shorter session shrinks the slot's pages (the first one kept); a longer one grows them.
  const ref::SessionState b = random_state(hp, kCtx, 3, 2);
  ASSERT_TRUE(slots->upload(b, 1, nullptr));
  EXPECT_EQ(as_vector(slots->pages(1)), (std::vector<int32_t>{0}));
  ASSERT_TRUE(slots->download(1, 3, back, nullptr));
  EXPECT_TRUE(back == b);
  const ref::SessionState c = random_state(hp, kCtx, kCtx, 3);
  ASSERT_TRUE(slots->upload(c, 1, nullptr));
  EXPECT_EQ(slots->pages(1).size(), static_cast<size_t>(kCtx / kPage));
  EXPECT_EQ(device_pages(*slots, 1, kCtx / kPage), as_vector(slots->pages(1)));
  ASSERT_TRUE(slots->download(1, kCtx, back, nullptr));
  EXPECT_TRUE(back == c);
}

TEST_P(StateSlotsTest, ResetZeroesAndCloneCopiesOneSlot) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = hparams(GetParam());
  auto slots = make_slots(hp, 3, 15);
  ASSERT_TRUE(slots) << slots.error().to_string();
  const int n_tok = 11;  // 3 pages
  const ref::SessionState a = random_state(hp, kCtx, n_tok, 2);
  const ref::SessionState b = random_state(hp, kCtx, n_tok, 3);
  ASSERT_TRUE(slots->upload(a, 0, nullptr));
  ASSERT_TRUE(slots->upload(b, 1, nullptr));

  auto cl = slots->clone(0, 2, n_tok, nullptr);
  ASSERT_TRUE(cl) << cl.error().to_string();
  EXPECT_EQ(slots->pages(2).size(), 3u);
  EXPECT_EQ(slots->free_pages(), 15 - 9);
  EXPECT_EQ(device_pages(*slots, 2, 3), as_vector(slots->pages(2)));
  ref::SessionState got = fresh(hp, kCtx);
  ASSERT_TRUE(slots->download(2, n_tok, got, nullptr));
  EXPECT_TRUE(got == a) << "clone 0 -> 2 differs from slot 0's session";
  ASSERT_TRUE(slots->download(1, n_tok, got, nullptr));
  EXPECT_TRUE(got == b) << "clone 0 -> 2 changed slot 1";

  ASSERT_TRUE(slots->reset(0, nullptr));
  EXPECT_TRUE(slots->pages(0).empty()) << "reset keeps the pages";
  EXPECT_EQ(slots->free_pages(), 15 - 6);
  ASSERT_TRUE(slots->download(0, 0, got, nullptr));
  EXPECT_TRUE(got == fresh(hp, kCtx)) << "reset did not zero slot 0";
  ASSERT_TRUE(slots->download(2, n_tok, got, nullptr));
  EXPECT_TRUE(got == a) << "reset of slot 0 changed its clone";

  // A clone of fewer tokens shrinks the destination to the pages they need.
  ASSERT_TRUE(slots->clone(2, 1, 5, nullptr));
  EXPECT_EQ(slots->pages(1).size(), 2u);
  ASSERT_TRUE(slots->download(1, 5, got, nullptr));
  EXPECT_TRUE(got == truncated(a, hp, 5)) << "clone of 5 tokens";
  // Cloning more tokens than the source holds pages for is refused.
  EXPECT_EQ(slots->clone(1, 0, 9, nullptr).error().code, ErrorCode::kOutOfRange);
}

TEST_P(StateSlotsTest, ExhaustedPoolRefusesCloneAndUploadWithTheDestinationUnchanged) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = hparams(GetParam());
  auto slots = make_slots(hp, 3, 7);
  ASSERT_TRUE(slots) << slots.error().to_string();
  const ref::SessionState a = random_state(hp, kCtx, 11, 4);  // 3 pages
  const ref::SessionState b = random_state(hp, kCtx, 9, 5);   // 3 pages
  const ref::SessionState c = random_state(hp, kCtx, 2, 6);   // 1 page
  ASSERT_TRUE(slots->upload(a, 0, nullptr));
  ASSERT_TRUE(slots->upload(b, 1, nullptr));
  ASSERT_TRUE(slots->upload(c, 2, nullptr));
  EXPECT_EQ(slots->free_pages(), 0);
  const std::vector<int32_t> pages2 = as_vector(slots->pages(2));

  const auto cl = slots->clone(0, 2, 11, nullptr);
  ASSERT_FALSE(cl);
  EXPECT_EQ(cl.error().code, ErrorCode::kResourceExhausted) << cl.error().to_string();
  EXPECT_NE(cl.error().message.find("tokens"), std::string::npos) << cl.error().message;
  EXPECT_NE(cl.error().message.find("bytes"), std::string::npos) << cl.error().message;
  const auto up = slots->upload(a, 2, nullptr);
  ASSERT_FALSE(up);
  EXPECT_EQ(up.error().code, ErrorCode::kResourceExhausted) << up.error().to_string();
  EXPECT_EQ(slots->reserve(2, 5).error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(as_vector(slots->pages(2)), pages2);
  ref::SessionState got = fresh(hp, kCtx);
  ASSERT_TRUE(slots->download(2, 2, got, nullptr));
  EXPECT_TRUE(got == c) << "a refused clone or upload changed the destination";

  // Freed pages serve the refused request.
  slots->release(1);
  ASSERT_TRUE(slots->clone(0, 2, 11, nullptr));
  ASSERT_TRUE(slots->download(2, 11, got, nullptr));
  EXPECT_TRUE(got == a);
}

TEST_P(StateSlotsTest, DeviceTablesAddressEverySlotAndPage) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = hparams(GetParam());
  const int n_slots = 5;
  auto slots = make_slots(hp, n_slots, 9);
  ASSERT_TRUE(slots) << slots.error().to_string();
  const uint64_t row = static_cast<uint64_t>(hp.n_head_kv) * hp.head_dim;
  float* first_k = nullptr;
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
      continue;
    }
    auto t = slots->kv_table(l);
    ASSERT_TRUE(t) << t.error().to_string();
    EXPECT_FALSE(slots->gdn_table(l));
    EXPECT_EQ(t->page_size, kPage);
    EXPECT_EQ(t->max_pages, kCtx / kPage);
    EXPECT_EQ(t->capacity(), kCtx);
    EXPECT_EQ(t->n_head_kv, static_cast<int>(hp.n_head_kv));
    EXPECT_EQ(t->head_dim, static_cast<int>(hp.head_dim));
    EXPECT_EQ(t->pages, slots->page_table()->pages);
    EXPECT_EQ(static_cast<uint64_t>(t->page_stride), slots->bytes_per_page() / sizeof(float));
    EXPECT_EQ(t->v, t->k + kPage * row) << "V follows the layer's K in a page";
    if (first_k == nullptr) {
      first_k = t->k;
    } else {
      EXPECT_EQ(t->k, first_k + 2 * kPage * row) << "the second attention layer follows the first's K and V";
    }
    for (int32_t p = 0; p < 9; ++p) {
      EXPECT_EQ(*slots->kv_k(p, l), t->k + p * t->page_stride) << "layer " << l << " page " << p;
      EXPECT_EQ(*slots->kv_v(p, l), t->v + p * t->page_stride) << "layer " << l << " page " << p;
    }
  }
  // Page ids written by write_page_table land in the slot's row of the device table.
  ASSERT_TRUE(slots->reserve(3, 13));  // 4 pages
  ASSERT_TRUE(slots->write_page_table(3, nullptr));
  EXPECT_EQ(device_pages(*slots, 3, 4), as_vector(slots->pages(3)));
}

// bytes_for (the auto GPU budget's state term) is what create() allocates, for several contexts, slot counts and
// pool sizes.
TEST_P(StateSlotsTest, BytesForIsWhatCreateAllocates) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(GetParam());
  for (const int ctx : {1, kCtx, 255}) {
    for (const int n : {1, 3}) {
      for (const int64_t pages : {int64_t{1}, int64_t{7}}) {
        const KvPoolConfig kv{kPage, pages};
        auto slots = StateSlots::create(hp, ctx, n, kv);
        ASSERT_TRUE(slots) << slots.error().to_string();
        EXPECT_EQ(StateSlots::bytes_for(hp, ctx, n, kv), slots->device_bytes())
            << "n_ctx " << ctx << ", " << n << " slots, " << pages << " pages";
      }
    }
  }
  EXPECT_EQ(StateSlots::bytes_for(hp, kCtx, 0, KvPoolConfig{kPage, 4}), 0u);
  EXPECT_EQ(StateSlots::bytes_for(hp, 0, 1, KvPoolConfig{kPage, 4}), 0u);
}

TEST_P(StateSlotsTest, ErrorsAreRefused) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = hparams(GetParam());
  EXPECT_EQ(StateSlots::create(hp, 0, 1, {kPage, 4}).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(StateSlots::create(hp, kCtx, 0, {kPage, 4}).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(StateSlots::create(hp, kCtx, 1, {3, 4}).error().code, ErrorCode::kInvalidArgument) << "page of 3";
  EXPECT_EQ(StateSlots::create(hp, kCtx, 1, {0, 4}).error().code, ErrorCode::kInvalidArgument) << "page of 0";
  EXPECT_EQ(StateSlots::create(hp, kCtx, 1, {kPage, 0}).error().code, ErrorCode::kInvalidArgument) << "no pages";
  auto slots = make_slots(hp, 2, 8);
  ASSERT_TRUE(slots) << slots.error().to_string();
  EXPECT_EQ(slots->reset(2, nullptr).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(slots->clone(0, -1, 0, nullptr).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(slots->clone(0, 1, kCtx + 1, nullptr).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(slots->gdn_s(0, 3).error().code, ErrorCode::kInvalidArgument);  // layer 3 is attention
  EXPECT_EQ(slots->kv_k(0, 0).error().code, ErrorCode::kInvalidArgument);   // layer 0 is GDN
  EXPECT_EQ(slots->kv_k(0, 9).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(slots->kv_k(8, 3).error().code, ErrorCode::kOutOfRange) << "page 8 of 8";
  EXPECT_EQ(slots->reserve(0, kCtx + 1).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(slots->page_at(0, 0).error().code, ErrorCode::kOutOfRange) << "slot 0 holds no page";
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
  EXPECT_TRUE(slots->pages(0).empty()) << "refused uploads took pages";
  EXPECT_EQ(slots->free_pages(), 8);
}

TEST_P(StateSlotsTest, MoreThanTheDeviceHoldsIsResourceExhausted) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = hparams(GetParam());
  size_t free_b = 0, total_b = 0;
  KESTREL_CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  const int page = 64;
  const uint64_t want = 2 * static_cast<uint64_t>(total_b) / StateSlots::kv_bytes_per_page(hp, page) + 1;
  ASSERT_LT(want, 0x7FFFFFFFu) << "page too small for this test";
  auto many = StateSlots::create(hp, kCtx, 1, {page, static_cast<int64_t>(want)});
  ASSERT_FALSE(many) << "allocated " << want << " pages";
  EXPECT_EQ(many.error().code, ErrorCode::kResourceExhausted) << many.error().to_string();
  EXPECT_NE(many.error().message.find("free"), std::string::npos) << many.error().message;
  // The device still works afterwards.
  auto again = make_slots(hp, 2, 4);
  EXPECT_TRUE(again) << again.error().to_string();
}

INSTANTIATE_TEST_SUITE_P(Archs, StateSlotsTest, ::testing::Values(Arch::kQwen35Moe, Arch::kQwen35, Arch::kQwen3Next),
                         [](const ::testing::TestParamInfo<Arch>& i) { return std::string(arch_name(i.param)); });

}  // namespace
}  // namespace kestrel::gpu
