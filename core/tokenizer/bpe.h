// BpeModel: byte-level BPE merges over one pre-tokenized piece, as llama.cpp's llm_tokenizer_bpe_session does.
//
// A piece's raw bytes become symbols (one per byte, written through the GPT-2 byte table); then, repeatedly, the
// adjacent pair with the lowest merge rank (leftmost on ties) is merged, until no adjacent pair has a rank. Each
// final symbol is its token id; a symbol that is not a token (only possible with inconsistent merges) falls back,
// as in llama.cpp, to the tokens of its single bytes that exist.
//
// Everything works on integer symbol ids: a symbol is a token id, or an id >= n_vocab for a merge result that is
// not a token. Ranks live in an open-addressing hash table keyed by the (left, right) id pair. Short pieces merge by
// scanning a compact array (cheapest for the usual 1..20 symbols); long ones (whitespace runs, base64, 100k repeated
// letters) use a min-heap over a linked list, so the cost stays O(n log n). Both give identical results.
//
// Immutable after build(); encode_piece() is const and thread-safe given a scratch object per thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/base/expected.h"

namespace kestrel {

// Reusable per-call buffers for BpeModel::encode_piece (one per thread; no state carries over between calls).
struct BpeScratch {
  struct Pair {
    int32_t rank;
    int32_t result;
  };
  struct Node {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct HeapEntry {
    int32_t rank;
    int32_t left;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  std::vector<int32_t> ids;
  std::vector<Pair> pairs;
  std::vector<Node> nodes;
  std::vector<HeapEntry> heap;
};

class BpeModel {
 public:
  // Pieces with more symbols than this use the heap algorithm.
  static constexpr size_t kScanMaxSymbols = 48;

  // tokens: id -> byte-level text; token_ids: text -> id (the tokenizer's lookup, last id wins for duplicate
  // texts); merges: "left right" in priority order (the first occurrence of a duplicate pair wins, as in llama.cpp).
  // kInvalidArgument for a merge without a separating space.
  static Expected<BpeModel> build(const std::vector<std::string>& tokens,
                                  const std::unordered_map<std::string, int32_t>& token_ids,
                                  const std::vector<std::string>& merges);

  // Appends the token ids of one piece of raw bytes.
  void encode_piece(std::string_view bytes, BpeScratch& scratch, std::vector<int32_t>& out) const;

  // The same, forcing one algorithm (tests compare them).
  void encode_piece_scan(std::string_view bytes, BpeScratch& scratch, std::vector<int32_t>& out) const;
  void encode_piece_heap(std::string_view bytes, BpeScratch& scratch, std::vector<int32_t>& out) const;

  size_t n_merges() const { return n_merges_; }

 private:
  static constexpr int32_t kNoRank = INT32_MAX;

  BpeScratch::Pair lookup(int32_t left, int32_t right) const;
  void emit(int32_t symbol, std::vector<int32_t>& out) const;

  int32_t n_vocab_ = 0;
  size_t n_merges_ = 0;
  int32_t byte_symbol_[256] = {};        // symbol of each raw byte
  int32_t single_byte_token_[256] = {};  // token whose text is that one byte, or -1 (llama.cpp's fallback)
  std::vector<std::string> extra_text_;  // byte-level text of symbols n_vocab_ + i that are not tokens
  // Open addressing, linear probing; key = left << 32 | right (ids >= 0), empty slot key = ~0. Key and value
  // share a 16-byte slot so a lookup touches one cache line.
  struct Slot {
    uint64_t key;
    BpeScratch::Pair value;
  };
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int shift_ = 0;
};

}  // namespace kestrel
