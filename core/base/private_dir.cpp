// check_private_dir() and the fallback folder's checks (private_dir.h).
#include "core/base/private_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

namespace kestrel {
namespace {

namespace fs = std::filesystem;

std::string octal(uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode);
  return buf;
}

Error unsafe(const std::string& dir, const std::string& reason, const std::string& fix) {
  return make_error(ErrorCode::kFailedPrecondition,
                    "private folder " + dir + " is not safe to use: " + reason + "; " + fix);
}

// lstat of `p`; a component that is a symbolic link is an error naming it.
Expected<struct stat> lstat_no_link(const std::string& dir, const fs::path& p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) {
    return make_error(ErrorCode::kIo, "cannot inspect " + p.string() + " (on the path of " + dir +
                                          "): " + std::generic_category().message(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    return unsafe(dir, p.string() + " is a symbolic link", "replace it with a real directory");
  }
  return st;
}

bool is_inside(const fs::path& path, const fs::path& root) {
  auto r = root.begin();
  for (auto p = path.begin(); r != root.end(); ++p, ++r) {
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

}  // namespace

std::string fallback_runtime_dir(uint32_t uid) { return "/tmp/kestrel-" + std::to_string(uid); }

Status check_private_dir(const std::string& dir, uint32_t uid) {
  const fs::path path = fs::path(dir).lexically_normal();
  if (!path.is_absolute()) {
    return make_error(ErrorCode::kInvalidArgument, "private folder " + dir + " must be an absolute path");
  }
  fs::path built = path.root_path();
  struct stat st {};
  for (const fs::path& part : path.relative_path()) {
    if (part.empty()) continue;
    built /= part;
    KESTREL_TRY_ASSIGN(st, lstat_no_link(dir, built));
  }
  if (!S_ISDIR(st.st_mode)) return unsafe(dir, "it is not a directory", "remove it");
  if (st.st_uid != uid) {
    return unsafe(dir,
                  "it belongs to uid " + std::to_string(st.st_uid) + ", not to this program's uid " +
                      std::to_string(uid) + ", so uid " + std::to_string(st.st_uid) +
                      " could replace what is in it (kestreld's socket, the cached model)",
                  "remove it (as uid " + std::to_string(st.st_uid) + " or root) and let kestrel create it");
  }
  const uint32_t mode = st.st_mode & 07777;
  if (mode != 0700 && mode != 0750) {
    return unsafe(dir, "its mode is " + octal(mode) + ", not 0700 or 0750", "chmod 0700 " + dir);
  }
  return ok_status();
}

Status check_inside_private_dir(const std::string& path, const std::string& root, uint32_t uid, const char* what) {
  const fs::path p = fs::path(path).lexically_normal();
  const fs::path r = fs::path(root).lexically_normal();
  if (!p.is_absolute() || !is_inside(p, r)) return ok_status();
  if (Status st = check_private_dir(r.string(), uid); !st) {
    return make_error(st.error().code, std::string(what) + " " + path + ": " + st.error().message);
  }
  fs::path built = r;
  for (auto it = std::next(p.begin(), std::distance(r.begin(), r.end())); it != p.end(); ++it) {
    if (it->empty()) continue;
    built /= *it;
    struct stat st {};
    if (::lstat(built.c_str(), &st) != 0) break;  // not created yet: nothing to follow
    if (S_ISLNK(st.st_mode)) {
      return make_error(ErrorCode::kFailedPrecondition, std::string(what) + " " + path + ": " + built.string() +
                                                            " inside the private folder " + r.string() +
                                                            " is a symbolic link; replace it with a real directory");
    }
  }
  return ok_status();
}

Status prepare_fallback_dir(const std::string& path, const char* what, const char* alternative) {
  const std::string root = fallback_runtime_dir(static_cast<uint32_t>(::getuid()));
  if (!is_inside(fs::path(path).lexically_normal(), fs::path(root))) return ok_status();
  if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
    return make_error(ErrorCode::kIo, std::string(what) + " " + path + ": cannot create " + root + ": " +
                                          std::generic_category().message(errno) + " (or " + alternative + ")");
  }
  Status st = check_inside_private_dir(path, root, static_cast<uint32_t>(::geteuid()), what);
  if (!st) return make_error(st.error().code, st.error().message + " (or " + alternative + ")");
  return st;
}

}  // namespace kestrel
