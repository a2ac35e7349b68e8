// TextStream: multi-byte characters split across tokens are held back until complete, leftovers become U+FFFD,
// stop strings are matched across chunk boundaries and cut before their first occurrence. Runs with the real
// Qwen3 vocabulary (tests/data) and the 1024-token byte-level vocabulary of a golden fixture model.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/tokenizer/byte_unicode.h"
#include "core/tokenizer/hf_tokenizer_json.h"
#include "core/tokenizer/utf8.h"
#include "daemon/engine/text_stream.h"
#include "tests/daemon/engine/engine_test_util.h"

namespace kestrel::daemon {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

bool valid_utf8(const std::string& s) { return utf8_first_invalid(s) == s.size(); }

class TextStreamTest : public ::testing::TestWithParam<const char*> {
 protected:
  // The Qwen3 vocabulary takes seconds to load: once per process.
  static const Tokenizer* qwen3() {
    static const std::unique_ptr<Tokenizer> tok = [] {
      auto vocab = load_hf_tokenizer_json(KESTREL_TEST_DATA_DIR "/tokenizer/qwen3/tokenizer.json", "qwen2", 151936);
      EXPECT_TRUE(vocab.has_value()) << vocab.error().to_string();
      if (!vocab) return std::unique_ptr<Tokenizer>();
      auto t = Tokenizer::from_vocab(std::move(*vocab));
      EXPECT_TRUE(t.has_value());
      return t ? std::make_unique<Tokenizer>(std::move(*t)) : std::unique_ptr<Tokenizer>();
    }();
    return tok.get();
  }

  void SetUp() override {
    if (std::string(GetParam()) == "qwen3") {
      tok_ = qwen3();
    } else {
      model_ = test::open_fixture(GetParam());
      ASSERT_TRUE(model_);
      tok_ = &model_->tokenizer();
    }
    ASSERT_NE(tok_, nullptr);
  }

  // Pushes every token, checking each chunk is valid UTF-8 on its own; returns the chunks (finish() last).
  std::vector<std::string> stream(const std::vector<int32_t>& ids, const std::vector<std::string>& stops,
                                  bool* stopped = nullptr, size_t* stopped_at = nullptr) {
    TextStream ts(*tok_, stops);
    std::vector<std::string> chunks;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto c = ts.push(ids[i]);
      EXPECT_TRUE(c.has_value());
      EXPECT_TRUE(valid_utf8(*c)) << "chunk " << i;
      chunks.push_back(*c);
      if (ts.stopped()) {
        if (stopped_at) *stopped_at = i;
        break;
      }
    }
    if (stopped) *stopped = ts.stopped();
    chunks.push_back(ts.finish());
    EXPECT_TRUE(valid_utf8(chunks.back()));
    return chunks;
  }

  // The token that stands for one raw byte (its GPT-2 byte-level text).
  int32_t byte_token(uint8_t b) const { return tok_->find_token(byte_to_utf8(b)); }

  std::unique_ptr<Model> model_;
  const Tokenizer* tok_ = nullptr;
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x;
  return s;
}

TEST_P(TextStreamTest, MultiByteCharactersSplitAcrossTokensAreHeldBack) {
  const std::string text = "na\xC3\xAFve \xF0\x9F\x8E\x89 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xEA\x99\xAE end";
  const std::vector<int32_t> ids = tok_->encode(text, false);
  // The case must really split a character: some token on its own is not valid UTF-8.
  bool split = false;
  for (int32_t id : ids) {
    auto b = tok_->token_bytes(id);
    ASSERT_TRUE(b.has_value());
    split |= !valid_utf8(std::string(*b));
  }
  ASSERT_TRUE(split) << "the test text no longer splits a character across tokens";
  const auto chunks = stream(ids, {});
  EXPECT_EQ(join(chunks), text);
  EXPECT_EQ(chunks.back(), "");  // nothing left over
  // Some chunk was held back empty while a character was incomplete.
  EXPECT_NE(std::find(chunks.begin(), chunks.end() - 1, std::string()), chunks.end() - 1);
}

