// kestreld's command line: one CLI11 option per configuration key, then file, flags, defaults, validation.
#include "daemon/ops/command_line.h"

#include <memory>
#include <vector>

#pragma GCC diagnostic push
// GCC 12 -O2 reports a false -Wnull-dereference inside libstdc++ when inlining CLI11's string splitting.
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop

#ifndef KESTREL_VERSION
#define KESTREL_VERSION "unknown"
#endif

namespace kestrel::daemon::ops {

namespace {

struct Parsed {
  std::string config_file;
  bool print_config = false;
  bool check_config = false;
  std::vector<std::string> values;        // one per config_keys() entry
  std::vector<CLI::Option*> key_options;  // same order
};

std::unique_ptr<CLI::App> make_app(Parsed& p) {
  auto app = std::make_unique<CLI::App>(
      "kestreld: the Kestrel inference daemon. Serves one GGUF model to local programs over gRPC (a Unix socket, TCP "
      "when configured), a shared-memory fast path and, when configured (--http), an OpenAI-compatible HTTP API.",
      "kestreld");
  app->set_version_flag("--version", std::string("kestreld ") + KESTREL_VERSION);
  app->footer(
      "Values come from the flags, then the --config file, then the defaults. Each flag sets the config key named "
      "in brackets. The full reference: docs/operations.md; an example file: /etc/kestrel/kestreld.toml.");
  app->add_option("-c,--config", p.config_file, "TOML configuration file (systemd/kestreld.toml.example)")
      ->type_name("FILE");
  CLI::Option* print = app->add_flag("--print-config", p.print_config,
                                     "print the effective configuration as TOML (with where each value came from) "
                                     "and exit");
  CLI::Option* check = app->add_flag("--check-config", p.check_config,
                                     "validate the configuration (file and flags) and exit: status 0 when valid");
  print->excludes(check);
  const std::vector<ConfigKey>& keys = config_keys();
  p.values.assign(keys.size(), std::string());
  p.key_options.assign(keys.size(), nullptr);
  for (size_t i = 0; i < keys.size(); ++i) {
    const ConfigKey& k = keys[i];
    const std::string help = std::string(k.help) + " [" + k.full_name() + "]";
    p.key_options[i] = app->add_option(std::string(k.flag), p.values[i], help)->type_name(std::string(k.value_name));
  }
  return app;
}

}  // namespace

Expected<CliResult> parse_command_line(int argc, const char* const* argv, const Environment& env, std::ostream& out,
                                       std::ostream& err) {
  Parsed p;
  std::unique_ptr<CLI::App> app = make_app(p);
  CliResult result;
  // CLI11 reads "--shm-socket=" as "the value is the next argument"; an empty value (shm_socket = "" disables the
  // fast path) must stay empty, so "--name=" is passed on as "--name" "".
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {  // CLI11 takes the arguments in reverse order
    const std::string a = argv[i];
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=' && a.find('=') == a.size() - 1) {
      args.emplace_back();
      args.push_back(a.substr(0, a.size() - 1));
    } else {
      args.push_back(a);
    }
  }
  try {
    app->parse(args);
  } catch (const CLI::ParseError& e) {
    result.action = CliAction::kExit;
    const int rc = app->exit(e, out, err);  // prints the help, the version or the error
    result.exit_code = rc == 0 ? 0 : 2;
    return result;
  }
  DaemonConfig& config = result.config;
  if (!p.config_file.empty()) KESTREL_TRY(apply_toml_file(config, p.config_file));
  const std::vector<ConfigKey>& keys = config_keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (p.key_options[i]->count() > 0) KESTREL_TRY(apply_flag(config, keys[i], p.values[i]));
  }
  resolve_defaults(config, env);
  KESTREL_TRY(validate(config));
  result.action = p.print_config ? CliAction::kPrintConfig : p.check_config ? CliAction::kCheckConfig : CliAction::kRun;
  return result;
}

std::string command_line_help() {
  Parsed p;
  return make_app(p)->help();
}

}  // namespace kestrel::daemon::ops
