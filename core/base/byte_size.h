// Byte sizes as people write them in flags and config files: "12G", "12GiB", "512 MiB", "1.5T", "8000000000".
// Units are binary (K = KiB = 1024, M = MiB, G = GiB, T = TiB; a trailing "B" or "iB" is optional, any case);
// "kB", "MB", "GB", "TB" written with a capital B and no "i" are the same binary units, as most tools read them.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/expected.h"

namespace kestrel {

// kInvalidArgument naming the text for anything else: no number, an unknown unit, a negative or non-finite value,
// or a size past 2^64 - 1.
Expected<uint64_t> parse_byte_size(std::string_view text);

}  // namespace kestrel
