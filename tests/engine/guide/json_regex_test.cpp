// JSON schema -> regex, checked with std::regex (ECMAScript, whole-string match) as the regex
// reference and nlohmann::json::parse as the JSON reference: random instances of each schema,
// written compactly, with a space after every ':' and ',' and with a random mix, must all match;
// instances mutated out of the schema (wrong type, missing or extra key, keys out of order, a
// trailing comma, too many items) must not. Documents stay short: std::regex recurses per character.
#include "engine/guide/json_regex.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace lragent::guide {
namespace {

using ojson = nlohmann::ordered_json;

JsonRegexOptions small_opts() {
  JsonRegexOptions o;
  o.max_depth = 2;
  return o;
}

std::regex compile(const ojson& schema, const JsonRegexOptions& o = small_opts()) {
  auto re = json_schema_regex(schema, o);
  EXPECT_TRUE(re.ok()) << (re.ok() ? "" : re.error().message) << "\nschema: " << schema.dump();
  return std::regex(re.ok() ? *re : std::string("[]"), std::regex::ECMAScript);
}

bool match(const std::regex& re, const std::string& text) { return std::regex_match(text, re); }

// Random instances of a schema of the supported subset, as the tests' schemas use it.
class Gen {
 public:
  Gen(const ojson& root, uint32_t seed) : root_(root), rng_(seed) {}

  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin() { return uniform(0, 1) == 1; }
  std::mt19937& rng() { return rng_; }

  ojson value(const ojson& s, int depth) {
    if (s.is_boolean() || s.empty()) return any(depth);
    if (s.contains("$ref")) {  // the regex cuts a recursion at max_depth (2 here)
      const std::string ref = s["$ref"];
      ++open_[ref];
      ojson v = value(root_.at(ojson::json_pointer(ref.substr(1))), depth);
      --open_[ref];
      return v;
    }
    if (s.contains("const")) return s["const"];
    if (s.contains("enum")) return s["enum"][static_cast<size_t>(uniform(0, static_cast<int>(s["enum"].size()) - 1))];
    for (const char* k : {"anyOf", "oneOf", "allOf"})
      if (s.contains(k)) return value(s[k][static_cast<size_t>(uniform(0, static_cast<int>(s[k].size()) - 1))], depth);
    std::string type = "any";
    if (s.contains("type"))
      type = s["type"].is_array() ? s["type"][static_cast<size_t>(uniform(0, static_cast<int>(s["type"].size()) - 1))]
                                  : s["type"];
    if (type == "object") return object(s, depth);
    if (type == "array") return array(s, depth);
    if (type == "string") return string(s);
    if (type == "integer") return integer(s);
    if (type == "number") return number(s);
    if (type == "boolean") return coin();
    if (type == "null") return nullptr;
    return any(depth);
  }

  // A string of `n` characters, some of them ones JSON escapes.
  std::string text(int n, bool ascii) {
    static const std::vector<std::string> kAscii = {"a", "b", "Z", "0",  "7",  " ", "_",  "-",  ".",    ":",
                                                    ",", "{", "]", "\"", "\\", "/", "\n", "\t", "\x01", "'"};
    static const std::vector<std::string> kWide = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    std::string out;
    for (int i = 0; i < n; ++i)
      out += !ascii && uniform(0, 5) == 0
                 ? kWide[static_cast<size_t>(uniform(0, 2))]
                 : kAscii[static_cast<size_t>(uniform(0, static_cast<int>(kAscii.size()) - 1))];
    return out;
  }

 private:
  ojson any(int depth) {
    switch (uniform(0, depth > 0 ? 6 : 4)) {
      case 0:
        return text(uniform(0, 4), false);
      case 1:
        return uniform(-50, 50);
      case 2:
        return uniform(-100, 100) / 8.0;
      case 3:
        return coin();
      case 4:
        return nullptr;
      case 5: {
        ojson o = ojson::object();
        for (int i = uniform(0, 2); i > 0; --i) o[text(uniform(0, 3), false)] = any(depth - 1);
        return o;
      }
      default: {
        ojson a = ojson::array();
        for (int i = uniform(0, 2); i > 0; --i) a.push_back(any(depth - 1));
        return a;
      }
    }
  }

  ojson object(const ojson& s, int depth) {
    ojson o = ojson::object();
    if (!s.contains("properties")) {
      const ojson addl = s.value("additionalProperties", ojson(true));
      for (int i = uniform(0, 2); i > 0; --i) o[text(uniform(0, 3), false)] = value(addl, depth - 1);
      return o;
    }
    const ojson req = s.value("required", ojson::array());
    for (const auto& [k, sub] : s["properties"].items())
      if (std::find(req.begin(), req.end(), k) != req.end() || coin()) o[k] = value(sub, depth);
    return o;
  }

