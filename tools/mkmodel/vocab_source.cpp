// The vocabulary step of kestrel-mkmodel: locate tokenizer.json, load it padded, write tokenizer.ggml.* keys.
#include "tools/mkmodel/vocab_source.h"

#include <filesystem>
#include <system_error>

#include "core/tokenizer/hf_tokenizer_json.h"
#include "core/tokenizer/tokenizer_gguf.h"

#ifndef KESTREL_MKMODEL_BIN_TO_DATA
#define KESTREL_MKMODEL_BIN_TO_DATA "../share"
#endif
#ifndef KESTREL_MKMODEL_SOURCE_VOCAB
#define KESTREL_MKMODEL_SOURCE_VOCAB ""
#endif

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
  return load_hf_tokenizer_json(tokenizer_json, kVocabPre, n_vocab);
}

Status add_vocab_metadata(GgufWriter& writer, const TokenizerVocab& vocab) {
  return write_tokenizer_metadata(writer, vocab);
}

}  // namespace kestrel::mkmodel
