// Tokenizer metadata in GGUF: write_tokenizer_metadata, read_tokenizer_vocab, Tokenizer::from_gguf
// (see tokenizer_gguf.h).
#include "core/tokenizer/tokenizer_gguf.h"

#include <string>
#include <utility>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/pretokenizer.h"

namespace kestrel {
namespace {

constexpr const char* kModelKey = "tokenizer.ggml.model";
constexpr const char* kPreKey = "tokenizer.ggml.pre";
constexpr const char* kTokensKey = "tokenizer.ggml.tokens";
constexpr const char* kTypesKey = "tokenizer.ggml.token_type";
constexpr const char* kMergesKey = "tokenizer.ggml.merges";
constexpr const char* kEosKey = "tokenizer.ggml.eos_token_id";
constexpr const char* kPadKey = "tokenizer.ggml.padding_token_id";
constexpr const char* kBosKey = "tokenizer.ggml.bos_token_id";
constexpr const char* kAddBosKey = "tokenizer.ggml.add_bos_token";
constexpr const char* kChatTemplateKey = "tokenizer.chat_template";

// Adds the file's name to an error from a typed getter.
Error in_file(const GgufFile& file, Error e) {
  const std::string where = file.path().empty() ? "GGUF image" : "'" + file.path() + "'";
  e.message = where + ": " + e.message;
  return e;
}

// An optional special id: -1 when absent; kOutOfRange when it does not name a token.
Expected<int32_t> read_special_id(const GgufFile& file, const char* key, size_t n_tokens, bool required) {
  if (file.find(key) == nullptr) {
    if (required) return in_file(file, make_error(ErrorCode::kNotFound, std::string("missing metadata key ") + key));
    return -1;
  }
  auto id = file.get_u64(key);
  if (!id) return in_file(file, std::move(id).error());
  if (*id >= n_tokens) {
    return in_file(file, make_error(ErrorCode::kOutOfRange, std::string(key) + " = " + std::to_string(*id) +
                                                                " is outside the vocabulary of " +
                                                                std::to_string(n_tokens) + " tokens"));
  }
  return static_cast<int32_t>(*id);
}

}  // namespace

Status write_tokenizer_metadata(GgufWriter& writer, const TokenizerVocab& vocab) {
  const size_t n = vocab.tokens.size();
  if (vocab.types.size() != n) {
    return make_error(ErrorCode::kInvalidArgument, "vocab has " + std::to_string(n) + " tokens but " +
                                                       std::to_string(vocab.types.size()) + " token types");
  }
  auto check_id = [&](const char* what, int32_t id, bool required) -> Status {
    if ((required && id < 0) || id >= static_cast<int64_t>(n) || id < -1) {
      return make_error(ErrorCode::kInvalidArgument, std::string("vocab ") + what + " id " + std::to_string(id) +
                                                         " is not a token id (0.." + std::to_string(n) + ")");
    }
    return ok_status();
  };
  KESTREL_TRY(check_id("eos", vocab.eos_id, true));
  KESTREL_TRY(check_id("padding", vocab.pad_id, false));
  KESTREL_TRY(check_id("bos", vocab.bos_id, false));

  std::vector<int32_t> types(n);
  for (size_t i = 0; i < n; ++i) types[i] = static_cast<int32_t>(vocab.types[i]);
  KESTREL_TRY(writer.add_metadata(kModelKey, GgufValue::string(vocab.model)));
  KESTREL_TRY(writer.add_metadata(kPreKey, GgufValue::string(vocab.pre)));
  KESTREL_TRY(writer.add_metadata(kTokensKey, GgufValue::string_array(vocab.tokens)));
  KESTREL_TRY(writer.add_metadata(kTypesKey, GgufValue::i32_array(types)));
  KESTREL_TRY(writer.add_metadata(kMergesKey, GgufValue::string_array(vocab.merges)));
  KESTREL_TRY(writer.add_metadata(kEosKey, GgufValue::u32(static_cast<uint32_t>(vocab.eos_id))));
  if (vocab.pad_id >= 0) {
    KESTREL_TRY(writer.add_metadata(kPadKey, GgufValue::u32(static_cast<uint32_t>(vocab.pad_id))));
  }
  if (vocab.bos_id >= 0) {
    KESTREL_TRY(writer.add_metadata(kBosKey, GgufValue::u32(static_cast<uint32_t>(vocab.bos_id))));
  }
  KESTREL_TRY(writer.add_metadata(kAddBosKey, GgufValue::boolean(false)));
  if (!vocab.chat_template.empty()) {
    KESTREL_TRY(writer.add_metadata(kChatTemplateKey, GgufValue::string(vocab.chat_template)));
  }
  return ok_status();
}

Expected<TokenizerVocab> read_tokenizer_vocab(const GgufFile& file) {
  auto get_string = [&](const char* key) -> Expected<std::string> {
    if (file.find(key) == nullptr) {
      return in_file(file, make_error(ErrorCode::kNotFound, std::string("missing metadata key ") + key));
    }
    auto s = file.get_string(key);
    if (!s) return in_file(file, std::move(s).error());
    return std::move(*s);
  };
  auto get_strings = [&](const char* key) -> Expected<std::vector<std::string>> {
    if (file.find(key) == nullptr) {
      return in_file(file, make_error(ErrorCode::kNotFound, std::string("missing metadata key ") + key));
    }
    auto s = file.get_string_array(key);
    if (!s) return in_file(file, std::move(s).error());
    return std::move(*s);
  };

  TokenizerVocab v;
  KESTREL_TRY_ASSIGN(v.model, get_string(kModelKey));
  if (v.model != "gpt2") {
    return in_file(file, make_error(ErrorCode::kUnsupported, std::string(kModelKey) + " is '" + v.model +
                                                                 "'; Kestrel implements byte-level BPE (\"gpt2\")"));
  }
  KESTREL_TRY_ASSIGN(v.pre, get_string(kPreKey));
  if (auto pattern = PreTokenizer::pattern_for(v.pre); !pattern) return in_file(file, std::move(pattern).error());
  KESTREL_TRY_ASSIGN(v.tokens, get_strings(kTokensKey));
  KESTREL_TRY_ASSIGN(v.merges, get_strings(kMergesKey));

  if (file.find(kTypesKey) == nullptr) {
    return in_file(file, make_error(ErrorCode::kNotFound, std::string("missing metadata key ") + kTypesKey));
  }
  auto types = file.get_int_array(kTypesKey);
  if (!types) return in_file(file, std::move(types).error());
  if (types->size() != v.tokens.size()) {
    return in_file(file, make_error(ErrorCode::kInvalidArgument,
                                    std::string(kTypesKey) + " has " + std::to_string(types->size()) + " entries but " +
                                        kTokensKey + " has " + std::to_string(v.tokens.size())));
  }
  v.types.reserve(types->size());
  for (size_t i = 0; i < types->size(); ++i) {
    const int64_t t = (*types)[i];
    if (t < static_cast<int64_t>(TokenType::kUndefined) || t > static_cast<int64_t>(TokenType::kByte)) {
      return in_file(file, make_error(ErrorCode::kInvalidArgument, std::string(kTypesKey) + "[" + std::to_string(i) +
                                                                       "] = " + std::to_string(t) +
                                                                       " is not a token type (0..6)"));
    }
    v.types.push_back(static_cast<TokenType>(t));
  }

  const size_t n = v.tokens.size();
  KESTREL_TRY_ASSIGN(v.eos_id, read_special_id(file, kEosKey, n, /*required=*/true));
  KESTREL_TRY_ASSIGN(v.pad_id, read_special_id(file, kPadKey, n, /*required=*/false));
  KESTREL_TRY_ASSIGN(v.bos_id, read_special_id(file, kBosKey, n, /*required=*/false));
  if (file.find(kChatTemplateKey) != nullptr) {
    KESTREL_TRY_ASSIGN(v.chat_template, get_string(kChatTemplateKey));
  }
  return v;
}

Expected<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  KESTREL_TRY_ASSIGN(TokenizerVocab vocab, read_tokenizer_vocab(file));
  auto tokenizer = from_vocab(std::move(vocab));
  if (!tokenizer) return in_file(file, std::move(tokenizer).error());
  return tokenizer;
}

}  // namespace kestrel
