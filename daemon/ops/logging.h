// kestreld's logging: one spdlog logger ("kestreld", the default logger) writing to stderr, which journald captures
// under systemd. Formats:
//   text     "2026-11-29 20:14:03.512 info  [1234] message"  (colours on a terminal)
//   journal  "<6>message"  — syslog priority prefixes that journald turns into PRIORITY= (journalctl -p warning);
//            no timestamp, journald adds its own
//   auto     journal when stderr is the journal's stream ($JOURNAL_STREAM matches stderr's device:inode), else text
//
// Protobuf's own log lines go through the same logger ("protobuf file:line: ..."); the ERROR it logs for a peer's
// string field that is not UTF-8, as that parse fails, is a debug line (clients trigger it at will).
//
// setup_logging() is called once from main() before any thread logs; spdlog's logger itself is thread-safe.
#pragma once

#include <string>

#include "core/base/expected.h"
#include "daemon/ops/config.h"

namespace kestrel::daemon::ops {

// Installs the logger; kInvalidArgument for an unknown level or format (config validation already refuses them).
Status setup_logging(const LogConfig& config);

// The format `auto` picks: "journal" or "text".
std::string resolve_log_format(const std::string& format);

// True when stderr is connected to the systemd journal ($JOURNAL_STREAM, see systemd.exec(5)).
bool stderr_is_journal();

}  // namespace kestrel::daemon::ops
