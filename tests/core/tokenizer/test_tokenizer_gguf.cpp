// Tokenizer metadata in GGUF: the real Qwen3 vocabulary written with write_tokenizer_metadata and read back with
// Tokenizer::from_gguf is identical and tokenizes identically; malformed tokenizer metadata gives clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/byte_unicode.h"
#include "core/tokenizer/hf_tokenizer_json.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/tokenizer_gguf.h"

namespace kestrel {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / ("kestrel_tok_" + name + ".gguf")).string();
}

// Writes a GGUF with only the given metadata and opens it.
Expected<GgufFile> write_and_open(const std::string& name, std::vector<std::pair<std::string, GgufValue>> kv) {
  const std::string path = temp_path(name);
  KESTREL_TRY_ASSIGN(GgufWriter w, GgufWriter::create(path));
  for (auto& [k, v] : kv) KESTREL_TRY(w.add_metadata(k, std::move(v)));
  KESTREL_TRY(w.write_header());
  KESTREL_TRY(w.finish());
  return GgufFile::open(path);
}

TEST(TokenizerGguf, QwenVocabularyRoundTrips) {
  auto vocab = load_hf_tokenizer_json(KESTREL_TEST_DATA_DIR "/tokenizer/qwen3/tokenizer.json", "qwen2", 151936);
  ASSERT_TRUE(vocab) << vocab.error().to_string();
  const std::string path = temp_path("qwen3");
  {
    auto w = GgufWriter::create(path);
    ASSERT_TRUE(w) << w.error().to_string();
    ASSERT_TRUE(w->add_metadata("general.architecture", GgufValue::string("qwen3")));
    const Status st = write_tokenizer_metadata(*w, *vocab);
    ASSERT_TRUE(st) << st.error().to_string();
    ASSERT_TRUE(w->write_header());
    ASSERT_TRUE(w->finish());
  }
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file) << file.error().to_string();
  auto add_bos = file->get_bool("tokenizer.ggml.add_bos_token");
  ASSERT_TRUE(add_bos);
  EXPECT_FALSE(*add_bos);
  EXPECT_EQ(file->find("tokenizer.ggml.bos_token_id"), nullptr);  // Qwen3's config has no BOS

  auto tok = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok) << tok.error().to_string();
  const TokenizerVocab& back = tok->vocab();
  EXPECT_EQ(back.model, "gpt2");
  EXPECT_EQ(back.pre, "qwen2");
  EXPECT_EQ(back.tokens, vocab->tokens);
  EXPECT_EQ(back.types, vocab->types);
  EXPECT_EQ(back.merges, vocab->merges);
  EXPECT_EQ(back.eos_id, vocab->eos_id);
  EXPECT_EQ(back.pad_id, vocab->pad_id);
  EXPECT_EQ(back.bos_id, -1);
  EXPECT_EQ(back.chat_template, vocab->chat_template);

  auto direct = Tokenizer::from_vocab(std::move(*vocab));
  ASSERT_TRUE(direct);
  const std::string text =
      "<|im_start|>user\nHello, y'all! 我想在apple工作 \xF0\x9F\xA6\x99 <think>\n</think><|im_end|>";
  for (const bool special : {false, true}) EXPECT_EQ(tok->encode(text, special), direct->encode(text, special));
  std::filesystem::remove(path);
}

// A minimal valid set of tokenizer keys: 256 byte tokens, one merge, eos = the last byte token.
std::vector<std::pair<std::string, GgufValue>> minimal_keys() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(byte_to_utf8(static_cast<uint8_t>(b)));
  tokens.push_back("ab");
  std::vector<int32_t> types(tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  return {{"tokenizer.ggml.model", GgufValue::string("gpt2")},
          {"tokenizer.ggml.pre", GgufValue::string("qwen35")},
          {"tokenizer.ggml.tokens", GgufValue::string_array(tokens)},
          {"tokenizer.ggml.token_type", GgufValue::i32_array(types)},
          {"tokenizer.ggml.merges", GgufValue::string_array({"a b"})},
          {"tokenizer.ggml.eos_token_id", GgufValue::u32(255)}};
}

std::vector<std::pair<std::string, GgufValue>> with(std::vector<std::pair<std::string, GgufValue>> kv,
                                                    const std::string& key, std::optional<GgufValue> value) {
  for (auto it = kv.begin(); it != kv.end(); ++it) {
    if (it->first == key) {
      if (value) {
        it->second = std::move(*value);
      } else {
        kv.erase(it);
      }
      return kv;
    }
  }
  if (value) kv.emplace_back(key, std::move(*value));
  return kv;
}

