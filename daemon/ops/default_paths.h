// Where kestreld puts things when the configuration does not say: the listening sockets and the cache folder of the
// embedded default model, derived from the environment the way systemd and the XDG base-directory spec intend.
//
//   socket  $RUNTIME_DIRECTORY/kestreld.sock (under systemd, RuntimeDirectory=kestrel)
//           else /run/kestrel/kestreld.sock when running as root
//           else $XDG_RUNTIME_DIR/kestrel/kestreld.sock
//           else /tmp/kestrel-$UID/kestreld.sock
//   shm     kestreld-shm.sock in the folder of the gRPC socket
//   cache   $CACHE_DIRECTORY (CacheDirectory=kestrel), else $XDG_CACHE_HOME/kestrel, else $HOME/.cache/kestrel,
//           else /tmp/kestrel-$UID/cache
//
// systemd sets RUNTIME_DIRECTORY / CACHE_DIRECTORY to a colon-separated list when a unit names several folders; the
// first one is used. Pure functions of an Environment value; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace kestrel::daemon::ops {

// The environment variables kestreld reads (empty = unset), captured once so that tests can pass their own.
struct Environment {
  std::string runtime_directory;  // $RUNTIME_DIRECTORY
  std::string cache_directory;    // $CACHE_DIRECTORY
  std::string xdg_runtime_dir;    // $XDG_RUNTIME_DIR
  std::string xdg_cache_home;     // $XDG_CACHE_HOME
  std::string home;               // $HOME
  uint32_t uid = 0;               // getuid()

  // Reads the variables of this process. Not thread-safe against concurrent setenv() (as getenv itself).
  static Environment from_process();
};

inline constexpr const char* kSocketFileName = "kestreld.sock";
inline constexpr const char* kShmSocketFileName = "kestreld-shm.sock";

std::string default_socket_path(const Environment& env);
// kestreld-shm.sock next to `socket_path` (in its folder).
std::string default_shm_socket_path(const std::string& socket_path);
std::string default_cache_dir(const Environment& env);

}  // namespace kestrel::daemon::ops
