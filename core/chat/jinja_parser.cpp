// Jinja parser: jinja2's recursive-descent grammar over the lexer's tokens (jinja_parser.h).
#include "core/chat/jinja_parser.h"

#include <initializer_list>

#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_lexer.h"

namespace kestrel::chat::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Expected<Program> run() {
    Program p;
    KESTREL_TRY_ASSIGN(p.body, subparse({}));
    if (cur().type != TokenType::kEof) return fail(cur().line, "unexpected " + describe_token(cur()));
    return p;
  }

 private:
  using Names = std::initializer_list<std::string_view>;

  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[i_ + 1 < t_.size() ? i_ + 1 : i_]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(std::string_view op) const { return cur().type == TokenType::kOperator && cur().value == op; }
  bool is_name(std::string_view name) const { return cur().type == TokenType::kName && cur().value == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  static Error fail(int line, const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument,
                      "template syntax error at line " + std::to_string(line) + ": " + what);
  }
  static Error refuse(int line, const std::string& what) {
    return make_error(ErrorCode::kUnsupported, what + " (template line " + std::to_string(line) + ") is not supported");
  }

  Status expect_op(std::string_view op) {
    if (!skip_op(op)) return fail(cur().line, "expected '" + std::string(op) + "', got " + describe_token(cur()));
    return ok_status();
  }
  Status expect_type(TokenType type, const char* what) {
    if (cur().type != type) return fail(cur().line, std::string("expected ") + what + ", got " + describe_token(cur()));
    next();
    return ok_status();
  }
  Expected<std::string> expect_name() {
    if (cur().type != TokenType::kName) return fail(cur().line, "expected a name, got " + describe_token(cur()));
    return next().value;
  }

  static ExprPtr node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- statements ---------------------------------------------------------------------------------------------

  // Statements until a block whose first name is in `ends` (left as the current token) or the end of the template.
  Expected<Body> subparse(Names ends) {
    if (++depth_ > kMaxDepth) return refuse(cur().line, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    auto body = subparse_body(ends);
    --depth_;
    return body;
  }

  Expected<Body> subparse_body(Names ends) {
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.type == TokenType::kEof) return body;
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.type == TokenType::kVariableBegin) {
        const int line = next().line;
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = line;
        KESTREL_TRY_ASSIGN(s->expr, parse_tuple(false, true, {}, false));
        KESTREL_TRY(expect_type(TokenType::kVariableEnd, "end of print statement"));
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        next();
        if (cur().type == TokenType::kName) {
          for (const std::string_view end : ends) {
            if (cur().value == end) return body;
          }
        }
        KESTREL_TRY_ASSIGN(StmtPtr s, parse_statement(ends));
        KESTREL_TRY(expect_type(TokenType::kBlockEnd, "end of statement block"));
        body.push_back(std::move(s));
      } else {
        return fail(t.line, "unexpected " + describe_token(t));
      }
    }
  }

  // The body of a block statement: the header's %}, statements up to one of `ends`, optionally consuming that name.
  Expected<Body> parse_statements(Names ends, bool drop_needle) {
    skip_op(":");
    KESTREL_TRY(expect_type(TokenType::kBlockEnd, "end of statement block"));
    KESTREL_TRY_ASSIGN(Body body, subparse(ends));
    if (cur().type == TokenType::kEof) {
      std::string list;
      for (const std::string_view e : ends) list += (list.empty() ? "'" : " or '") + std::string(e) + "'";
      return fail(cur().line, "unexpected end of template, expected " + list);
    }
    if (drop_needle) next();
    return body;
  }

  Expected<StmtPtr> parse_statement(Names ends) {
    const Token& t = cur();
    if (t.type != TokenType::kName) return fail(t.line, "expected a statement, got " + describe_token(t));
    const std::string& tag = t.value;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "filter") return parse_filter_block();
    if (tag == "generation") return parse_generation();
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return fail(t.line, "'" + tag + "' outside of a loop");
      auto s = std::make_unique<Stmt>();
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      s->line = next().line;
      return s;
    }
    static constexpr std::string_view kUnsupportedTags[] = {"extends", "block", "include",    "import", "from",
                                                            "call",    "with",  "autoescape", "endraw", "endblock"};
    for (const std::string_view u : kUnsupportedTags) {
      if (tag == u) return refuse(t.line, "the {% " + tag + " %} tag");
    }
    std::string expected;
    for (const std::string_view e : ends) expected += (expected.empty() ? "" : ", ") + std::string(e);
    return fail(t.line, "unknown tag '" + tag + "'" + (expected.empty() ? "" : " (expected one of " + expected + ")"));
  }

  Expected<StmtPtr> parse_if() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kIf;
    s->line = next().line;
    for (;;) {
      IfBranch b;
      KESTREL_TRY_ASSIGN(b.cond, parse_tuple(false, false, {}, false));
      KESTREL_TRY_ASSIGN(b.body, parse_statements({"elif", "else", "endif"}, false));
      s->branches.push_back(std::move(b));
      const std::string end = next().value;
      if (end == "elif") continue;
      if (end == "else") {
        KESTREL_TRY_ASSIGN(s->else_body, parse_statements({"endif"}, true));
      }
      return s;
    }
  }

  // A for-loop or assignment target: a name, `ns.attr` (with_namespace), or a tuple of names.
  Expected<Target> parse_assign_target(bool with_namespace, Names extra_end) {
    Target target;
    if (with_namespace && cur().type == TokenType::kName && look().type == TokenType::kOperator &&
        look().value == ".") {
      target.kind = Target::Kind::kNsAttr;
      target.names.push_back(next().value);
      next();
      KESTREL_TRY_ASSIGN(target.attr, expect_name());
      return target;
    }
    const int line = cur().line;
    KESTREL_TRY_ASSIGN(ExprPtr e, parse_tuple(true, true, extra_end, false));
    if (e->kind == ExprKind::kName) {
      target.names.push_back(e->name);
      return target;
    }
    if (e->kind != ExprKind::kTuple) return fail(line, "can't assign to this expression");
    target.kind = Target::Kind::kTuple;
    for (const ExprPtr& item : e->args) {
      if (item->kind == ExprKind::kTuple) return refuse(line, "nested unpacking in an assignment target");
      if (item->kind != ExprKind::kName) return fail(line, "can't assign to this expression");
      target.names.push_back(item->name);
    }
    return target;
  }

  bool is_end_name(Names names) const {
    if (cur().type != TokenType::kName) return false;
    for (const std::string_view n : names) {
      if (cur().value == n) return true;
    }
    return false;
  }

  Expected<StmtPtr> parse_for() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kFor;
    s->line = next().line;
    KESTREL_TRY_ASSIGN(s->target, parse_assign_target(false, {"in"}));
    if (!skip_name("in")) return fail(cur().line, "expected 'in', got " + describe_token(cur()));
    KESTREL_TRY_ASSIGN(s->expr, parse_tuple(false, false, {"recursive"}, false));
    if (skip_name("if")) {
      KESTREL_TRY_ASSIGN(s->cond, parse_expression(true));
    }
    if (is_name("recursive")) return refuse(cur().line, "a recursive for-loop");
    ++loop_depth_;
    auto body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (!body) return std::move(body).error();
    s->body = std::move(*body);
    if (next().value == "else") {
      KESTREL_TRY_ASSIGN(s->else_body, parse_statements({"endfor"}, true));
    }
    return s;
  }

  Expected<StmtPtr> parse_set() {
    auto s = std::make_unique<Stmt>();
    s->line = next().line;
    KESTREL_TRY_ASSIGN(s->target, parse_assign_target(true, {}));
    if (skip_op("=")) {
      s->kind = StmtKind::kSet;
      KESTREL_TRY_ASSIGN(s->expr, parse_tuple(false, true, {}, false));
      return s;
    }
    s->kind = StmtKind::kSetBlock;
    if (is_op("|")) {
      KESTREL_TRY_ASSIGN(s->expr, parse_filter(nullptr, false));
    }
    KESTREL_TRY_ASSIGN(s->body, parse_statements({"endset"}, true));
    return s;
  }

  Expected<StmtPtr> parse_macro() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kMacro;
    s->line = next().line;
    KESTREL_TRY_ASSIGN(s->text, expect_name());
    KESTREL_TRY(expect_op("("));
    while (!is_op(")")) {
      if (!s->params.empty()) KESTREL_TRY(expect_op(","));
      MacroParam p;
      KESTREL_TRY_ASSIGN(p.name, expect_name());
      if (skip_op("=")) {
        KESTREL_TRY_ASSIGN(p.default_value, parse_expression(true));
      } else if (!s->params.empty() && s->params.back().default_value) {
        return fail(s->line, "non-default argument follows default argument");
      }
      s->params.push_back(std::move(p));
    }
    next();
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;
    auto body = parse_statements({"endmacro"}, true);
    loop_depth_ = saved_depth;
    if (!body) return std::move(body).error();
    s->body = std::move(*body);
    for (const StmtPtr& st : s->body) KESTREL_TRY(check_macro_names(*st));
    return s;
  }

  // varargs, kwargs and caller give a macro extra arguments in jinja2; this interpreter does not provide them.
  static Status check_macro_names(const Expr& e) {
    if (e.kind == ExprKind::kName && (e.name == "varargs" || e.name == "kwargs" || e.name == "caller")) {
      return refuse(e.line, "'" + e.name + "' in a macro");
    }
    for (const ExprPtr& a : e.args) {
      if (a) KESTREL_TRY(check_macro_names(*a));
    }
    for (const auto& [k, a] : e.kwargs) KESTREL_TRY(check_macro_names(*a));
    return ok_status();
  }
  static Status check_macro_names(const Stmt& s) {
    for (const Expr* e : {s.expr.get(), s.cond.get()}) {
      if (e != nullptr) KESTREL_TRY(check_macro_names(*e));
    }
    for (const IfBranch& b : s.branches) {
      KESTREL_TRY(check_macro_names(*b.cond));
      for (const StmtPtr& st : b.body) KESTREL_TRY(check_macro_names(*st));
    }
    for (const MacroParam& p : s.params) {
      if (p.default_value) KESTREL_TRY(check_macro_names(*p.default_value));
    }
    for (const Body* body : {&s.body, &s.else_body}) {
      for (const StmtPtr& st : *body) KESTREL_TRY(check_macro_names(*st));
    }
    return ok_status();
  }

  Expected<StmtPtr> parse_filter_block() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kFilterBlock;
    s->line = next().line;
    KESTREL_TRY_ASSIGN(s->expr, parse_filter(nullptr, true));
    KESTREL_TRY_ASSIGN(s->body, parse_statements({"endfilter"}, true));
    return s;
  }

  Expected<StmtPtr> parse_generation() {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kGeneration;
    s->line = next().line;
    KESTREL_TRY_ASSIGN(s->body, parse_statements({"endgeneration"}, true));
    return s;
  }

  // ---- expressions --------------------------------------------------------------------------------------------

  bool is_tuple_end(Names extra_end) const {
    const TokenType t = cur().type;
    if (t == TokenType::kVariableEnd || t == TokenType::kBlockEnd || is_op(")")) return true;
    return is_end_name(extra_end);
  }

  // Comma-separated expressions: one expression, or a tuple when there is a comma.
  Expected<ExprPtr> parse_tuple(bool simplified, bool with_condexpr, Names extra_end, bool explicit_parentheses) {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    for (;;) {
      if (!args.empty()) KESTREL_TRY(expect_op(","));
      if (is_tuple_end(extra_end)) break;
      Expected<ExprPtr> e = simplified ? parse_primary() : parse_expression(with_condexpr);
      if (!e) return std::move(e).error();
      args.push_back(std::move(*e));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) return fail(cur().line, "expected an expression, got " + describe_token(cur()));
    }
    ExprPtr t = node(ExprKind::kTuple, line);
    t->args = std::move(args);
    return t;
  }

  Expected<ExprPtr> parse_expression(bool with_condexpr) {
    // Nesting is bounded so that parsing (and later evaluation) cannot run out of stack.
    if (++depth_ > kMaxDepth) return refuse(cur().line, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    auto e = with_condexpr ? parse_condexpr() : parse_or();
    --depth_;
    return e;
  }

  Expected<ExprPtr> parse_condexpr() {
    int line = cur().line;
    KESTREL_TRY_ASSIGN(ExprPtr expr1, parse_or());
    while (skip_name("if")) {
      KESTREL_TRY_ASSIGN(ExprPtr expr2, parse_or());
      ExprPtr expr3;
      if (skip_name("else")) {
        KESTREL_TRY_ASSIGN(expr3, parse_condexpr());
      }
      ExprPtr c = node(ExprKind::kCondExpr, line);
      c->args.push_back(std::move(expr1));
      c->args.push_back(std::move(expr2));
      c->args.push_back(std::move(expr3));
      expr1 = std::move(c);
      line = cur().line;
    }
    return expr1;
  }

  Expected<ExprPtr> parse_or() {
    KESTREL_TRY_ASSIGN(ExprPtr left, parse_and());
    while (is_name("or")) {
      const int line = next().line;
      KESTREL_TRY_ASSIGN(ExprPtr right, parse_and());
      left = binary(ExprKind::kOr, line, std::move(left), std::move(right));
    }
    return left;
  }

  Expected<ExprPtr> parse_and() {
    KESTREL_TRY_ASSIGN(ExprPtr left, parse_not());
    while (is_name("and")) {
      const int line = next().line;
      KESTREL_TRY_ASSIGN(ExprPtr right, parse_not());
      left = binary(ExprKind::kAnd, line, std::move(left), std::move(right));
    }
    return left;
  }

  Expected<ExprPtr> parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      KESTREL_TRY_ASSIGN(ExprPtr operand, parse_not());
      ExprPtr n = node(ExprKind::kNot, line);
      n->args.push_back(std::move(operand));
      return n;
    }
    return parse_compare();
  }

  static ExprPtr binary(ExprKind kind, int line, ExprPtr a, ExprPtr b) {
    ExprPtr n = node(kind, line);
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(b));
    return n;
  }

  Expected<ExprPtr> parse_compare() {
    const int line = cur().line;
    KESTREL_TRY_ASSIGN(ExprPtr expr, parse_math1());
    ExprPtr cmp;
    for (;;) {
      CompareOp op{};
      if (cur().type == TokenType::kOperator && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                                 cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        const std::string& v = cur().value;
        op = v == "=="   ? CompareOp::kEq
             : v == "!=" ? CompareOp::kNe
             : v == "<"  ? CompareOp::kLt
             : v == "<=" ? CompareOp::kLe
             : v == ">"  ? CompareOp::kGt
                         : CompareOp::kGe;
        next();
      } else if (is_name("in")) {
        op = CompareOp::kIn;
        next();
      } else if (is_name("not") && look().type == TokenType::kName && look().value == "in") {
        op = CompareOp::kNotIn;
        next();
        next();
      } else {
        break;
      }
      KESTREL_TRY_ASSIGN(ExprPtr operand, parse_math1());
      if (!cmp) {
        cmp = node(ExprKind::kCompare, line);
        cmp->args.push_back(std::move(expr));
      }
      cmp->compare_ops.push_back(op);
      cmp->args.push_back(std::move(operand));
    }
    if (cmp) return cmp;
    return expr;
  }

  Expected<ExprPtr> parse_math1() {
    KESTREL_TRY_ASSIGN(ExprPtr left, parse_concat());
    while (is_op("+") || is_op("-")) {
      const BinaryOp op = cur().value == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
      const int line = next().line;
      KESTREL_TRY_ASSIGN(ExprPtr right, parse_concat());
      left = binary(ExprKind::kBinary, line, std::move(left), std::move(right));
      left->op = op;
    }
    return left;
  }

  Expected<ExprPtr> parse_concat() {
    const int line = cur().line;
    KESTREL_TRY_ASSIGN(ExprPtr first, parse_math2());
    if (!is_op("~")) return first;
    ExprPtr c = node(ExprKind::kConcat, line);
    c->args.push_back(std::move(first));
    while (skip_op("~")) {
      KESTREL_TRY_ASSIGN(ExprPtr more, parse_math2());
      c->args.push_back(std::move(more));
    }
    return c;
  }

  Expected<ExprPtr> parse_math2() {
    KESTREL_TRY_ASSIGN(ExprPtr left, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string& v = cur().value;
      const BinaryOp op = v == "*"    ? BinaryOp::kMul
                          : v == "/"  ? BinaryOp::kDiv
                          : v == "//" ? BinaryOp::kFloorDiv
                                      : BinaryOp::kMod;
      const int line = next().line;
      KESTREL_TRY_ASSIGN(ExprPtr right, parse_pow());
      left = binary(ExprKind::kBinary, line, std::move(left), std::move(right));
      left->op = op;
    }
    return left;
  }

  Expected<ExprPtr> parse_pow() {
    KESTREL_TRY_ASSIGN(ExprPtr left, parse_unary(true));
    while (is_op("**")) {
      const int line = next().line;
      KESTREL_TRY_ASSIGN(ExprPtr right, parse_unary(true));
      left = binary(ExprKind::kBinary, line, std::move(left), std::move(right));
      left->op = BinaryOp::kPow;
    }
    return left;
  }

  Expected<ExprPtr> parse_unary(bool with_filter) {
    const int line = cur().line;
    ExprPtr n;
    if (is_op("-") || is_op("+")) {
      const ExprKind kind = cur().value == "-" ? ExprKind::kNeg : ExprKind::kPos;
      next();
      KESTREL_TRY_ASSIGN(ExprPtr operand, parse_unary(false));
      n = node(kind, line);
      n->args.push_back(std::move(operand));
    } else {
      KESTREL_TRY_ASSIGN(n, parse_primary());
    }
    KESTREL_TRY_ASSIGN(n, parse_postfix(std::move(n)));
    if (with_filter) {
      KESTREL_TRY_ASSIGN(n, parse_filter_expr(std::move(n)));
    }
    return n;
  }

  Expected<ExprPtr> parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == TokenType::kName) {
      ExprPtr n;
      if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
        n = node(ExprKind::kConst, line);
        n->constant = Value::boolean(t.value == "true" || t.value == "True");
      } else if (t.value == "none" || t.value == "None") {
        n = node(ExprKind::kConst, line);
        n->constant = Value::none();
      } else {
        n = node(ExprKind::kName, line);
        n->name = t.value;
      }
      next();
      return n;
    }
    if (t.type == TokenType::kString) {
      std::string s;
      while (cur().type == TokenType::kString) s += next().value;
      ExprPtr n = node(ExprKind::kConst, line);
      n->constant = Value::string(std::move(s));
      return n;
    }
    if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
      ExprPtr n = node(ExprKind::kConst, line);
      n->constant = t.type == TokenType::kInteger ? Value::integer(t.int_value) : Value::number(t.float_value);
      next();
      return n;
    }
    if (is_op("(")) {
      next();
      KESTREL_TRY_ASSIGN(ExprPtr n, parse_tuple(false, true, {}, true));
      KESTREL_TRY(expect_op(")"));
      return n;
    }
    if (is_op("[")) {
      next();
      ExprPtr n = node(ExprKind::kList, line);
      while (!is_op("]")) {
        if (!n->args.empty()) KESTREL_TRY(expect_op(","));
        if (is_op("]")) break;
        KESTREL_TRY_ASSIGN(ExprPtr item, parse_expression(true));
        n->args.push_back(std::move(item));
      }
      next();
      return n;
    }
    if (is_op("{")) {
      next();
      ExprPtr n = node(ExprKind::kDict, line);
      while (!is_op("}")) {
        if (!n->args.empty()) KESTREL_TRY(expect_op(","));
        if (is_op("}")) break;
        KESTREL_TRY_ASSIGN(ExprPtr key, parse_expression(true));
        KESTREL_TRY(expect_op(":"));
        KESTREL_TRY_ASSIGN(ExprPtr value, parse_expression(true));
        n->args.push_back(std::move(key));
        n->args.push_back(std::move(value));
      }
      next();
      return n;
    }
    return fail(line, "unexpected " + describe_token(t));
  }

  Expected<ExprPtr> parse_postfix(ExprPtr n) {
    for (;;) {
      if (is_op(".") || is_op("[")) {
        KESTREL_TRY_ASSIGN(n, parse_subscript(std::move(n)));
      } else if (is_op("(")) {
        KESTREL_TRY_ASSIGN(n, parse_call(std::move(n)));
      } else {
        return n;
      }
    }
  }

  Expected<ExprPtr> parse_filter_expr(ExprPtr n) {
    for (;;) {
      if (is_op("|")) {
        KESTREL_TRY_ASSIGN(n, parse_filter(std::move(n), false));
      } else if (is_name("is")) {
        KESTREL_TRY_ASSIGN(n, parse_test(std::move(n)));
      } else if (is_op("(")) {
        KESTREL_TRY_ASSIGN(n, parse_call(std::move(n)));
      } else {
        return n;
      }
    }
  }

  Expected<ExprPtr> parse_subscript(ExprPtr subject) {
    const Token& t = next();
    const int line = t.line;
    if (t.value == ".") {
      const Token& attr = cur();
      if (attr.type == TokenType::kName) {
        ExprPtr n = node(ExprKind::kGetattr, line);
        n->name = next().value;
        n->args.push_back(std::move(subject));
        return n;
      }
      if (attr.type != TokenType::kInteger) return fail(attr.line, "expected name or number");
      ExprPtr key = node(ExprKind::kConst, attr.line);
      key->constant = Value::integer(next().int_value);
      ExprPtr n = node(ExprKind::kGetitem, line);
      n->args.push_back(std::move(subject));
      n->args.push_back(std::move(key));
      return n;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) KESTREL_TRY(expect_op(","));
      KESTREL_TRY_ASSIGN(ExprPtr a, parse_subscribed());
      args.push_back(std::move(a));
    }
    next();
    ExprPtr n = node(ExprKind::kGetitem, line);
    n->args.push_back(std::move(subject));
    if (args.size() == 1) {
      n->args.push_back(std::move(args[0]));
    } else {
      ExprPtr tuple = node(ExprKind::kTuple, line);
      tuple->args = std::move(args);
      n->args.push_back(std::move(tuple));
    }
    return n;
  }

  // One subscript: an expression or a slice start:stop:step (each part optional).
  Expected<ExprPtr> parse_subscribed() {
    const int line = cur().line;
    std::vector<ExprPtr> parts;
    if (is_op(":")) {
      next();
      parts.emplace_back();
    } else {
      KESTREL_TRY_ASSIGN(ExprPtr e, parse_expression(true));
      if (!is_op(":")) return e;
      next();
      parts.push_back(std::move(e));
    }
    if (is_op(":")) {
      parts.emplace_back();
    } else if (!is_op("]") && !is_op(",")) {
      KESTREL_TRY_ASSIGN(ExprPtr e, parse_expression(true));
      parts.push_back(std::move(e));
    } else {
      parts.emplace_back();
    }
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(",")) {
        KESTREL_TRY_ASSIGN(ExprPtr e, parse_expression(true));
        parts.push_back(std::move(e));
      } else {
        parts.emplace_back();
      }
    } else {
      parts.emplace_back();
    }
    ExprPtr n = node(ExprKind::kSlice, line);
    n->args = std::move(parts);
    return n;
  }

  // (args, name=kwargs); `*x` and `**x` are refused.
  Status parse_call_args(Expr& n) {
    const int line = cur().line;
    KESTREL_TRY(expect_op("("));
    bool need_comma = false;
    while (!is_op(")")) {
      if (need_comma) {
        KESTREL_TRY(expect_op(","));
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) return refuse(line, "'" + cur().value + "' arguments in a call");
      if (cur().type == TokenType::kName && look().type == TokenType::kOperator && look().value == "=") {
        std::string key = next().value;
        next();
        KESTREL_TRY_ASSIGN(ExprPtr value, parse_expression(true));
        n.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!n.kwargs.empty()) return fail(line, "invalid syntax for function call expression");
        KESTREL_TRY_ASSIGN(ExprPtr value, parse_expression(true));
        n.args.push_back(std::move(value));
      }
      need_comma = true;
    }
    next();
    return ok_status();
  }

  Expected<ExprPtr> parse_call(ExprPtr callee) {
    const int line = cur().line;
    if (callee->kind == ExprKind::kName && is_unsupported_global(callee->name)) {
      return refuse(line, "the global function " + callee->name + "()");
    }
    ExprPtr n = node(ExprKind::kCall, line);
    n->args.push_back(std::move(callee));
    KESTREL_TRY(parse_call_args(*n));
    return n;
  }

  Expected<std::string> parse_dotted_name() {
    KESTREL_TRY_ASSIGN(std::string name, expect_name());
    while (skip_op(".")) {
      KESTREL_TRY_ASSIGN(std::string more, expect_name());
      name += "." + more;
    }
    return name;
  }

  // `| name(args)` repeated; `start_inline`: the first filter has no leading pipe ({% filter name %}).
  Expected<ExprPtr> parse_filter(ExprPtr subject, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const int line = cur().line;
      KESTREL_TRY_ASSIGN(std::string name, parse_dotted_name());
      if (!is_supported_filter(name)) {
        if (is_known_filter(name)) return refuse(line, "the filter '" + name + "'");
        return fail(line, "no filter named '" + name + "'");
      }
      ExprPtr n = node(ExprKind::kFilter, line);
      n->name = std::move(name);
      n->args.push_back(std::move(subject));
      if (is_op("(")) KESTREL_TRY(parse_call_args(*n));
      subject = std::move(n);
    }
    return subject;
  }

  Expected<ExprPtr> parse_test(ExprPtr subject) {
    const int line = next().line;  // `is`
    const bool negated = skip_name("not");
    KESTREL_TRY_ASSIGN(std::string name, parse_dotted_name());
    if (!is_supported_test(name)) {
      if (is_known_test(name)) return refuse(line, "the test '" + name + "'");
      return fail(line, "no test named '" + name + "'");
    }
    ExprPtr n = node(ExprKind::kTest, line);
    n->name = std::move(name);
    n->args.push_back(std::move(subject));
    if (is_op("(")) {
      KESTREL_TRY(parse_call_args(*n));
    } else if ((cur().type == TokenType::kName || cur().type == TokenType::kString ||
                cur().type == TokenType::kInteger || cur().type == TokenType::kFloat || is_op("(") || is_op("[") ||
                is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) return fail(cur().line, "you cannot chain multiple tests with is");
      KESTREL_TRY_ASSIGN(ExprPtr arg, parse_primary());
      KESTREL_TRY_ASSIGN(arg, parse_postfix(std::move(arg)));
      n->args.push_back(std::move(arg));
    }
    if (!negated) return n;
    ExprPtr no = node(ExprKind::kNot, line);
    no->args.push_back(std::move(n));
    return no;
  }

  static constexpr int kMaxDepth = 256;

  std::vector<Token> t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

Expected<Program> parse_program(std::string_view source) {
  KESTREL_TRY_ASSIGN(std::vector<Token> tokens, lex_template(source));
  return Parser(std::move(tokens)).run();
}

}  // namespace kestrel::chat::jinja
