// The Jinja interpreter (src/server/jinja) against jinja2 itself: every case of
// tests/fixtures/goldens/jinja.json (scripts/goldens/jinja_goldens.py renders snippets and the
// chat templates of tests/fixtures/chat_templates with jinja2 set up as transformers sets it up)
// must render byte for byte the same, or fail where jinja2 failed. Then what jinja2 has and
// lragent refuses, and the limits that keep any template from running away.
#include <gtest/gtest.h>

#include <ctime>
#include <map>

#include "server/jinja/jinja.h"
#include "server/jinja/value.h"
#include "test_util.h"

namespace lragent::server::jinja {
namespace {

using nlohmann::ordered_json;

// strftime_now at the script's FIXED_NOW, 2026-11-30 14:05:09 (a Monday).
std::string fixed_strftime(const std::string& format) { return testing::strftime_at(format, 2026, 11, 30, 14, 5, 9); }

RenderOptions golden_options() {
  RenderOptions o;
  o.strftime_now = fixed_strftime;
  return o;
}

Result<std::string> render(const std::string& source, const ordered_json& vars = ordered_json::object(),
                           const RenderOptions& options = golden_options()) {
  auto t = Template::parse(source);
  if (!t.ok()) return t.error();
  return t->render(vars, options);
}

std::string render_ok(const std::string& source, const ordered_json& vars = ordered_json::object()) {
  auto r = render(source, vars);
  EXPECT_TRUE(r.ok()) << source << ": " << r.error().message;
  return r.ok() ? *r : std::string();
}

Error render_error(const std::string& source, const ordered_json& vars = ordered_json::object(),
                   const RenderOptions& options = golden_options()) {
  auto r = render(source, vars, options);
  EXPECT_FALSE(r.ok()) << source << " rendered: " << (r.ok() ? *r : "");
  return r.ok() ? Error{} : r.error();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Jinja, RendersAsJinja2Does) {
  const std::string path = testing::fixtures_dir() + "/goldens/jinja.json";
  const std::string text = testing::read_file(path);
  ASSERT_FALSE(text.empty()) << path << " missing: run scripts/goldens/jinja_goldens.py";
  const ordered_json goldens = ordered_json::parse(text);
  std::map<std::string, std::string> files;
  size_t outputs = 0, errors = 0, raised = 0;
  for (const ordered_json& c : goldens.at("cases")) {
    const std::string name = c.at("name");
    std::string source;
    ordered_json vars = c.at("vars");
    if (c.contains("template")) {
      source = c["template"].get<std::string>();
      vars = goldens.at("snippet_vars");
      vars.update(c.at("vars"));
    } else {
      const std::string file = c.at("template_file");
      if (!files.count(file)) {
        files[file] = testing::read_file(testing::fixtures_dir() + "/chat_templates/" + file + ".jinja");
        ASSERT_FALSE(files[file].empty()) << file << ".jinja missing";
      }
      source = files[file];
    }
    auto t = Template::parse(source);
    if (c.contains("output")) {
      ++outputs;
      if (!t.ok()) {
        ADD_FAILURE() << name << ": " << t.error().message << "\n" << source;
        continue;
      }
      auto r = t->render(vars, golden_options());
      if (!r.ok()) {
        ADD_FAILURE() << name << ": " << r.error().message << "\n" << source;
        continue;
      }
      EXPECT_EQ(*r, c["output"].get<std::string>()) << name << "\n" << source;
      continue;
    }
    const ordered_json& err = c.at("error");
    ++errors;
    if (err.at("phase") == "parse") {
      if (t.ok()) {
        ADD_FAILURE() << name << ": jinja2 refused it (" << err.dump() << ")\n" << source;
        continue;
      }
      EXPECT_EQ(t.error().code, ErrorCode::kCorrupt) << name;
      EXPECT_TRUE(contains(t.error().message, "line ")) << name << ": " << t.error().message;
    } else {
      if (!t.ok()) {
        ADD_FAILURE() << name << ": " << t.error().message << "\n" << source;
        continue;
      }
      auto r = t->render(vars, golden_options());
      if (r.ok()) {
        ADD_FAILURE() << name << ": jinja2 failed (" << err.dump() << ") but this rendered:\n" << *r;
        continue;
      }
      EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << name;
      if (err.at("type") == "TemplateError") {  // the template's raise_exception: its message verbatim
        EXPECT_TRUE(contains(r.error().message, std::string(kRaisedPrefix) + err.at("message").get<std::string>()))
            << name << ": " << r.error().message;
        ++raised;
      }
    }
  }
  EXPECT_EQ(outputs + errors, goldens["cases"].size());
  EXPECT_GT(outputs, 450u);
  EXPECT_GT(errors, 150u);
  EXPECT_GT(raised, 20u);
  EXPECT_EQ(files.size(), 9u);
}

TEST(Jinja, ErrorsNameThePlaceAndTheCause) {
  auto parse = Template::parse("line one\n{{ a +* b }}");
  ASSERT_FALSE(parse.ok());
  EXPECT_EQ(parse.error().code, ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(parse.error().message, "line 2, column 7")) << parse.error().message;

  Error e = render_error("a\n  {{ messages[0].content.x }}", {{"messages", ordered_json::array()}});
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(e.message, "line 2")) << e.message;
  EXPECT_TRUE(contains(e.message, "no element 0")) << e.message;

  e = render_error("{% if true %}\n{{ raise_exception('Roles must alternate: ' ~ 2) }}{% endif %}");
  EXPECT_TRUE(contains(e.message, "line 2")) << e.message;
  EXPECT_TRUE(contains(e.message, "raise_exception: Roles must alternate: 2")) << e.message;

