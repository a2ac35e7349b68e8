// TextStream: the incremental detokenizer of one generation — token ids in, text chunks out.
//
// Every chunk push() returns is valid UTF-8 on its own: the bytes of a character split across tokens are held back
// until the character is complete; bytes that can never start or finish a well-formed character become U+FFFD at
// once. Stop strings: text that could still grow into one of them is held back; when one occurs, the text is cut
// before its first occurrence (the earliest-starting stop string wins) and stopped() turns true. finish() returns
// what is still held back (an unfinished character as U+FFFD; a held-back stop-string prefix as the text it is).
//
// Control and user-defined tokens give their text (Tokenizer::token_bytes); the caller decides which tokens reach
// the stream (the Service keeps end-of-generation tokens out). Owns its buffers; borrows the Tokenizer for its
// lifetime. Not thread-safe: one generation, one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"
#include "core/tokenizer/tokenizer.h"

namespace kestrel::daemon {

class TextStream {
 public:
  // Empty stop strings are ignored; invalid UTF-8 in a stop string is matched as U+FFFD.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings);

  // The text that became safe to emit after `token` (may be empty). kInvalidArgument for an id outside the
  // vocabulary (nothing changes). After a stop string matched, push() returns empty text and does nothing.
  Expected<std::string> push(int32_t token);
  // Text still held back, released at the end of the generation (with a stop-string check of its own). Afterwards
  // the stream is empty.
  std::string finish();

  bool stopped() const { return stopped_; }

 private:
  // Moves the complete characters of raw_ into text_ (invalid bytes as U+FFFD), then releases from text_ what can
  // no longer be part of a stop string. `final`: nothing more will come.
  std::string release(bool final);

  const Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  std::string raw_;   // bytes of an unfinished character (<= 3)
  std::string text_;  // valid UTF-8 not yet emitted (a possible stop-string prefix)
  bool stopped_ = false;
};

// Appends `bytes` to out as valid UTF-8: each byte that does not belong to a well-formed sequence becomes U+FFFD.
void append_utf8_sanitized(std::string_view bytes, std::string& out);

// How many bytes at the end of `bytes` are the start of a well-formed character still missing bytes (0..3).
size_t utf8_incomplete_tail(std::string_view bytes);

}  // namespace kestrel::daemon
