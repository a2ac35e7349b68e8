// Byte-level BPE merges over one piece (see bpe.h).
#include "core/tokenizer/bpe.h"

#include <algorithm>
#include <bit>
#include <cstddef>

#include "core/tokenizer/byte_unicode.h"

namespace kestrel {
namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};
constexpr uint64_t kHashMul = 0x9E3779B97F4A7C15ULL;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Min-heap order on (rank, left position): the lowest rank first, the leftmost among equal ranks (llama.cpp's
// llm_bigram_bpe::comparator).
bool heap_after(const BpeScratch::HeapEntry& a, const BpeScratch::HeapEntry& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
}

}  // namespace

Expected<BpeModel> BpeModel::build(const std::vector<std::string>& tokens,
                                   const std::unordered_map<std::string, int32_t>& token_ids,
                                   const std::vector<std::string>& merges) {
  BpeModel m;
  m.n_vocab_ = static_cast<int32_t>(tokens.size());
  m.n_merges_ = merges.size();

  std::unordered_map<std::string, int32_t> extra_ids;  // symbols that are not tokens
  auto find_symbol = [&](const std::string& text) -> int32_t {
    if (auto it = token_ids.find(text); it != token_ids.end()) return it->second;
    if (auto it = extra_ids.find(text); it != extra_ids.end()) return it->second;
    return -1;
  };
  auto symbol_for = [&](const std::string& text) -> int32_t {
    const int32_t id = find_symbol(text);
    if (id >= 0) return id;
    const int32_t extra = m.n_vocab_ + static_cast<int32_t>(m.extra_text_.size());
    m.extra_text_.push_back(text);
    extra_ids.emplace(text, extra);
    return extra;
  };

  for (int b = 0; b < 256; ++b) {
    m.byte_symbol_[b] = symbol_for(std::string(byte_to_utf8(static_cast<uint8_t>(b))));
    const auto it = token_ids.find(std::string(1, static_cast<char>(b)));
    m.single_byte_token_[b] = it == token_ids.end() ? -1 : it->second;
  }

  // Every string a merge can produce is a symbol, whether or not it is a token (a later merge may use it).
  std::vector<std::pair<std::string_view, std::string_view>> parts;
  parts.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& merge = merges[r];
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= merge.size()) {
      return make_error(ErrorCode::kInvalidArgument, "BPE merge " + std::to_string(r) + " ('" + merge +
                                                         "') is not two byte-level strings separated by a space");
    }
    const std::string_view view(merge);
    parts.emplace_back(view.substr(0, space), view.substr(space + 1));
    std::string joined(parts.back().first);
    joined.append(parts.back().second);
    symbol_for(joined);
  }

  size_t capacity = 16;
  while (2 * capacity < 3 * merges.size()) capacity *= 2;  // load <= 2/3: 151k merges fit 4 MB
  m.slots_.assign(capacity, Slot{kEmptyKey, {kNoRank, -1}});
  m.mask_ = capacity - 1;
  m.shift_ = 64 - std::countr_zero(capacity);

  std::string left_text;
  std::string right_text;
  for (size_t r = 0; r < parts.size(); ++r) {
    left_text.assign(parts[r].first);
    right_text.assign(parts[r].second);
    const int32_t left = find_symbol(left_text);
    const int32_t right = find_symbol(right_text);
    if (left < 0 || right < 0) continue;  // a side no piece can ever produce: the merge never applies
    const int32_t result = find_symbol(left_text + right_text);
    const uint64_t key = pair_key(left, right);
    uint64_t slot = (key * kHashMul) >> m.shift_;
    while (m.slots_[slot].key != kEmptyKey && m.slots_[slot].key != key) slot = (slot + 1) & m.mask_;
    if (m.slots_[slot].key == key) continue;  // duplicate merge: the first (highest priority) stays
    m.slots_[slot] = {key, {static_cast<int32_t>(r), result}};
  }
  return m;
}

BpeScratch::Pair BpeModel::lookup(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  uint64_t slot = (key * kHashMul) >> shift_;
  while (true) {
    const Slot& entry = slots_[slot];
    if (entry.key == key) return entry.value;
    if (entry.key == kEmptyKey) return {kNoRank, -1};
    slot = (slot + 1) & mask_;
  }
}

void BpeModel::emit(int32_t symbol, std::vector<int32_t>& out) const {
  if (symbol < n_vocab_) {
    out.push_back(symbol);
    return;
  }
  for (const char c : extra_text_[symbol - n_vocab_]) {
    const int32_t id = single_byte_token_[static_cast<uint8_t>(c)];
    if (id >= 0) out.push_back(id);
  }
}

void BpeModel::encode_piece(std::string_view bytes, BpeScratch& scratch, std::vector<int32_t>& out) const {
  if (bytes.size() <= kScanMaxSymbols) {
    encode_piece_scan(bytes, scratch, out);
  } else {
    encode_piece_heap(bytes, scratch, out);
  }
}

void BpeModel::encode_piece_scan(std::string_view bytes, BpeScratch& scratch, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  std::vector<int32_t>& ids = scratch.ids;               // symbols, left to right
  std::vector<BpeScratch::Pair>& pairs = scratch.pairs;  // pairs[i]: merge of ids[i] and ids[i + 1]
  ids.resize(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) ids[i] = byte_symbol_[static_cast<uint8_t>(bytes[i])];
  pairs.resize(ids.size() - 1);
  for (size_t i = 0; i + 1 < ids.size(); ++i) pairs[i] = lookup(ids[i], ids[i + 1]);

  while (!pairs.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < pairs.size(); ++i) {
      if (pairs[i].rank < pairs[best].rank) best = i;
    }
    if (pairs[best].rank == kNoRank) break;
    ids[best] = pairs[best].result;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(best));
    if (best > 0) pairs[best - 1] = lookup(ids[best - 1], ids[best]);
    if (best < pairs.size()) pairs[best] = lookup(ids[best], ids[best + 1]);
  }
  for (const int32_t id : ids) emit(id, out);
}

void BpeModel::encode_piece_heap(std::string_view bytes, BpeScratch& scratch, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  const auto n = static_cast<int32_t>(bytes.size());
  std::vector<BpeScratch::Node>& nodes = scratch.nodes;  // linked list of live symbols; id -1: merged away
  std::vector<BpeScratch::HeapEntry>& heap = scratch.heap;
  nodes.resize(static_cast<size_t>(n));
  heap.clear();
  for (int32_t i = 0; i < n; ++i)
    nodes[i] = {byte_symbol_[static_cast<uint8_t>(bytes[i])], i - 1, i + 1 < n ? i + 1 : -1};

  auto push_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = nodes[left].next;
    if (right < 0) return;
    const BpeScratch::Pair p = lookup(nodes[left].id, nodes[right].id);
    if (p.rank == kNoRank) return;
    heap.push_back({p.rank, left, nodes[left].id, nodes[right].id, p.result});
    std::push_heap(heap.begin(), heap.end(), heap_after);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), heap_after);
    const BpeScratch::HeapEntry e = heap.back();
    heap.pop_back();
    BpeScratch::Node& left = nodes[e.left];
    // Stale entries: the left symbol changed (or died), or its right neighbour is no longer the one paired.
    if (left.id != e.left_id || left.next < 0 || nodes[left.next].id != e.right_id) continue;
    const int32_t right = left.next;
    left.id = e.result;
    left.next = nodes[right].next;
    if (left.next >= 0) nodes[left.next].prev = e.left;
    nodes[right].id = -1;
    push_pair(left.prev);
    push_pair(e.left);
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) emit(nodes[i].id, out);
}

}  // namespace kestrel
