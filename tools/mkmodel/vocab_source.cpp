// The vocabulary step of kestrel-mkmodel: locate tokenizer.json, load it padded, write tokenizer.ggml.* keys.
#include "tools/mkmodel/vocab_source.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "core/tokenizer/hf_tokenizer_json.h"
#include "core/tokenizer/tokenizer_gguf.h"

#ifndef KESTREL_MKMODEL_BIN_TO_DATA
#define KESTREL_MKMODEL_BIN_TO_DATA "../share"
#endif
#ifndef KESTREL_MKMODEL_SOURCE_VOCAB
#define KESTREL_MKMODEL_SOURCE_VOCAB ""
#endif

#include <string_view>
#include <unordered_map>

namespace kestrel::mkmodel {

namespace {

namespace fs = std::filesystem;

constexpr const char* kVocabRelative = "kestrel/tokenizer/qwen3/tokenizer.json";

std::string binary_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return std::string();
  return exe.parent_path().string();
}

}  // namespace

std::vector<std::string> vocab_candidates(const std::string& explicit_path) {
  std::vector<std::string> out;
  if (!explicit_path.empty()) out.push_back(explicit_path);
  const std::string bin = binary_dir();
  if (!bin.empty()) {
    out.push_back((fs::path(bin) / KESTREL_MKMODEL_BIN_TO_DATA / kVocabRelative).lexically_normal().string());
  }
  const std::string source = KESTREL_MKMODEL_SOURCE_VOCAB;
  if (!source.empty()) out.push_back(source);
  return out;
}

Expected<std::string> find_vocab_file(const std::string& explicit_path) {
  std::error_code ec;
  if (!explicit_path.empty()) {
    if (!fs::is_regular_file(explicit_path, ec)) {
      return make_error(ErrorCode::kNotFound, "--vocab " + explicit_path + ": no such file");
    }
    return explicit_path;
  }
  std::string tried;
  for (const std::string& path : vocab_candidates(explicit_path)) {
    if (fs::is_regular_file(path, ec)) return path;
    tried += (tried.empty() ? "" : ", ") + path;
  }
  return make_error(ErrorCode::kNotFound,
                    "no Qwen3 tokenizer.json found (tried " + tried + "); pass --vocab PATH/tokenizer.json");
}

Expected<TokenizerVocab> load_vocab(const std::string& tokenizer_json, uint32_t n_vocab) {
  if (n_vocab >= kQwen3FullVocabRows) return load_hf_tokenizer_json(tokenizer_json, kVocabPre, n_vocab);
  KESTREL_TRY_ASSIGN(TokenizerVocab full, load_hf_tokenizer_json(tokenizer_json, kVocabPre, 0));
  return truncate_vocab(full, n_vocab);
}

Expected<TokenizerVocab> truncate_vocab(const TokenizerVocab& full, uint32_t n_vocab) {
  const char* const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  constexpr uint32_t kSpecials = 3;
  if (n_vocab < 256 + kSpecials || n_vocab > full.tokens.size()) {
    return make_error(ErrorCode::kInvalidArgument, "a truncated vocabulary needs 259.." +
                                                       std::to_string(full.tokens.size()) + " rows, not " +
                                                       std::to_string(n_vocab));
  }
  const uint32_t n_keep = n_vocab - kSpecials;
  TokenizerVocab v;
  v.model = full.model;
  v.pre = full.pre;
  v.tokens.assign(full.tokens.begin(), full.tokens.begin() + n_keep);
  v.types.assign(full.types.begin(), full.types.begin() + n_keep);
  // A merge survives when both parts and the merged token are kept, so every kept token stays reachable.
  std::unordered_map<std::string_view, uint32_t> id_of;
  for (uint32_t i = 0; i < n_keep; ++i) id_of.emplace(v.tokens[i], i);
  for (const std::string& m : full.merges) {
    const size_t sp = m.find(' ');
    if (sp == std::string::npos) continue;
    const std::string_view a(m.data(), sp), b(m.data() + sp + 1, m.size() - sp - 1);
    const std::string ab = std::string(a) + std::string(b);
    if (id_of.count(a) != 0 && id_of.count(b) != 0 && id_of.count(ab) != 0) v.merges.push_back(m);
  }
  for (const char* sp : specials) {
    v.tokens.emplace_back(sp);
    v.types.push_back(TokenType::kControl);
  }
  v.pad_id = static_cast<int32_t>(n_keep);      // <|endoftext|>
  v.eos_id = static_cast<int32_t>(n_keep + 2);  // <|im_end|>
  return v;
}

Expected<std::string> read_chat_template_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return make_error(ErrorCode::kNotFound, "--chat-template " + path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, "--chat-template " + path + ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return make_error(ErrorCode::kIo, "--chat-template " + path + ": read failed");
  if (text.empty()) return make_error(ErrorCode::kInvalidArgument, "--chat-template " + path + ": the file is empty");
  return text;
}

Status add_vocab_metadata(GgufWriter& writer, const TokenizerVocab& vocab) {
  return write_tokenizer_metadata(writer, vocab);
}

}  // namespace kestrel::mkmodel
