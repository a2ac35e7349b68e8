// parse_byte_size (byte_size.h).
#include "core/base/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

namespace kestrel {

Expected<uint64_t> parse_byte_size(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'" + std::string(text) + "' is not a byte size (" + why + "; e.g. 12G, 512MiB, 8000000000)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad("no number");
  const std::string number(text.substr(0, i));
  if (number.find('.') != number.rfind('.')) return bad("two decimal points");
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) return bad("no number");
  size_t j = i;
  while (j < text.size() && text[j] == ' ') ++j;
  std::string unit;
  for (; j < text.size(); ++j) unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[j])));
  double scale = 1;
  if (!unit.empty() && unit != "B") {
    const char prefix = unit[0];
    const std::string rest = unit.substr(1);
    if (rest != "" && rest != "B" && rest != "IB") return bad("unknown unit");
    switch (prefix) {
      case 'K': scale = 1024.0; break;
      case 'M': scale = 1024.0 * 1024.0; break;
      case 'G': scale = 1024.0 * 1024.0 * 1024.0; break;
      case 'T': scale = 1024.0 * 1024.0 * 1024.0 * 1024.0; break;
      default: return bad("unknown unit");
    }
  }
  const double bytes = std::floor(value * scale);
  if (bytes >= 18446744073709551616.0) return bad("too large");
  return static_cast<uint64_t>(bytes);
}

}  // namespace kestrel
