// Tokenizer: validation, indexing, encode and decode (see tokenizer.h). GGUF I/O lives in tokenizer_gguf.cpp.
#include "core/tokenizer/tokenizer.h"

#include <limits>
#include <unordered_map>
#include <utility>

#include "core/tokenizer/bpe.h"
#include "core/tokenizer/byte_unicode.h"
#include "core/tokenizer/pretokenizer.h"
#include "core/tokenizer/special_tokens.h"

namespace kestrel {
namespace {

constexpr size_t kMaxCachedPieceBytes = 32;
constexpr size_t kChunkBytes = size_t{1} << 16;
constexpr size_t kMaxCachedPieces = size_t{1} << 16;

bool valid_type(TokenType t) {
  const auto v = static_cast<int32_t>(t);
  return v >= static_cast<int32_t>(TokenType::kUndefined) && v <= static_cast<int32_t>(TokenType::kByte);
}

Status check_special_id(const char* what, int32_t id, size_t n_tokens) {
  if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= n_tokens)) {
    return make_error(ErrorCode::kOutOfRange, std::string(what) + " id " + std::to_string(id) +
                                                  " is outside the vocabulary of " + std::to_string(n_tokens) +
                                                  " tokens");
  }
  return ok_status();
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Where the chunk of `text` that starts at `start` ends: about kChunkBytes later, just after a '\n' followed by an
// ASCII byte that is not whitespace. No piece crosses such a point (a match that takes in a newline can only go on
// with whitespace, and no pattern looks behind), so splitting chunk by chunk gives the same pieces as splitting the
// whole text, with the piece list bounded and cache-resident. Without such a point the chunk is the rest of the text.
size_t chunk_end(std::string_view text, size_t start) {
  if (text.size() - start <= kChunkBytes) return text.size();
  for (size_t nl = text.find('\n', start + kChunkBytes); nl != std::string_view::npos && nl + 1 < text.size();
       nl = text.find('\n', nl + 1)) {
    const auto next = static_cast<unsigned char>(text[nl + 1]);
    const bool whitespace = next == ' ' || (next >= '\t' && next <= '\r');
    if (next < 0x80 && !whitespace) return nl + 1;
  }
  return text.size();
}

// The bytes a token stands for when decoded (llama.cpp's token_to_piece with special = true).
std::string piece_of(const std::string& text, TokenType type) {
  switch (type) {
    case TokenType::kNormal: {
      std::string bytes;
      // A normal token whose text is not byte-level (never produced by encode) decodes to its text as is.
      if (!byte_level_decode(text, bytes)) return text;
      return bytes;
    }
    case TokenType::kControl:
    case TokenType::kUserDefined:
    case TokenType::kUnknown: return text;
    case TokenType::kByte:
      // "<0xAB>" (SentencePiece-style byte tokens; not used by byte-level vocabularies but valid GGUF).
      if (text.size() == 6 && text.starts_with("<0x") && text.back() == '>' && hex_digit(text[3]) >= 0 &&
          hex_digit(text[4]) >= 0) {
        return std::string(1, static_cast<char>(hex_digit(text[3]) * 16 + hex_digit(text[4])));
      }
      return {};
    case TokenType::kUndefined:
    case TokenType::kUnused: return {};
  }
  return {};
}

}  // namespace

struct Tokenizer::Impl {
  TokenizerVocab vocab;
  std::unordered_map<std::string, int32_t> ids;  // token text → id (the last id wins, as in llama.cpp)
  PreTokenizer pre;
  BpeModel bpe;
  SpecialTokenMatcher specials;
  std::string pieces;                 // decoded bytes of every token, back to back
  std::vector<size_t> piece_offsets;  // [n_vocab + 1]: token i is pieces[piece_offsets[i], piece_offsets[i + 1])

