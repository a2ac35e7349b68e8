// Jinja evaluator: statements, scopes, expressions (jinja_eval.h).
#include "core/chat/jinja_eval.h"

#include <algorithm>

#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_methods.h"
#include "core/chat/jinja_ops.h"

namespace kestrel::chat::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find_local(std::string_view name) const {
    for (const auto& [k, v] : vars) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  void set(std::string_view name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(std::string(name), std::move(v));
  }
};

namespace {

constexpr std::string_view kLinePrefix = "template line ";

template <class T>
Expected<T> at(Expected<T> r, int line, std::string_view construct = {}) {
  if (r) return r;
  Error e = std::move(r).error();
  if (!construct.empty() && !e.message.starts_with(kLinePrefix)) e.message = std::string(construct) + ": " + e.message;
  return at_line(std::move(e), line);
}

// A macro defined with {% macro %}: renders its body in a new scope under the scope it was defined in.
class MacroCallable final : public Callable {
 public:
  MacroCallable(const Stmt& macro, std::weak_ptr<Scope> closure) : macro_(macro), closure_(std::move(closure)) {}
  std::string repr() const override { return "the macro '" + macro_.text + "'"; }
  Expected<Value> call(Evaluator& ev, CallArgs args) const override {
    return ev.call_macro(macro_, closure_, std::move(args));
  }

 private:
  const Stmt& macro_;
  std::weak_ptr<Scope> closure_;
};

}  // namespace

Error at_line(Error e, int line) {
  if (!e.message.starts_with(kLinePrefix))
    e.message = std::string(kLinePrefix) + std::to_string(line) + ": " + e.message;
  return e;
}

Evaluator::Evaluator(const Program& program, Dict globals, RenderLimits limits)
    : program_(program), globals_(std::move(globals)), limits_(limits) {}

Evaluator::~Evaluator() {
  // A namespace may hold a value that refers back to it; clearing every one breaks such cycles.
  for (const auto& ns : namespaces_) ns->attrs.clear();
}

std::shared_ptr<Namespace> Evaluator::make_namespace() {
  namespaces_.push_back(std::make_shared<Namespace>());
  return namespaces_.back();
}

Status Evaluator::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    return make_error(ErrorCode::kResourceExhausted,
                      "the rendered text passes the limit of " + std::to_string(limits_.max_output_bytes) + " bytes");
  }
  return ok_status();
}

Expected<std::string> Evaluator::render(size_t expected_bytes) {
  auto top = std::make_shared<Scope>();
  std::string out;
  out.reserve(std::min(expected_bytes, limits_.max_output_bytes));
  KESTREL_TRY(exec(program_.body, top, out));
  return out;
}

Expected<Evaluator::Flow> Evaluator::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const StmtPtr& s : body) {
    KESTREL_TRY_ASSIGN(Flow f, exec_stmt(*s, scope, out));
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Expected<Evaluator::Flow> Evaluator::exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
  if (++steps_ > limits_.max_steps) {
    return at_line(make_error(ErrorCode::kResourceExhausted,
                              "the template ran more than " + std::to_string(limits_.max_steps) + " statements"),
                   s.line);
  }
  switch (s.kind) {
    case StmtKind::kText:
      out += s.text;
      KESTREL_TRY(at(check_size(out.size()), s.line));
      return Flow::kNormal;
    case StmtKind::kPrint: {
      KESTREL_TRY_ASSIGN(Value v, eval(*s.expr, scope));
      KESTREL_TRY_ASSIGN(std::string text, at(py_str(v), s.line, "{{ }}"));
      out += text;
      KESTREL_TRY(at(check_size(out.size()), s.line));
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      for (const IfBranch& b : s.branches) {
        KESTREL_TRY_ASSIGN(Value c, eval(*b.cond, scope));
        if (truthy(c)) return exec(b.body, scope, out);
      }
      return exec(s.else_body, scope, out);
    case StmtKind::kFor: return exec_for(s, scope, out);
    case StmtKind::kSet: {
      KESTREL_TRY_ASSIGN(Value v, eval(*s.expr, scope));
      KESTREL_TRY(assign(s.target, std::move(v), scope, s.line));
      return Flow::kNormal;
    }
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      std::string text;
      KESTREL_TRY(exec(s.body, inner, text));
      Value v = Value::string(std::move(text));
      if (s.expr) {
        KESTREL_TRY_ASSIGN(v, apply_filter_chain(*s.expr, std::move(v), scope));
      }
      if (s.kind == StmtKind::kSetBlock) {
        KESTREL_TRY(assign(s.target, std::move(v), scope, s.line));
      } else {
        KESTREL_TRY_ASSIGN(std::string t, at(py_str(v), s.line, "{% filter %}"));
        out += t;
        KESTREL_TRY(at(check_size(out.size()), s.line));
      }
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      scope->set(s.text, Value::callable(std::make_shared<MacroCallable>(s, std::weak_ptr<Scope>(scope))));
      return Flow::kNormal;
    case StmtKind::kBreak: return Flow::kBreak;
    case StmtKind::kContinue: return Flow::kContinue;
    case StmtKind::kGeneration: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      KESTREL_TRY(exec(s.body, inner, out));
      return Flow::kNormal;
    }
  }
  return Flow::kNormal;
}

