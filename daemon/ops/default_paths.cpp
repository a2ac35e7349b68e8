// Default socket and cache paths from the environment (default_paths.h).
#include "daemon/ops/default_paths.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/base/private_dir.h"
#include "tools/mkmodel/default_model.h"

namespace kestrel::daemon::ops {

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read once at start-up, before threads
  return v != nullptr ? std::string(v) : std::string();
}

// systemd joins several RuntimeDirectory=/CacheDirectory= folders with ':'; the first is ours.
std::string first_of_list(const std::string& value) { return value.substr(0, value.find(':')); }

}  // namespace

Environment Environment::from_process() {
  Environment env;
  env.runtime_directory = env_or_empty("RUNTIME_DIRECTORY");
  env.cache_directory = env_or_empty("CACHE_DIRECTORY");
  env.xdg_runtime_dir = env_or_empty("XDG_RUNTIME_DIR");
  env.xdg_cache_home = env_or_empty("XDG_CACHE_HOME");
  env.home = env_or_empty("HOME");
  env.uid = static_cast<uint32_t>(::getuid());
  return env;
}

std::string default_socket_path(const Environment& env) {
  namespace fs = std::filesystem;
  if (!env.runtime_directory.empty()) {
    return (fs::path(first_of_list(env.runtime_directory)) / kSocketFileName).string();
  }
  if (env.uid == 0) return std::string("/run/kestrel/") + kSocketFileName;
  if (!env.xdg_runtime_dir.empty()) return (fs::path(env.xdg_runtime_dir) / "kestrel" / kSocketFileName).string();
  return (fs::path(fallback_runtime_dir(env.uid)) / kSocketFileName).string();
}

std::string default_shm_socket_path(const std::string& socket_path) {
  namespace fs = std::filesystem;
  return (fs::path(socket_path).parent_path() / kShmSocketFileName).string();
}

std::string default_cache_dir(const Environment& env) {
  return mkmodel::default_model_cache_dir(env.cache_directory, env.xdg_cache_home, env.home, env.uid);
}

}  // namespace kestrel::daemon::ops
