// The subcommands of the `kestrel` CLI. Each lives in its own file (cmd_<name>.cpp) and exposes one add_<name>()
// that registers a CLI11 subcommand on the root app; main.cpp calls them all.
//
// Contract for a subcommand: it parses its own options, runs when selected, writes results to stdout and failures
// as one line "kestrel: error: <what>: <message>" on stderr, and stores its exit status (0 success, 1 failure) in
// *exit_code. Not thread-safe: the CLI is single-threaded.
#pragma once

namespace CLI {
class App;
}

namespace kestrel::cli {

// `kestrel inspect FILE.gguf [--tensors] [--metadata]` (cmd_inspect.cpp).
void add_inspect(CLI::App& app, int* exit_code);

// `kestrel run --model FILE --prompt TEXT [-n N] [sampling options]` (cmd_run.cpp).
void add_run(CLI::App& app, int* exit_code);

}  // namespace kestrel::cli
