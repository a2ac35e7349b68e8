// Unit tests of the tokenizer's parts without the real vocabulary: UTF-8 validation, the GPT-2 byte table, the
// qwen2/qwen35 pre-tokenizer splits, BPE merges on a hand-made vocabulary, special-token partition, from_vocab
// validation.
#include <gtest/gtest.h>

#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/tokenizer/bpe.h"
#include "core/tokenizer/byte_unicode.h"
#include "core/tokenizer/pretokenizer.h"
#include "core/tokenizer/special_tokens.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/utf8.h"

namespace kestrel {
namespace {

std::vector<std::string> split(const PreTokenizer& pre, std::string_view text) {
  std::vector<TextSpan> spans;
  pre.split(text, spans);
  std::vector<std::string> out;
  size_t expect_begin = 0;
  for (const TextSpan& s : spans) {
    EXPECT_EQ(s.begin, expect_begin) << "pieces must tile the text";
    EXPECT_LT(s.begin, s.end) << "empty piece";
    expect_begin = s.end;
    out.emplace_back(text.substr(s.begin, s.end - s.begin));
  }
  EXPECT_EQ(expect_begin, text.size());
  return out;
}

using Pieces = std::vector<std::string>;

TEST(Utf8, ValidatesStrictly) {
  EXPECT_EQ(utf8_first_invalid("plain ascii text that is long enough"), 36u);
  EXPECT_EQ(utf8_first_invalid("caf\xC3\xA9 \xE6\x88\x91 \xF0\x9F\xA6\x99"), 14u);
  EXPECT_EQ(utf8_first_invalid("ab\x80"), 2u);            // lone continuation byte
  EXPECT_EQ(utf8_first_invalid("ab\xC0\xAF"), 2u);        // overlong '/'
  EXPECT_EQ(utf8_first_invalid("\xE0\x80\xAF"), 0u);      // overlong 3-byte
  EXPECT_EQ(utf8_first_invalid("x\xED\xA0\x80"), 1u);     // surrogate U+D800
  EXPECT_EQ(utf8_first_invalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_first_invalid("abcdefgh\xE6\x88"), 8u);  // truncated at the end
  EXPECT_EQ(utf8_first_invalid("\xFF"), 0u);
  std::string s;
  for (uint32_t cp : {0x41u, 0xE9u, 0x6211u, 0x1F999u}) utf8_append(cp, s);
  EXPECT_EQ(s, "A\xC3\xA9\xE6\x88\x91\xF0\x9F\xA6\x99");
  EXPECT_EQ(utf8_decode_at(s, 3, 3), 0x6211u);
  EXPECT_EQ(utf8_decode_at(s, 6, 4), 0x1F999u);
}

TEST(ByteUnicode, IsGpt2Table) {
  EXPECT_EQ(byte_to_codepoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_codepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_codepoint('\t'), 0x109u);  // 'ĉ'
  EXPECT_EQ(byte_to_codepoint('A'), uint32_t{'A'});
  EXPECT_EQ(byte_to_codepoint(0xAD), 0x143u);  // soft hyphen is the last remapped byte
  EXPECT_EQ(byte_to_codepoint(0xE9), 0xE9u);   // printable Latin-1 maps to itself
  EXPECT_EQ(byte_to_utf8(' '), "\xC4\xA0");
  // A bijection between the 256 bytes and 256 code points.
  std::vector<bool> seen(0x144, false);
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_to_codepoint(static_cast<uint8_t>(b));
    ASSERT_LT(cp, 0x144u);
    EXPECT_FALSE(seen[cp]);
    seen[cp] = true;
    EXPECT_EQ(codepoint_to_byte(cp), b);
  }
  EXPECT_EQ(codepoint_to_byte(0x144), -1);
  EXPECT_EQ(codepoint_to_byte(0x7F), -1);  // DEL is remapped, so U+007F stands for no byte

  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string encoded;
  byte_level_encode(all, encoded);
  EXPECT_EQ(utf8_first_invalid(encoded), encoded.size());
  std::string decoded;
  ASSERT_TRUE(byte_level_decode(encoded, decoded));
  EXPECT_EQ(decoded, all);

  std::string bad;
  const Status st = byte_level_decode("ab\xE6\x88\x91", bad);  // U+6211 is not in the table
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message.find("U+6211"), std::string::npos) << st.error().message;
}

