// The folder of a listening socket: created when missing (mode 0750, each missing level) and checked to be a
// writable directory (and, for the fallback /tmp/kestrel-$UID, a private one) before the servers bind, so that a bad
// path is one clear start-up error ("socket folder /run/kestrel is not writable by uid 1000 ...") instead of a bind
// failure deep in gRPC.
//
// Blocking file-system calls; call from main() during start-up.
#pragma once

#include <string>

#include "core/base/expected.h"

namespace kestrel::daemon::ops {

// kIo naming the folder and the reason; the message suggests [listen] socket / --socket. A folder in the private
// fallback folder /tmp/kestrel-$UID must also pass prepare_fallback_dir (core/base/private_dir.h): kFailedPrecondition
// otherwise.
Status prepare_socket_dir(const std::string& socket_path);

}  // namespace kestrel::daemon::ops
