// LineReader over libedit or plain stdin (line_reader.h).
#include "client/cli/line_reader.h"

#include <editline/readline.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <system_error>

namespace kestrel::cli {

namespace {

class PlainReader final : public LineReader {
 public:
  std::optional<std::string> read(const std::string& /*prompt*/) override {
    std::string line;
    if (!std::getline(std::cin, line)) return std::nullopt;
    return line;
  }
};

class EditlineReader final : public LineReader {
 public:
  explicit EditlineReader(std::string history_path) : history_path_(std::move(history_path)) {
    // Ctrl-C at the prompt goes to the chat's own SIGINT handler; libedit does not install handlers of its own.
    rl_catch_signals = 0;
    using_history();
    stifle_history(kHistoryLines);
    if (!history_path_.empty()) read_history(history_path_.c_str());
  }

  std::optional<std::string> read(const std::string& prompt) override {
    char* raw = readline(prompt.c_str());
    if (raw == nullptr) return std::nullopt;
    std::string line(raw);
    std::free(raw);
    if (!line.empty()) {
      add_history(line.c_str());
      save();
    }
    return line;
  }

 private:
  void save() {
    if (history_path_.empty()) return;
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::path(history_path_).parent_path();
    if (!dir.empty() && !std::filesystem::exists(dir, ec)) {
      std::filesystem::create_directories(dir, ec);
      if (!ec) ::chmod(dir.c_str(), 0700);
    }
    if (write_history(history_path_.c_str()) == 0) ::chmod(history_path_.c_str(), 0600);
  }

  std::string history_path_;
};

}  // namespace

std::string default_history_path() {
  const char* state = std::getenv("XDG_STATE_HOME");
  if (state != nullptr && state[0] == '/') return std::string(state) + "/kestrel/chat_history";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return std::string(home) + "/.local/state/kestrel/chat_history";
  return std::string();
}

std::unique_ptr<LineReader> LineReader::create(bool interactive, std::string history_path) {
  if (!interactive) return std::make_unique<PlainReader>();
  return std::make_unique<EditlineReader>(std::move(history_path));
}

}  // namespace kestrel::cli
