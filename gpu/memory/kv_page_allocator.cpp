// KvPageAllocator (see kv_page_allocator.h): a free list of page ids and each slot's pages in position order.
#include "gpu/memory/kv_page_allocator.h"

#include <cstdio>
#include <limits>
#include <string>
#include <utility>

namespace kestrel::gpu {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string bytes_text(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%llu bytes (%.2f GB)", static_cast<unsigned long long>(b),
                static_cast<double>(b) / 1e9);
  return buf;
}

}  // namespace

Expected<KvPageAllocator> KvPageAllocator::create(int64_t n_pages, int page_size, uint64_t page_bytes, int n_slots,
                                                  int max_pages_per_slot) {
  const auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "KV page allocator: " + what);
  };
  if (page_size < 1) return bad("page size " + str(page_size) + " must be at least 1 position");
  if (n_slots < 1) return bad("need at least one slot, got " + str(n_slots));
  if (max_pages_per_slot < 1) return bad("a slot must be allowed at least one page, got " + str(max_pages_per_slot));
  if (n_pages < 0 || (n_pages == 0 && page_bytes > 0) ||
      n_pages > static_cast<int64_t>(std::numeric_limits<int32_t>::max())) {
    return bad(str(n_pages) + " pages (1.." + str(std::numeric_limits<int32_t>::max()) + ")");
  }
  KvPageAllocator a;
  a.page_size_ = page_size;
  a.page_bytes_ = page_bytes;
  a.n_pages_ = n_pages;
  a.max_pages_per_slot_ = max_pages_per_slot;
  a.slots_.resize(static_cast<size_t>(n_slots));
  // Handed out from the back: the first grows get pages 0, 1, 2, ...
  a.free_.reserve(static_cast<size_t>(n_pages));
  for (int64_t p = n_pages - 1; p >= 0; --p) a.free_.push_back(static_cast<int32_t>(p));
  return a;
}

int64_t KvPageAllocator::pages_for(int64_t n_tokens) const {
  return n_tokens <= 0 ? 0 : (n_tokens + page_size_ - 1) / page_size_;
}

std::span<const int32_t> KvPageAllocator::pages(int slot) const {
  if (slot < 0 || slot >= n_slots()) return {};
  return slots_[static_cast<size_t>(slot)];
}

Expected<int32_t> KvPageAllocator::page_at(int slot, int64_t position) const {
  KESTREL_TRY(check_slot(slot));
  const std::vector<int32_t>& p = slots_[static_cast<size_t>(slot)];
  const int64_t i = position < 0 ? -1 : position / page_size_;
  if (i < 0 || i >= static_cast<int64_t>(p.size())) {
    return make_error(ErrorCode::kOutOfRange, "KV pages: slot " + str(slot) + " holds " + str(p.size()) + " pages of " +
                                                  str(page_size_) + " positions, none for position " + str(position));
  }
  return p[static_cast<size_t>(i)];
}

Status KvPageAllocator::check_slot(int slot) const {
  if (slot < 0 || slot >= n_slots()) {
    return make_error(ErrorCode::kOutOfRange, "KV pages: slot " + str(slot) + " outside 0.." + str(n_slots() - 1));
  }
  return ok_status();
}

Status KvPageAllocator::check_tokens(int64_t n_tokens) const {
  if (n_tokens < 0 || pages_for(n_tokens) > max_pages_per_slot_) {
    return make_error(ErrorCode::kOutOfRange, "KV pages: " + str(n_tokens) + " tokens outside 0.." +
                                                  str(static_cast<int64_t>(max_pages_per_slot_) * page_size_) +
                                                  " (a slot's largest context)");
  }
  return ok_status();
}

Error KvPageAllocator::exhausted(int slot, int64_t n_tokens, int64_t more) const {
  const uint64_t pb = page_bytes_;
  return make_error(ErrorCode::kResourceExhausted,
                    "KV cache full: slot " + str(slot) + " needs " + str(more) + " more pages of " + str(page_size_) +
                        " tokens (" + str(more * page_size_) + " tokens, " +
                        bytes_text(static_cast<uint64_t>(more) * pb) + ") to hold " + str(n_tokens) + " tokens, but " +
                        str(free_pages()) + " of the pool's " + str(n_pages_) + " pages are free (" +
                        str(free_pages() * page_size_) + " of " + str(n_pages_ * page_size_) + " tokens, " +
                        bytes_text(static_cast<uint64_t>(free_pages()) * pb) + " of " +
                        bytes_text(static_cast<uint64_t>(n_pages_) * pb) +
                        ", shared by every session); the session is unchanged: retry when other sessions have ended, "
                        "or give the engine a larger kv_cache_bytes");
}

Status KvPageAllocator::grow(int slot, int64_t n_tokens) {
  KESTREL_TRY(check_slot(slot));
  KESTREL_TRY(check_tokens(n_tokens));
  std::vector<int32_t>& p = slots_[static_cast<size_t>(slot)];
  const int64_t want = pages_for(n_tokens), have = static_cast<int64_t>(p.size());
  if (want <= have) return ok_status();
  if (want - have > free_pages()) return exhausted(slot, n_tokens, want - have);
  for (int64_t i = have; i < want; ++i) {
    p.push_back(free_.back());
    free_.pop_back();
  }
  return ok_status();
}

Status KvPageAllocator::resize(int slot, int64_t n_tokens) {
  KESTREL_TRY(check_slot(slot));
  KESTREL_TRY(check_tokens(n_tokens));
  std::vector<int32_t>& p = slots_[static_cast<size_t>(slot)];
  const int64_t want = pages_for(n_tokens);
  if (want >= static_cast<int64_t>(p.size())) return grow(slot, n_tokens);
  // The pages past the new end go back to the free list, the last one first.
  while (static_cast<int64_t>(p.size()) > want) {
    free_.push_back(p.back());
    p.pop_back();
  }
  return ok_status();
}

void KvPageAllocator::release(int slot) {
  if (slot < 0 || slot >= n_slots()) return;
  (void)resize(slot, 0);
}

}  // namespace kestrel::gpu
