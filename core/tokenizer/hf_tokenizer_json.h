// Builds a TokenizerVocab from a Hugging Face tokenizer.json, the way llama.cpp's convert_hf_to_gguf.py does for
// Qwen (get_vocab_base + gguf.SpecialVocab), so that a GGUF written from it carries the same tokenizer metadata as
// a llama.cpp conversion.
//
//  - ids come from model.vocab and added_tokens; every id below n_vocab_padded without a token becomes "[PAD<id>]"
//    of type kUnused (the model's vocab_size rounds the embedding up, e.g. 151669 tokens -> 151936 rows);
//  - added tokens with special=true, or whose text looks special ("<|...|>", as the converter's
//    does_token_look_special), are kControl; the other added tokens are kUserDefined; all others kNormal;
//  - merges: ["a", "b"] pairs (current format) or "a b" strings (older format) are stored as "a b", as GGUF does;
//  - the model type must be "BPE" (model.ignore_merges must not be true: llama.cpp's qwen2 path ignores it);
//  - eos / pad / bos and the chat template are read from tokenizer_config.json in the same directory when it
//    exists (eos_token, pad_token, bos_token: a string or {"content": ...}; chat_template), as SpecialVocab does.
//    Without that file eos and pad are "<|endoftext|>" when the vocabulary has it, bos none. For the Qwen3 files in
//    tests/data (the hybrid-thinking release) this gives eos = <|im_end|> 151645, pad = <|endoftext|> 151643,
//    bos none, which is what llama.cpp writes for them.
//
// n_vocab_padded: the vocabulary size to pad to (config.json vocab_size); 0 means "no padding" (highest id + 1).
// Errors: kIo/kNotFound when the file cannot be read, kDataLoss for malformed JSON or a structure that is not a
// tokenizer.json (naming the field), kInvalidArgument when n_vocab_padded is smaller than the ids present or two
// tokens claim one id, kUnsupported for a non-BPE model. Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "core/base/expected.h"
#include "core/tokenizer/tokenizer.h"

namespace kestrel {

Expected<TokenizerVocab> load_hf_tokenizer_json(const std::string& path, std::string pre, uint32_t n_vocab_padded);

}  // namespace kestrel
