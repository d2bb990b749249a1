// Training-time augmentation: the CPU backend's crop-and-flip gather against a naive reference
// (padding built out, cropped and mirrored by hand, then normalised), the per-sample decisions as
// a pure function of (seed, epoch, step, sample), and the image geometry augmentation accepts.
#include "engine/data/augment.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

// torchvision's RandomCrop(padding=P) then RandomHorizontalFlip on one uint8 CHW image, spelled
// out: build the padded image, take the HxW window at (dy, dx), mirror it.
std::vector<uint8_t> NaiveCropFlip(const uint8_t* image, const AugmentGeometry& g,
                                   const CropFlip& d) {
  const int P = g.padding, ph = g.height + 2 * P, pw = g.width + 2 * P;
  std::vector<uint8_t> padded(static_cast<size_t>(g.channels) * ph * pw, 0);
  for (int c = 0; c < g.channels; ++c) {
    for (int y = 0; y < g.height; ++y) {
      for (int x = 0; x < g.width; ++x) {
        padded[(c * ph + y + P) * pw + x + P] = image[(c * g.height + y) * g.width + x];
      }
    }
  }
  std::vector<uint8_t> out(g.sample_elems());
  for (int c = 0; c < g.channels; ++c) {
    for (int y = 0; y < g.height; ++y) {
      for (int x = 0; x < g.width; ++x) {
        const int sx = d.flip ? g.width - 1 - x : x;
        const int py = y + d.dy, px = sx + d.dx;
        const bool inside = py >= 0 && py < ph && px >= 0 && px < pw;
        out[(c * g.height + y) * g.width + x] = inside ? padded[(c * ph + py) * pw + px] : 0;
      }
    }
  }
  return out;
}

class CpuGatherAugmentTest : public ::testing::Test {
 protected:
  template <typename T>
  Tensor Upload(DType dtype, const std::vector<T>& v) {
    auto t = cpu_.Allocate(dtype, {static_cast<int64_t>(v.size())});
    EXPECT_OK(t);
    EXPECT_OK(cpu_.CopyFromHost(v.data(), v.size() * sizeof(T), &*t));
    return *t;
  }

  CpuBackend cpu_{2};
};