  e = render_error("{{ x }}", ordered_json::array());
  EXPECT_TRUE(contains(e.message, "JSON object")) << e.message;
}

TEST(Jinja, WhatJinja2HasAndThisRefusesIsAnError) {
  for (const char* source :
       {"{% include 'x' %}", "{% extends 'x' %}", "{% block b %}{% endblock %}", "{% import 'x' as y %}",
        "{% for x in [1] recursive %}{% endfor %}", "{{ 10000000000000000000 }}", "{{ '\\N{BULLET}' }}",
        "{{ caf\xc3\xa9 }}", "{{ x | pprint }}", "{{ x | groupby('a') }}"}) {
    auto t = Template::parse(source);
    EXPECT_FALSE(t.ok()) << source;
  }
  // Python's ints are unbounded; these are 64-bit and say so instead of wrapping.
  EXPECT_TRUE(contains(render_error("{{ 2 ** 64 }}").message, "64-bit"));
  EXPECT_TRUE(contains(render_error("{{ 9223372036854775807 + 1 }}").message, "64-bit"));
}

TEST(Jinja, NoTemplateRunsAway) {
  RenderOptions small = golden_options();
  small.max_output_bytes = 1 << 16;
  small.max_steps = 200'000;
  small.max_depth = 20;
  // jinja2's sandbox refuses ranges past 100000 items before making them.
  EXPECT_TRUE(contains(render_error("{{ range(10**12) | length }}").message, "Range too big"));
  // Output, strings and lists past the limit.
  EXPECT_TRUE(contains(
      render_error("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", ordered_json::object(), small).message,
      "bytes"));
  EXPECT_TRUE(contains(render_error("{{ 'x' * 100000000000 }}", ordered_json::object(), small).message, "bytes"));
  EXPECT_FALSE(
      render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
             ordered_json::object(), small)
          .ok());
  EXPECT_FALSE(render("{{ [1] * 10000000000 }}", ordered_json::object(), small).ok());
  EXPECT_FALSE(render("{% set s = 'x' * 60000 %}{{ [s] * 1000 }}", ordered_json::object(), small).ok());
  EXPECT_FALSE(render("{% set s = 'x' * 60000 %}{{ ([s] * 1000) | tojson }}", ordered_json::object(), small).ok());
  EXPECT_FALSE(render("{% set s = 'x' * 60000 %}{{ ([s] * 1000) | join }}", ordered_json::object(), small).ok());
  // Steps: loops inside loops, and work inside filters.
  EXPECT_TRUE(contains(render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                                    ordered_json::object(), small)
                           .message,
                       "steps"));
  // Recursion: a macro calling itself, nesting in the parser, nesting in values.
  EXPECT_TRUE(contains(
      render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ordered_json::object(), small).message,
      "nest deeper than 20"));
  EXPECT_FALSE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").ok());
  EXPECT_FALSE(Template::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").ok());
  EXPECT_FALSE(Template::parse("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}").ok());
  std::string long_sum = "{{ 1";
  for (int i = 0; i < 5000; ++i) long_sum += " + 1";
  EXPECT_FALSE(Template::parse(long_sum + " }}").ok());
  EXPECT_FALSE(Template::parse("{{ " + std::string(5000, '-') + "1 }}").ok());
  std::string nested_ifs;
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% if true %}";
  EXPECT_FALSE(Template::parse(nested_ifs).ok());
  EXPECT_TRUE(contains(
      render_error("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}")
          .message,
      "nested deeper"));
  // A namespace cannot be made to hold itself.
  EXPECT_FALSE(render("{% set ns = namespace(a=1) %}{% set ns.self = ns %}").ok());
  EXPECT_FALSE(render("{% set ns = namespace(a=1) %}{% set ns.l = [ns] %}").ok());
  EXPECT_FALSE(render("{% for x in [1] %}{% set ns = namespace() %}{% set ns.l = loop %}{% endfor %}").ok());
  // A new namespace may hold an older one: nothing can point back at it.
  EXPECT_EQ(render_ok("{% set a = namespace(x=1) %}{% set b = namespace(a=a) %}{% set a.x = 2 %}{{ b.a.x }}"), "2");
  // Deeply nested input is refused rather than walked.
  ordered_json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = ordered_json::array({deep});
  EXPECT_FALSE(render("{{ x }}", {{"x", deep}}).ok());
}

TEST(Jinja, RendersTheSameTwiceAndKeepsNoState) {
  auto t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  const ordered_json vars = {{"messages", {1, 2, 3}}};
  EXPECT_EQ(*t->render(vars), "3");
  EXPECT_EQ(*t->render(vars), "3");
  // The default strftime_now is the local time now.
  auto date = Template::parse("{{ strftime_now('%Y') }}");
  ASSERT_TRUE(date.ok());
  auto year = date->render(ordered_json::object());
  ASSERT_TRUE(year.ok());
  EXPECT_EQ(year->size(), 4u);
  EXPECT_EQ(*year, strftime_local_now("%Y"));
}

TEST(Jinja, ValuesConvertFromAndToJson) {
  const ordered_json j = ordered_json::parse(R"({"b": [1, 2.5, "x", null, true], "a": {"k": "v"}})");
  auto v = from_json(j);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(repr(*v), "{'b': [1, 2.5, 'x', None, True], 'a': {'k': 'v'}}");
  auto back = to_json(*v);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dump(), j.dump());  // keys keep their order
  EXPECT_FALSE(from_json(ordered_json(18446744073709551615ull)).ok());
  EXPECT_EQ(render_ok("{{ x }}|{{ x | tojson }}", {{"x", 1e308 * 10}}), "inf|Infinity");
}

}  // namespace
}  // namespace lragent::server::jinja