  ojson array(const ojson& s, int depth) {
    ojson a = ojson::array();
    for (const ojson& p : s.value("prefixItems", ojson::array())) a.push_back(value(p, depth));
    const int lo = s.value("minItems", 0), hi = s.value("maxItems", lo + 3);
    const ojson items = s.value("items", ojson(true));
    const bool cut = items.contains("$ref") && open_[items["$ref"]] >= 2;
    for (int n = uniform(lo, hi) - static_cast<int>(a.size()); n > 0 && items != false && !cut; --n)
      a.push_back(value(items, depth - 1));
    return a;
  }

  ojson string(const ojson& s) {
    const std::string f = s.value("format", "");
    auto two = [&](int lo, int hi) { return fmt::format("{:02}", uniform(lo, hi)); };
    const std::string time = two(0, 23) + ":" + two(0, 59) + ":" + two(0, 59) + (coin() ? ".5" : "") +
                             (coin() ? "Z" : (coin() ? "+" : "-") + two(0, 23) + ":" + two(0, 59));
    std::string date;
    do {  // std::chrono decides which days exist
      date = fmt::format("{:04}-{:02}-{:02}", uniform(1, 9999), uniform(1, 12), uniform(1, 31));
    } while (!std::chrono::year_month_day(std::chrono::year(std::stoi(date)),
                                          std::chrono::month(std::stoi(date.substr(5))),
                                          std::chrono::day(std::stoi(date.substr(8))))
                  .ok());
    if (f == "date") return date;
    if (f == "time") return time;
    if (f == "date-time") return date + "T" + time;
    if (f == "uuid") return "0f8fad5b-d9cb-469f-a165-70867728950" + std::string(1, "0aF"[uniform(0, 2)]);
    if (f == "email")
      return (coin() ? "ann" : "a.b_c+d") + std::string("@") + (coin() ? "example.com" : "mail.x-y.org");
    const int lo = s.value("minLength", 0);
    return text(uniform(lo, s.value("maxLength", lo + 6)), s.contains("minLength") || s.contains("maxLength"));
  }

  ojson integer(const ojson& s) {
    const int lo = s.contains("exclusiveMinimum") ? s["exclusiveMinimum"].get<int>() + 1 : s.value("minimum", -100000);
    const int hi = s.value("maximum", 100000);
    return coin() ? uniform(lo, hi) : uniform(0, 1) ? lo : hi;
  }

  ojson number(const ojson& s) {
    const bool non_negative = s.contains("minimum");
    const std::string mantissa = (non_negative || coin() ? "" : "-") + std::to_string(uniform(0, 999)) +
                                 (coin() ? "." + std::to_string(uniform(0, 99)) : "");
    return ojson::parse(mantissa + (coin() ? "e" + std::to_string(uniform(-5, 5)) : ""));
  }

  const ojson& root_;
  std::mt19937 rng_;
  std::map<std::string, int> open_;  // $refs being expanded
};

// `v` written with a space after ':' and ',' always (1), never (0) or at random (2).
std::string write(const ojson& v, int spaces, std::mt19937& rng) {
  auto sp = [&] { return spaces == 1 || (spaces == 2 && rng() % 2) ? " " : ""; };
  std::string out;
  if (v.is_object()) {
    for (const auto& [k, x] : v.items())
      out += (out.empty() ? "" : std::string(",") + sp()) + ojson(k).dump() + ":" + sp() + write(x, spaces, rng);
    return "{" + out + "}";
  }
  if (v.is_array()) {
    for (const ojson& x : v) out += (out.empty() ? "" : std::string(",") + sp()) + write(x, spaces, rng);
    return "[" + out + "]";
  }
  return v.dump();
}

// Mutations that take an instance of a closed object schema out of the regex's language.
std::vector<std::string> mutants(const ojson& schema, const ojson& inst, std::mt19937& rng) {
  std::vector<std::string> out;
  const ojson& props = schema["properties"];
  const ojson req = schema.value("required", ojson::array());
  const std::string text = write(inst, 0, rng);
  out.push_back(text.substr(0, text.size() - 1) + (inst.empty() ? "\"x\":1" : ",") + "}");  // trailing comma
  out.push_back(write(ojson::array({inst}), 0, rng));                                       // not an object
  ojson extra = inst;
  extra["zz_extra"] = 1;
  out.push_back(write(extra, 0, rng));
  for (const auto& [k, v] : inst.items()) {
    const ojson& sub = props[k];
    if (std::find(req.begin(), req.end(), k) != req.end()) {
      ojson missing = inst;
      missing.erase(k);
      out.push_back(write(missing, 0, rng));
    }
    ojson wrong = inst;
    if (sub.contains("enum"))
      wrong[k] = "not a member";
    else if (sub.contains("type") && sub["type"].is_string())
      wrong[k] = sub["type"] == "string" ? ojson(12) : sub["type"] == "array" ? ojson::object() : ojson("x");
    else
      continue;
    out.push_back(write(wrong, 1, rng));
    if (sub.contains("maxItems")) {
      ojson many = inst;
      while (many[k].size() <= sub["maxItems"].get<size_t>())
        many[k].push_back(many[k].empty() ? ojson(1) : many[k][0]);
      out.push_back(write(many, 0, rng));
    }
  }
  if (inst.size() >= 2) {  // the first two keys swapped
    ojson swapped = ojson::object();
    auto it = inst.begin();
    const auto a = it++, b = it++;
    swapped[b.key()] = *b;
    swapped[a.key()] = *a;
    for (; it != inst.end(); ++it) swapped[it.key()] = *it;
    out.push_back(write(swapped, 0, rng));
  }
  return out;
}

// Every random instance, in each of the three spacings, is JSON and matches; every mutant of
// an object instance does not. Returns how many texts were checked.
int check_schema(const ojson& schema, int n, uint32_t seed, bool mutate) {
  const std::regex re = compile(schema);
  Gen gen(schema, seed);
  int checked = 0;
  for (int i = 0; i < n; ++i) {
    const ojson inst = gen.value(schema, 2);
    for (int spaces : {0, 1, 2}) {
      const std::string text = write(inst, spaces, gen.rng());
      if (text.size() > 220) continue;  // std::regex's recursion depth grows with the text
      EXPECT_FALSE(ojson::parse(text, nullptr, false).is_discarded()) << text;
      EXPECT_TRUE(match(re, text)) << "valid instance rejected: " << text << "\nschema: " << schema.dump();
      ++checked;
    }
    if (!mutate || !inst.is_object()) continue;
    for (const std::string& bad : mutants(schema, inst, gen.rng())) {
      if (bad.size() > 220) continue;
      EXPECT_FALSE(match(re, bad)) << "invalid instance accepted: " << bad << "\nschema: " << schema.dump();
      ++checked;
    }
  }
  return checked;
}

const ojson kFlat = ojson::parse(R"js({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "score": {"type": "number"},
    "ok": {"type": "boolean"},
    "nothing": {"type": "null"},
    "tag": {"enum": ["a.b", "(x)", "say \"hi\"", "back\\slash", 3, null]},
    "note": {"type": "string"}
  },
  "required": ["age", "ok", "tag"],
  "additionalProperties": false
})js");