Expected<Evaluator::Flow> Evaluator::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  KESTREL_TRY_ASSIGN(Value seq, eval(*s.expr, scope));
  KESTREL_TRY_ASSIGN(std::vector<Value> items, at(py_iterate(seq), s.line, "for-loop"));
  if (s.cond) {
    // {% for x in seq if cond %}: the condition sees the loop variable; loop.* counts the items that pass.
    std::vector<Value> kept;
    for (Value& item : items) {
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      KESTREL_TRY(assign(s.target, item, probe, s.line));
      KESTREL_TRY_ASSIGN(Value c, eval(*s.cond, probe));
      if (truthy(c)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    KESTREL_TRY(exec(s.else_body, inner, out));
    return Flow::kNormal;
  }
  auto shared = std::make_shared<const std::vector<Value>>(std::move(items));
  for (size_t i = 0; i < shared->size(); ++i) {
    auto iter = std::make_shared<Scope>();
    iter->parent = scope;
    KESTREL_TRY(assign(s.target, (*shared)[i], iter, s.line));
    auto state = std::make_shared<LoopState>();
    state->items = shared;
    state->index0 = i;
    iter->set("loop", Value::loop(std::move(state)));
    KESTREL_TRY_ASSIGN(Flow f, exec(s.body, iter, out));
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Status Evaluator::assign(const Target& target, Value value, const ScopePtr& scope, int line) {
  switch (target.kind) {
    case Target::Kind::kName: scope->set(target.names[0], std::move(value)); return ok_status();
    case Target::Kind::kTuple: {
      KESTREL_TRY_ASSIGN(std::vector<Value> items, at(py_iterate(value), line, "unpacking"));
      const size_t n = target.names.size();
      if (items.size() < n) {
        return at_line(type_error("not enough values to unpack (expected " + std::to_string(n) + ", got " +
                                  std::to_string(items.size()) + ")"),
                       line);
      }
      if (items.size() > n) {
        return at_line(type_error("too many values to unpack (expected " + std::to_string(n) + ")"), line);
      }
      for (size_t i = 0; i < n; ++i) scope->set(target.names[i], std::move(items[i]));
      return ok_status();
    }
    case Target::Kind::kNsAttr: {
      const Value ns = lookup(target.names[0], scope);
      if (ns.kind() != Value::Kind::kNamespace) {
        return at_line(type_error("cannot assign attribute on non-namespace object"), line);
      }
      if (value.depth() > kMaxNesting) {
        return at_line(make_error(ErrorCode::kResourceExhausted,
                                  "a value nested more than " + std::to_string(kMaxNesting) + " levels deep"),
                       line);
      }
      ns.name_space().set(target.attr, std::move(value));
      return ok_status();
    }
  }
  return ok_status();
}

Value Evaluator::lookup(const std::string& name, const ScopePtr& scope) const {
  for (const Scope* s = scope.get(); s != nullptr; s = s->parent.get()) {
    if (const Value* v = s->find_local(name)) return *v;
  }
  if (const Value* v = globals_.find(name)) return *v;
  if (auto fn = find_global_function(name)) return *fn;
  return Value::undefined("'" + name + "' is undefined");
}

Expected<CallArgs> Evaluator::eval_args(const Expr& e, const ScopePtr& scope) {
  CallArgs args;
  for (size_t i = 1; i < e.args.size(); ++i) {
    KESTREL_TRY_ASSIGN(Value v, eval(*e.args[i], scope));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [k, expr] : e.kwargs) {
    KESTREL_TRY_ASSIGN(Value v, eval(*expr, scope));
    args.keyword.emplace_back(k, std::move(v));
  }
  return args;
}

Expected<Value> Evaluator::call(const Value& fn, CallArgs args) {
  if (fn.is_undefined()) return undefined_error(fn);
  if (fn.kind() == Value::Kind::kLoop) return unsupported("calling loop (recursive loops)");
  if (fn.kind() != Value::Kind::kCallable) return type_error("'" + type_name(fn) + "' object is not callable");
  return fn.callable().call(*this, std::move(args));
}

Expected<Value> Evaluator::call_macro(const Stmt& macro, const std::weak_ptr<Scope>& closure, CallArgs args) {
  const std::shared_ptr<Scope> parent = closure.lock();
  if (!parent) return unsupported("calling the macro '" + macro.text + "' after the scope that defined it ended");
  if (depth_ >= limits_.max_call_depth) {
    return make_error(ErrorCode::kResourceExhausted,
                      "macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
  }
  const std::string name = "macro '" + macro.text + "'";
  if (args.positional.size() > macro.params.size()) {
    return type_error(name + " takes not more than " + std::to_string(macro.params.size()) + " argument(s)");
  }
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  std::vector<bool> bound(macro.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    scope->set(macro.params[i].name, std::move(args.positional[i]));
    bound[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < macro.params.size() && macro.params[i].name != key) ++i;
    if (i == macro.params.size()) return type_error(name + " takes no keyword argument '" + key + "'");
    if (bound[i]) return type_error(name + " got multiple values for argument '" + key + "'");
    scope->set(key, std::move(value));
    bound[i] = true;
  }
  for (size_t i = 0; i < macro.params.size(); ++i) {
    if (bound[i]) continue;
    const MacroParam& p = macro.params[i];
    if (p.default_value) {
      KESTREL_TRY_ASSIGN(Value v, eval(*p.default_value, scope));
      scope->set(p.name, std::move(v));
    } else {
      scope->set(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
    }
  }
  ++depth_;
  std::string out;
  auto flow = exec(macro.body, scope, out);
  --depth_;
  if (!flow) return std::move(flow).error();
  return Value::string(std::move(out));
}

Expected<Value> Evaluator::apply_filter_chain(const Expr& e, Value subject, const ScopePtr& scope) {
  Value inner = std::move(subject);
  if (e.args[0]) {
    KESTREL_TRY_ASSIGN(inner, apply_filter_chain(*e.args[0], std::move(inner), scope));
  }
  KESTREL_TRY_ASSIGN(CallArgs args, eval_args(e, scope));
  return at(apply_filter(*this, e.name, inner, std::move(args)), e.line, "filter '" + e.name + "'");
}

Expected<Value> Evaluator::eval_call(const Expr& e, const ScopePtr& scope) {
  KESTREL_TRY_ASSIGN(Value fn, eval(*e.args[0], scope));
  KESTREL_TRY_ASSIGN(CallArgs args, eval_args(e, scope));
  std::string what = "call";
  if (e.args[0]->kind == ExprKind::kName) what = "call to " + e.args[0]->name + "()";
  if (e.args[0]->kind == ExprKind::kGetattr) what = "call to ." + e.args[0]->name + "()";
  return at(call(fn, std::move(args)), e.line, what);
}

namespace {

Expected<bool> compare_values(CompareOp op, const Value& left, const Value& right) {
  switch (op) {
    case CompareOp::kEq: return py_equal(left, right);
    case CompareOp::kNe: return !py_equal(left, right);
    case CompareOp::kLt: return py_order(left, right, Order::kLt);
    case CompareOp::kLe: return py_order(left, right, Order::kLe);
    case CompareOp::kGt: return py_order(left, right, Order::kGt);
    case CompareOp::kGe: return py_order(left, right, Order::kGe);
    case CompareOp::kIn: return py_contains(right, left);
    case CompareOp::kNotIn: {
      KESTREL_TRY_ASSIGN(bool r, py_contains(right, left));
      return !r;
    }
  }
  return false;
}

}  // namespace

// Chained comparisons as Python: a < b < c is (a < b) and (b < c), each operand evaluated once.
Expected<Value> Evaluator::eval_compare(const Expr& e, const ScopePtr& scope) {
  KESTREL_TRY_ASSIGN(Value left, eval(*e.args[0], scope));
  for (size_t i = 0; i < e.compare_ops.size(); ++i) {
    KESTREL_TRY_ASSIGN(Value right, eval(*e.args[i + 1], scope));
    KESTREL_TRY_ASSIGN(bool r, at(compare_values(e.compare_ops[i], left, right), e.line));
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Expected<Value> Evaluator::eval(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::kConst: return e.constant;
    case ExprKind::kName: return lookup(e.name, scope);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const ExprPtr& a : e.args) {
        KESTREL_TRY_ASSIGN(Value v, eval(*a, scope));
        items.push_back(std::move(v));
      }
      return Value::list(std::move(items), e.kind == ExprKind::kList ? SeqKind::kList : SeqKind::kTuple);
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        KESTREL_TRY_ASSIGN(Value k, eval(*e.args[i], scope));
        KESTREL_TRY_ASSIGN(Value v, eval(*e.args[i + 1], scope));
        if (k.kind() == Value::Kind::kDict || (k.kind() == Value::Kind::kList && k.list().kind != SeqKind::kTuple) ||
            k.is_undefined()) {
          return at_line(type_error("unhashable type: '" + type_name(k) + "'"), e.line);
        }
        bool replaced = false;
        for (auto& [ek, ev] : d.entries) {
          if (py_equal(ek, k)) {
            ev = std::move(v);
            replaced = true;
            break;
          }
        }
        if (!replaced) d.entries.emplace_back(std::move(k), std::move(v));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kGetattr: {
      KESTREL_TRY_ASSIGN(Value obj, eval(*e.args[0], scope));
      return at(get_attr(obj, e.name), e.line, "attribute '" + e.name + "'");
    }
    case ExprKind::kGetitem: {
      KESTREL_TRY_ASSIGN(Value obj, eval(*e.args[0], scope));
      const Expr& key = *e.args[1];
      if (key.kind == ExprKind::kSlice) {
        Value bounds[3] = {Value::none(), Value::none(), Value::none()};
        for (size_t i = 0; i < 3; ++i) {
          if (key.args[i]) {
            KESTREL_TRY_ASSIGN(bounds[i], eval(*key.args[i], scope));
          }
        }
        return at(get_slice(obj, bounds[0], bounds[1], bounds[2]), e.line, "slice");
      }
      KESTREL_TRY_ASSIGN(Value k, eval(key, scope));
      return at(get_item(obj, k), e.line, "subscript");
    }
    case ExprKind::kSlice: return at_line(unsupported("a slice outside of a subscript"), e.line);
    case ExprKind::kCall: return eval_call(e, scope);
    case ExprKind::kFilter: {
      KESTREL_TRY_ASSIGN(Value subject, eval(*e.args[0], scope));
      KESTREL_TRY_ASSIGN(CallArgs args, eval_args(e, scope));
      return at(apply_filter(*this, e.name, subject, std::move(args)), e.line, "filter '" + e.name + "'");
    }
    case ExprKind::kTest: {
      KESTREL_TRY_ASSIGN(Value subject, eval(*e.args[0], scope));
      KESTREL_TRY_ASSIGN(CallArgs args, eval_args(e, scope));
      KESTREL_TRY_ASSIGN(bool r,
                         at(apply_test(*this, e.name, subject, std::move(args)), e.line, "test '" + e.name + "'"));
      return Value::boolean(r);
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      KESTREL_TRY_ASSIGN(Value v, eval(*e.args[0], scope));
      return at(e.kind == ExprKind::kNeg ? unary_minus(v) : unary_plus(v), e.line);
    }
    case ExprKind::kNot: {
      KESTREL_TRY_ASSIGN(Value v, eval(*e.args[0], scope));
      return Value::boolean(!truthy(v));
    }
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      // Python's `and` / `or` give one of their operands.
      KESTREL_TRY_ASSIGN(Value left, eval(*e.args[0], scope));
      if (truthy(left) == (e.kind == ExprKind::kOr)) return left;
      return eval(*e.args[1], scope);
    }
    case ExprKind::kBinary: {
      KESTREL_TRY_ASSIGN(Value a, eval(*e.args[0], scope));
      KESTREL_TRY_ASSIGN(Value b, eval(*e.args[1], scope));
      return at(binary_op(e.op, a, b, limits_.max_output_bytes), e.line);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const ExprPtr& a : e.args) {
        KESTREL_TRY_ASSIGN(Value v, eval(*a, scope));
        KESTREL_TRY_ASSIGN(std::string s, at(py_str(v), e.line, "'~'"));
        out += s;
        KESTREL_TRY(at(check_size(out.size()), e.line));
      }
      return Value::string(std::move(out));
    }
    case ExprKind::kCompare: return eval_compare(e, scope);
    case ExprKind::kCondExpr: {
      KESTREL_TRY_ASSIGN(Value c, eval(*e.args[1], scope));
      if (truthy(c)) return eval(*e.args[0], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value();
}

}  // namespace kestrel::chat::jinja
