// The embedded default model: when no model is configured, kestreld serves <cache_dir>/kestrel-tiny-<version>.gguf,
// the `tiny` preset of kestrel-mkmodel (byte-identical to `kestrel-mkmodel --preset tiny -o FILE`), creating it on
// first start; `kestrel run` without --model uses the same file.
//
// <version> is "<kestrel version>-<8 hex digits>", the digits a hash of the preset's tensor plan, so a preset that
// changes shape gets a new file instead of a stale one. Creation is atomic: the model is written to a temporary
// file in the same folder (".kestrel-tiny-<version>.gguf.tmp-<pid>"), flushed to disk and renamed over the final
// name, so a crash never leaves a half-written model under the final name; temporaries left by dead processes are
// removed on the next start. Two daemons starting at once both write and rename the same bytes.
//
// Blocking (the tiny model is about 20 MB, written in well under a second); thread-safe for different folders.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "core/base/expected.h"

namespace kestrel::mkmodel {

// "kestrel-tiny-0.1.0-1a2b3c4d.gguf"
Expected<std::string> default_model_file_name();

struct DefaultModel {
  std::string path;      // the model file, ready to open
  bool created = false;  // false: an existing file was reused
};

// Log lines go to `log` (may be empty): what was found, what is being written, how long it took.
using LogLine = std::function<void(std::string_view)>;

// Returns the cached default model, creating `cache_dir` (mode 0755 as the umask allows) and the file as needed.
// kIo naming the folder when it cannot be created or written (the message suggests another folder or --model). A folder
// in the fallback /tmp/kestrel-$UID must first pass prepare_fallback_dir (core/base/private_dir.h):
// kFailedPrecondition naming what to fix otherwise.
Expected<DefaultModel> ensure_default_model(const std::string& cache_dir, const LogLine& log);

// The folder of the default model: $CACHE_DIRECTORY (systemd's CacheDirectory=; the first of a ':' list), else
// $XDG_CACHE_HOME/kestrel, else $HOME/.cache/kestrel, else /tmp/kestrel-$UID/cache. Arguments are the variables'
// values ("" = unset). kestreld (daemon/ops/default_paths.h) and `kestrel run` share this rule.
std::string default_model_cache_dir(const std::string& cache_directory, const std::string& xdg_cache_home,
                                    const std::string& home, uint32_t uid);
// The same from this process's environment. Reads getenv: call before starting threads that setenv.
std::string default_model_cache_dir_from_process();

}  // namespace kestrel::mkmodel