TEST(JsonRegexInstances, FlatObjectOfEveryScalarType) { EXPECT_GT(check_schema(kFlat, 300, 1, true), 2000); }

TEST(JsonRegexInstances, AllOptionalAndAllRequired) {
  ojson all_optional = kFlat;
  all_optional.erase("required");
  EXPECT_GT(check_schema(all_optional, 300, 2, true), 1500);
  ojson all_required = kFlat;
  all_required["required"] = ojson::array({"name", "age", "score", "ok", "nothing", "tag", "note"});
  EXPECT_GT(check_schema(all_required, 200, 3, true), 1000);
  // Optional properties between and after required ones.
  ojson middle = kFlat;
  middle["required"] = ojson::array({"score", "note"});
  EXPECT_GT(check_schema(middle, 300, 4, true), 1500);
}

TEST(JsonRegexInstances, NestedObjectsAndArrays) {
  const ojson schema = ojson::parse(R"js({
    "type": "object",
    "properties": {
      "id": {"type": "integer"},
      "owner": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 4},
                "last": {"type": ["string", "null"], "maxLength": 4}}, "required": ["last"]},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 3},
      "pairs": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": false},
      "meta": {"type": "object"},
      "extra": {}
    },
    "required": ["id", "tags"]
  })js");
  EXPECT_GT(check_schema(schema, 300, 5, true), 1000);
}

TEST(JsonRegexInstances, TopLevelArraysWithCounts) {
  for (auto [lo, hi] : {std::pair{0, 0}, {0, 1}, {0, 3}, {1, 1}, {2, 4}}) {
    const ojson schema = {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", lo}, {"maxItems", hi}};
    EXPECT_GT(check_schema(schema, 60, 6, false), 100);
    const std::regex re = compile(schema);
    std::string list = "[";
    for (int n = 0; n <= 6; ++n, list += (n > 1 ? "," : "") + std::to_string(n)) {
      EXPECT_EQ(match(re, list + "]"), n >= lo && n <= hi) << list << "] vs " << lo << ".." << hi;
    }
  }
  const std::regex unbounded = compile({{"type", "array"}, {"items", {{"type", "null"}}}, {"minItems", 2}});
  EXPECT_FALSE(match(unbounded, "[null]"));
  EXPECT_TRUE(match(unbounded, "[null,null,null,null,null,null,null]"));
  EXPECT_FALSE(match(unbounded, "[null,null,]"));
}

TEST(JsonRegexInstances, EnumsConstAndAnyOf) {
  const ojson schema = ojson::parse(R"js({
    "type": "object",
    "properties": {
      "color": {"enum": ["red", "gr|een", "a+b*", "[x]", "tab\t", "\u00e9t\u00e9"]},
      "mode": {"const": "fixed.{1}"},
      "either": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}, {"type": "null"}]},
      "one": {"oneOf": [{"type": "boolean"}, {"enum": [1.5, -2, "x"]}]}
    },
    "required": ["color", "mode", "either"]
  })js");
  EXPECT_GT(check_schema(schema, 300, 7, true), 1500);
  const std::regex re = compile(schema);
  EXPECT_FALSE(match(re, R"({"color":"gr","mode":"fixed.{1}","either":1})"));   // a regex reading of "gr|een"
  EXPECT_FALSE(match(re, R"({"color":"red","mode":"fixedX{1}","either":1})"));  // '.' is literal
  EXPECT_FALSE(match(re, R"({"color":"red","mode":"fixed.{1}","either":"abc"})"));
  EXPECT_FALSE(match(re, R"({"color":"red","mode":"fixed.{1}","either":1,"one":2})"));
  // Object and array values of an enum, written as dump() writes them.
  const std::regex objects = compile(ojson::parse(R"js({"enum": [{"a": [1, "x"]}, [true, null]]})js"));
  EXPECT_TRUE(match(objects, R"({"a":[1,"x"]})"));
  EXPECT_TRUE(match(objects, "[true,null]"));
  EXPECT_FALSE(match(objects, "[true]"));
}

