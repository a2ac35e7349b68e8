// core/chat on inputs the golden comparison with jinja2 cannot cover: syntax errors (with their line), constructs
// refused at parse time (named, with their line), render errors naming the line, the API's input checks, limits,
// key order, concurrent renders of one template, and mutated templates.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/chat/chat_template.h"
#include "core/chat/jinja_eval.h"
#include "core/chat/jinja_json.h"
#include "core/chat/jinja_parser.h"

namespace kestrel::chat {
namespace {

using Json = nlohmann::ordered_json;

Expected<std::string> render(std::string_view source, const Json& context = Json::object()) {
  KESTREL_TRY_ASSIGN(ChatTemplate t, ChatTemplate::parse(source));
  return t.render(context);
}

struct BadTemplate {
  const char* source;
  const char* line;    // "line N" the error must name
  const char* detail;  // a part of the message
};

TEST(ChatTemplateParse, SyntaxErrorsNameTheLine) {
  const BadTemplate cases[] = {
      {"a\n{% if x %}\nb", "line 3", "expected 'elif' or 'else' or 'endif'"},
      {"{{ 1 + }}", "line 1", "end of print statement"},
      {"x\n\n{% foo %}", "line 3", "unknown tag 'foo'"},
      {"{% for x in y %}\n{% endif %}", "line 2", "unknown tag 'endif'"},
      {"{% endfor %}", "line 1", "unknown tag 'endfor'"},
      {"one\ntwo {{ 'open }}", "line 2", "unexpected char"},
      {"{{ x | nosuchfilter }}", "line 1", "no filter named 'nosuchfilter'"},
      {"{{ x is nosuchtest }}", "line 1", "no test named 'nosuchtest'"},
      {"\n{% break %}", "line 2", "'break' outside of a loop"},
      {"a\n{# never closed", "line 2", "missing end of comment tag"},
      {"{{ (1, 2 }}", "line 1", "unexpected '}'"},
      {"{{ [1, 2) }}", "line 1", "unexpected ')', expected ']'"},
      {"{% set 1 = x %}", "line 1", "can't assign"},
      {"{% macro m(a=1, b) %}{% endmacro %}", "line 1", "non-default argument follows default argument"},
      {"{{ }}", "line 1", "expected an expression"},
      {"{{ 'x'\n\n", "line 1", "unexpected end of template"},
      {"{% if x %}{% else %}{% elif y %}{% endif %}", "line 1", "unknown tag 'elif'"},
  };
  for (const BadTemplate& c : cases) {
    auto t = ChatTemplate::parse(c.source);
    ASSERT_FALSE(t) << c.source;
    EXPECT_EQ(t.error().code, ErrorCode::kInvalidArgument) << c.source << ": " << t.error().to_string();
    EXPECT_NE(t.error().message.find(c.line), std::string::npos) << c.source << ": " << t.error().message;
    EXPECT_NE(t.error().message.find(c.detail), std::string::npos) << c.source << ": " << t.error().message;
  }
}

TEST(ChatTemplateParse, UnsupportedConstructsAreRefusedByName) {
  const BadTemplate cases[] = {
      {"{% extends 'base' %}", "line 1", "{% extends %}"},
      {"x\n{% include 'other' %}", "line 2", "{% include %}"},
      {"{% import 'm' as m %}", "line 1", "{% import %}"},
      {"{% from 'm' import f %}", "line 1", "{% from %}"},
      {"{% call m() %}x{% endcall %}", "line 1", "{% call %}"},
      {"{% with a = 1 %}{{ a }}{% endwith %}", "line 1", "{% with %}"},
      {"\n\n{% raw %}{{ x }}{% endraw %}", "line 3", "{% raw %}"},
      {"{% block b %}{% endblock %}", "line 1", "{% block %}"},
      {"{% autoescape true %}{% endautoescape %}", "line 1", "{% autoescape %}"},
      {"{% for x in y recursive %}{% endfor %}", "line 1", "recursive for-loop"},
      {"{{ x | sort }}", "line 1", "filter 'sort'"},
      {"{{ x | dictsort }}", "line 1", "filter 'dictsort'"},
      {"{{ x is escaped }}", "line 1", "test 'escaped'"},
      {"a\n{{ strftime_now('%Y') }}", "line 2", "strftime_now()"},
      {"{{ cycler(1, 2) }}", "line 1", "cycler()"},
      {"{% macro m() %}\n{{ varargs }}{% endmacro %}", "line 2", "'varargs' in a macro"},
      {"{% macro m() %}{{ kwargs }}{% endmacro %}", "line 1", "'kwargs' in a macro"},
      {"{% macro m() %}{{ caller() }}{% endmacro %}", "line 1", "'caller' in a macro"},
      {"{{ f(*args) }}", "line 1", "'*' arguments"},
      {"{{ f(**kw) }}", "line 1", "'**' arguments"},
      {"{% for (a, b), c in x %}{% endfor %}", "line 1", "nested unpacking"},
      {"{{ '\\N{EM DASH}' }}", "line 1", "\\N{...}"},
      {"{{ 99999999999999999999 }}", "line 1", "64 bits"},
  };
  for (const BadTemplate& c : cases) {
    auto t = ChatTemplate::parse(c.source);
    ASSERT_FALSE(t) << c.source;
    EXPECT_EQ(t.error().code, ErrorCode::kUnsupported) << c.source << ": " << t.error().to_string();
    EXPECT_NE(t.error().message.find(c.line), std::string::npos) << c.source << ": " << t.error().message;
    EXPECT_NE(t.error().message.find(c.detail), std::string::npos) << c.source << ": " << t.error().message;
  }
}

TEST(ChatTemplateParse, RefusesInvalidUtf8AndDeepNesting) {
  auto bad = ChatTemplate::parse("{{ 'caf\xC3' }}");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  const std::string deep = "{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}";
  auto d = ChatTemplate::parse(deep);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, ErrorCode::kUnsupported) << d.error().to_string();
  std::string blocks;
  for (int i = 0; i < 300; ++i) blocks += "{% if true %}";
  for (int i = 0; i < 300; ++i) blocks += "{% endif %}";
  auto b = ChatTemplate::parse(blocks);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code, ErrorCode::kUnsupported) << b.error().to_string();
}

