// gpu/KvPageAllocator (host code, no device needed): pages_for rounds up; grow() gives a slot the pages it lacks and
// keeps the ones it has, in position order; an exhausted pool refuses with kResourceExhausted naming tokens and
// bytes and changes nothing; release and resize return pages that other slots then get; page_at maps positions to
// the slot's pages. A random sequence of grows, resizes and releases on several slots is checked after every step
// against the invariant (every page either free or held by exactly one slot, each slot holding exactly
// pages_for(its tokens) pages, the counts adding up) and against a plain model of each slot's token count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpu/memory/kv_page_allocator.h"

namespace kestrel::gpu {
namespace {

KvPageAllocator make(int64_t n_pages, int page_size, int n_slots, int max_pages, uint64_t page_bytes = 1000) {
  auto a = KvPageAllocator::create(n_pages, page_size, page_bytes, n_slots, max_pages);
  EXPECT_TRUE(a) << a.error().to_string();
  return std::move(*a);
}

std::vector<int32_t> as_vector(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

TEST(KvPageAllocator, PagesForRoundsUp) {
  const KvPageAllocator a = make(4, 16, 1, 8);
  EXPECT_EQ(a.pages_for(0), 0);
  EXPECT_EQ(a.pages_for(-3), 0);
  EXPECT_EQ(a.pages_for(1), 1);
  EXPECT_EQ(a.pages_for(16), 1);
  EXPECT_EQ(a.pages_for(17), 2);
  EXPECT_EQ(a.pages_for(128), 8);
}

TEST(KvPageAllocator, GrowKeepsPagesInPositionOrderAndMapsPositions) {
  KvPageAllocator a = make(10, 4, 3, 10);
  ASSERT_TRUE(a.grow(0, 5));  // 2 pages
  ASSERT_TRUE(a.grow(1, 1));  // 1 page
  ASSERT_TRUE(a.grow(0, 9));  // one more
  EXPECT_EQ(as_vector(a.pages(0)), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(as_vector(a.pages(1)), (std::vector<int32_t>{2}));
  EXPECT_EQ(a.free_pages(), 6);
  EXPECT_EQ(a.used_pages(), 4);
  ASSERT_TRUE(a.grow(0, 2));  // never shrinks
  EXPECT_EQ(a.pages(0).size(), 3u);
  EXPECT_EQ(*a.page_at(0, 0), 0);
  EXPECT_EQ(*a.page_at(0, 3), 0);
  EXPECT_EQ(*a.page_at(0, 4), 1);
  EXPECT_EQ(*a.page_at(0, 8), 3);
  EXPECT_EQ(*a.page_at(0, 11), 3);
  EXPECT_EQ(a.page_at(0, 12).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(a.page_at(0, -1).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(a.page_at(2, 0).error().code, ErrorCode::kOutOfRange) << "slot 2 holds nothing";
  EXPECT_EQ(a.page_at(3, 0).error().code, ErrorCode::kOutOfRange) << "no slot 3";
  // A slot freed and another grown: the freed pages are reused, so a slot's pages need not be ascending.
  a.release(0);
  EXPECT_TRUE(a.pages(0).empty());
  EXPECT_EQ(a.free_pages(), 9);
  ASSERT_TRUE(a.grow(2, 16));
  EXPECT_EQ(as_vector(a.pages(2)), (std::vector<int32_t>{0, 1, 3, 4}));
}

TEST(KvPageAllocator, ExhaustionIsRefusedAndChangesNothing) {
  const int page_size = 8;
  const uint64_t page_bytes = 40960;
  KvPageAllocator a = make(5, page_size, 3, 100, page_bytes);
  ASSERT_TRUE(a.grow(0, 24));  // 3 pages
  ASSERT_TRUE(a.grow(1, 1));   // 1 page
  const std::vector<int32_t> p0 = as_vector(a.pages(0)), p1 = as_vector(a.pages(1));
  const auto st = a.grow(2, 17);  // needs 3, 1 free
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kResourceExhausted);
  const std::string& m = st.error().message;
  EXPECT_NE(m.find("needs 3 more pages of 8 tokens"), std::string::npos) << m;
  EXPECT_NE(m.find("to hold 17 tokens"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(3 * page_bytes) + " bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("1 of the pool's 5 pages are free"), std::string::npos) << m;
  EXPECT_NE(m.find("8 of 40 tokens"), std::string::npos) << m;
  EXPECT_TRUE(a.pages(2).empty());
  EXPECT_EQ(as_vector(a.pages(0)), p0);
  EXPECT_EQ(as_vector(a.pages(1)), p1);
  EXPECT_EQ(a.free_pages(), 1);
  // Growing a slot that already has pages is refused whole as well.
  EXPECT_EQ(a.grow(1, 24).error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(as_vector(a.pages(1)), p1);
  // What fits still goes through, and a release makes room for the refused request.
  ASSERT_TRUE(a.grow(1, 16));
  EXPECT_EQ(a.free_pages(), 0);
  a.release(0);
  ASSERT_TRUE(a.grow(2, 17)) << "after a release";
  EXPECT_EQ(a.free_pages(), 0);
}

TEST(KvPageAllocator, ResizeKeepsTheFirstPages) {
  KvPageAllocator a = make(6, 2, 2, 6);
  ASSERT_TRUE(a.grow(0, 12));  // all 6
  const std::vector<int32_t> before = as_vector(a.pages(0));
  ASSERT_TRUE(a.resize(0, 5));  // 3 pages
  EXPECT_EQ(as_vector(a.pages(0)), std::vector<int32_t>(before.begin(), before.begin() + 3));
  EXPECT_EQ(a.free_pages(), 3);
  // Resizing to more than is free fails without shrinking or growing.
  ASSERT_TRUE(a.grow(1, 6));  // the 3 free pages
  EXPECT_EQ(a.resize(0, 8).error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(a.pages(0).size(), 3u);
  ASSERT_TRUE(a.resize(1, 0));
  ASSERT_TRUE(a.resize(0, 8));
  EXPECT_EQ(a.pages(0).size(), 4u);
  EXPECT_EQ(as_vector(a.pages(0)).front(), before.front());
}

TEST(KvPageAllocator, ArgumentsAreChecked) {
  EXPECT_EQ(KvPageAllocator::create(4, 0, 10, 1, 1).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(KvPageAllocator::create(4, 8, 10, 0, 1).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(KvPageAllocator::create(4, 8, 10, 1, 0).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(KvPageAllocator::create(-1, 8, 10, 1, 1).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(KvPageAllocator::create(0, 8, 10, 1, 1).error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(KvPageAllocator::create(0, 8, 0, 1, 1)) << "no pages for a model without attention";
  KvPageAllocator a = make(8, 4, 2, 3);
  EXPECT_EQ(a.grow(2, 1).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(a.grow(-1, 1).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(a.grow(0, 13).error().code, ErrorCode::kOutOfRange) << "past the slot's 3 pages of 4";
  EXPECT_EQ(a.grow(0, -1).error().code, ErrorCode::kOutOfRange);
  EXPECT_TRUE(a.grow(0, 12));
  EXPECT_EQ(a.free_pages(), 5);
  a.release(7);  // out of range: nothing happens
  EXPECT_EQ(a.free_pages(), 5);
}

TEST(KvPageAllocator, RandomOperationsKeepEveryPageAccountedFor) {
  const int n_slots = 5, page_size = 4, max_pages = 7;
  const int64_t n_pages = 16;
  KvPageAllocator a = make(n_pages, page_size, n_slots, max_pages);
  std::vector<int64_t> tokens(n_slots, 0);  // what each slot was last given room for
  std::mt19937 rng(12345);
  int refused = 0;
  for (int step = 0; step < 4000; ++step) {
    const int slot = static_cast<int>(rng() % n_slots);
    const int op = static_cast<int>(rng() % 8);
    const int64_t n = static_cast<int64_t>(rng() % (page_size * max_pages + 1));
    const int64_t free_before = a.free_pages();
    const std::vector<int32_t> before = as_vector(a.pages(slot));
    if (op == 0) {
      a.release(slot);
      tokens[static_cast<size_t>(slot)] = 0;
    } else {
      const bool resize = op <= 2;
      const int64_t target = resize ? n : std::max(n, tokens[static_cast<size_t>(slot)]);
      const int64_t need = a.pages_for(target) - static_cast<int64_t>(before.size());
      const auto st = resize ? a.resize(slot, n) : a.grow(slot, n);
      if (need > free_before) {
        ASSERT_FALSE(st) << "step " << step << ": " << need << " pages with " << free_before << " free";
        ASSERT_EQ(st.error().code, ErrorCode::kResourceExhausted);
        ASSERT_EQ(as_vector(a.pages(slot)), before) << "a refused request changed the slot";
        ASSERT_EQ(a.free_pages(), free_before);
        ++refused;
      } else {
        ASSERT_TRUE(st) << "step " << step << ": " << st.error().to_string();
        tokens[static_cast<size_t>(slot)] = target;
        // The pages kept are the first ones, in order.
        const std::vector<int32_t> now = as_vector(a.pages(slot));
        const size_t kept = std::min(before.size(), now.size());
        ASSERT_TRUE(std::equal(now.begin(), now.begin() + static_cast<std::ptrdiff_t>(kept), before.begin()));
      }
    }
    // Every page is free or held by exactly one slot; each slot holds what its tokens need.
    std::multiset<int32_t> seen;
    int64_t held = 0;
    for (int s = 0; s < n_slots; ++s) {
      ASSERT_EQ(static_cast<int64_t>(a.pages(s).size()), a.pages_for(tokens[static_cast<size_t>(s)]))
          << "slot " << s << " at step " << step;
      for (int32_t p : a.pages(s)) seen.insert(p);
      held += static_cast<int64_t>(a.pages(s).size());
    }
    ASSERT_EQ(held + a.free_pages(), n_pages);
    ASSERT_EQ(static_cast<int64_t>(std::set<int32_t>(seen.begin(), seen.end()).size()), held)
        << "a page is held twice at step " << step;
    for (int32_t p : seen) ASSERT_TRUE(p >= 0 && p < n_pages);
  }
  EXPECT_GT(refused, 50) << "the sequence should exhaust the pool often";
}

}  // namespace
}  // namespace kestrel::gpu