const ojson kTree = ojson::parse(R"js({
  "$defs": {
    "Node": {"type": "object", "properties": {"v": {"type": "integer"},
             "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}}, "required": ["v"]},
    "Point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
              "required": ["x", "y"]}
  },
  "type": "object",
  "properties": {"root": {"$ref": "#/$defs/Node"}, "at": {"allOf": [{"$ref": "#/$defs/Point"}]}},
  "required": ["root"]
})js");

TEST(JsonRegexInstances, DefsRefsAndRecursion) {
  EXPECT_GT(check_schema(kTree, 200, 8, true), 600);
  const std::regex re = compile(kTree);  // max_depth 2: Node inside Node, then kids must be empty
  EXPECT_TRUE(match(re, R"({"root":{"v":1,"kids":[{"v":2,"kids":[]}]}})"));
  EXPECT_TRUE(match(re, R"({"root":{"v":1,"kids":[{"v":2}]},"at":{"x":1,"y":-2.5e3}})"));
  EXPECT_FALSE(match(re, R"({"root":{"v":1,"kids":[{"v":2,"kids":[{"v":3}]}]}})"));
  EXPECT_FALSE(match(re, R"({"root":{"v":1},"at":{"x":1}})"));
  // A recursion that cannot end within max_depth accepts no value.
  auto endless = json_schema_regex(ojson::parse(
      R"({"$defs": {"L": {"type": "object", "properties": {"next": {"$ref": "#/$defs/L"}}, "required": ["next"]}},
          "$ref": "#/$defs/L"})"));
  ASSERT_FALSE(endless.ok());
  EXPECT_EQ(endless.error().code, ErrorCode::kInvalidArgument);
  // draft-7 definitions and a reference to the root.
  const std::regex list = compile(ojson::parse(
      R"({"definitions": {"n": {"type": "integer"}}, "type": "array", "items": {"anyOf": [{"$ref": "#/definitions/n"}, {"$ref": "#"}]}})"));
  EXPECT_TRUE(match(list, "[1,[2,[]],3]"));
  EXPECT_FALSE(match(list, "[1,[2,[[]]]]"));  // three levels of the root under max_depth 2
}

TEST(JsonRegexInstances, PydanticStyleSchema) {
  // What pydantic v2 emits for a model with an enum, an optional field and a nested model.
  const ojson schema = ojson::parse(R"js({
    "$defs": {
      "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"},
      "Dims": {"properties": {"w": {"title": "W", "type": "integer", "exclusiveMinimum": 0},
               "h": {"title": "H", "type": "integer", "exclusiveMinimum": 0}},
               "required": ["w", "h"], "title": "Dims", "type": "object"}
    },
    "description": "A box.",
    "properties": {
      "label": {"description": "What it says", "title": "Label", "type": "string", "maxLength": 6},
      "color": {"$ref": "#/$defs/Color", "description": "Its colour"},
      "dims": {"anyOf": [{"$ref": "#/$defs/Dims"}, {"type": "null"}], "default": null},
      "price": {"anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}], "default": null, "title": "Price"},
      "when": {"format": "date-time", "title": "When", "type": "string"}
    },
    "required": ["label", "color"],
    "title": "Box",
    "type": "object"
  })js");
  EXPECT_GT(check_schema(schema, 300, 9, true), 1500);
  const std::regex re = compile(schema);
  EXPECT_TRUE(match(re, R"({"label":"box","color":"red","dims":{"w":3,"h":40},"price":0.5})"));
  EXPECT_FALSE(match(re, R"({"label":"box","color":"red","dims":{"w":0,"h":40}})"));  // exclusiveMinimum 0
  EXPECT_FALSE(match(re, R"({"label":"box","color":"red","price":-1})"));             // minimum 0
  EXPECT_FALSE(match(re, R"({"label":"box","color":"blue"})"));
  EXPECT_FALSE(match(re, R"({"label":"box","color":"red","when":"2024-02-30T10:00:00Z"})"));
}

TEST(JsonRegexInstances, PropertyOrderIsTheSchemasOrder) {
  const std::string text = R"({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}})";
  const std::regex ordered = compile(ojson::parse(text));
  EXPECT_TRUE(match(ordered, R"({"b":1,"a":2})"));
  EXPECT_FALSE(match(ordered, R"({"a":2,"b":1})"));
  // nlohmann::json keeps keys sorted: its overload can only follow key order.
  auto sorted = json_schema_regex(nlohmann::json::parse(text), small_opts());
  ASSERT_TRUE(sorted.ok());
  EXPECT_TRUE(match(std::regex(*sorted), R"({"a":2,"b":1})"));
}

TEST(JsonRegexStrings, LengthsCountCharactersAndEscapesOnce) {
  const std::regex re = compile({{"type", "string"}, {"minLength", 2}, {"maxLength", 3}});
  for (const char* ok : {R"("ab")", R"("a\"b")", R"("\n\t")", R"("\u00e9x")", R"("a\\")", R"("\/\/\/")"})
    EXPECT_TRUE(match(re, ok)) << ok;
  for (const char* bad : {R"("a")", R"("abcd")", R"("\n")", R"("a"b")", R"("\x")", "\"a\tb\"", R"("\ud83d\ude00")"})
    EXPECT_FALSE(match(re, bad)) << bad;  // the surrogate pair is one character
  const std::regex any = compile({{"type", "string"}});
  for (const char* ok : {R"("a\/b")", R"("\b\f\r\u12aB")", R"("")"}) EXPECT_TRUE(match(any, ok)) << ok;
  for (const char* bad : {R"("\u12")", R"("\a")", R"("a)", "\"\x1f\""}) EXPECT_FALSE(match(any, bad)) << bad;
  Gen gen(ojson::object(), 10);
  for (int i = 0; i < 500; ++i) {
    const std::string text = ojson(gen.text(gen.uniform(0, 12), false)).dump();
    EXPECT_TRUE(match(any, text)) << text;
  }
}

