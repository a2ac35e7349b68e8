// The private fallback folder /tmp/kestrel-$UID (kestreld's sockets when there is no XDG_RUNTIME_DIR,
// daemon/ops/default_paths.h; the default model's cache, for kestreld and `kestrel run`, when there is no HOME,
// tools/mkmodel/default_model.h) lives in a directory every user may write. Another user can create that name first
// (a directory of theirs, mode 0777, or a symbolic link) and then move kestreld's socket away and listen in its place,
// or plant a model in the cache. So before a kestrel program uses anything under it, the folder must be a real
// directory (no symbolic link anywhere on its path), owned by the program's uid, with mode 0700 or 0750; anything else
// is an error that says what to fix.
//
// Blocking file-system calls; call during start-up. Pure otherwise; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "core/base/expected.h"

namespace kestrel {

// /tmp/kestrel-$UID: the folder of last resort (no XDG_RUNTIME_DIR for sockets, no HOME for the cache). Used only
// through prepare_fallback_dir.
std::string fallback_runtime_dir(uint32_t uid);

// kFailedPrecondition naming `dir` and the fix when: a component of its path is a symbolic link, it is not a
// directory, it is not owned by `uid`, or its mode is not 0700 / 0750. kIo when it cannot be inspected. `dir` must be
// absolute.
Status check_private_dir(const std::string& dir, uint32_t uid);

// When `path` is `root` or lies inside it: check_private_dir(root, uid), and no existing component between root and
// path is a symbolic link. Other paths: ok. `what` names the path's use in messages ("socket folder").
Status check_inside_private_dir(const std::string& path, const std::string& root, uint32_t uid, const char* what);

// For a `path` inside this process's fallback folder, fallback_runtime_dir(getuid()): creates that folder (mode 0700)
// when it is missing, then check_inside_private_dir with geteuid(). Other paths: ok, nothing done. `alternative`
// ends an error's message: how not to use the fallback ("set XDG_RUNTIME_DIR, or ...").
Status prepare_fallback_dir(const std::string& path, const char* what, const char* alternative);

}  // namespace kestrel
