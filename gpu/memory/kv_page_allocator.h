// KvPageAllocator: which pages of the KV page pool each state slot holds (host bookkeeping, no device calls).
//
// The pool (gpu/memory/state_slots.h) keeps the attention layers' K and V in pages of page_size consecutive positions
// of one session; a slot holding n tokens owns pages_for(n) = ceil(n / page_size) pages, listed in position order
// (page i holds positions [i · page_size, (i + 1) · page_size)). Pages are handed out from a free list, so a slot's
// pages are in no particular order in the pool; a released page goes back to the list and its contents are left as
// they are (nobody reads a position a session has not written).
//
// Every change is all or nothing: grow() and resize() either give the slot exactly what was asked or leave every
// slot and the free list as they were, refusing with kResourceExhausted and a message naming the tokens and bytes
// asked for and free. Not thread-safe (the engine's calls never overlap).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/base/expected.h"

namespace kestrel::gpu {

class KvPageAllocator {
 public:
  KvPageAllocator() = default;
  // n_pages pages of page_size positions (page_bytes each, for the messages) shared by n_slots slots, each slot
  // holding at most max_pages_per_slot pages. kInvalidArgument for a count below 1 (n_pages may be 0 only when
  // page_bytes is 0: a model without attention layers has no KV pages).
  static Expected<KvPageAllocator> create(int64_t n_pages, int page_size, uint64_t page_bytes, int n_slots,
                                          int max_pages_per_slot);

  int page_size() const { return page_size_; }
  uint64_t page_bytes() const { return page_bytes_; }
  int64_t n_pages() const { return n_pages_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_pages() const { return n_pages_ - free_pages(); }
  int n_slots() const { return static_cast<int>(slots_.size()); }
  int max_pages_per_slot() const { return max_pages_per_slot_; }

  // Pages that hold n_tokens positions: ceil(n_tokens / page_size) (0 for n_tokens <= 0).
  int64_t pages_for(int64_t n_tokens) const;
  // The slot's pages in position order (empty for a slot out of range).
  std::span<const int32_t> pages(int slot) const;
  // The page holding `position` of the slot; kOutOfRange when the slot holds no page for it.
  Expected<int32_t> page_at(int slot, int64_t position) const;

  // Gives the slot the pages it lacks to hold n_tokens positions (it keeps the ones it has; it never shrinks).
  Status grow(int slot, int64_t n_tokens);
  // Gives the slot exactly pages_for(n_tokens) pages: its first pages are kept, the ones past them freed, the
  // missing ones taken from the free list.
  Status resize(int slot, int64_t n_tokens);
  // Frees every page of the slot.
  void release(int slot);

 private:
  Status check_slot(int slot) const;
  Status check_tokens(int64_t n_tokens) const;
  Error exhausted(int slot, int64_t n_tokens, int64_t more) const;

  int page_size_ = 1;
  uint64_t page_bytes_ = 0;
  int64_t n_pages_ = 0;
  int max_pages_per_slot_ = 0;
  std::vector<int32_t> free_;                // page ids, the next one handed out last
  std::vector<std::vector<int32_t>> slots_;  // per slot, its pages in position order
};

}  // namespace kestrel::gpu