TEST(JsonRegexStrings, FormatsAgainstStdChrono) {
  const std::regex date = compile({{"type", "string"}, {"format", "date"}});
  int checked = 0;
  for (int y : {0, 1, 4, 100, 400, 1900, 2000, 2023, 2024, 9999})
    for (int m = 0; m <= 13; ++m)
      for (int d = 0; d <= 32; ++d, ++checked) {
        const std::string text = fmt::format("\"{:04}-{:02}-{:02}\"", y, m, d);
        const bool real =
            y >= 1 && std::chrono::year_month_day(std::chrono::year(y), std::chrono::month(static_cast<unsigned>(m)),
                                                  std::chrono::day(static_cast<unsigned>(d)))
                          .ok();
        EXPECT_EQ(match(date, text), real) << text;
      }
  EXPECT_EQ(checked, 10 * 14 * 33);
  const std::regex time = compile({{"type", "string"}, {"format", "time"}});
  EXPECT_TRUE(match(time, R"("23:59:59Z")"));
  EXPECT_TRUE(match(time, R"("00:00:00.123+05:30")"));
  for (const char* bad : {R"("24:00:00Z")", R"("12:60:00Z")", R"("12:00:00")", R"("12:00Z")", R"("1:00:00Z")"})
    EXPECT_FALSE(match(time, bad)) << bad;
  const std::regex uuid = compile({{"type", "string"}, {"format", "uuid"}});
  EXPECT_TRUE(match(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(match(uuid, R"("123e4567-e89b-12d3-a456-42661417400")"));
  const std::regex email = compile({{"type", "string"}, {"format", "email"}});
  EXPECT_TRUE(match(email, R"("first.last+tag@mail.example.org")"));
  for (const char* bad : {R"("a@b")", R"(".a@b.com")", R"("a..b@c.com")", R"("a@-b.com")", R"("a b@c.com")"})
    EXPECT_FALSE(match(email, bad)) << bad;
}

TEST(JsonRegexStrings, PatternsMatchAsTheirOwnRegexDoes) {
  // For texts a JSON string holds raw, the translated pattern matches exactly what std::regex of
  // the pattern matches (whole string); escapes in the value are refused.
  const std::vector<std::string> patterns = {"^[a-z]+\\d{2}$",    "^(ab|c)*x?$", "[A-F0-9]{2,4}",
                                             "^\\w+@\\w+\\.com$", "a.c",         "^[^abc]+$",
                                             "^\\S+ \\D$",        "x{,2}",       "^[^\\s@]+$"};
  const std::vector<std::string> texts = {"",     "abc12",        "ab",    "abx", "cccx",    "FF",  "A0B1C",
                                          "G1",   "joe@site.com", "a c",   "abc", "a-c",     "xyz", "def",
                                          "ab 1", "ab 1c",        "x{,2}", "a b", "\xc3\xa9"};
  for (const std::string& p : patterns) {
    const std::regex re = compile({{"type", "string"}, {"pattern", p}});
    std::string bare = p;
    if (bare.front() == '^') bare.erase(0, 1);
    if (bare.back() == '$') bare.pop_back();
    const std::regex reference(bare == "x{,2}" ? "x\\{,2\\}" : bare);  // ECMAScript reads "{,2}" literally
    for (const std::string& t : texts) {
      if (t == "\xc3\xa9") continue;  // std::regex sees bytes, the DFA characters
      EXPECT_EQ(match(re, "\"" + t + "\""), std::regex_match(t, reference)) << p << " on " << t;
    }
    EXPECT_FALSE(match(re, "\"a\\\"b\"")) << p;
  }
  // Characters JSON must escape: a literal one is its escape, a class or '.' leaves them out.
  const std::regex quote = compile({{"type", "string"}, {"pattern", "^say \"(hi|yo)\"\\n$"}});
  EXPECT_TRUE(match(quote, R"("say \"hi\"\n")"));
  EXPECT_FALSE(match(quote, R"("say "hi"\n")"));
  const std::regex dot = compile({{"type", "string"}, {"pattern", "^.[ -~]$"}});
  EXPECT_TRUE(match(dot, R"("a~")"));
  for (const char* bad : {R"("""")", R"("a"")", R"("a\")", "\"\ta\""}) EXPECT_FALSE(match(dot, bad)) << bad;
}

TEST(JsonRegexNumbers, IntegerRangesAreExact) {
  const std::vector<std::pair<std::optional<int>, std::optional<int>>> ranges = {
      {0, std::nullopt}, {1, std::nullopt},  {std::nullopt, -1},    {-12, 7}, {5, 5}, {-305, -17}, {9, 1000},
      {37, 4210},        {std::nullopt, 99}, {-1000, std::nullopt}, {0, 0}};
  for (auto [lo, hi] : ranges) {
    ojson schema = {{"type", "integer"}};
    if (lo) schema["minimum"] = *lo;
    if (hi) schema["maximum"] = *hi;
    const std::regex re = compile(schema);
    for (int v = -1200; v <= 5000; v += (v > -400 && v < 1100) ? 1 : 7)
      EXPECT_EQ(match(re, std::to_string(v)), (!lo || v >= *lo) && (!hi || v <= *hi)) << schema.dump() << " on " << v;
    EXPECT_FALSE(match(re, "01"));
    EXPECT_FALSE(match(re, "-0"));
    EXPECT_FALSE(match(re, "1.0"));
  }
  const std::regex open = compile({{"type", "integer"}, {"exclusiveMinimum", 2.5}, {"exclusiveMaximum", 10}});
  EXPECT_FALSE(match(open, "2"));
  EXPECT_TRUE(match(open, "3"));
  EXPECT_TRUE(match(open, "9"));
  EXPECT_FALSE(match(open, "10"));
  const std::regex draft4 = compile({{"type", "integer"}, {"minimum", 0}, {"exclusiveMinimum", true}});
  EXPECT_FALSE(match(draft4, "0"));
  EXPECT_TRUE(match(draft4, "1"));
}

TEST(JsonRegexNumbers, NumberGrammar) {
  const std::regex num = compile({{"type", "number"}});
  for (const char* ok : {"0", "-0", "12", "-3.25", "1e5", "1E+05", "0.5e-3", "-0.0"}) EXPECT_TRUE(match(num, ok)) << ok;
  for (const char* bad : {"01", "+1", ".5", "1.", "1e", "--1", "NaN", "Infinity", "0x1"})
    EXPECT_FALSE(match(num, bad)) << bad;
  const std::regex positive = compile({{"type", "number"}, {"exclusiveMinimum", 0}});
  for (const char* ok : {"1", "0.001", "3.5e9", "10", "0.0000000000000001"}) EXPECT_TRUE(match(positive, ok)) << ok;
  // 1e-400 and 0.(400 zeros)1 parse as 0.0: no negative exponent, at most 15 zeros after the point.
  for (const char* bad : {"0", "0.000", "-1", "0e5", "1e-400", "0.00000000000000001"})
    EXPECT_FALSE(match(positive, bad)) << bad;
  const std::regex non_negative = compile({{"type", "number"}, {"minimum", 0}});
  EXPECT_TRUE(match(non_negative, "0.0"));
  EXPECT_FALSE(match(non_negative, "-0.5"));
}

TEST(JsonRegexObject, UntypedValuesUpToMaxDepth) {
  const std::regex any = compile(ojson::object());  // max_depth 2
  for (const char* ok : {"1", "\"x\"", "null", "[]", "[[1]]", R"({"a":[]})", R"([{"a":1}])", R"({"a":{}})"})
    EXPECT_TRUE(match(any, ok)) << ok;
  for (const char* bad : {"[[[1]]]", R"({"a":{"b":{}}})", R"([{"a":{}}])", "[1,]", "", " 1"})
    EXPECT_FALSE(match(any, bad)) << bad;
  // A oneOf with pydantic's discriminator note: the branches' consts tell them apart.
  const std::regex pets = compile(ojson::parse(R"js({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"]},
      {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}],
    "discriminator": {"propertyName": "kind", "mapping": {"cat": "#/cat", "dog": "#/dog"}}})js"));
  EXPECT_TRUE(match(pets, R"({"kind":"cat","lives":9})"));
  EXPECT_FALSE(match(pets, R"({"kind":"dog","lives":9})"));
}

TEST(JsonRegexObject, AnyObjectUpToMaxDepth) {
  for (int depth : {1, 2, 3}) {
    JsonRegexOptions o;
    o.max_depth = depth;
    const std::regex re(json_object_regex(o));
    std::string nested = R"({"k":1})";
    for (int d = 1; d <= 4; ++d, nested = R"({"a":[)" + nested + "]}") {
      // Each wrap adds two levels (an object holding an array).
      const int level = 2 * d - 1;
      EXPECT_TRUE(ojson::accept(nested));
      EXPECT_EQ(match(re, nested), level <= depth) << nested << " at max_depth " << depth;
    }
    EXPECT_TRUE(match(re, "{}"));
    EXPECT_TRUE(match(re, R"({"a": "x\"y", "b": null, "c": -1.5e3, "": true})"));
    for (const char* bad : {"[]", "[{}]", "1", "\"x\"", "null", "true", R"({"a":1,})", R"({"a" 1})", R"({a:1})", "{} "})
      EXPECT_FALSE(match(re, bad)) << bad;
    const std::string level2 = R"({"a":{"b":[]}})";
    EXPECT_EQ(match(re, level2), depth >= 3) << depth;  // three levels: object, object, array
  }
  JsonRegexOptions clamped;
  clamped.max_depth = 99;
  EXPECT_EQ(json_object_regex(clamped), json_object_regex(JsonRegexOptions{kMaxJsonDepth, "[ ]?"}));
  // An object's regex at the deepest level stays within the size the DFA is given.
  EXPECT_LT(json_object_regex(clamped).size(), size_t{1} << 20);
}

TEST(JsonRegexChoice, ExactlyTheChoices) {
  const std::vector<std::string> choices = {"a.b", "(x)",         "1+1", "yes|no", "[z]",
                                            "^$",  "back\\slash", "{2}", "q?",     "\t"};
  const std::regex re(choice_regex(choices));
  for (const auto& c : choices) EXPECT_TRUE(match(re, c)) << c;
  for (const char* bad : {"axb", "x", "11", "yes", "no", "z", "", "backslash", "2", "22", "q", "a.bx", "(x)(x)"})
    EXPECT_FALSE(match(re, bad)) << bad;
  EXPECT_TRUE(match(std::regex(choice_regex({"only"})), "only"));
  // escape_regex: every byte string matches itself only.
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int n = static_cast<int>(rng() % 8); n > 0; --n) s += static_cast<char>(1 + rng() % 127);
    const std::regex lit(escape_regex(s));
    EXPECT_TRUE(match(lit, s)) << escape_regex(s);
    EXPECT_FALSE(match(lit, s + "x"));
  }
}

TEST(JsonRegexErrors, NameTheKeywordAndItsPointer) {
  struct Case {
    const char* schema;
    ErrorCode code;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"age":{"type":"number","minimum":3}}})",
       ErrorCode::kUnsupported,
       {"'minimum'", "/properties/age"}},
      {R"({"type":"number","maximum":3})", ErrorCode::kUnsupported, {"'maximum'", "the root"}},
      {R"({"type":"integer","multipleOf":2})", ErrorCode::kUnsupported, {"'multipleOf'"}},
      {R"({"type":"array","items":{"type":"string"},"uniqueItems":true})", ErrorCode::kUnsupported, {"'uniqueItems'"}},
      {R"({"type":"object","properties":{"a":{}},"additionalProperties":true})",
       ErrorCode::kUnsupported,
       {"'additionalProperties'"}},
      {R"({"properties":{"x":{"type":"string","format":"ipv4"}}})",
       ErrorCode::kUnsupported,
       {"'format'", "/properties/x", "ipv4"}},
      {R"({"properties":{"x":{"not":{"type":"string"}}}})", ErrorCode::kUnsupported, {"'not'", "/properties/x"}},
      {R"({"allOf":[{"type":"string"},{"maxLength":3}]})", ErrorCode::kUnsupported, {"'allOf'", "2 schemas"}},
      {R"js({"type":"string","pattern":"a(?=b)"})js", ErrorCode::kUnsupported, {"'pattern'"}},
      {R"({"type":"string","pattern":"(a)\\1"})", ErrorCode::kUnsupported, {"'pattern'", "\\1"}},
      {R"({"type":"string","pattern":"[^\\d]"})", ErrorCode::kUnsupported, {"'pattern'", "negated"}},
      {R"({"type":"string","pattern":"a^b"})", ErrorCode::kUnsupported, {"'pattern'", "anchors"}},
      {R"({"type":"string","pattern":"(ab"})", ErrorCode::kInvalidArgument, {"'pattern'", "open"}},
      {R"({"type":"string","pattern":"a","maxLength":3})", ErrorCode::kUnsupported, {"'pattern'"}},
      {R"({"type":"string","maxLength":5000})", ErrorCode::kUnsupported, {"'maxLength'", "1000"}},
      {R"({"$ref":"https://example.com/s.json"})", ErrorCode::kUnsupported, {"'$ref'", "local"}},
      {R"({"$ref":"#/$defs/Missing"})", ErrorCode::kInvalidArgument, {"'$ref'", "#/$defs/Missing"}},
      {R"({"$defs":{"A":{"type":"integer","exclusiveMaximum":"x"}},"$ref":"#/$defs/A"})",
       ErrorCode::kInvalidArgument,
       {"'exclusiveMaximum'", "/$defs/A"}},
      {R"({"type":"strin"})", ErrorCode::kInvalidArgument, {"'type'", "\"strin\""}},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})",
       ErrorCode::kInvalidArgument,
       {"'required'", "\"b\""}},
      {R"({"type":"array","items":{"type":"integer"},"minItems":-1})", ErrorCode::kInvalidArgument, {"'minItems'"}},
      {R"({"anyOf":[]})", ErrorCode::kInvalidArgument, {"'anyOf'"}},
      {R"({"properties":{"a":3}})", ErrorCode::kInvalidArgument, {"/properties/a"}},
      {R"({"type":"string","enum":[1,2]})", ErrorCode::kInvalidArgument, {"accepts no value"}},
      {R"({"enum":["a"],"maxLength":3})", ErrorCode::kUnsupported, {"'maxLength'", "'enum'"}},
      {R"({"type":"object","$ref":"#"})", ErrorCode::kUnsupported, {"'type'", "'$ref'"}},
      {"false", ErrorCode::kInvalidArgument, {"accepts no value"}},
  };
  for (const Case& c : cases) {
    auto r = json_schema_regex(ojson::parse(c.schema), small_opts());
    ASSERT_FALSE(r.ok()) << c.schema;
    EXPECT_EQ(r.error().code, c.code) << c.schema << ": " << r.error().message;
    for (const std::string& s : c.says)
      EXPECT_NE(r.error().message.find(s), std::string::npos)
          << c.schema << ": " << r.error().message << " lacks " << s;
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
  }
}

TEST(JsonRegexErrors, TooLargeAndBadOptions) {
  // 40 optional properties of untyped values: every prefix is a branch of its own.
  ojson wide = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 40; ++i) wide["properties"]["p" + std::to_string(i)] = ojson::object();
  JsonRegexOptions deep;
  deep.max_depth = 4;
  auto r = json_schema_regex(wide, deep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("too large"), std::string::npos) << r.error().message;
  deep.max_depth = 0;
  EXPECT_FALSE(json_schema_regex(ojson::parse("{}"), deep).ok());
  deep.max_depth = kMaxJsonDepth + 1;
  EXPECT_FALSE(json_schema_regex(ojson::parse("{}"), deep).ok());
  // A schema nested past any sensible depth is refused, not a stack overflow.
  ojson nested = {{"type", "string"}};
  for (int i = 0; i < 1000; ++i) nested = {{"type", "array"}, {"items", nested}};
  r = json_schema_regex(nested, small_opts());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("deeper"), std::string::npos) << r.error().message;
}

TEST(JsonRegexWhitespace, IsTheOptionsOwn) {
  const ojson schema = ojson::parse(
      R"js({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":{"type":"null"}}})js");
  JsonRegexOptions none = small_opts();
  none.whitespace = "";
  const std::regex compact = compile(schema, none);
  EXPECT_TRUE(match(compact, R"({"a":[1,2],"b":null})"));
  EXPECT_FALSE(match(compact, R"({"a": [1,2],"b":null})"));
  const std::regex spaced = compile(schema);
  EXPECT_TRUE(match(spaced, R"({"a": [1, 2], "b": null})"));
  EXPECT_FALSE(match(spaced, R"({"a":  [1,2]})"));  // one space at most
  EXPECT_FALSE(match(spaced, R"({ "a":[1,2]})"));   // none inside the braces
  EXPECT_FALSE(match(spaced, R"({"a":[1 ,2]})"));   // nor before a comma
  EXPECT_FALSE(match(spaced, R"({"a":[1,2] ,"b":null})"));
}

}  // namespace
}  // namespace lragent::guide
