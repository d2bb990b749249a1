// Tensor decoding and encoding: inputs are viewed in place in the request in the right form, and
// outputs are laid out with the protocol's names, datatypes, shapes and sizes.
#include "server/serving/tensor_codec.h"

#include <gtest/gtest.h>

#include "tests/serving/serving_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::serving {
namespace {

using testing::Form;
using testing::MakeRequest;

TEST(TensorCodecTest, InputsAreViewedInPlaceInTheirForm) {
  const std::vector<uint8_t> images = testing::SampleImages(3, 1);
  struct Case {
    std::string datatype;
    Form form;
    PixelEncoding encoding;
  } cases[] = {{"UINT8", Form::kRaw, PixelEncoding::kU8},
               {"UINT8", Form::kTyped, PixelEncoding::kU32},
               {"FP32", Form::kRaw, PixelEncoding::kF32},
               {"FP32", Form::kTyped, PixelEncoding::kF32}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.datatype);
    auto request = MakeRequest("m", images.data(), 3, c.datatype, c.form, {3, 1, 28, 28});
    auto input = DecodeInput(request, 784);
    ASSERT_OK(input) << input.status();
    EXPECT_EQ(input->samples, 3);
    EXPECT_EQ(input->encoding, c.encoding);
    const void* expected =
        c.form == Form::kRaw ? static_cast<const void*>(request.raw_input_contents(0).data())
        : c.datatype == "UINT8"
            ? static_cast<const void*>(request.inputs(0).contents().uint_contents().data())
            : request.inputs(0).contents().fp32_contents().data();
    EXPECT_EQ(input->data, expected);
  }
}

TEST(TensorCodecTest, AnyShapeWithTheModelsPerSampleCountIsAccepted) {
  const std::vector<uint8_t> images = testing::SampleImages(2, 1);
  for (std::vector<int64_t> shape :
       {std::vector<int64_t>{2, 784}, {2, 28, 28}, {2, 1, 28, 28}, {2, 4, 196}}) {
    auto request = MakeRequest("m", images.data(), 2, "UINT8", Form::kRaw, shape);
    EXPECT_OK(DecodeInput(request, 784));
  }
}

TEST(TensorCodecTest, OutputsDefaultToBothAndKeepTheRequestedOrder) {
  inference::ModelInferRequest request;
  auto all = SelectOutputs(request);
  ASSERT_OK(all);
  ASSERT_EQ(all->count, 2);
  EXPECT_EQ(all->kinds[0], OutputKind::kProbabilities);
  EXPECT_EQ(all->kinds[1], OutputKind::kClass);
  request.add_outputs()->set_name("class");
  request.add_outputs()->set_name("probabilities");
  auto both = SelectOutputs(request);
  ASSERT_OK(both);
  EXPECT_EQ(both->kinds[0], OutputKind::kClass);
  EXPECT_EQ(both->kinds[1], OutputKind::kProbabilities);
}

TEST(TensorCodecTest, PreparedOutputsHaveTheProtocolsLayout) {
  OutputSelection both;
  inference::ModelInferResponse typed;
  OutputBuffers t = PrepareOutputs(both, 3, 10, ContentsForm::kTyped, &typed);
  ASSERT_EQ(typed.outputs_size(), 2);
  EXPECT_EQ(typed.outputs(0).name(), "probabilities");
  EXPECT_EQ(typed.outputs(0).datatype(), "FP32");
  EXPECT_EQ(std::vector<int64_t>(typed.outputs(0).shape().begin(), typed.outputs(0).shape().end()),
            std::vector<int64_t>({3, 10}));
  EXPECT_EQ(typed.outputs(0).contents().fp32_contents_size(), 30);
  EXPECT_EQ(typed.outputs(1).name(), "class");
  EXPECT_EQ(typed.outputs(1).datatype(), "INT64");
  EXPECT_EQ(typed.outputs(1).contents().int64_contents_size(), 3);
  EXPECT_EQ(typed.raw_output_contents_size(), 0);
  EXPECT_EQ(t.probabilities,
            reinterpret_cast<const char*>(typed.outputs(0).contents().fp32_contents().data()));

  inference::ModelInferResponse raw;
  OutputSelection only_class;
  only_class.kinds[0] = OutputKind::kClass;
  only_class.count = 1;
  OutputBuffers r = PrepareOutputs(only_class, 3, 10, ContentsForm::kRaw, &raw);
  ASSERT_EQ(raw.outputs_size(), 1);
  EXPECT_FALSE(raw.outputs(0).has_contents());
  ASSERT_EQ(raw.raw_output_contents_size(), 1);
  EXPECT_EQ(raw.raw_output_contents(0).size(), 3 * sizeof(int64_t));
  EXPECT_EQ(r.probabilities, nullptr);
  EXPECT_EQ(r.classes, raw.raw_output_contents(0).data());
}

}  // namespace
}  // namespace kiln::serving
