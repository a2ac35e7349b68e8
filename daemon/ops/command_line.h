// kestreld's command line (CLI11): one flag per configuration key (config.h) plus --config, --print-config,
// --check-config and --version. parse_command_line() reads the file named by --config, applies the flags on top
// (flags > file > defaults), fills the environment defaults and validates, so main() gets a finished DaemonConfig.
//
//   kestreld [--config FILE] [--model PATH] [--socket PATH] [--max-sessions N] ... [--print-config | --check-config]
//
// Thread-compatible: call it from main() before any thread starts.
#pragma once

#include <ostream>
#include <string>

#include "core/base/expected.h"
#include "daemon/ops/config.h"
#include "daemon/ops/default_paths.h"

namespace kestrel::daemon::ops {

enum class CliAction {
  kRun,          // serve with `config`
  kPrintConfig,  // print to_toml(config) and exit 0
  kCheckConfig,  // the configuration is valid: say so and exit 0
  kExit,         // --help / --version (already printed to `out`) or a command-line syntax error (printed to `err`)
};

struct CliResult {
  CliAction action = CliAction::kRun;
  int exit_code = 0;  // for kExit: 0 after --help/--version, 2 after a syntax error
  DaemonConfig config;
};

// Errors (exit status 1): a config file that cannot be read or holds a bad value, a bad flag value, a cross-key
// conflict; each names the key and the file line or flag. Syntax errors (unknown flag, missing argument) are
// printed to `err` by CLI11 and come back as kExit with status 2.
Expected<CliResult> parse_command_line(int argc, const char* const* argv, const Environment& env, std::ostream& out,
                                       std::ostream& err);

// The --help text (every flag with its config key), for docs and tests.
std::string command_line_help();

}  // namespace kestrel::daemon::ops
