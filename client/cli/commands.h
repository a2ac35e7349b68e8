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

// The client commands, built with the daemon (KESTREL_DAEMON, libkestrel-client). Each talks to a running kestreld
// at --connect URI (client_flags.h); usage errors found after parsing exit with 2.
// `kestrel generate --prompt TEXT [-n N] [--stop STR]... [--session ID] [--logprobs K] [--json]` (cmd_generate.cpp).
void add_generate(CLI::App& app, int* exit_code);
// `kestrel chat [--system TEXT]`: interactive streaming chat, one session across turns (cmd_chat.cpp).
void add_chat(CLI::App& app, int* exit_code);
// `kestrel status [--json]`: health, model info and placement, server counters (cmd_status.cpp).
void add_status(CLI::App& app, int* exit_code);
// `kestrel bench [--transport all|grpc|shm] [-n STEPS] [--tokens K]`: step round-trip latency (cmd_bench.cpp).
void add_bench(CLI::App& app, int* exit_code);

}  // namespace kestrel::cli
