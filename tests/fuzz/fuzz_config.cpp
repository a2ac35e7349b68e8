// Fuzz target for kestreld's configuration file parser (daemon/ops/config.h): any text through apply_toml(), as
// `kestreld --config FILE` and `--check-config` read it.
//
// Invariants: an error names where it came from ("fuzz.toml" and, for a value, its line) and is kInvalidArgument
// (every parse, key and value error is one); an accepted file gives a configuration whose to_toml() text reads back
// (apply_toml on fresh defaults) to the same values, so --print-config output is always a valid file; and
// validate() on it answers (ok or an error with a message) without crashing. Built as fuzz_config (libFuzzer) and
// fuzz_config_smoke.
#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/ops/config.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace kestrel;
using namespace kestrel::daemon::ops;
using kestrel::fuzz::fuzz_check;

void check(bool ok, const char* what) { fuzz_check(ok, "fuzz_config", what); }

// to_toml() text without its "# where this came from" comments, which name the file a value was read from.
std::string values_only(const std::string& toml) {
  std::string out;
  size_t pos = 0;
  while (pos < toml.size()) {
    size_t end = toml.find('\n', pos);
    if (end == std::string::npos) end = toml.size();
    std::string_view line(toml.data() + pos, end - pos);
    if (!line.starts_with("#")) out.append(line.substr(0, line.find("  # "))).push_back('\n');
    pos = end + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(bytes), size);
  DaemonConfig config;
  const Status st = apply_toml(config, text, "fuzz.toml");
  if (!st) {
    check(st.error().message.rfind("fuzz.toml", 0) == 0, "errors start with the file name");
    check(st.error().code == ErrorCode::kInvalidArgument, "file errors are kInvalidArgument");
    return 0;
  }
  const Status valid = validate(config);
  if (!valid) check(!valid.error().message.empty(), "validation errors carry a message");
  const std::string printed = to_toml(config);
  DaemonConfig again;
  const Status reread = apply_toml(again, printed, "printed.toml");
  check(static_cast<bool>(reread), "to_toml output reads back");
  check(values_only(to_toml(again)) == values_only(printed), "to_toml output reads back to the same configuration");
  return 0;
}