// Every offset in [0, 2P] on both axes with and without the flip, on non-square images, one and
// three channels, scalar and per-channel normalisation: the op gives exactly the bits of the plain
// gather over the hand-augmented images, and every padded pixel is the normalised 0.
TEST_F(CpuGatherAugmentTest, MatchesANaiveCropFlipThenNormalise) {
  struct Case {
    AugmentGeometry g;
    bool per_channel;
  };
  for (const Case& k : {Case{{3, 5, 7, 2}, true}, Case{{1, 6, 4, 3}, false},
                        Case{{3, 4, 4, 0}, true}, Case{{2, 3, 9, 1}, false}}) {
    const AugmentGeometry& g = k.g;
    SCOPED_TRACE(::testing::Message()
                 << g.channels << "x" << g.height << "x" << g.width << " padding " << g.padding);
    const int64_t elems = g.sample_elems();
    std::vector<CropFlip> decisions;
    for (int dy = 0; dy <= 2 * g.padding; ++dy) {
      for (int dx = 0; dx <= 2 * g.padding; ++dx) {
        for (int flip : {0, 1}) decisions.push_back({dy, dx, flip});
      }
    }
    const int count = static_cast<int>(decisions.size());
    const int dataset = 11;
    std::mt19937 gen(7);
    std::vector<uint8_t> pixels(dataset * elems);
    for (auto& p : pixels) p = static_cast<uint8_t>(1 + gen() % 255);  // 0 only where padded
    std::vector<int32_t> labels(dataset), index(count);
    for (int i = 0; i < dataset; ++i) labels[i] = i % 10;
    for (int i = 0; i < count; ++i) index[i] = static_cast<int32_t>(gen() % dataset);
    PixelNorm norm(1.0f / 255, 0.1307f, 0.3081f);
    if (k.per_channel) {
      norm.channel_mean.assign({0.4914f, 0.4822f, 0.4465f});
      norm.channel_std.assign({0.2470f, 0.2435f, 0.2616f});
      norm.channel_mean.resize(g.channels);
      norm.channel_std.resize(g.channels);
    }

    // The reference: augmented uint8 images, in batch order, through the plain gather.
    std::vector<uint8_t> augmented;
    std::vector<int32_t> identity(count), want_labels(count);
    for (int i = 0; i < count; ++i) {
      const std::vector<uint8_t> img =
          NaiveCropFlip(pixels.data() + index[i] * elems, g, decisions[i]);
      augmented.insert(augmented.end(), img.begin(), img.end());
      identity[i] = i;
      want_labels[i] = labels[index[i]];
    }
    Tensor ref_px = Upload(DType::kU8, augmented), ref_idx = Upload(DType::kI32, identity);
    std::vector<float> want(count * elems);
    ASSERT_OK(cpu_.GatherNormalize(count, elems, ref_idx.i32(), ref_px.u8(), nullptr, norm,
                                   want.data(), nullptr));

    Tensor px = Upload(DType::kU8, pixels), idx = Upload(DType::kI32, index),
           lab = Upload(DType::kI32, labels);
    auto dec = cpu_.Allocate(DType::kI32, {3 * int64_t{count}});
    ASSERT_OK(dec);
    ASSERT_OK(cpu_.CopyFromHost(decisions.data(), decisions.size() * sizeof(CropFlip), &*dec));
    std::vector<float> got(count * elems, -99.0f);
    std::vector<int32_t> got_labels(count, -1);
    ASSERT_OK(cpu_.GatherAugmentNormalize(count, g, idx.i32(), px.u8(), lab.i32(),
                                          reinterpret_cast<const CropFlip*>(dec->i32()), norm,
                                          got.data(), got_labels.data()));
    EXPECT_EQ(got, want);
    EXPECT_EQ(got_labels, want_labels);

    // Padded pixels are (0 * scale - mean[c]) / std[c], torchvision's value for a zero pad.
    int padded_seen = 0;
    for (size_t j = 0; j < augmented.size(); ++j) {
      if (augmented[j] != 0) continue;
      const int c = static_cast<int>((j % elems) / (elems / g.channels));
      const float mean = k.per_channel ? norm.channel_mean[c] : norm.mean;
      const float std = k.per_channel ? norm.channel_std[c] : norm.std;
      ASSERT_NEAR(got[j], (0.0f - mean) / std, 1e-6f) << "element " << j;
      ++padded_seen;
    }
    EXPECT_EQ(padded_seen > 0, g.padding > 0);
  }
}

// Offsets past [0, 2P] (which DrawCropFlip never makes) read padding, not memory outside the
// image; labels may be left out.
TEST_F(CpuGatherAugmentTest, OffsetsBeyondThePaddingReadOnlyPadding) {
  const AugmentGeometry g{1, 3, 3, 1};
  const std::vector<uint8_t> pixels = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  Tensor px = Upload(DType::kU8, pixels), idx = Upload(DType::kI32, std::vector<int32_t>{0, 0});
  Tensor dec = Upload(DType::kI32, std::vector<int32_t>{-5, 0, 0, 2, 9, 1});
  std::vector<float> got(18);
  ASSERT_OK(cpu_.GatherAugmentNormalize(2, g, idx.i32(), px.u8(), nullptr,
                                        reinterpret_cast<const CropFlip*>(dec.i32()),
                                        PixelNorm(1.0f, 0.0f, 1.0f), got.data(), nullptr));
  EXPECT_EQ(got, std::vector<float>(18, 0.0f));
}

// --- decisions -----------------------------------------------------------------------------------

std::vector<CropFlip> Batch(const AugmentConfig& a, uint64_t seed, int epoch, int64_t step,
                            int count = 64) {
  std::vector<CropFlip> out;
  for (int i = 0; i < count; ++i) out.push_back(DrawCropFlip(a, seed, epoch, step, i));
  return out;
}