TEST(PreTokenizer, RejectsUnknownName) {
  auto pre = PreTokenizer::create("llama3");
  ASSERT_FALSE(pre);
  EXPECT_EQ(pre.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(pre.error().message.find("llama3"), std::string::npos);
}

TEST(PreTokenizer, Qwen2Splits) {
  auto pre = PreTokenizer::create("qwen2");
  ASSERT_TRUE(pre) << pre.error().to_string();
  EXPECT_EQ(split(*pre, "Hello, world!"), (Pieces{"Hello", ",", " world", "!"}));
  EXPECT_EQ(split(*pre, "I've been 'told he's there, 'RE you"),
            (Pieces{"I", "'ve", " been", " '", "told", " he", "'s", " there", ",", " '", "RE", " you"}));
  EXPECT_EQ(split(*pre, "We'Ve a'lL"), (Pieces{"We", "'Ve", " a", "'lL"}));
  EXPECT_EQ(split(*pre, "3333"), (Pieces{"3", "3", "3", "3"}));  // \p{N} one digit at a time
  EXPECT_EQ(split(*pre, "    Hello\n    Hello"), (Pieces{"   ", " Hello", "\n", "   ", " Hello"}));
  EXPECT_EQ(split(*pre, "a  \n\n b"), (Pieces{"a", "  \n\n", " b"}));
  EXPECT_EQ(split(*pre, "x   "), (Pieces{"x", "   "}));
  EXPECT_EQ(split(*pre, "foo();\r\n\r\nbar"), (Pieces{"foo", "();\r\n\r\n", "bar"}));
  EXPECT_EQ(split(*pre,
                  "\xE6\x88\x91\xE6\x83\xB3"
                  "apple"),
            (Pieces{"\xE6\x88\x91\xE6\x83\xB3"
                    "apple"}));
  // U+0085 (NEL) and U+3000 are White_Space: `\s` here is the Unicode set, whatever the PCRE2 version.
  EXPECT_EQ(split(*pre,
                  "a\xC2\x85\xC2\x85"
                  "b"),
            (Pieces{"a", "\xC2\x85",
                    "\xC2\x85"
                    "b"}));
  EXPECT_EQ(split(*pre,
                  "a\xE3\x80\x80\xE3\x80\x80"
                  "b"),
            (Pieces{"a", "\xE3\x80\x80",
                    "\xE3\x80\x80"
                    "b"}));
  EXPECT_TRUE(split(*pre, "").empty());
}

TEST(PreTokenizer, InvalidUtf8SplitsAsReplacementCharacter) {
  auto pre = PreTokenizer::create("qwen2");
  ASSERT_TRUE(pre);
  // U+FFFD is a symbol (So): it joins the punctuation run, as in llama.cpp; the original bytes stay in the piece.
  EXPECT_EQ(split(*pre, "ab\xFF!?cd"), (Pieces{"ab", "\xFF!?", "cd"}));
  EXPECT_EQ(split(*pre, "ab \xFF\xFE"), (Pieces{"ab", " \xFF\xFE"}));
  EXPECT_EQ(split(*pre,
                  "\x80"
                  "abc"),
            (Pieces{"\x80"
                    "abc"}));                                // optional non-letter prefix of a letter run
  EXPECT_EQ(split(*pre, "\xE6\x88"), (Pieces{"\xE6\x88"}));  // truncated sequence: two U+FFFD
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string s(static_cast<size_t>(rng() % 64), '\0');
    for (char& c : s) c = static_cast<char>(rng());
    split(*pre, s);  // checks that the pieces tile the text
  }
}

// The hand-written ASCII matcher must agree with PCRE2 everywhere, including where ASCII meets other characters
// (letters with accents, Unicode spaces, marks, CJK, '½', '…') and invalid bytes.
TEST(PreTokenizer, AsciiFastPathAgreesWithPcre2) {
  static const char* const kAtoms[] = {"a",
                                       "Z",
                                       "q",
                                       "7",
                                       "0",
                                       " ",
                                       "  ",
                                       "\t",
                                       "\n",
                                       "\r",
                                       "\r\n",
                                       "\v",
                                       "\f",
                                       "'",
                                       "'s",
                                       "'S",
                                       "'re",
                                       "'rE",
                                       "'ll",
                                       "'l",
                                       "'d",
                                       "'ve",
                                       "'v",
                                       "'m",
                                       "'t",
                                       "!",
                                       "?",
                                       ".",
                                       "...",
                                       "(",
                                       ")",
                                       "-",
                                       "_",
                                       "\"",
                                       "`",
                                       "\x01",
                                       "\x7F",
                                       "\x1F",
                                       "\xC3\xA9",
                                       "\xC3\x84",
                                       "\xC2\x85",
                                       "\xC2\xA0",
                                       "\xE3\x80\x80",
                                       "\xE2\x80\xA8",
                                       "\xCC\x81",
                                       "\xE6\x88\x91",
                                       "\xC2\xBD",
                                       "\xE2\x80\xA6",
                                       "\xF0\x9F\x98\x81",
                                       "\xEF\xB8\x8F",
                                       "\xFF",
                                       "\xE6\x88"};
  std::mt19937 rng(3);
  for (const char* name : {"qwen2", "qwen35"}) {
    auto pre = PreTokenizer::create(name);
    ASSERT_TRUE(pre);
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int n = 1 + static_cast<int>(rng() % 24);
      for (int k = 0; k < n; ++k) s += kAtoms[rng() % std::size(kAtoms)];
      std::vector<TextSpan> fast, slow;
      pre->split(s, fast);
      pre->split_pcre2_only(s, slow);
      ASSERT_EQ(fast.size(), slow.size()) << name << " '" << s << "'";
      for (size_t k = 0; k < fast.size(); ++k) {
        ASSERT_TRUE(fast[k].begin == slow[k].begin && fast[k].end == slow[k].end)
            << name << " '" << s << "' piece " << k;
      }
    }
  }
}

