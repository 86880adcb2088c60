#include "common/json/json.h"

#include <string>
#include <vector>

#include "common/status/status.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::json {
namespace {

using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

constexpr char kConfig[] = R"({
  "model_type": "kimi_k3",
  "text_config": {
    "hidden_size": 7168,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": false,
    "rope_scaling": null,
    "linear_attn_config": {"kda_layers": [1, 2, 3, "4"], "head_dim": 128},
    "big": 18446744073709551615,
    "neg": -5,
    "ratio": 2,
    "names": ["a", "b"],
    "weights": [0.5, 1, -2.25]
  }
})";

class JsonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<nlohmann::json> parsed = Parse(kConfig, "config.json");
    ASSERT_OK(parsed.status());
    doc_ = std::move(*parsed);
  }
  Cursor Root() const { return Cursor::Root(doc_, "config.json"); }
  Cursor Text() const { return *Root().Object("text_config"); }

  nlohmann::json doc_;
};

// A typical caller, written with the status macros.
absl::StatusOr<int64_t> HeadDim(const Cursor& root) {
  COLI_ASSIGN_OR_RETURN(Cursor text, root.Object("text_config"));
  COLI_ASSIGN_OR_RETURN(Cursor linear, text.Object("linear_attn_config"));
  COLI_ASSIGN_OR_RETURN(int64_t head_dim, linear.Int("head_dim"));
  return head_dim;
}

TEST_F(JsonTest, TypedGettersReadValues) {
  ASSERT_OK_AND_ASSIGN(int64_t head_dim, HeadDim(Root()));
  EXPECT_EQ(head_dim, 128);
  Cursor text = Text();
  EXPECT_EQ(text.path(), "text_config");
  EXPECT_EQ(*text.Int("hidden_size"), 7168);
  EXPECT_EQ(*text.Int("neg"), -5);
  EXPECT_DOUBLE_EQ(*text.Double("rms_norm_eps"), 1e-6);
  EXPECT_DOUBLE_EQ(*text.Double("ratio"), 2.0);  // integers are numbers
  EXPECT_EQ(*text.Bool("tie_word_embeddings"), false);
  EXPECT_EQ(*Root().String("model_type"), "kimi_k3");
  EXPECT_THAT(*text.StringArray("names"), ElementsAre("a", "b"));
  EXPECT_THAT(*text.DoubleArray("weights"), ElementsAre(0.5, 1.0, -2.25));
  EXPECT_TRUE(text.Has("rope_scaling"));
  EXPECT_FALSE(text.Has("nope"));
  EXPECT_THAT(*text.Keys(), ::testing::Contains("hidden_size"));
}

TEST_F(JsonTest, ErrorsCarryTheFullPath) {
  absl::StatusOr<Cursor> linear = Text().Object("linear_attn_config");
  ASSERT_OK(linear.status());
  EXPECT_EQ(linear->path(), "text_config.linear_attn_config");
  EXPECT_THAT(linear->IntArray("kda_layers"),
              StatusIs(kInvalid,
                       "config.json: text_config.linear_attn_config.kda_layers[3]: "
                       "expected integer, got string"));
  EXPECT_THAT(Text().Int("missing"),
              StatusIs(kInvalid, "config.json: text_config.missing: required key is missing"));
  EXPECT_THAT(
      Text().String("hidden_size"),
      StatusIs(kInvalid, "config.json: text_config.hidden_size: expected string, got integer"));
  EXPECT_THAT(Text().Bool("hidden_size"), StatusIs(kInvalid, HasSubstr("expected boolean")));
  EXPECT_THAT(Text().Int("rms_norm_eps"),
              StatusIs(kInvalid, HasSubstr("expected integer, got number")));
  EXPECT_THAT(Text().Int("big"),
              StatusIs(kInvalid, HasSubstr("text_config.big: integer "
                                           "18446744073709551615 is out of range")));
  EXPECT_THAT(Text().Object("hidden_size"), StatusIs(kInvalid, HasSubstr("expected object")));
  EXPECT_THAT(Text().Array("hidden_size"), StatusIs(kInvalid, HasSubstr("expected array")));
  EXPECT_THAT(Text().IntArray("hidden_size"), StatusIs(kInvalid, HasSubstr("expected array")));
  // Object access on a non-object names the non-object.
  Cursor hidden = *Text().Member("hidden_size");
  EXPECT_THAT(
      hidden.Int("x"),
      StatusIs(kInvalid, "config.json: text_config.hidden_size: expected object, got integer"));
}

TEST_F(JsonTest, OptionalGettersTreatMissingAndNullAlike) {
  Cursor text = Text();
  EXPECT_EQ(*text.OptionalInt("missing"), std::nullopt);
  EXPECT_EQ(*text.OptionalObject("rope_scaling"), std::nullopt);
  EXPECT_EQ(*text.OptionalInt("hidden_size"), 7168);
  EXPECT_EQ(*text.IntOr("missing", 9), 9);
  EXPECT_EQ(*text.IntOr("rope_scaling", 9), 9);
  EXPECT_EQ(*text.DoubleOr("missing", 0.25), 0.25);
  EXPECT_EQ(*text.BoolOr("tie_word_embeddings", true), false);
  EXPECT_EQ(*text.StringOr("missing", "dflt"), "dflt");
  EXPECT_THAT(
      text.OptionalIntArray("weights"),
      StatusIs(kInvalid, HasSubstr("text_config.weights[0]: expected integer, got number")));
  EXPECT_THAT(*text.OptionalIntArray("missing"), std::nullopt);
  // Present with the wrong type is still an error.
  EXPECT_THAT(text.OptionalString("hidden_size"),
              StatusIs(kInvalid, HasSubstr("text_config.hidden_size: expected string")));
  EXPECT_THAT(text.IntOr("names", 1), StatusIs(kInvalid, HasSubstr("expected integer, got array")));
  EXPECT_THAT(text.OptionalBool("neg"), StatusIs(kInvalid, HasSubstr("expected boolean")));
  EXPECT_THAT(text.OptionalDouble("names"), StatusIs(kInvalid, HasSubstr("expected number")));
}

