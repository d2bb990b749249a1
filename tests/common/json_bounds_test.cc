// JSON from clients within bounds: nesting refused before a tree is built, values quoted short.
#include "common/json_bounds.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(JsonBoundsTest, NestingDeeperThanTheLimitIsRefusedNamingWhereItWent) {
  const std::string deep = std::string(80'000, '[') + std::string(80'000, ']');
  absl::Status s = CheckJsonDepth(deep, "the body");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the body nests arrays and objects deeper than 64 levels"));
  EXPECT_THAT(s.message(), HasSubstr("at byte 64"));
  EXPECT_EQ(ParseJsonWithin(deep, "the body").status().code(), absl::StatusCode::kInvalidArgument);
  const std::string objects = std::string(70, '{');
  EXPECT_FALSE(CheckJsonDepth(objects, "x").ok()) << "objects count as arrays do";
}

TEST(JsonBoundsTest, AtTheLimitAndBracketsInsideStringsPass) {
  const std::string at_limit = std::string(64, '[') + std::string(64, ']');
  EXPECT_TRUE(CheckJsonDepth(at_limit, "x").ok());
  EXPECT_TRUE(ParseJsonWithin(at_limit, "x").ok());
  const std::string in_string = "[\"" + std::string(100, '[') + "\\\"[[[\"]";
  EXPECT_TRUE(CheckJsonDepth(in_string, "x").ok());
  auto parsed = ParseJsonWithin(in_string, "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)[0].get<std::string>().size(), 104u);
}

TEST(JsonBoundsTest, InvalidJsonNamesWhatAndWhere) {
  absl::StatusOr<nlohmann::json> s = ParseJsonWithin("{\"a\": }", "the spec");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("the spec is not valid JSON"));
}

TEST(JsonBoundsTest, PreviewsNeverQuoteAContainerOrALongStringWhole) {
  EXPECT_EQ(JsonPreview(nlohmann::json::parse("[1,2,3]")), "an array of 3 elements");
  EXPECT_EQ(JsonPreview(nlohmann::json::parse("{\"a\":1}")), "an object of 1 member");
  EXPECT_EQ(JsonPreview(nlohmann::json(2.5)), "2.5");
  EXPECT_EQ(JsonPreview(nlohmann::json("ab")), "\"ab\"");
  const std::string preview = JsonPreview(nlohmann::json(std::string(10'000, 'x')));
  EXPECT_LT(preview.size(), 100u);
  EXPECT_THAT(preview, HasSubstr("(10000 bytes)"));
}

}  // namespace
}  // namespace kiln
