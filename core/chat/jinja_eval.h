// Evaluator of the Jinja interpreter (core/chat): renders a Program with a set of global variables, with jinja2's
// semantics under transformers' environment (ImmutableSandboxedEnvironment, default Undefined, autoescape off).
//
// Scoping follows jinja2: every for-loop iteration, macro call, {% set %} / {% filter %} block body and
// {% generation %} body runs in a new scope whose parent is the enclosing one, so a `set` inside them does not leak
// out (namespace() attributes do, being shared objects); `if` bodies share the enclosing scope. A macro sees the
// scope it was defined in. Names resolve through the scopes, then the globals, then the builtins (namespace, range,
// dict, raise_exception); anything else is an Undefined that prints as "" and fails when used.
//
// Errors (kInvalidArgument for what the template or its data does wrong: raise_exception, TypeError, undefined
// values; kUnsupported for Python behaviour not implemented; kResourceExhausted past the limits) name the template
// line. One Evaluator renders once, on one thread. Limits (RenderLimits) bound the output, nested macro calls and the
// statements executed, so no template and no conversation can make a render run away.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/chat/jinja_ast.h"
#include "core/chat/jinja_value.h"

namespace kestrel::chat::jinja {

struct Scope;

struct RenderLimits {
  size_t max_output_bytes = size_t{256} << 20;  // the rendered text, and any one string built on the way
  int max_call_depth = 256;                     // nested macro calls
  uint64_t max_steps = 50'000'000;              // statements executed (loop bodies included), ~seconds of work
};

class Evaluator {
 public:
  Evaluator(const Program& program, Dict globals, RenderLimits limits = {});
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // `expected_bytes`: a guess of the output's size (reserved up front: growing a large string step by step costs
  // more than the rendering itself).
  Expected<std::string> render(size_t expected_bytes = 0);

  // For builtins and callables.
  Expected<Value> call(const Value& fn, CallArgs args);
  Expected<Value> call_macro(const Stmt& macro, const std::weak_ptr<Scope>& closure, CallArgs args);
  std::shared_ptr<Namespace> make_namespace();
  // kResourceExhausted when a string of `bytes` would pass the output limit.
  Status check_size(size_t bytes) const;

 private:
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };
  using ScopePtr = std::shared_ptr<Scope>;

  Expected<Flow> exec(const Body& body, const ScopePtr& scope, std::string& out);
  Expected<Flow> exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out);
  Expected<Flow> exec_for(const Stmt& s, const ScopePtr& scope, std::string& out);
  Status assign(const Target& target, Value value, const ScopePtr& scope, int line);
  Expected<Value> eval(const Expr& e, const ScopePtr& scope);
  Expected<Value> eval_call(const Expr& e, const ScopePtr& scope);
  Expected<Value> eval_compare(const Expr& e, const ScopePtr& scope);
  Expected<CallArgs> eval_args(const Expr& e, const ScopePtr& scope);
  // A filter chain whose innermost subject is null (set / filter blocks), applied to `subject`.
  Expected<Value> apply_filter_chain(const Expr& e, Value subject, const ScopePtr& scope);
  Value lookup(const std::string& name, const ScopePtr& scope) const;

  const Program& program_;
  Dict globals_;
  RenderLimits limits_;
  int depth_ = 0;
  uint64_t steps_ = 0;
  std::vector<std::shared_ptr<Namespace>> namespaces_;  // cleared at the end: a namespace may hold itself
};

// Adds "line N: " to an error raised by an operation at that template line.
Error at_line(Error e, int line);

}  // namespace kestrel::chat::jinja