void expect_error(const std::string& name, std::vector<std::pair<std::string, GgufValue>> kv, ErrorCode code,
                  const std::string& mention) {
  auto file = write_and_open(name, std::move(kv));
  ASSERT_TRUE(file) << file.error().to_string();
  auto tok = Tokenizer::from_gguf(*file);
  ASSERT_FALSE(tok) << name;
  EXPECT_EQ(tok.error().code, code) << name << ": " << tok.error().to_string();
  EXPECT_NE(tok.error().message.find(mention), std::string::npos) << name << ": " << tok.error().message;
  std::filesystem::remove(temp_path(name));
}

TEST(TokenizerGguf, MinimalVocabularyLoads) {
  auto file = write_and_open("minimal", minimal_keys());
  ASSERT_TRUE(file) << file.error().to_string();
  auto tok = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok) << tok.error().to_string();
  EXPECT_EQ(tok->vocab().pre, "qwen35");
  EXPECT_EQ(tok->encode("ab", false), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok->vocab().pad_id, -1);
  std::filesystem::remove(temp_path("minimal"));
}

TEST(TokenizerGguf, MalformedMetadataIsRefused) {
  expect_error("no_tokens", with(minimal_keys(), "tokenizer.ggml.tokens", std::nullopt), ErrorCode::kNotFound,
               "tokenizer.ggml.tokens");
  expect_error("no_merges", with(minimal_keys(), "tokenizer.ggml.merges", std::nullopt), ErrorCode::kNotFound,
               "tokenizer.ggml.merges");
  expect_error("no_types", with(minimal_keys(), "tokenizer.ggml.token_type", std::nullopt), ErrorCode::kNotFound,
               "tokenizer.ggml.token_type");
  expect_error("no_eos", with(minimal_keys(), "tokenizer.ggml.eos_token_id", std::nullopt), ErrorCode::kNotFound,
               "tokenizer.ggml.eos_token_id");
  expect_error("no_pre", with(minimal_keys(), "tokenizer.ggml.pre", std::nullopt), ErrorCode::kNotFound,
               "tokenizer.ggml.pre");
  expect_error("llama_model", with(minimal_keys(), "tokenizer.ggml.model", GgufValue::string("llama")),
               ErrorCode::kUnsupported, "llama");
  expect_error("unknown_pre", with(minimal_keys(), "tokenizer.ggml.pre", GgufValue::string("llama-bpe")),
               ErrorCode::kUnsupported, "llama-bpe");
  expect_error("short_types", with(minimal_keys(), "tokenizer.ggml.token_type", GgufValue::i32_array({1, 1, 1})),
               ErrorCode::kInvalidArgument, "3 entries");
  std::vector<int32_t> bad_types(257, 1);
  bad_types[7] = 42;
  expect_error("bad_type", with(minimal_keys(), "tokenizer.ggml.token_type", GgufValue::i32_array(bad_types)),
               ErrorCode::kInvalidArgument, "[7] = 42");
  expect_error("eos_range", with(minimal_keys(), "tokenizer.ggml.eos_token_id", GgufValue::u32(257)),
               ErrorCode::kOutOfRange, "257");
  expect_error("pad_range", with(minimal_keys(), "tokenizer.ggml.padding_token_id", GgufValue::u32(1000)),
               ErrorCode::kOutOfRange, "padding_token_id");
  expect_error("tokens_type", with(minimal_keys(), "tokenizer.ggml.tokens", GgufValue::i32_array({1, 2})),
               ErrorCode::kInvalidArgument, "tokenizer.ggml.tokens");
  expect_error("bad_merge", with(minimal_keys(), "tokenizer.ggml.merges", GgufValue::string_array({"ab"})),
               ErrorCode::kInvalidArgument, "merge 0");
}

TEST(TokenizerGguf, WriterRefusesInconsistentVocab) {
  auto vocab = TokenizerVocab{};
  vocab.tokens = {"a", "b"};
  vocab.types = {TokenType::kNormal, TokenType::kNormal};
  const std::string path = temp_path("refused");
  auto w = GgufWriter::create(path);
  ASSERT_TRUE(w);
  vocab.eos_id = -1;
  EXPECT_EQ(write_tokenizer_metadata(*w, vocab).error().code, ErrorCode::kInvalidArgument);  // no eos
  vocab.eos_id = 2;
  EXPECT_EQ(write_tokenizer_metadata(*w, vocab).error().code, ErrorCode::kInvalidArgument);  // out of range
  vocab.eos_id = 1;
  vocab.types.pop_back();
  EXPECT_EQ(write_tokenizer_metadata(*w, vocab).error().code, ErrorCode::kInvalidArgument);  // lengths differ
}

}  // namespace
}  // namespace kestrel
