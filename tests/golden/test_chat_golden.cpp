// Chat templates against Python's jinja2: every conversation of tests/golden/chat/conversations.json rendered with
// every template of tests/data/chat_templates must give the bytes tools/golden/make_chat_golden.py recorded from
// jinja2 (in transformers' environment), or fail where jinja2 raised; the same for the small templates of
// snippets.json. Each model template goes through a GGUF first: written with write_tokenizer_metadata and read back
// with read_tokenizer_vocab, as the daemon gets it from a model file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "core/chat/chat_template.h"
#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/byte_unicode.h"
#include "core/tokenizer/tokenizer_gguf.h"

namespace kestrel::chat {
namespace {

using Json = nlohmann::ordered_json;

const std::filesystem::path kGolden = std::filesystem::path(KESTREL_GOLDEN_DIR) / "chat";
const std::filesystem::path kTemplates = std::filesystem::path(KESTREL_TEST_DATA_DIR) / "chat_templates";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << p;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Json read_json(const std::filesystem::path& p) { return Json::parse(read_file(p)); }

// The template stored as tokenizer.chat_template in a GGUF (with a minimal byte-level vocabulary) and read back.
std::string through_gguf(const std::string& name, const std::string& source) {
  TokenizerVocab vocab;
  for (int b = 0; b < 256; ++b) {
    vocab.tokens.emplace_back(byte_to_utf8(static_cast<uint8_t>(b)));
    vocab.types.push_back(TokenType::kNormal);
  }
  vocab.tokens.emplace_back("<|im_end|>");
  vocab.types.push_back(TokenType::kControl);
  vocab.eos_id = 256;
  vocab.chat_template = source;
  const std::string path = (std::filesystem::path(::testing::TempDir()) / ("kestrel_chat_" + name + ".gguf")).string();
  {
    auto w = GgufWriter::create(path);
    EXPECT_TRUE(w) << w.error().to_string();
    if (!w) return {};
    EXPECT_TRUE(w->add_metadata("general.architecture", GgufValue::string("qwen35")));
    const Status st = write_tokenizer_metadata(*w, vocab);
    EXPECT_TRUE(st) << st.error().to_string();
    EXPECT_TRUE(w->write_header());
    EXPECT_TRUE(w->finish());
  }
  auto file = GgufFile::open(path);
  EXPECT_TRUE(file) << file.error().to_string();
  if (!file) return {};
  auto back = read_tokenizer_vocab(*file);
  EXPECT_TRUE(back) << back.error().to_string();
  std::filesystem::remove(path);
  return back ? back->chat_template : std::string();
}

// One rendered case against its expected record: equal bytes, or a failure where Python raised. A template's own
// raise_exception message must come through.
void check_case(const Expected<std::string>& got, const Json& expected, const std::string& label) {
  if (expected.contains("output")) {
    ASSERT_TRUE(got) << label << ": " << got.error().to_string();
    EXPECT_EQ(*got, expected["output"].get<std::string>()) << label;
    return;
  }
  const std::string python_error = expected["error"].get<std::string>();
  ASSERT_FALSE(got) << label << ": rendered, but jinja2 raised " << python_error << "\nrendered: " << *got;
  EXPECT_NE(got.error().code, ErrorCode::kUnsupported) << label << ": " << got.error().to_string();
  const std::string prefix = "TemplateError: ";
  if (python_error.starts_with(prefix)) {
    EXPECT_NE(got.error().message.find(python_error.substr(prefix.size())), std::string::npos)
        << label << ": " << got.error().to_string() << " vs " << python_error;
  }
}

class ChatGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatGolden, MatchesJinja2) {
  const std::string stem = GetParam();
  const std::string source = read_file(kTemplates / (stem + ".jinja"));
  const std::string from_gguf = through_gguf(stem, source);
  ASSERT_EQ(from_gguf, source) << "the template changed on its way through the GGUF";
  auto tmpl = ChatTemplate::parse(from_gguf);
  ASSERT_TRUE(tmpl) << tmpl.error().to_string();

  const Json conversations = read_json(kGolden / "conversations.json")["cases"];
  const Json expected = read_json(kGolden / "expected" / (stem + ".json"));
  ASSERT_EQ(expected["template"].get<std::string>(), stem + ".jinja");
  const Json& cases = expected["cases"];
  ASSERT_EQ(cases.size(), conversations.size()) << "regenerate with tools/golden/make_chat_golden.py";
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(cases[i]["name"], conversations[i]["name"]);
    check_case(tmpl->render(conversations[i]["context"]), cases[i],
               stem + " / " + conversations[i]["name"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatGolden,
                         ::testing::Values("qwen3", "qwen3.5", "qwen3-next-instruct", "qwen3-next-thinking"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string n = param.param;
                           for (char& c : n) {
                             if (c == '.' || c == '-') c = '_';
                           }
                           return n;
                         });

TEST(ChatGoldenSnippets, MatchJinja2) {
  const Json snippets = read_json(kGolden / "snippets.json")["cases"];
  const Json expected = read_json(kGolden / "expected" / "snippets.json")["cases"];
  ASSERT_EQ(snippets.size(), expected.size()) << "regenerate with tools/golden/make_chat_golden.py";
  for (size_t i = 0; i < snippets.size(); ++i) {
    const std::string name = snippets[i]["name"].get<std::string>();
    ASSERT_EQ(expected[i]["name"].get<std::string>(), name);
    auto tmpl = ChatTemplate::parse(snippets[i]["template"].get<std::string>());
    if (!tmpl) {
      // A template jinja2 refuses at compile time may be refused here at parse time.
      EXPECT_TRUE(expected[i].contains("error")) << name << ": " << tmpl.error().to_string();
      continue;
    }
    check_case(tmpl->render(snippets[i]["context"]), expected[i], "snippet " + name);
  }
}

}  // namespace
}  // namespace kestrel::chat
