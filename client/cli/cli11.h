// Includes CLI11 (header-only) for the `kestrel` CLI sources.
//
// GCC 12 at -O2 reports a false "potential null pointer dereference" (-Wnull-dereference) inside libstdc++'s
// std::string when inlining CLI11's CLI::detail::split; the warning points into the system header, so it is silenced
// for the headers included here only (the state is pushed and popped around them).
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop
