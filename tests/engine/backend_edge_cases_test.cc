// The rules every backend shares at the edges of its ops' inputs (backend.h's Check* functions),
// one test body run over every backend: the CPU here, CUDA where a device is found.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_registry.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

class BackendEdgeCases : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string absent = testing::AbsentDeviceReason(GetParam());
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto b = CreateBackend(GetParam());
    ASSERT_OK(b);
    backend_ = std::move(*b);
  }

  Tensor Make(DType dtype, const Shape& shape) {
    auto t = backend_->Allocate(dtype, shape);
    EXPECT_OK(t);
    return t.ok() ? *t : Tensor();
  }

  std::unique_ptr<Backend> backend_;
};

Pool2dGeometry Pool(int h, int w, int kernel, int stride) {
  Pool2dGeometry g;
  g.batch = 2;
  g.channels = 3;
  g.in_h = h;
  g.in_w = w;
  g.kernel_h = g.kernel_w = kernel;
  g.stride_h = g.stride_w = stride;
  return g;
}

TEST_P(BackendEdgeCases, PoolingAnInputSmallerThanTheWindowIsInvalidArgument) {
  // (1 - 2) / 2 + 1 truncates to 1 output row: without the check the window reads past the input.
  for (const Pool2dGeometry& g : {Pool(1, 4, 2, 2), Pool(4, 1, 2, 2), Pool(2, 2, 3, 1)}) {
    SCOPED_TRACE(::testing::Message() << g.in_h << "x" << g.in_w << " k" << g.kernel_h);
    Tensor x = Make(DType::kF32, {g.batch, g.channels, g.in_h, g.in_w});
    Tensor y = Make(DType::kF32, {g.batch, g.channels, 4, 4});
    Tensor argmax = Make(DType::kI32, {g.batch, g.channels, 4, 4});
    const absl::Status fwd = backend_->MaxPool2dForward(g, x.f32(), y.f32(), argmax.i32());
    EXPECT_EQ(fwd.code(), absl::StatusCode::kInvalidArgument) << fwd;
    EXPECT_NE(fwd.message().find("smaller than"), std::string::npos) << fwd;
    const absl::Status bwd = backend_->MaxPool2dBackward(g, y.f32(), argmax.i32(), x.f32());
    EXPECT_EQ(bwd.code(), absl::StatusCode::kInvalidArgument) << bwd;
  }
  Tensor x = Make(DType::kF32, {2, 3, 4, 4});
  Tensor y = Make(DType::kF32, {2, 3, 4, 4});
  Tensor argmax = Make(DType::kI32, {2, 3, 4, 4});
  for (const Pool2dGeometry& g : {Pool(4, 4, 0, 1), Pool(4, 4, 2, 0)}) {
    EXPECT_EQ(backend_->MaxPool2dForward(g, x.f32(), y.f32(), argmax.i32()).code(),
              absl::StatusCode::kInvalidArgument);
  }
  // The window exactly as large as the input is fine: one output per plane.
  EXPECT_OK(backend_->MaxPool2dForward(Pool(2, 2, 2, 2), x.f32(), y.f32(), argmax.i32()));
}

// A NaN in a max-pooling window wins and stays the winner, as in PyTorch (`v > best || isnan(v)`):
// a later, larger value does not replace it. Parity tests cannot see a rule both backends share.
TEST_P(BackendEdgeCases, MaxPoolingKeepsANanWinnerAsPyTorchDoes) {
  const float nan = std::nanf("");
  // 2x2 windows (the CPU's vectorised path), then a 3x3 window with stride 1 (the general one).
  // Window 0: NaN first; window 1: NaN second, then larger values.
  Pool2dGeometry two = Pool(2, 4, 2, 2), three = Pool(3, 3, 3, 1);
  two.batch = two.channels = three.batch = three.channels = 1;
  const struct {
    Pool2dGeometry g;
    std::vector<float> x;
    std::vector<int32_t> winners;
  } cases[] = {{two, {nan, 1, 1, nan, 1, 1, 2, 3}, {0, 3}},
               {three, {-1, nan, 5, 6, 7, 8, 9, 10, 11}, {1}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "kernel " << c.g.kernel_h);
    const int64_t outs = static_cast<int64_t>(c.winners.size());
    Tensor x = Make(DType::kF32, {1, 1, c.g.in_h, c.g.in_w});
    Tensor y = Make(DType::kF32, {outs}), argmax = Make(DType::kI32, {outs});
    ASSERT_OK(backend_->CopyFromHost(c.x.data(), c.x.size() * sizeof(float), &x));
    ASSERT_OK(backend_->MaxPool2dForward(c.g, x.f32(), y.f32(), argmax.i32()));
    std::vector<float> got(outs);
    std::vector<int32_t> won(outs);
    ASSERT_OK(backend_->CopyToHost(y, got.data(), got.size() * sizeof(float)));
    ASSERT_OK(backend_->CopyToHost(argmax, won.data(), won.size() * sizeof(int32_t)));
    for (int64_t i = 0; i < outs; ++i) EXPECT_TRUE(std::isnan(got[i])) << "window " << i;
    EXPECT_EQ(won, c.winners);
  }
}

TEST_P(BackendEdgeCases, SoftmaxCrossEntropyOverNoRowsIsNanLossAndNoneCorrect) {
  Tensor loss = Make(DType::kF32, {1}), correct = Make(DType::kI32, {1});
  const float garbage = 7.0f;
  ASSERT_OK(backend_->CopyFromHost(&garbage, sizeof(garbage), &loss));
  ASSERT_OK(backend_->Fill(&correct, 5.0f));
  Tensor logits = Make(DType::kF32, {1, 10}), labels = Make(DType::kI32, {1});
  ASSERT_OK(backend_->SoftmaxCrossEntropy(0, 10, logits.f32(), labels.i32(), 0.0f, loss.f32(),
                                          correct.i32(), nullptr));
  float loss_host = 0;
  int32_t correct_host = -1;
  ASSERT_OK(backend_->CopyToHost(loss, &loss_host, sizeof(loss_host)));
  ASSERT_OK(backend_->CopyToHost(correct, &correct_host, sizeof(correct_host)));
  EXPECT_TRUE(std::isnan(loss_host)) << loss_host;
  EXPECT_EQ(correct_host, 0);
}

