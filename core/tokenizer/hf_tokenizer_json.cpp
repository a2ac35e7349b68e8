// tokenizer.json -> TokenizerVocab, as llama.cpp's converter builds it (see hf_tokenizer_json.h).
#include "core/tokenizer/hf_tokenizer_json.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>

namespace kestrel {
namespace {

using nlohmann::json;

Expected<json> read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const auto code = std::filesystem::exists(path) ? ErrorCode::kIo : ErrorCode::kNotFound;
    return make_error(code, "cannot open '" + path + "'");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::kIo, "cannot read '" + path + "'");
  json doc = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return make_error(ErrorCode::kDataLoss, "'" + path + "' is not valid JSON");
  return doc;
}

Error malformed(const std::string& path, const std::string& what) {
  return make_error(ErrorCode::kDataLoss, "'" + path + "' is not a tokenizer.json: " + what);
}

// convert_hf_to_gguf.py's does_token_look_special (the forms that can occur in byte-level vocabularies).
bool looks_special(const std::string& t) {
  auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.starts_with(open) && t.ends_with(close);
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

// tokenizer_config.json's "<typ>_token": a string, or an object with "content".
std::optional<std::string> config_token(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

Expected<TokenizerVocab> load_hf_tokenizer_json(const std::string& path, std::string pre, uint32_t n_vocab_padded) {
  KESTREL_TRY_ASSIGN(const json doc, read_json(path));
  if (!doc.is_object()) return malformed(path, "the top level is not an object");
  const auto model = doc.find("model");
  if (model == doc.end() || !model->is_object()) return malformed(path, "no \"model\" object");
  const auto type = model->find("type");
  if (type != model->end() && (!type->is_string() || type->get<std::string>() != "BPE")) {
    return make_error(ErrorCode::kUnsupported, "'" + path + "': model.type is " + type->dump() + ", not \"BPE\"");
  }
  if (const auto ignore = model->find("ignore_merges");
      ignore != model->end() && ignore->is_boolean() && ignore->get<bool>()) {
    return make_error(ErrorCode::kUnsupported, "'" + path +
                                                   "': model.ignore_merges is true; the qwen2/qwen35 "
                                                   "tokenizers always apply merges");
  }
  const auto vocab_json = model->find("vocab");
  if (vocab_json == model->end() || !vocab_json->is_object()) return malformed(path, "no model.vocab object");
  const auto merges_json = model->find("merges");
  if (merges_json == model->end() || !merges_json->is_array()) return malformed(path, "no model.merges array");

  // id → (text, type); filled from model.vocab, then added_tokens.
  std::vector<std::optional<std::pair<std::string, TokenType>>> by_id;
  auto place = [&](int64_t id, std::string text, TokenType t) -> Status {
    if (id < 0 || id >= (int64_t{1} << 30)) {
      return malformed(path, "token '" + text + "' has id " + std::to_string(id));
    }
    const auto i = static_cast<size_t>(id);
    if (by_id.size() <= i) by_id.resize(i + 1);
    if (by_id[i] && by_id[i]->first != text) {
      return make_error(ErrorCode::kInvalidArgument, "'" + path + "': id " + std::to_string(id) + " is claimed by '" +
                                                         by_id[i]->first + "' and '" + text + "'");
    }
    by_id[i] = std::make_pair(std::move(text), t);
    return ok_status();
  };
  for (const auto& [text, id] : vocab_json->items()) {
    if (!id.is_number_integer()) return malformed(path, "model.vocab['" + text + "'] is not an integer");
    KESTREL_TRY(place(id.get<int64_t>(), text, TokenType::kNormal));
  }
  std::vector<std::pair<std::string, int32_t>> added;  // in file order, for special-token lookup
  if (const auto added_json = doc.find("added_tokens"); added_json != doc.end() && !added_json->is_null()) {
    if (!added_json->is_array()) return malformed(path, "added_tokens is not an array");
    for (const json& a : *added_json) {
      const auto id = a.find("id");
      const auto content = a.find("content");
      if (!a.is_object() || id == a.end() || !id->is_number_integer() || content == a.end() || !content->is_string()) {
        return malformed(path, "an added_tokens entry lacks an integer \"id\" or a string \"content\": " + a.dump());
      }
      const auto special = a.find("special");
      const bool is_special = special != a.end() && special->is_boolean() && special->get<bool>();
      const std::string text = content->get<std::string>();
      const TokenType t = is_special || looks_special(text) ? TokenType::kControl : TokenType::kUserDefined;
      KESTREL_TRY(place(id->get<int64_t>(), text, t));
      added.emplace_back(text, static_cast<int32_t>(id->get<int64_t>()));
    }
  }
  if (by_id.empty()) return malformed(path, "model.vocab is empty");
  if (n_vocab_padded == 0) n_vocab_padded = static_cast<uint32_t>(by_id.size());
  if (n_vocab_padded < by_id.size()) {
    return make_error(ErrorCode::kInvalidArgument, "'" + path + "' has token id " + std::to_string(by_id.size() - 1) +
                                                       " but the vocabulary size given is " +
                                                       std::to_string(n_vocab_padded));
  }

  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = std::move(pre);
  v.tokens.reserve(n_vocab_padded);
  v.types.reserve(n_vocab_padded);
  for (uint32_t i = 0; i < n_vocab_padded; ++i) {
    if (i < by_id.size() && by_id[i]) {
      v.tokens.push_back(std::move(by_id[i]->first));
      v.types.push_back(by_id[i]->second);
    } else {
      v.tokens.push_back("[PAD" + std::to_string(i) + "]");
      v.types.push_back(TokenType::kUnused);
    }
  }

  v.merges.reserve(merges_json->size());
  for (const json& m : *merges_json) {
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      return malformed(path, "model.merges holds " + m.dump() + " (expected \"a b\" or [\"a\", \"b\"])");
    }
  }

  // Special ids: tokenizer_config.json beside tokenizer.json, as gguf.SpecialVocab reads them.
  auto id_of = [&](const std::string& text) -> int32_t {
    for (const auto& [t, id] : added) {
      if (t == text) return id;
    }
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == text) return static_cast<int32_t>(i);
    }
    return -1;
  };
  const std::filesystem::path config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    KESTREL_TRY_ASSIGN(const json config, read_json(config_path.string()));
    if (!config.is_object()) {
      return make_error(ErrorCode::kDataLoss, "'" + config_path.string() + "' is not a JSON object");
    }
    if (auto t = config_token(config, "eos_token")) v.eos_id = id_of(*t);
    if (auto t = config_token(config, "pad_token")) v.pad_id = id_of(*t);
    if (auto t = config_token(config, "bos_token")) v.bos_id = id_of(*t);
    if (const auto tmpl = config.find("chat_template"); tmpl != config.end() && tmpl->is_string()) {
      v.chat_template = tmpl->get<std::string>();
    }
  } else {
    v.eos_id = id_of("<|endoftext|>");
    v.pad_id = v.eos_id;
  }
  return v;
}

}  // namespace kestrel
