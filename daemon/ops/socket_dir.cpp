// prepare_socket_dir(): mkdir -p with mode 0750, then a writability check (socket_dir.h).
#include "daemon/ops/socket_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "core/base/private_dir.h"

namespace kestrel::daemon::ops {

namespace {

Error dir_error(const std::string& dir, const std::string& reason) {
  return make_error(ErrorCode::kIo, "socket folder " + dir + ": " + reason +
                                        " (choose another path with [listen] socket / --socket, or fix the folder)");
}

}  // namespace

Status prepare_socket_dir(const std::string& socket_path) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(socket_path).parent_path();
  if (dir.empty()) return ok_status();
  KESTREL_TRY(prepare_fallback_dir(
      dir.string(), "socket folder",
      "set XDG_RUNTIME_DIR, or choose a socket folder of your own with [listen] socket / --socket"));
  fs::path built;
  for (const fs::path& part : dir) {
    built /= part;
    if (::mkdir(built.c_str(), 0750) != 0 && errno != EEXIST) {
      return dir_error(built.string(), "cannot create it: " + std::generic_category().message(errno));
    }
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return dir_error(dir.string(), std::generic_category().message(errno));
  if (!S_ISDIR(st.st_mode)) return dir_error(dir.string(), "not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return dir_error(dir.string(), "not writable by uid " + std::to_string(::geteuid()) + ": " +
                                       std::generic_category().message(errno));
  }
  return ok_status();
}

}  // namespace kestrel::daemon::ops