TEST(PreTokenizer, Qwen35KeepsMarksWithLetters) {
  auto q2 = PreTokenizer::create("qwen2");
  auto q35 = PreTokenizer::create("qwen35");
  ASSERT_TRUE(q2 && q35);
  const std::string cafe =
      "caf"
      "e\xCC\x81";  // "café" with U+0301 COMBINING ACUTE ACCENT
  EXPECT_EQ(split(*q2, cafe), (Pieces{"cafe", "\xCC\x81"}));
  EXPECT_EQ(split(*q35, cafe), (Pieces{cafe}));
  const std::string resume = "re\xCC\x81sume\xCC\x81 now";
  // qwen2: a mark is neither letter nor digit, so it may be the one-character prefix of the next letter run.
  EXPECT_EQ(split(*q2, resume), (Pieces{"re", "\xCC\x81sume", "\xCC\x81", " now"}));
  EXPECT_EQ(split(*q35, resume), (Pieces{"re\xCC\x81sume\xCC\x81", " now"}));
  // A mark after a space: qwen2 makes " ́" a punctuation piece; qwen35 makes it part of a letter run.
  EXPECT_EQ(split(*q2, "a \xCC\x81x"), (Pieces{"a", " \xCC\x81", "x"}));
  EXPECT_EQ(split(*q35, "a \xCC\x81x"), (Pieces{"a", " \xCC\x81x"}));
  // Without marks the two agree.
  const std::string plain = "Hello, y'all! How are you \xF0\x9F\x98\x81 ?\xE6\x88\x91\xE6\x83\xB3 1314151 \t\n";
  EXPECT_EQ(split(*q2, plain), split(*q35, plain));
}

// A tiny byte-level vocabulary: the 256 byte tokens plus a few merges, and two special tokens.
TokenizerVocab tiny_vocab() {
  TokenizerVocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.emplace_back(byte_to_utf8(static_cast<uint8_t>(b)));
    v.types.push_back(TokenType::kNormal);
  }
  const std::vector<std::string> merges = {"a b", "ab c", "Ġ a", "c c", "b c", "Ġa bc"};
  for (const std::string& m : merges) {
    v.merges.push_back(m);
    std::string joined = m;
    joined.erase(joined.find(' '), 1);
    v.tokens.push_back(joined);
    v.types.push_back(TokenType::kNormal);
  }
  v.tokens.push_back("<|end|>");
  v.types.push_back(TokenType::kControl);
  v.tokens.push_back("<think>");
  v.types.push_back(TokenType::kUserDefined);
  v.tokens.push_back("[PAD264]");
  v.types.push_back(TokenType::kUnused);
  v.eos_id = 262;
  return v;
}

TEST(Bpe, MergesByRankLeftmostFirst) {
  auto tok = Tokenizer::from_vocab(tiny_vocab());
  ASSERT_TRUE(tok) << tok.error().to_string();
  const int32_t ab = tok->find_token("ab"), abc = tok->find_token("abc"), cc = tok->find_token("cc");
  const int32_t bc = tok->find_token("bc"), sp_a = tok->find_token("Ġa"), sp_abc = tok->find_token("Ġabc");
  ASSERT_GE(std::min({ab, abc, cc, bc, sp_a, sp_abc}), 256);
  EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{abc}));
  // "abcc": a+b (rank 0) then ab+c (rank 1) → abc, c. Not a, b, cc.
  EXPECT_EQ(tok->encode("abcc", false), (std::vector<int32_t>{abc, 'c'}));
  // "bcc": c+c (rank 3) beats b+c (rank 4): b, cc.
  EXPECT_EQ(tok->encode("bcc", false), (std::vector<int32_t>{'b', cc}));
  // " abc": "Ġ a" (rank 2) happens after "a b" (rank 0), so the result is Ġ, abc (never reaching "Ġa bc").
  EXPECT_EQ(tok->encode(" abc", false), (std::vector<int32_t>{tok->find_token("Ġ"), abc}));
  // " abd": a+b first, then nothing joins Ġ with ab.
  EXPECT_EQ(tok->encode(" abd", false), (std::vector<int32_t>{tok->find_token("Ġ"), ab, 'd'}));
}

