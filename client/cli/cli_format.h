// Small text-formatting helpers shared by the `kestrel` subcommands (sizes, percentages, shapes, error lines).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kestrel::cli {

// "1.23 GiB", "45.6 MiB", "7.8 KiB", "512 B" (binary units, 3 significant digits).
std::string format_bytes(uint64_t bytes);
// "12.3%" of `whole` (0 whole → "0.0%").
std::string format_percent(uint64_t part, uint64_t whole);
// "{2048, 151936}".
std::string format_shape(std::span<const uint64_t> ne);
// "1,234,567".
std::string format_count(uint64_t n);
// Writes "kestrel: error: <subject>: <message>" to stderr (one line; a message that already starts with
// "<subject>: " is not prefixed twice, and newlines in it become spaces).
void print_error(std::string_view subject, std::string_view message);

}  // namespace kestrel::cli