  Impl(TokenizerVocab v, PreTokenizer p) : vocab(std::move(v)), pre(std::move(p)) {}
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Expected<Tokenizer> Tokenizer::from_vocab(TokenizerVocab vocab) {
  if (vocab.model != "gpt2") {
    return make_error(ErrorCode::kUnsupported, "tokenizer model '" + vocab.model +
                                                   "' (tokenizer.ggml.model) is not supported; Kestrel implements "
                                                   "byte-level BPE, \"gpt2\"");
  }
  KESTREL_TRY_ASSIGN(PreTokenizer pre, PreTokenizer::create(vocab.pre));
  const size_t n = vocab.tokens.size();
  if (n == 0) return make_error(ErrorCode::kInvalidArgument, "the vocabulary has no tokens");
  // Symbols beyond the vocabulary (merge results that are not tokens) get ids above n; keep them in int32.
  if (n + vocab.merges.size() + 256 > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return make_error(ErrorCode::kOutOfRange, "vocabulary of " + std::to_string(n) + " tokens and " +
                                                  std::to_string(vocab.merges.size()) + " merges is too large");
  }
  if (vocab.types.size() != n) {
    return make_error(ErrorCode::kInvalidArgument, "the vocabulary has " + std::to_string(n) + " tokens but " +
                                                       std::to_string(vocab.types.size()) + " token types");
  }
  for (size_t i = 0; i < n; ++i) {
    if (!valid_type(vocab.types[i])) {
      return make_error(ErrorCode::kInvalidArgument, "token " + std::to_string(i) + " has unknown token type " +
                                                         std::to_string(static_cast<int32_t>(vocab.types[i])));
    }
  }
  KESTREL_TRY(check_special_id("eos", vocab.eos_id, n));
  KESTREL_TRY(check_special_id("padding", vocab.pad_id, n));
  KESTREL_TRY(check_special_id("bos", vocab.bos_id, n));

  auto impl = std::make_unique<Impl>(std::move(vocab), std::move(pre));
  const TokenizerVocab& v = impl->vocab;
  impl->ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!v.tokens[i].empty()) impl->ids.insert_or_assign(v.tokens[i], static_cast<int32_t>(i));
  }
  KESTREL_TRY_ASSIGN(impl->bpe, BpeModel::build(v.tokens, impl->ids, v.merges));
  impl->specials = SpecialTokenMatcher(v.tokens, v.types);
  impl->piece_offsets.reserve(n + 1);
  impl->piece_offsets.push_back(0);
  for (size_t i = 0; i < n; ++i) {
    impl->pieces += piece_of(v.tokens[i], v.types[i]);
    impl->piece_offsets.push_back(impl->pieces.size());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 16);
  std::vector<TextFragment> fragments;
  impl_->specials.partition(text, parse_special, fragments);
  std::vector<TextSpan> pieces;
  BpeScratch scratch;
  // Memo of short pieces already merged in this call (prose and code repeat most words): piece → (offset, count)
  // in cache_ids. Keys view `text`, so the memo lives only for this call; nothing is shared between threads.
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;
  std::vector<int32_t> cache_ids;
  for (const TextFragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    const std::string_view whole = text.substr(f.begin, f.end - f.begin);
    for (size_t start = 0; start < whole.size();) {
      const size_t end = chunk_end(whole, start);
      const std::string_view fragment = whole.substr(start, end - start);
      start = end;
      pieces.clear();
      impl_->pre.split(fragment, pieces);
      for (const TextSpan& p : pieces) {
        const std::string_view piece = fragment.substr(p.begin, p.end - p.begin);
        if (piece.size() < 2 || piece.size() > kMaxCachedPieceBytes) {
          impl_->bpe.encode_piece(piece, scratch, out);
          continue;
        }
        auto [it, inserted] = cache.try_emplace(piece, 0, 0);
        if (!inserted) {
          out.insert(out.end(), cache_ids.begin() + it->second.first,
                     cache_ids.begin() + it->second.first + it->second.second);
          continue;
        }
        const size_t before = out.size();
        impl_->bpe.encode_piece(piece, scratch, out);
        if (cache.size() > kMaxCachedPieces) {  // bound the memo's memory on huge inputs of unique pieces
          cache.erase(it);
          continue;
        }
        it->second = {static_cast<uint32_t>(cache_ids.size()), static_cast<uint32_t>(out.size() - before)};
        cache_ids.insert(cache_ids.end(), out.begin() + before, out.end());
      }
    }
  }
  return out;
}

Expected<std::string_view> Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= n_vocab()) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "token id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(n_vocab() - 1) + ")");
  }
  const size_t begin = impl_->piece_offsets[static_cast<size_t>(id)];
  const size_t end = impl_->piece_offsets[static_cast<size_t>(id) + 1];
  return std::string_view(impl_->pieces).substr(begin, end - begin);
}

Expected<std::string> Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto piece = token_bytes(ids[i]);
    if (!piece) {
      return make_error(ErrorCode::kInvalidArgument,
                        "cannot decode position " + std::to_string(i) + ": " + piece.error().message);
    }
    out.append(*piece);
  }
  return out;
}

int32_t Tokenizer::find_token(std::string_view text) const {
  const auto it = impl_->ids.find(std::string(text));
  return it == impl_->ids.end() ? -1 : it->second;
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return TokenType::kUndefined;
  return impl_->vocab.types[static_cast<size_t>(id)];
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->vocab.tokens.size()); }

const TokenizerVocab& Tokenizer::vocab() const { return impl_->vocab; }

bool Tokenizer::is_control(int32_t id) const { return token_type(id) == TokenType::kControl; }

}  // namespace kestrel