TEST(ChatTemplateRender, ErrorsNameTheLineAndTheConstruct) {
  auto r = render("line one\n{% if true %}\n  {{ 1 + 'a' }}\n{% endif %}");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("template line 3"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("unsupported operand type(s) for +: 'int' and 'str'"), std::string::npos);

  r = render("{{ messages[0].content.foo.bar }}", Json{{"messages", Json::array({Json{{"content", "x"}}})}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("template line 1"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("'str object' has no attribute 'foo'"), std::string::npos) << r.error().message;

  r = render("\n\n{{ raise_exception('No user query found in messages.') }}");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("template line 3"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("No user query found in messages."), std::string::npos) << r.error().message;

  r = render("{{ x | tojson }}");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("filter 'tojson'"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("Object of type Undefined is not JSON serializable"), std::string::npos);

  // An error inside a macro names the line in the macro's body, not the call site.
  r = render("{% macro m() %}\n{{ nope.attr }}\n{% endmacro %}\n\n{{ m() }}");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("template line 2"), std::string::npos) << r.error().message;
}

TEST(ChatTemplateRender, UnsupportedAtRenderTimeIsKUnsupported) {
  auto r = render("{{ s.upper() }}", Json{{"s", "\xC3\xA9t\xC3\xA9"}});  // "été": Python maps é, not implemented
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnsupported) << r.error().to_string();
  r = render("{{ s.upper() }}", Json{{"s", "abc \xE4\xBD\xA0\xE5\xA5\xBD"}});  // CJK has no case: fine
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(*r, "ABC \xE4\xBD\xA0\xE5\xA5\xBD");
  r = render("{{ '%s' % 1 }}");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnsupported);
  r = render("{{ 'a'.format() }}");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnsupported);
  r = render("{{ 2 ** 64 }}");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnsupported);
}

