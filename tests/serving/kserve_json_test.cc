// KServe v2 REST infer bodies parsed into ModelInferRequest (server/serving/kserve_json.h), with
// each input's "data" decoded from its packed elements (server/serving/infer_body_reader.h): a
// large body into the right typed values, nested rows, mixed integers and fractions, "datatype"
// after "data", every datatype's field, and malformed data refused naming the input and element.
#include "server/serving/kserve_json.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tests/support/status_matchers.h"

namespace kiln::serving {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<RestInferRequest> Parse(const std::string& body) {
  return ParseInferRequest(body, std::nullopt, "m", "");
}

// A body of one input "x" whose members are `members` (JSON text, in that order).
std::string OneInput(const std::string& members) {
  return absl::StrCat(R"({"inputs": [{)", members, "}]}");
}

TEST(KServeJsonTest, ALargeBodyParsesIntoItsTypedValues) {
  // 2000 rows of 28 (56,000 values, 0.6 MB of text), each value printed as a client prints it.
  constexpr int kRows = 2000, kCols = 28;
  std::vector<float> expected;
  std::string data = "[";
  for (int r = 0; r < kRows; ++r) {
    data += r == 0 ? "[" : "],[";
    for (int c = 0; c < kCols; ++c) {
      const float v = static_cast<float>(r * kCols + c) / 7.f - 1000.f;
      char text[32];
      std::snprintf(text, sizeof(text), "%.9g", static_cast<double>(v));
      if (c > 0) data += ",";
      data += text;
      expected.push_back(v);  // 9 significant digits are enough to read a float back exactly
    }
  }
  data += "]]";
  const std::string body = OneInput(absl::StrCat(R"("name": "x", "datatype": "FP32", "shape": [)",
                                                 kRows, ", ", kCols, R"(], "data": )", data));
  ASSERT_GT(body.size(), 500'000u);
  absl::StatusOr<RestInferRequest> parsed = Parse(body);
  ASSERT_OK(parsed);
  const auto& in = parsed->request.inputs(0);
  EXPECT_THAT(in.shape(), ElementsAre(kRows, kCols));
  ASSERT_EQ(in.contents().fp32_contents_size(), kRows * kCols);
  for (int i = 0; i < kRows * kCols; ++i) {
    ASSERT_EQ(in.contents().fp32_contents(i), expected[i]) << "element " << i;
  }
}

TEST(KServeJsonTest, NestedRowsMixedNumbersAndDatatypeAfterData) {
  // "data" first, "datatype" last.
  absl::StatusOr<RestInferRequest> parsed = Parse(OneInput(
      R"("data": [[1, 2.5, -3], [4e0, -0, 0.1]], "shape": [2, 3], "name": "x",
         "datatype": "FP32")"));
  ASSERT_OK(parsed);
  EXPECT_THAT(parsed->request.inputs(0).contents().fp32_contents(),
              ElementsAre(1.f, 2.5f, -3.f, 4.f, 0.f, 0.1f));
  EXPECT_EQ(parsed->request.inputs(0).datatype(), "FP32");

  // Rows are not checked against each other here: they are the elements in row-major order,
  // and the model checks their count against the shape.
  parsed = Parse(OneInput(R"("name": "x", "shape": [3], "data": [[1], [[2, 3]], []],
                             "datatype": "INT64")"));
  ASSERT_OK(parsed);
  EXPECT_THAT(parsed->request.inputs(0).contents().int64_contents(), ElementsAre(1, 2, 3));

  // A single value is one element; a repeated key's last value counts, as for every member.
  parsed = Parse(OneInput(R"("name": "x", "datatype": "UINT8", "shape": [1], "data": [9, 9],
                             "data": 7)"));
  ASSERT_OK(parsed);
  EXPECT_THAT(parsed->request.inputs(0).contents().uint_contents(), ElementsAre(7u));
}

TEST(KServeJsonTest, EveryDatatypeFillsItsField) {
  auto contents = [](const std::string& datatype, const std::string& data) {
    absl::StatusOr<RestInferRequest> parsed = Parse(OneInput(absl::StrCat(
        R"("name": "x", "shape": [3], "data": )", data, R"(, "datatype": ")", datatype, "\"")));
    EXPECT_OK(parsed) << datatype;
    return parsed.ok() ? parsed->request.inputs(0).contents() : inference::InferTensorContents();
  };
  EXPECT_THAT(contents("FP64", "[0.1, -2, 18446744073709551615]").fp64_contents(),
              ElementsAre(0.1, -2.0, 18446744073709551615.0));
  EXPECT_THAT(contents("UINT32", "[0, 4294967295, -0]").uint_contents(),
              ElementsAre(0u, 4294967295u, 0u));
  EXPECT_THAT(contents("UINT64", "[18446744073709551615, 1, 0]").uint64_contents(),
              ElementsAre(18446744073709551615u, 1u, 0u));
  EXPECT_THAT(contents("INT32", "[-2147483648, 2147483647, 0]").int_contents(),
              ElementsAre(-2147483648, 2147483647, 0));
  EXPECT_THAT(contents("INT64", "[-9223372036854775808, 9223372036854775807, -1]").int64_contents(),
              ElementsAre(INT64_MIN, INT64_MAX, -1));
  EXPECT_THAT(contents("BOOL", "[true, false, true]").bool_contents(),
              ElementsAre(true, false, true));
  EXPECT_THAT(contents("BYTES", R"(["a", "", "\u00e9"])").bytes_contents(),
              ElementsAre("a", "", "\xc3\xa9"));
  // A datatype the protocol's fields do not hold keeps no data; the model's check names it.
  const inference::InferTensorContents none = contents("FP16", "[1, null, {}]");
  EXPECT_EQ(none.ByteSizeLong(), 0u);
}

TEST(KServeJsonTest, MalformedDataIsRefusedNamingTheInputAndElement) {
  struct Case {
    std::string datatype;
    std::string data;
    std::string message;
  } cases[] = {
      {"FP32", R"([1, 2, "3"])", R"(input "x": data[2]: "3" is not a number)"},
      {"FP32", "[[1, 2], [true, 4]]", R"(input "x": data[2]: true is not a number)"},
      {"FP32", "[1, null]", R"(input "x": data[1]: null is not a number)"},
      {"FP64", R"([{"a": 1, "b": [2], "a": 3}])",
       R"(input "x": data[0]: an object of 2 members is not a number)"},
      {"INT32", "[1, 2.5]", R"(input "x": data[1]: 2.5 is not a INT32 value)"},
      {"INT8", "[2147483648]", R"(input "x": data[0]: 2147483648 is not a INT8 value)"},
      {"UINT8", "[0, -1]", R"(input "x": data[1]: -1 is not a UINT8 value)"},
      {"UINT64", "[18446744073709551616]",
       R"(input "x": data[0]: 1.8446744073709552e+19 is not a UINT64 value)"},
      {"BOOL", "[true, 1]", R"(input "x": data[1]: 1 is not a BOOL value)"},
      {"BYTES", R"(["a", 1])", R"(input "x": data[1]: 1 is not a BYTES string)"},
      {"FP32", std::string(33, '[') + std::string(33, ']'),
       R"(input "x": nested deeper than 32 arrays)"},
  };
  for (const Case& c : cases) {
    // "datatype" before "data" and after it: the same answer.
    for (const std::string& body :
         {OneInput(absl::StrCat(R"("name": "x", "datatype": ")", c.datatype,
                                R"(", "shape": [2], "data": )", c.data)),
          OneInput(absl::StrCat(R"("name": "x", "shape": [2], "data": )", c.data,
                                R"(, "datatype": ")", c.datatype, "\""))}) {
      absl::StatusOr<RestInferRequest> parsed = Parse(body);
      ASSERT_FALSE(parsed.ok()) << body;
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << body;
      EXPECT_EQ(parsed.status().message(), c.message) << body;
    }
  }
  // A long string is quoted by its start.
  absl::StatusOr<RestInferRequest> parsed =
      Parse(OneInput(absl::StrCat(R"("name": "x", "datatype": "INT64", "shape": [1], "data": [")",
                                  std::string(5000, 'z'), "\"]")));
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("... (5000 bytes) is not a INT64 value"));
  EXPECT_LT(parsed.status().message().size(), 200u);
}

// Only the inputs' data was packed: a body whose bulk was a shape of millions of dimensions, or
// a member kilnd does not read, still cost a tree at 25 times its size. The tree now stops at
// 65,536 values, whatever holds them.
TEST(KServeJsonTest, ValuesOutsideTheDataAreBoundedWhereverTheyAre) {
  std::string many = "[0";
  for (int i = 1; i < 70000; ++i) absl::StrAppend(&many, ",", i % 10);
  many += "]";
  for (const std::string& body :
       {OneInput(absl::StrCat(R"("name": "x", "datatype": "FP32", "shape": )", many,
                              R"(, "data": [1])")),
        absl::StrCat(R"({"unread": )", many, R"(, "inputs": [{"name": "x", "datatype": "FP32", )",
                     R"("shape": [1], "data": [1]}]})")}) {
    absl::StatusOr<RestInferRequest> parsed = Parse(body);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr("holds more than 65536 values outside the inputs' \"data\""));
  }
  // As many values in the data are fine.
  ASSERT_OK(Parse(OneInput(absl::StrCat(R"("name": "x", "datatype": "FP32", "shape": [70000], )",
                                        R"("data": )", many))));
}

TEST(KServeJsonTest, DataOutsideTheInputsIsAValueLikeAnyOther) {
  // "data" elsewhere (an output, the body) is not an input's: read as before, here ignored.
  absl::StatusOr<RestInferRequest> parsed = Parse(
      R"({"data": [1, [2]], "inputs": [{"name": "x", "datatype": "INT32", "shape": [1],
          "data": [5], "parameters": {"data": 1}}], "outputs": [{"name": "y", "data": [true]}]})");
  ASSERT_OK(parsed);
  EXPECT_THAT(parsed->request.inputs(0).contents().int_contents(), ElementsAre(5));
  EXPECT_EQ(parsed->request.inputs(0).parameters().at("data").int64_param(), 1);
  EXPECT_EQ(parsed->request.outputs(0).name(), "y");
  // Text that is not JSON is named by where it broke, as the parser says it.
  parsed = Parse(OneInput(R"("name": "x", "datatype": "INT32", "shape": [1], "data": [1,)"));
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("the request body is not valid JSON: [json.exception.parse_error.101]"));
}

}  // namespace
}  // namespace kiln::serving
