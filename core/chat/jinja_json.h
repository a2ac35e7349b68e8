// Python's json.dumps for interpreter Values (core/chat): the `tojson` filter as transformers defines it
// (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)) must give the same bytes.
//
// Reproduced: ", " / ": " separators without indent and "," / ": " with it (or the given pair), indentation by a
// number of spaces or a string, "[]" / "{}" for empty containers at any indent, float repr (NaN, Infinity,
// -Infinity), escapes \" \\ \n \r \t \b \f and \u00XX for other control characters, non-ASCII kept (or \uXXXX with
// surrogate pairs under ensure_ascii), dict keys of type str, int, float, bool or None converted as Python converts
// them, sort_keys ordering, and "Object of type X is not JSON serializable" for anything else.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "core/base/expected.h"
#include "core/chat/jinja_value.h"

namespace kestrel::chat::jinja {

struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: one line
  std::optional<std::string> item_separator;
  std::optional<std::string> key_separator;
  bool sort_keys = false;
};

Expected<std::string> json_dumps(const Value& v, const JsonDumpOptions& options);

// A JSON document as a Value, the way Python's json.loads gives it to jinja2: objects as dicts (in the document's
// key order for ordered_json; nlohmann::json has sorted them), arrays as lists. `text_bytes` (optional) receives the
// total length of its strings. kInvalidArgument for a string or key that is not UTF-8 or nesting past 512 levels,
// kUnsupported for an integer beyond int64.
Expected<Value> value_from_json(const nlohmann::json& j, size_t* text_bytes = nullptr);
Expected<Value> value_from_json(const nlohmann::ordered_json& j, size_t* text_bytes = nullptr);

}  // namespace kestrel::chat::jinja
