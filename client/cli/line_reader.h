// LineReader: where `kestrel chat` reads its input lines. On a terminal: libedit (BSD editline) with line editing
// and a persistent history; otherwise plain lines from stdin, with no prompt and no history.
//
// History: default_history_path() is $XDG_STATE_HOME/kestrel/chat_history (or ~/.local/state/kestrel/chat_history);
// it is read at start, each entered line is added, and the file (mode 0600, its folder created 0700) is rewritten
// after every line so that a killed chat keeps it; at most kHistoryLines lines are kept. Failing to read or write it
// is not an error (the chat goes on without a saved history).
//
// Not thread-safe: one reader per process, used from the main thread (libedit keeps global state).
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace kestrel::cli {

inline constexpr int kHistoryLines = 1000;

// The history file, or empty when neither XDG_STATE_HOME nor HOME is set.
std::string default_history_path();

class LineReader {
 public:
  // interactive: stdin is a terminal (line editing, prompt, history in `history_path`; empty path: no history).
  static std::unique_ptr<LineReader> create(bool interactive, std::string history_path);
  virtual ~LineReader() = default;
  // The next line without its newline; nullopt at the end of input (Ctrl-D).
  virtual std::optional<std::string> read(const std::string& prompt) = 0;
};

}  // namespace kestrel::cli