TEST(Bpe, ScanAndHeapAgree) {
  TokenizerVocab v = tiny_vocab();
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids[v.tokens[i]] = static_cast<int32_t>(i);
  auto bpe = BpeModel::build(v.tokens, ids, v.merges);
  ASSERT_TRUE(bpe) << bpe.error().to_string();
  std::mt19937 rng(11);
  BpeScratch scratch;
  for (int i = 0; i < 500; ++i) {
    std::string s(static_cast<size_t>(1 + rng() % 200), '\0');
    for (char& c : s) c = "abc d"[rng() % 5];
    std::vector<int32_t> a, b;
    bpe->encode_piece_scan(s, scratch, a);
    bpe->encode_piece_heap(s, scratch, b);
    ASSERT_EQ(a, b) << s;
  }
}

TEST(Bpe, MergeResultsThatAreNotTokensFallBackToBytes) {
  TokenizerVocab v = tiny_vocab();
  v.merges.push_back("x y");  // "xy" is not a token: llama.cpp falls back to the tokens of its single bytes
  auto tok = Tokenizer::from_vocab(v);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->encode("xy", false), (std::vector<int32_t>{'x', 'y'}));
  v.merges.push_back("nospace");
  auto bad = Tokenizer::from_vocab(v);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message.find("nospace"), std::string::npos);
}

TEST(SpecialTokens, PartitionLikeLlamaCpp) {
  // Longest token first, each over all fragments: with "bcd" before "ab", "abcd" gives a, [bcd] (a leftmost-longest
  // scan would give [ab], cd).
  std::vector<std::string> tokens = {"ab", "bcd", "x"};
  std::vector<TokenType> types = {TokenType::kControl, TokenType::kControl, TokenType::kUserDefined};
  SpecialTokenMatcher m(tokens, types);
  std::vector<TextFragment> f;
  m.partition("abcd", true, f);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].token, -1);
  EXPECT_EQ(f[0].end, 1u);
  EXPECT_EQ(f[1].token, 1);
  m.partition("abcdxab", false, f);  // only the user-defined "x"
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[1].token, 2);
  EXPECT_EQ(f[2].begin, 5u);
  m.partition("", true, f);
  EXPECT_TRUE(f.empty());
}

TEST(Tokenizer, SpecialAndDecode) {
  auto tok = Tokenizer::from_vocab(tiny_vocab());
  ASSERT_TRUE(tok);
  const int32_t end = tok->find_token("<|end|>"), think = tok->find_token("<think>");
  EXPECT_TRUE(tok->is_control(end));
  EXPECT_FALSE(tok->is_control(think));
  const auto with = tok->encode("a<|end|><think>", true);
  EXPECT_EQ(with, (std::vector<int32_t>{'a', end, think}));
  const auto without = tok->encode("a<|end|><think>", false);
  EXPECT_EQ(without.back(), think);  // user-defined tokens are matched either way
  EXPECT_EQ(std::count(without.begin(), without.end(), end), 0);
  auto text = tok->decode(with);
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, "a<|end|><think>");
  auto pad = tok->token_bytes(264);
  ASSERT_TRUE(pad);
  EXPECT_EQ(*pad, "");  // unused tokens decode to nothing
  const int32_t bad_ids[] = {'a', 265};
  auto bad = tok->decode(bad_ids);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message.find("265"), std::string::npos);
  EXPECT_FALSE(tok->token_bytes(-1));
}

TEST(Tokenizer, FromVocabValidates) {
  TokenizerVocab v = tiny_vocab();
  v.model = "llama";
  EXPECT_EQ(Tokenizer::from_vocab(v).error().code, ErrorCode::kUnsupported);
  v = tiny_vocab();
  v.pre = "gpt4o";
  EXPECT_EQ(Tokenizer::from_vocab(v).error().code, ErrorCode::kUnsupported);
  v = tiny_vocab();
  v.types.pop_back();
  EXPECT_EQ(Tokenizer::from_vocab(v).error().code, ErrorCode::kInvalidArgument);
  v = tiny_vocab();
  v.types[3] = static_cast<TokenType>(9);
  EXPECT_EQ(Tokenizer::from_vocab(v).error().code, ErrorCode::kInvalidArgument);
  v = tiny_vocab();
  v.eos_id = 265;
  EXPECT_EQ(Tokenizer::from_vocab(v).error().code, ErrorCode::kOutOfRange);
  v = tiny_vocab();
  v.tokens.clear();
  v.types.clear();
  EXPECT_EQ(Tokenizer::from_vocab(v).error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel
