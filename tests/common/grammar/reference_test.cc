// The matcher against an independent reference (grammar_ref.py: Python's json
// module and python3-jsonschema), for a set of schemas covering nested objects,
// bounded arrays, enums, anyOf / oneOf, $ref recursion, strings with escapes
// and non-ASCII text:
//  - random walks of the matcher (a random allowed byte at a time until it may
//  or must end)
//    give documents the reference parses and validates, and never reach a dead
//    end;
//  - instances the reference generates and accepts, serialised in schema key
//  order compactly,
//    with ", " / ": ", with indent=2 and ASCII-escaped, are accepted
//    completely;
//  - mutations of them the reference refuses are never accepted as complete.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grammar/json_constraint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace coli::grammar {
namespace {

struct Case {
  const char* name;
  const char* schema;
  // Strings, arrays and numbers all bounded: every walk must end (bounded whitespace).
  bool bounded = false;
};

const Case kCases[] = {
    {"nested_objects",
     R"({"type":"object","properties":{"id":{"type":"integer"},
         "name":{"type":"string","minLength":1,"maxLength":6},
         "tags":{"type":"array","items":{"type":"string","maxLength":3},"maxItems":3},
         "owner":{"type":"object","properties":{"email":{"type":"string","maxLength":5},
           "active":{"type":"boolean"}},"required":["active"],"additionalProperties":false}},
         "required":["id","owner"],"additionalProperties":false})",
     true},
    {"bounded_arrays",
     R"({"type":"array","prefixItems":[{"type":"integer"},{"enum":["a","b"]}],
         "items":{"type":"number"},"minItems":2,"maxItems":4})",
     true},
    {"enums_and_nullable",
     R"({"type":"object","properties":{"color":{"enum":["red","green",null,3,1.5,true]},
         "k":{"const":"fixed"},"maybe":{"type":["string","null"],"maxLength":2},
         "n":{"type":["integer","boolean"]},"o":{"type":["integer","null"]}},
         "required":["color","k","maybe","n"],"additionalProperties":false})",
     true},
    {"any_of",
     R"({"anyOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},
           "required":["kind","r"],"additionalProperties":false},
         {"type":"object","properties":{"kind":{"const":"rect"},"w":{"type":"integer"},
           "h":{"type":"integer"}},"required":["kind","w","h"],"additionalProperties":false},
         {"type":"array","items":{"type":"integer"},"maxItems":2}]})",
     true},
    {"ref_tree",
     R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
         "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},
         "required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})"},
    {"ref_list_one_of",
     R"({"definitions":{"list":{"oneOf":[{"type":"null"},{"type":"object","properties":{
         "head":{"type":"string","maxLength":2},"tail":{"$ref":"#/definitions/list"}},
         "required":["head","tail"],"additionalProperties":false}]}},
         "$ref":"#/definitions/list"})"},
    {"strings",
     R"({"type":"object","properties":{"s":{"type":"string","minLength":2,"maxLength":5},
         "t":{"type":"string","maxLength":3},"u":{"type":"string","minLength":1}},
         "required":["s","t"],"additionalProperties":false})"},
    {"additional_schema",
     R"({"type":"object","properties":{"a":{"type":"integer"}},
         "additionalProperties":{"type":"string","maxLength":2}})"},
    {"free_object", R"({"type":"object"})"},
    {"top_level_number", R"({"type":["number","null"]})", true},
    // Patterns match the decoded value (unescaped characters only) and are unanchored
    // (re.search): "w" and "any_ab" must CONTAIN a match, maxLength forces one in time.
    {"patterns",
     R"({"type":"object","properties":{
         "code":{"type":"string","pattern":"^[A-Z]{2}-\\d{2,4}$","examples":["AB-12","ZZ-0000"]},
         "w":{"type":"string","pattern":"(cat|dog)s?","maxLength":8,"examples":["cats","a dog!"]},
         "neg":{"type":"string","pattern":"^[^a-z0-9]+x?$","maxLength":5,"examples":["AB","éx"]},
         "alt":{"type":"string","pattern":"^a|b$","maxLength":4,"examples":["a","zb","ab"]},
         "opt":{"type":"string","pattern":"^(\\w+\\.)?\\w{1,3}$","maxLength":10,
                "examples":["a.b","xyz","q_1.abc"]},
         "dot":{"type":"string","pattern":"^.{2}\\s\\S$","examples":["ab c","€. x"]},
         "any_ab":{"type":"string","pattern":"a[b-d]|[^\\w]{2}","maxLength":6,
                   "examples":["xab","!!","__ad__"]}},
         "required":["code","w","neg","alt","opt","dot","any_ab"],"additionalProperties":false})",
     true},
    {"formats",
     R"({"type":"object","properties":{
         "date":{"type":"string","format":"date","examples":["2024-02-29","1999-12-31"]},
         "time":{"type":"string","format":"time","examples":["23:59:59Z","00:00:00.5+05:30"]},
         "dt":{"type":"string","format":"date-time","examples":["2000-02-29T12:00:00-01:00"]},
         "uuid":{"type":"string","format":"uuid",
                 "examples":["123e4567-e89b-12d3-a456-426614174000"]},
         "email":{"type":"string","format":"email","maxLength":30,"examples":["a.b@c.de"]},
         "ipv4":{"type":"string","format":"ipv4","examples":["192.168.0.1","0.0.0.0"]},
         "ipv6":{"type":"string","format":"ipv6","examples":["::1","fe80::1:2","1:2:3:4:5:6:7::"]},
         "host":{"type":"string","format":"hostname","maxLength":20,"examples":["a-b.example"]},
         "other":{"type":"string","format":"x-unknown","maxLength":2}},
         "required":["date","time","dt","uuid","email","ipv4","ipv6","host"],
         "additionalProperties":false})",
     true},
    {"integer_ranges",
     R"({"type":"object","properties":{
         "a":{"type":"integer","minimum":-5,"maximum":123},
         "b":{"type":"integer","exclusiveMinimum":7,"exclusiveMaximum":1000.5},
         "c":{"type":"integer","minimum":-1234567},
         "d":{"minimum":2,"maximum":9},
         "g":{"type":"number","minimum":-2,"exclusiveMaximum":3},
         "h":{"type":"number","exclusiveMinimum":0,"maximum":1},
         "e":{"type":["integer","null"],"maximum":-20,"minimum":-31},
         "f":{"type":"integer","minimum":99,"maximum":100}},
         "required":["a","b","c","d","e","f","g","h"],"additionalProperties":false})",
     true},
};