TEST(ChatTemplateRender, ContextChecks) {
  auto t = ChatTemplate::parse("{{ x }}");
  ASSERT_TRUE(t);
  auto r = t->render(Json::array({1, 2}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  r = t->render(Json{{"x", std::string("bad \xFF byte")}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  r = t->render(Json{{"x", uint64_t{18446744073709551615u}}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnsupported);
  r = t->render(Json{{"x", uint64_t{9223372036854775807u}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, "9223372036854775807");
  r = t->render(Json::object());
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, "");
}

TEST(ChatTemplateRender, OrderedJsonKeepsKeyOrderAndJsonSortsIt) {
  auto t = ChatTemplate::parse("{{ d | tojson }}|{% for k in d %}{{ k }}{% endfor %}");
  ASSERT_TRUE(t);
  const std::string text = R"({"d": {"b": 1, "a": {"z": true, "y": null}}})";
  auto ordered = t->render(nlohmann::ordered_json::parse(text));
  ASSERT_TRUE(ordered);
  EXPECT_EQ(*ordered, R"({"b": 1, "a": {"z": true, "y": null}}|ba)");
  auto sorted = t->render(nlohmann::json::parse(text));
  ASSERT_TRUE(sorted);
  EXPECT_EQ(*sorted, R"({"a": {"y": null, "z": true}, "b": 1}|ab)");
}

TEST(ChatTemplateRender, LimitsAreErrorsNotCrashes) {
  auto program = jinja::parse_program("{% for i in range(1000) %}{{ s }}{% endfor %}");
  ASSERT_TRUE(program);
  jinja::Dict globals;
  globals.entries.emplace_back(jinja::Value::string("s"), jinja::Value::string(std::string(100, 'x')));
  jinja::Evaluator ev(*program, globals, jinja::RenderLimits{10000, 256});
  auto r = ev.render();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kResourceExhausted) << r.error().to_string();

  auto deep = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(deep);
  EXPECT_EQ(deep.error().code, ErrorCode::kResourceExhausted) << deep.error().to_string();

  auto big = render("{{ 'x' * 10 ** 12 }}");
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code, ErrorCode::kResourceExhausted) << big.error().to_string();

  Json nested = 1;
  for (int i = 0; i < 600; ++i) nested = Json::array({nested});
  auto too_deep = render("{{ x }}", Json{{"x", nested}});
  ASSERT_FALSE(too_deep);
  EXPECT_EQ(too_deep.error().code, ErrorCode::kInvalidArgument);

  // A namespace that holds itself is released (the evaluator clears namespaces at the end of a render).
  auto cyclic = render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns.self.self is defined }}");
  ASSERT_TRUE(cyclic) << cyclic.error().to_string();
  EXPECT_EQ(*cyclic, "True");
}

TEST(ChatTemplateRender, ConcurrentRendersOfOneTemplateAgree) {
  auto t = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}<{{ m.role }}>{{ m.content | trim "
      "}}"
      "{% endfor %}{{ ns.n }}{{ tools | tojson }}");
  ASSERT_TRUE(t);
  Json ctx;
  for (int i = 0; i < 50; ++i)
    ctx["messages"].push_back(Json{{"role", i % 2 ? "user" : "assistant"}, {"content", " m "}});
  ctx["tools"] = Json::array({Json{{"name", "f"}, {"parameters", Json::object()}}});
  auto expected = t->render(ctx);
  ASSERT_TRUE(expected);
  const ChatTemplate copy = *t;
  std::vector<std::string> results(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 50; ++rep) {
        auto r = (k % 2 ? copy : *t).render(ctx);
        results[static_cast<size_t>(k)] = r ? *r : r.error().to_string();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& r : results) EXPECT_EQ(r, *expected);
}

// Seeded random edits of the real templates (deleted, duplicated and swapped spans, inserted Jinja tokens): every
// mutant must parse or be refused, and render or fail, with an error and never a crash, a hang or an exception. The
// limits are small so that a mutant that loops or recurses ends quickly.
TEST(ChatTemplateRobustness, MutatedTemplatesFailCleanly) {
  std::vector<std::string> seeds;
  for (const char* name : {"qwen3", "qwen3.5", "qwen3-next-instruct", "qwen3-next-thinking"}) {
    std::ifstream in(std::string(KESTREL_TEST_DATA_DIR) + "/chat_templates/" + name + ".jinja", std::ios::binary);
    seeds.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(seeds.back().empty()) << name;
  }
  static constexpr const char* kPieces[] = {"{%",
                                            "%}",
                                            "{{",
                                            "}}",
                                            "{#",
                                            "#}",
                                            "-",
                                            "+",
                                            "(",
                                            ")",
                                            "[",
                                            "]",
                                            "{",
                                            "}",
                                            "'",
                                            "\"",
                                            "|",
                                            ".",
                                            ",",
                                            ":",
                                            " is ",
                                            " not ",
                                            " in ",
                                            " and ",
                                            " or ",
                                            " if ",
                                            " else ",
                                            "endif",
                                            "endfor",
                                            "for x in ",
                                            "loop",
                                            "ns",
                                            "messages",
                                            "tojson",
                                            "trim",
                                            "items",
                                            "length",
                                            "[::-1]",
                                            "*",
                                            "**",
                                            "//",
                                            "~",
                                            "\n",
                                            " ",
                                            "0",
                                            "-1",
                                            "1e9",
                                            "range(99999)",
                                            "raise_exception('x')",
                                            "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
                                            "\xC3\xA9"};
  const Json ctx = Json::parse(R"({
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi <tool_response>"},
                 {"role": "assistant", "content": "<think>r</think>a", "reasoning_content": "r",
                  "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null]}}}]},
                 {"role": "tool", "content": "ok"}, {"role": "user", "content": [{"type": "text", "text": "t"}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false})");
  auto globals = jinja::value_from_json(ctx);
  ASSERT_TRUE(globals);
  std::mt19937_64 rng(12345);
  int parsed = 0, rendered = 0;
  for (int iter = 0; iter < 1200; ++iter) {
    std::string t = seeds[static_cast<size_t>(iter) % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !t.empty(); ++e) {
      const size_t at = rng() % t.size();
      const size_t len = 1 + rng() % 24;
      switch (rng() % 4) {
        case 0: t.erase(at, len); break;
        case 1: t.insert(at, t.substr(at, len)); break;
        case 2: t.insert(at, kPieces[rng() % (sizeof kPieces / sizeof kPieces[0])]); break;
        default: {
          const size_t other = rng() % t.size();
          t.insert(at, t.substr(other, len));
          break;
        }
      }
    }
    auto program = jinja::parse_program(t);
    if (!program) {
      EXPECT_FALSE(program.error().message.empty());
      continue;
    }
    ++parsed;
    jinja::Evaluator ev(*program, globals->dict(), jinja::RenderLimits{1 << 20, 32, 200000});
    auto r = ev.render();
    if (r) {
      ++rendered;
    } else {
      EXPECT_FALSE(r.error().message.empty());
    }
  }
  // The mutants exercise both outcomes.
  EXPECT_GT(parsed, 100);
  EXPECT_GT(rendered, 50);
}

}  // namespace
}  // namespace kestrel::chat
