// The syntax tree of a parsed Jinja template (core/chat): expressions and statements, as jinja2's parser builds
// them for the subset the interpreter renders. Every node carries the template line it starts on, for errors.
// Built once by parse_program (jinja_parser.h); immutable afterwards, so one Program may be rendered by many
// threads at once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/chat/jinja_value.h"

namespace kestrel::chat::jinja {

enum class ExprKind : uint8_t {
  kConst,     // constant
  kName,      // name
  kList,      // [args...]
  kTuple,     // (args...)
  kDict,      // {args[0]: args[1], args[2]: args[3], ...}
  kGetattr,   // args[0].name
  kGetitem,   // args[0][args[1]]
  kSlice,     // args[0]:args[1]:args[2], each may be null (only as args[1] of kGetitem)
  kCall,      // args[0](args[1..], kwargs)
  kFilter,    // args[0] | name(args[1..], kwargs); args[0] is null in {% filter %} / {% set x | f %} chains
  kTest,      // args[0] is name(args[1..], kwargs)
  kNeg,       // -args[0]
  kPos,       // +args[0]
  kNot,       // not args[0]
  kAnd,       // args[0] and args[1]
  kOr,        // args[0] or args[1]
  kBinary,    // args[0] op args[1]
  kConcat,    // args[0] ~ args[1] ~ ...
  kCompare,   // args[0] compare_ops[0] args[1] compare_ops[1] args[2] ...
  kCondExpr,  // args[0] if args[1] else args[2] (args[2] may be null)
};

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CompareOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kConst;
  int line = 0;
  Value constant;    // kConst
  std::string name;  // kName, kGetattr (the attribute), kFilter / kTest (the filter or test)
  BinaryOp op = BinaryOp::kAdd;
  std::vector<CompareOp> compare_ops;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

// An assignment target: `x`, `a, b` (unpacking), or `ns.attr`.
struct Target {
  enum class Kind : uint8_t { kName, kTuple, kNsAttr } kind = Kind::kName;
  std::vector<std::string> names;  // kName: one; kTuple: several; kNsAttr: the namespace variable
  std::string attr;                // kNsAttr
};

enum class StmtKind : uint8_t {
  kText,      // text: template data
  kPrint,     // {{ expr }}
  kIf,        // branches (if / elif ...), else_body
  kFor,       // for target in expr [if cond]: body, else_body
  kSet,       // set target = expr
  kSetBlock,  // set target [| filters (expr)]: body ... endset
  kMacro,     // macro text(params): body
  kBreak,
  kContinue,
  kFilterBlock,  // filter expr: body ... endfilter
  kGeneration,   // transformers' {% generation %}: body, rendered as is
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct IfBranch {
  ExprPtr cond;
  Body body;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: none
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  std::string text;  // kText: the data; kMacro: the macro's name
  ExprPtr expr;      // kPrint, kSet value, kFor iterable, kSetBlock / kFilterBlock filter chain (may be null)
  ExprPtr cond;      // kFor: the `if` filter (may be null)
  Target target;     // kSet, kSetBlock, kFor
  std::vector<IfBranch> branches;
  std::vector<MacroParam> params;
  Body body;
  Body else_body;
};

struct Program {
  Body body;
};

}  // namespace kestrel::chat::jinja
