// Python-style argument binding (jinja_args.h).
#include "core/chat/jinja_args.h"

#include <string>

namespace kestrel::chat::jinja {

Expected<std::vector<Value>> bind_args(std::string_view fn, CallArgs args, std::initializer_list<Param> params) {
  const std::string name(fn);
  if (args.positional.size() > params.size()) {
    return type_error(name + "() takes at most " + std::to_string(params.size()) + " argument(s) (" +
                      std::to_string(args.positional.size()) + " given)");
  }
  std::vector<Value> out;
  std::vector<bool> given(params.size(), false);
  out.reserve(params.size());
  size_t i = 0;
  for (const Param& p : params) {
    if (i < args.positional.size()) {
      out.push_back(std::move(args.positional[i]));
      given[i] = true;
    } else {
      out.push_back(p.default_value);
    }
    ++i;
  }
  for (auto& [key, value] : args.keyword) {
    size_t k = 0;
    bool found = false;
    for (const Param& p : params) {
      if (key == p.name) {
        if (given[k]) return type_error(name + "() got multiple values for argument '" + key + "'");
        out[k] = std::move(value);
        given[k] = true;
        found = true;
        break;
      }
      ++k;
    }
    if (!found) return type_error(name + "() got an unexpected keyword argument '" + key + "'");
  }
  size_t k = 0;
  for (const Param& p : params) {
    if (p.required && !given[k]) {
      return type_error(name + "() missing required argument '" + std::string(p.name) + "'");
    }
    ++k;
  }
  return out;
}

}  // namespace kestrel::chat::jinja