TEST_F(JsonTest, ArrayElements) {
  Cursor names = *Text().Array("names");
  EXPECT_EQ(*names.Size(), 2u);
  Cursor second = *names.At(1);
  EXPECT_EQ(second.path(), "text_config.names[1]");
  EXPECT_EQ(*second.AsString(), "b");
  EXPECT_THAT(names.At(2),
              StatusIs(kInvalid, HasSubstr("text_config.names: index 2 out of range")));
  ASSERT_OK_AND_ASSIGN(std::vector<Cursor> elements, names.Elements());
  ASSERT_EQ(elements.size(), 2u);
  EXPECT_EQ(elements[0].path(), "text_config.names[0]");
  EXPECT_THAT(Text().Size(), StatusIs(kInvalid, HasSubstr("expected array, got object")));
}

TEST_F(JsonTest, CheckKeysNamesTheFirstUnknownKey) {
  Cursor linear = *Text().Object("linear_attn_config");
  EXPECT_OK(linear.CheckKeys({"kda_layers", "head_dim", "unused"}));
  EXPECT_THAT(linear.CheckKeys({"kda_layers"}),
              StatusIs(kInvalid, HasSubstr("config.json: text_config.linear_attn_config.head_dim: "
                                           "unknown key (allowed: kda_layers)")));
  EXPECT_THAT(Text().Member("hidden_size")->CheckKeys({"a"}),
              StatusIs(kInvalid, HasSubstr("expected object")));
}

TEST(JsonPath, KeysThatAreNotIdentifiersAreQuoted) {
  EXPECT_EQ(JoinKey("", "a"), "a");
  EXPECT_EQ(JoinKey("a", "b_c-1"), "a.b_c-1");
  EXPECT_EQ(JoinKey("weight_map", "model.norm.weight"), "weight_map[\"model.norm.weight\"]");
  EXPECT_EQ(JoinKey("", ""), "[\"\"]");
  EXPECT_EQ(JoinIndex("kda_layers", 3), "kda_layers[3]");
}

TEST(JsonParse, SyntaxErrorGivesLineAndColumn) {
  EXPECT_THAT(Parse("{\n  \"a\": 1,\n  \"b\": tru }", "cfg.json"),
              StatusIs(kInvalid, HasSubstr("cfg.json: parse error at line 3, column")));
  EXPECT_THAT(Parse("", "empty.json"), StatusIs(kInvalid, HasSubstr("empty.json")));
  EXPECT_THAT(Parse("{} x"), StatusIs(kInvalid, HasSubstr("line 1, column 4")));
  EXPECT_THAT(Parse("\"\xff\""), StatusIs(kInvalid, HasSubstr("UTF-8")));
}

TEST(JsonParse, DuplicateKeysAreRefusedWithTheirPath) {
  EXPECT_THAT(Parse(R"({"a": {"b": [1, {"c": 1, "c": 2}]}})", "d.json"),
              StatusIs(kInvalid, "d.json: a.b[1].c: duplicate key \"c\""));
  EXPECT_THAT(Parse(R"({"x": 1, "x": 1})"), StatusIs(kInvalid, "x: duplicate key \"x\""));
  // The same key in different objects is fine.
  EXPECT_OK(Parse(R"({"a": {"k": 1}, "b": {"k": 1}, "c": [{"k": 1}, {"k": 2}]})"));
}

TEST(JsonParse, DeepNestingIsRefused) {
  std::string ok(kMaxDepth, '[');
  ok += std::string(kMaxDepth, ']');
  EXPECT_OK(Parse(ok));
  std::string deep(100000, '[');
  EXPECT_THAT(Parse(deep, "deep.json"),
              StatusIs(kInvalid, HasSubstr("deep.json: nesting deeper than 128 levels")));
}

TEST(JsonParse, TypeNames) {
  ASSERT_OK_AND_ASSIGN(nlohmann::json v, Parse(R"([1, -1, 1.5, "s", true, null, {}, []])"));
  std::vector<std::string_view> names;
  for (const auto& e : v) names.push_back(TypeName(e));
  EXPECT_THAT(names, ElementsAre("integer", "integer", "number", "string", "boolean", "null",
                                 "object", "array"));
}

TEST(JsonCursor, RootErrorsNameTheSource) {
  ASSERT_OK_AND_ASSIGN(nlohmann::json v, Parse("[1]"));
  EXPECT_THAT(Cursor::Root(v, "x.json").Int("a"),
              StatusIs(kInvalid, "x.json: expected object, got array"));
  EXPECT_THAT(Cursor::Root(v).Int("a"), StatusIs(kInvalid, "(root): expected object, got array"));
}

}  // namespace
}  // namespace coli::json