TEST_P(BackendEdgeCases, SoftmaxCrossEntropyOverNoClassesIsInvalidArgument) {
  Tensor loss = Make(DType::kF32, {1}), correct = Make(DType::kI32, {1});
  Tensor logits = Make(DType::kF32, {4}), labels = Make(DType::kI32, {4});
  for (int rows : {0, 3}) {
    const absl::Status s = backend_->SoftmaxCrossEntropy(rows, 0, logits.f32(), labels.i32(), 0.0f,
                                                         loss.f32(), correct.i32(), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << rows << " rows: " << s;
    EXPECT_NE(s.message().find("at least one class"), std::string::npos) << s;
  }
  EXPECT_OK(backend_->Synchronize());
}

TEST_P(BackendEdgeCases, PerChannelNormalisationUsesEachChannelsMeanAndStd) {
  // Two samples of 3 channels x 4 pixels (plane 4: the vectorised path) and of 3 x 3 (scalar).
  for (int64_t plane : {int64_t{4}, int64_t{3}}) {
    SCOPED_TRACE(::testing::Message() << "plane " << plane);
    const int64_t elems = 3 * plane;
    std::vector<uint8_t> pixels(2 * elems);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 37 % 256);
    PixelNorm norm;
    norm.channel_mean = {0.5f, 0.25f, 0.0f};
    norm.channel_std = {0.5f, 0.25f, 2.0f};
    Tensor px = Make(DType::kU8, {2, elems}), idx = Make(DType::kI32, {2});
    Tensor out = Make(DType::kF32, {2, elems}), again = Make(DType::kF32, {2, elems});
    const int32_t index[2] = {1, 0};
    ASSERT_OK(backend_->CopyFromHost(pixels.data(), pixels.size(), &px));
    ASSERT_OK(backend_->CopyFromHost(index, sizeof(index), &idx));
    ASSERT_OK(
        backend_->GatherNormalize(2, elems, idx.i32(), px.u8(), nullptr, norm, out.f32(), nullptr));
    std::vector<float> got(2 * elems);
    ASSERT_OK(backend_->CopyToHost(out, got.data(), got.size() * sizeof(float)));
    for (int i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < elems; ++j) {
        const int c = static_cast<int>(j / plane);
        const float want =
            (pixels[index[i] * elems + j] / 255.0f - norm.channel_mean[c]) / norm.channel_std[c];
        EXPECT_NEAR(got[i * elems + j], want, 1e-5f) << "sample " << i << " element " << j;
      }
    }
    // Float inputs of pixel / 255 with a 255 times larger scale land on the same values.
    std::vector<float> unit(2 * elems);
    for (int i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < elems; ++j)
        unit[i * elems + j] = pixels[index[i] * elems + j] / 255.0f;
    }
    ASSERT_OK(backend_->CopyFromHost(unit.data(), unit.size() * sizeof(float), &again));
    PixelNorm scaled = norm;
    scaled.scale *= 255.0f;
    ASSERT_OK(backend_->Normalize(2, elems, again.f32(), scaled, again.f32()));
    std::vector<float> got_f32(2 * elems);
    ASSERT_OK(backend_->CopyToHost(again, got_f32.data(), got_f32.size() * sizeof(float)));
    for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got_f32[k], got[k], 1e-5f) << k;
  }
  // Channels that do not divide the sample are refused, not read past.
  PixelNorm bad;
  bad.channel_mean = {0, 0};
  bad.channel_std = {1, 1};
  Tensor px = Make(DType::kU8, {1, 3}), idx = Make(DType::kI32, {1}),
         out = Make(DType::kF32, {1, 3});
  ASSERT_OK(backend_->Fill(&idx, 0.0f));
  EXPECT_EQ(
      backend_->GatherNormalize(1, 3, idx.i32(), px.u8(), nullptr, bad, out.f32(), nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  bad.channel_std = {1};
  EXPECT_EQ(backend_->Normalize(1, 2, out.f32(), bad, out.f32()).code(),
            absl::StatusCode::kInvalidArgument);
}

// The augmenting gather refuses images that are not whole (an empty side, a negative padding),
// beyond the 32-bit positions the CUDA kernel indexes with, and a normalisation whose channels are
// neither one nor the images' (CheckAugmentGeometry).
TEST_P(BackendEdgeCases, AugmentedGatherOfABadGeometryOrNormalisationIsInvalidArgument) {
  Tensor px = Make(DType::kU8, {1, 12}), idx = Make(DType::kI32, {1}), dec = Make(DType::kI32, {3}),
         out = Make(DType::kF32, {1, 12});
  const CropFlip* d = reinterpret_cast<const CropFlip*>(dec.i32());
  for (const AugmentGeometry& g :
       {AugmentGeometry{1, 0, 4, 0}, AugmentGeometry{1, 3, 4, -1}, AugmentGeometry{0, 3, 4, 0},
        AugmentGeometry{1, 1 << 20, 1 << 20, 0}, AugmentGeometry{1, 3, 4, 1 << 30}}) {
    const absl::Status s = backend_->GatherAugmentNormalize(1, g, idx.i32(), px.u8(), nullptr, d,
                                                            PixelNorm(), out.f32(), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  PixelNorm two;
  two.channel_mean = {0, 0};
  two.channel_std = {1, 1};
  const absl::Status s = backend_->GatherAugmentNormalize(1, {3, 2, 2, 0}, idx.i32(), px.u8(),
                                                          nullptr, d, two, out.f32(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("2 channels but the images have 3"), std::string::npos) << s;
  EXPECT_OK(backend_->Synchronize());
}

// A convolution whose scratch cannot be had (here im2col columns of 4097^2 x 2^20 floats, 70 TB)
// is an error naming the workspace, never an exception: a job fails, the daemon stays up. The
// CPU's alone: cuDNN keeps its workspace within a fixed limit, picking algorithms to fit. More
// than the machine's memory is refused before allocating, so it holds where the kernel
// overcommits any size (the H200 machine, vm.overcommit_memory=1, had let 70 TB through).
TEST(CpuBackendEdgeCases, AConvolutionWhoseWorkspaceCannotBeAllocatedIsResourceExhausted) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer ends the process on an allocation it cannot make instead of "
                  "throwing std::bad_alloc (scripts/sanitize)";
#endif
  auto backend = CreateBackend("cpu");
  ASSERT_OK(backend);
  Conv2dGeometry g;
  g.batch = 1;
  g.in_channels = 1;
  g.in_h = 1;
  g.in_w = 1 << 20;
  g.out_channels = 1;
  g.kernel_h = g.kernel_w = 4097;
  g.padding_h = g.padding_w = 2048;
  auto x = (*backend)->Allocate(DType::kF32, {1, 1, g.in_h, g.in_w});
  auto w = (*backend)->Allocate(DType::kF32, {1, 1, g.kernel_h, g.kernel_w});
  auto y = (*backend)->Allocate(DType::kF32, {1, 1, g.out_h(), g.out_w()});
  ASSERT_OK(x);
  ASSERT_OK(w);
  ASSERT_OK(y);
  absl::Status status;
  EXPECT_NO_THROW(status = (*backend)->Conv2dForward(g, x->f32(), w->f32(), nullptr,
                                                     Activation::kNone, y->f32()));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("conv2d workspace"));
}

// A CPU backend asked for more threads than the machine has (a deployment's threads=1024) gets
// one per core: a thread team larger than the cores only slows every job and model down.
TEST(CpuBackendEdgeCases, ThreadsAskedBeyondTheMachinesCoresAreCappedToThem) {
  const int cores = CpuBackendThreads(BackendOptions{});  // every core, as "0" asks
  BackendOptions options;
  options.threads = 1024;
  EXPECT_EQ(CpuBackendThreads(options), std::min(1024, cores));
  options.threads = 1;
  EXPECT_EQ(CpuBackendThreads(options), 1);
}

// A max pooling fused into a convolution must be of non-overlapping windows, without padding,
// of fewer positions than a byte records, over exactly the convolution's output: anything else
// is InvalidArgument naming what differs, before any memory is touched.
TEST(CpuBackendEdgeCases, AFusedMaxPoolingThatDoesNotFitTheConvolutionIsInvalidArgument) {
  auto backend = CreateBackend("cpu");
  ASSERT_OK(backend);
  ASSERT_TRUE((*backend)->FusesConvMaxPool());
  Conv2dGeometry g;
  g.batch = 2;
  g.in_channels = 1;
  g.in_h = g.in_w = 18;
  g.out_channels = 3;
  g.kernel_h = g.kernel_w = 3;  // 16x16 out
  auto pool = [&](int kernel, int stride, int padding, int channels) {
    Pool2dGeometry p = Pool(16, 16, kernel, stride);
    p.channels = channels;
    p.padding_h = p.padding_w = padding;
    return p;
  };
  const struct {
    Pool2dGeometry pool;
    const char* says;
  } cases[] = {{pool(3, 2, 0, 3), "needs stride == kernel"},
               {pool(2, 2, 1, 3), "needs stride == kernel and no padding"},
               {pool(16, 16, 0, 3), "more positions than a byte records"},
               {pool(2, 2, 0, 4), "the convolution gives 2x3x16x16"}};
  std::vector<float> x(2 * 18 * 18), w(27), y(2 * 4 * 8 * 8);
  std::vector<uint8_t> winners(y.size());
  for (const auto& c : cases) {
    const absl::Status forward = (*backend)->Conv2dMaxPoolForward(
        g, c.pool, x.data(), w.data(), nullptr, Activation::kRelu, winners.data(), y.data());
    EXPECT_EQ(forward.code(), absl::StatusCode::kInvalidArgument) << forward;
    EXPECT_THAT(std::string(forward.message()), ::testing::HasSubstr(c.says));
    const absl::Status backward =
        (*backend)->Conv2dMaxPoolBackward(g, c.pool, x.data(), w.data(), winners.data(), y.data(),
                                          Activation::kRelu, w.data(), nullptr, nullptr);
    EXPECT_EQ(backward.code(), absl::StatusCode::kInvalidArgument) << backward;
  }
}

// The CPU's convolution with max pooling fused in keeps the same NaN rule as MaxPool2dForward:
// a 1x1 convolution of weight 1 passes the input through, NaN included.
TEST(CpuBackendEdgeCases, AFusedMaxPoolingKeepsANanWinnerAsTheUnfusedOneDoes) {
  auto backend = CreateBackend("cpu");
  ASSERT_OK(backend);
  Conv2dGeometry g;
  g.batch = g.in_channels = g.out_channels = 1;
  g.in_h = 2;
  g.in_w = 4;
  g.kernel_h = g.kernel_w = 1;
  Pool2dGeometry p = Pool(2, 4, 2, 2);
  p.batch = p.channels = 1;
  const float nan = std::nanf("");
  const std::vector<float> x = {nan, 1, 1, nan, 1, 1, 2, 3}, w = {1.0f};
  std::vector<float> y(2);
  std::vector<uint8_t> winners(2);
  ASSERT_OK((*backend)->Conv2dMaxPoolForward(g, p, x.data(), w.data(), nullptr,
                                             Activation::kNone, winners.data(), y.data()));
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_TRUE(std::isnan(y[1]));
}

// SumOfSquares adds to its scalar (one call per gradient makes the global norm), leaves it alone
// for no values, and refuses a negative count.
TEST_P(BackendEdgeCases, SumOfSquaresAddsToItsOutputAndRefusesANegativeCount) {
  Tensor out = Make(DType::kF32, {1});
  const float start = 2.5f;
  ASSERT_OK(backend_->CopyFromHost(&start, sizeof(start), &out));
  Tensor x = testing::MakeTensor(*backend_, {3}, {1.0f, -2.0f, 3.0f});
  ASSERT_OK(backend_->SumOfSquares(0, x.f32(), out.f32()));
  EXPECT_EQ(testing::ToHost(*backend_, out)[0], 2.5f);
  ASSERT_OK(backend_->SumOfSquares(3, x.f32(), out.f32()));
  EXPECT_EQ(testing::ToHost(*backend_, out)[0], 16.5f);
  ASSERT_OK(backend_->SumOfSquares(2, x.f32(), out.f32()));
  EXPECT_EQ(testing::ToHost(*backend_, out)[0], 21.5f);
  const absl::Status negative = backend_->SumOfSquares(-1, x.f32(), out.f32());
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  EXPECT_THAT(std::string(negative.message()), ::testing::HasSubstr("negative"));
  EXPECT_EQ(backend_->SumOfSquares(3, x.f32(), nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// Millions of squares summed in float would drift by several percent (0.01f added to 40000 loses
// most of its bits); in double the result is the exact sum rounded once.
TEST_P(BackendEdgeCases, SumOfSquaresOfMillionsOfValuesIsAccurateAndRepeatable) {
  const int64_t n = 4'000'003;
  std::vector<float> values(static_cast<size_t>(n));
  double exact = 0;
  for (int64_t i = 0; i < n; ++i) {
    values[i] = (i % 2 == 0 ? 0.1f : -0.3f) * (1.0f + static_cast<float>(i % 7) / 8.0f);
    exact += static_cast<double>(values[i]) * values[i];
  }
  Tensor x = testing::MakeTensor(*backend_, {n}, values);
  float got[2];
  for (float& g : got) {
    Tensor out = Make(DType::kF32, {1});
    ASSERT_OK(backend_->Fill(&out, 0.0f));
    ASSERT_OK(backend_->SumOfSquares(n, x.f32(), out.f32()));
    g = testing::ToHost(*backend_, out)[0];
  }
  EXPECT_NEAR(got[0], exact, exact * 1e-7);
  EXPECT_EQ(got[0], got[1]) << "a second run gave other bits";
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, BackendEdgeCases, ::testing::Values("cpu", "cuda:0"),
                         testing::DeviceParamName);

}  // namespace
}  // namespace kiln
