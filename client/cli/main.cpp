// `kestrel`: the Kestrel command-line tool. Parses the command line with CLI11 and runs one subcommand.
//
// Subcommands live one per file (cmd_<name>.cpp, declared in commands.h): inspect, run, and with the daemon
// (KESTREL_CLI_CLIENT_COMMANDS) generate, chat, status, bench. A new one: write cmd_<name>.cpp with add_<name>(),
// declare it in commands.h, call it below and list the file in CMakeLists.txt.
//
// Exit status: the subcommand's (0 success, 1 failure); 2 for a command-line error (CLI11's message on stderr).
#include <exception>

#include "client/cli/cli11.h"
#include "client/cli/cli_format.h"
#include "client/cli/commands.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Kestrel: inference for Qwen3.5-MoE / Qwen3.5 / Qwen3-Next GGUF models", "kestrel"};
  app.set_version_flag("--version", "kestrel " KESTREL_VERSION);
  app.require_subcommand(1);
  app.footer("Run 'kestrel <command> --help' for the options of a command.");

  int exit_code = 0;
  kestrel::cli::add_inspect(app, &exit_code);
  kestrel::cli::add_run(app, &exit_code);
#ifdef KESTREL_CLI_CLIENT_COMMANDS
  kestrel::cli::add_generate(app, &exit_code);
  kestrel::cli::add_chat(app, &exit_code);
  kestrel::cli::add_status(app, &exit_code);
  kestrel::cli::add_bench(app, &exit_code);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with code 0; every real command-line error exits with 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // CLI11 reports command-line errors as exceptions (handled by CLI11_PARSE); anything else that escapes (e.g.
  // std::bad_alloc) becomes the usual one-line error instead of std::terminate.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    kestrel::cli::print_error("", e.what());
  } catch (...) {
    kestrel::cli::print_error("", "unknown exception");
  }
  return 1;
}