TEST_P(TextStreamTest, UnfinishedCharacterAtTheEndBecomesReplacement) {
  const int32_t f0 = byte_token(0xF0);  // lead byte of a 4-byte sequence
  const int32_t x9f = byte_token(0x9F);
  ASSERT_GE(f0, 0);
  ASSERT_GE(x9f, 0);
  TextStream ts(*tok_, {});
  EXPECT_EQ(*ts.push(tok_->encode("ok", false)[0]), "ok");
  EXPECT_EQ(*ts.push(f0), "");
  EXPECT_EQ(*ts.push(x9f), "");
  EXPECT_EQ(ts.finish(), kFffd);
  // A byte that can never start a character (0xFF) is replaced at once, as is a lead cut off by ASCII.
  const int32_t ff = byte_token(0xFF);
  ASSERT_GE(ff, 0);
  TextStream t2(*tok_, {});
  EXPECT_EQ(*t2.push(ff), kFffd);
  EXPECT_EQ(*t2.push(f0), "");
  EXPECT_EQ(*t2.push(tok_->encode("a", false)[0]), kFffd + "a");
  EXPECT_EQ(t2.finish(), "");
  EXPECT_EQ(t2.push(-1).error().code, ErrorCode::kInvalidArgument);
}

TEST_P(TextStreamTest, StopStringAcrossChunksCutsBeforeIt) {
  const std::string text = "Hello world</end> and more";
  std::vector<int32_t> ids = tok_->encode(text, false);
  bool stopped = false;
  size_t at = 0;
  const auto chunks = stream(ids, {"</end>"}, &stopped, &at);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(join(chunks), "Hello world");
  EXPECT_LT(at + 1, ids.size()) << "it stops at the token that completes the stop string";
  // Token by token: the text before "</end>" never includes a partial "<" of it once held.
  std::string before_stop = tok_->decode(std::span<const int32_t>(ids).first(at)).value();
  EXPECT_NE(before_stop.find('<'), std::string::npos) << "the stop string spans more than one token";
}

TEST_P(TextStreamTest, HeldBackPrefixIsReleasedWhenItDiverges) {
  TextStream ts(*tok_, {"<x>", "abc"});
  std::string out;
  for (int32_t id : tok_->encode("a<", false)) out += *ts.push(id);
  EXPECT_EQ(out, "a");  // "a" could start "abc"... but "a<" cannot; "<" could start "<x>"
  for (int32_t id : tok_->encode("y", false)) out += *ts.push(id);
  EXPECT_EQ(out, "a<y");
  for (int32_t id : tok_->encode(" ST", false)) out += *ts.push(id);
  out += ts.finish();
  EXPECT_EQ(out, "a<y ST");
  EXPECT_FALSE(ts.stopped());
}

TEST_P(TextStreamTest, EarliestStopStringWinsAndMultiByteStops) {
  bool stopped = false;
  // "abc" completes no later than "cd"; if both complete in one chunk, the earlier start wins.
  auto chunks = stream(tok_->encode("xabcd tail", false), {"cd", "abc"}, &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(join(chunks), "x");
  const std::string jp = "\xE4\xBB\x8A\xE6\x97\xA5\xE3\x81\xAF\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E";  // 今日は日本語
  chunks = stream(tok_->encode(jp, false), {"\xE6\x97\xA5\xE6\x9C\xAC"}, &stopped);                   // 日本
  EXPECT_TRUE(stopped);
  EXPECT_EQ(join(chunks), "\xE4\xBB\x8A\xE6\x97\xA5\xE3\x81\xAF");
  // A stop string that never occurs: everything comes out, the held-back tail at finish().
  chunks = stream(tok_->encode("the end is nigh", false), {"nighty"}, &stopped);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(join(chunks), "the end is nigh");
  EXPECT_EQ(chunks.back(), "nigh");
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TextStreamTest, ::testing::Values("qwen3", "golden-qwen35moe"));

TEST(Utf8Helpers, IncompleteTailAndSanitize) {
  EXPECT_EQ(utf8_incomplete_tail(""), 0u);
  EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xC3"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xC3\xA9"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x8E"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("\xE0\x80"), 0u);  // overlong: can never complete
  EXPECT_EQ(utf8_incomplete_tail("\xED\xA0"), 0u);  // surrogate
  EXPECT_EQ(utf8_incomplete_tail("\xFF"), 0u);
  std::string out;
  append_utf8_sanitized("a\xFF\xC3\xA9\x80z", out);
  EXPECT_EQ(out, "a" + kFffd + "\xC3\xA9" + kFffd + "z");
}

}  // namespace
}  // namespace kestrel::daemon