TEST(CropFlipDecisions, SameSeedEpochAndStepDrawTheSameAndAnyOtherKeyDrawsOthers) {
  const AugmentConfig a{4, true};
  const std::vector<CropFlip> batch = Batch(a, 7, 2, 13);
  EXPECT_EQ(batch, Batch(a, 7, 2, 13));
  EXPECT_NE(batch, Batch(a, 7, 2, 14));
  EXPECT_NE(batch, Batch(a, 7, 3, 13));
  EXPECT_NE(batch, Batch(a, 8, 2, 13));
  // The samples of one batch differ from each other too.
  std::set<std::tuple<int, int, int>> distinct;
  for (const CropFlip& d : batch) distinct.insert({d.dy, d.dx, d.flip});
  EXPECT_GT(distinct.size(), 32u);
}

TEST(CropFlipDecisions, OffsetsCoverZeroToTwiceThePaddingAndFlipsHalfTheTime) {
  const AugmentConfig a{2, true};
  std::vector<int> dy_seen(5), dx_seen(5);
  int flips = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const CropFlip d = DrawCropFlip(a, 1, 1, i / 100, i % 100);
    ASSERT_GE(d.dy, 0);
    ASSERT_LE(d.dy, 4);
    ASSERT_GE(d.dx, 0);
    ASSERT_LE(d.dx, 4);
    ASSERT_TRUE(d.flip == 0 || d.flip == 1);
    ++dy_seen[d.dy];
    ++dx_seen[d.dx];
    flips += d.flip;
  }
  for (int v = 0; v <= 4; ++v) {
    EXPECT_NEAR(dy_seen[v], n / 5, n / 50) << "dy " << v;  // within 10% of uniform
    EXPECT_NEAR(dx_seen[v], n / 5, n / 50) << "dx " << v;
  }
  EXPECT_NEAR(flips, n / 2, n / 50);
}

// Each part draws from its own stream: turning the flip on leaves the crops where they were, and
// a part that is off always decides "no change".
TEST(CropFlipDecisions, PartsThatAreOffDecideNothingAndDoNotMoveTheOthers) {
  const std::vector<CropFlip> crop_only = Batch({3, false}, 5, 1, 0);
  const std::vector<CropFlip> both = Batch({3, true}, 5, 1, 0);
  const std::vector<CropFlip> flip_only = Batch({0, true}, 5, 1, 0);
  for (size_t i = 0; i < both.size(); ++i) {
    EXPECT_EQ(crop_only[i].flip, 0);
    EXPECT_EQ(crop_only[i].dy, both[i].dy);
    EXPECT_EQ(crop_only[i].dx, both[i].dx);
    EXPECT_EQ(flip_only[i].dy, 0);
    EXPECT_EQ(flip_only[i].dx, 0);
    EXPECT_EQ(flip_only[i].flip, both[i].flip);
  }
}

// --- geometry ------------------------------------------------------------------------------------

TEST(AugmentImageGeometry, TakesHwAndChwImagesAndRefusesTablesAndOversizedPadding) {
  const AugmentConfig a{4, true};
  auto mnist = AugmentImageGeometry(a, {28, 28}, false, 1);
  ASSERT_OK(mnist);
  EXPECT_EQ(mnist->channels, 1);
  EXPECT_EQ(mnist->height, 28);
  EXPECT_EQ(mnist->width, 28);
  EXPECT_EQ(mnist->padding, 4);
  auto cifar = AugmentImageGeometry(a, {3, 32, 32}, false, 3);
  ASSERT_OK(cifar);
  EXPECT_EQ(cifar->channels, 3);

  auto refused = [](const absl::StatusOr<AugmentGeometry>& g) {
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(g.status().message());
  };
  EXPECT_NE(refused(AugmentImageGeometry(a, {32}, true, 32)).find("table"), std::string::npos);
  EXPECT_NE(refused(AugmentImageGeometry(a, {784}, false, 1)).find("are [784]"), std::string::npos);
  EXPECT_NE(refused(AugmentImageGeometry({15, false}, {28, 28}, false, 1))
                .find("random_crop_padding must be in [0, 14] for 28x28 images"),
            std::string::npos);
  EXPECT_NE(refused(AugmentImageGeometry({3, false}, {5, 9}, false, 1)).find("[0, 2]"),
            std::string::npos);
  EXPECT_NE(refused(AugmentImageGeometry(a, {28, 28}, false, 3)).find("3 channels"),
            std::string::npos);
  EXPECT_OK(AugmentImageGeometry({0, true}, {1, 1}, false, 1));
}

}  // namespace
}  // namespace kiln
