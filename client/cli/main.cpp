// `kestrel`: the Kestrel command-line tool. Parses the command line with CLI11 and runs one subcommand.
//
// Subcommands live one per file (cmd_<name>.cpp, declared in commands.h). Today: inspect, run. Later issues add
// generate, chat, status and bench the same way: write cmd_<name>.cpp with add_<name>(), declare it in commands.h,
// call it below and list the file in CMakeLists.txt.
//
// Exit status: the subcommand's (0 success, 1 failure); CLI11's own codes for command-line errors (106: no subcommand,
// 109: an unknown option), with its message on stderr.
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

  CLI11_PARSE(app, argc, argv);
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