std::string Hex(std::string_view s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string Unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  return out;
}

// A random walk: a uniformly random allowed byte at a time; stops where the
// matcher may end (with probability 1/3) or must end. nullopt when longer than
// `budget` bytes. A state that allows no byte but cannot end is a dead end: a
// failure.
std::optional<std::string> RandomWalk(const std::shared_ptr<const JsonConstraint>& c,
                                      std::mt19937& rng, size_t budget) {
  JsonMatcher m(c);
  std::string doc;
  while (doc.size() < budget) {
    std::vector<char> next;
    for (int b = 0; b < 256; ++b) {
      JsonMatcher copy = m;
      const char byte = static_cast<char>(b);
      if (copy.Accept(std::string_view(&byte, 1))) next.push_back(byte);
    }
    if (next.empty()) {
      EXPECT_TRUE(m.CanEnd()) << "dead end after " << doc;
      EXPECT_TRUE(m.MustEnd()) << doc;
      return doc;
    }
    EXPECT_FALSE(m.MustEnd()) << doc;
    if (m.CanEnd() && rng() % 3 == 0) return doc;
    const char b = next[rng() % next.size()];
    EXPECT_TRUE(m.Accept(std::string_view(&b, 1)));
    doc += b;
  }
  return std::nullopt;
}

bool Complete(const std::shared_ptr<const JsonConstraint>& c, std::string_view doc) {
  JsonMatcher m(c);
  return m.Accept(doc) && m.CanEnd();
}

nlohmann::json RunReference(const nlohmann::ordered_json& cases) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/grammar_ref_", getpid(), ".json");
  std::ofstream(path) << cases.dump();
  const std::string cmd = absl::StrCat(GRAMMAR_TEST_PYTHON, " ", GRAMMAR_TEST_REF, " ", path);
  FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  if (p == nullptr) return {};
  std::string all;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) all.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd << " failed (the reference needs Debian's python3-jsonschema)";
  std::remove(path.c_str());
  return nlohmann::json::parse(all, nullptr, /*allow_exceptions=*/false);
}

TEST(JsonMatcherReference, WalksValidateAndReferenceDocumentsMatch) {
  std::mt19937 rng(20261129);
  nlohmann::ordered_json input = {{"seed", 7}, {"cases", nlohmann::ordered_json::array()}};
  std::vector<std::shared_ptr<const JsonConstraint>> constraints;
  for (const Case& k : kCases) {
    auto c = JsonConstraint::FromSchema(k.schema);
    ASSERT_TRUE(c.ok()) << k.name << ": " << c.status();
    constraints.push_back(*c);
    nlohmann::ordered_json walks = nlohmann::ordered_json::array();
    int finished = 0;
    for (int i = 0; i < 30; ++i) {
      std::optional<std::string> doc = RandomWalk(*c, rng, 4000);
      if (!doc) continue;
      ++finished;
      walks.push_back(Hex(*doc));
    }
    EXPECT_GE(finished, k.bounded ? 30 : 20) << k.name << ": walks must end within the budget";
    input["cases"].push_back(nlohmann::ordered_json{
        {"name", k.name},
        {"schema", nlohmann::ordered_json::parse(k.schema)},
        {"walks", walks},
        {"unescaped_only",
         std::string_view(k.schema).find("\"pattern\"") != std::string::npos ||
             std::string_view(k.schema).find("\"format\"") != std::string::npos}});
  }
  const nlohmann::json out = RunReference(input);
  ASSERT_TRUE(out.is_object() && out.contains("cases")) << "reference failed";
  ASSERT_EQ(out["cases"].size(), std::size(kCases));
  for (size_t i = 0; i < std::size(kCases); ++i) {
    const nlohmann::json& r = out["cases"][i];
    SCOPED_TRACE(kCases[i].name);
    for (const auto& e : r["walk_errors"]) ADD_FAILURE() << "reference refuses: " << e;
    EXPECT_GT(r["valid"].size(), 0u);
    for (const auto& h : r["valid"]) {
      const std::string doc = Unhex(h.get<std::string>());
      EXPECT_TRUE(Complete(constraints[i], doc)) << "refused a valid document: " << doc;
    }
    EXPECT_GT(r["invalid"].size(), 10u);
    for (const auto& h : r["invalid"]) {
      const std::string doc = Unhex(h.get<std::string>());
      EXPECT_FALSE(Complete(constraints[i], doc)) << "accepted an invalid document: " << doc;
    }
  }
}

}  // namespace
}  // namespace coli::grammar
