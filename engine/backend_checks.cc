#include "engine/backend_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status CheckImageLayout(const char* op, ImageLayout layout, int channels,
                              const Backend& backend) {
  if (layout == ImageLayout::kNchw) return absl::OkStatus();
  if (!backend.TakesNchw16c()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", backend.name(), " takes images in NCHW, not ", ImageLayoutName(layout)));
  }
  if (channels % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": images in nChw16c need a multiple of 16 channels, got ", channels));
  }
  return absl::OkStatus();
}

absl::Status CheckConv2dLayouts(const Conv2dGeometry& g, const Backend& backend) {
  if (absl::Status s = CheckImageLayout("conv2d input", g.x_layout, g.in_channels, backend);
      !s.ok()) {
    return s;
  }
  return CheckImageLayout("conv2d output", g.y_layout, g.out_channels, backend);
}

absl::Status CheckBatchNorm(const BatchNormGeometry& g, double eps, bool training,
                            const Backend& backend) {
  if (g.batch < 0 || g.channels < 1 || g.spatial < 1 || !(eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("batchnorm: invalid geometry ", g.batch, "x",
                                                   g.channels, "x", g.spatial, " eps ", eps));
  }
  if (training && g.values_per_channel() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("batchnorm: expected more than 1 value per channel when training, got ",
                     g.values_per_channel(), " (batch ", g.batch, " x ", g.spatial, ")"));
  }
  return CheckImageLayout("batchnorm", g.layout, g.channels, backend);
}

absl::Status CheckAugmentGeometry(const AugmentGeometry& g, int norm_channels) {
  // Within int32 (CUDA indexes within a sample in 32 bits), padding included.
  constexpr int64_t kMax = int64_t{1} << 30;
  if (g.channels < 1 || g.height < 1 || g.width < 1 || g.padding < 0 ||
      int64_t{g.height} + 2 * int64_t{g.padding} > kMax ||
      int64_t{g.width} + 2 * int64_t{g.padding} > kMax || g.sample_elems() > kMax) {
    return absl::InvalidArgumentError(absl::StrCat("augment: invalid geometry ", g.channels, "x",
                                                   g.height, "x", g.width, " padding ", g.padding));
  }
  if (norm_channels != 1 && norm_channels != g.channels) {
    return absl::InvalidArgumentError(absl::StrCat("augment: the normalisation has ", norm_channels,
                                                   " channels but the images have ", g.channels,
                                                   "; it needs one, or one per image channel"));
  }
  return absl::OkStatus();
}

absl::Status CheckCopyFits(const char* op, size_t bytes, size_t capacity) {
  if (bytes <= capacity) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", bytes, " bytes do not fit a tensor of ", capacity, " bytes"));
}

absl::Status CheckPool2d(const char* op, const Pool2dGeometry& g) {
  if (g.kernel_h < 1 || g.kernel_w < 1 || g.stride_h < 1 || g.stride_w < 1 || g.padding_h < 0 ||
      g.padding_w < 0 || g.batch < 0 || g.channels < 0 || g.in_h < 0 || g.in_w < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": invalid geometry kernel ", g.kernel_h, "x", g.kernel_w, " stride ",
                     g.stride_h, "x", g.stride_w, " padding ", g.padding_h, "x", g.padding_w,
                     " over ", g.batch, "x", g.channels, "x", g.in_h, "x", g.in_w));
  }
  if (2 * g.padding_h > g.kernel_h || 2 * g.padding_w > g.kernel_w) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": padding ", g.padding_h, "x", g.padding_w,
                                                   " is more than half the ", g.kernel_h, "x",
                                                   g.kernel_w, " window"));
  }
  if (g.in_h + 2 * g.padding_h < g.kernel_h || g.in_w + 2 * g.padding_w < g.kernel_w) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": padded input ", g.in_h + 2 * g.padding_h, "x", g.in_w + 2 * g.padding_w,
                     " is smaller than the ", g.kernel_h, "x", g.kernel_w, " window"));
  }
  return absl::OkStatus();
}

absl::Status CheckMaxPool2d(const Pool2dGeometry& g) {
  if (absl::Status s = CheckPool2d("maxpool2d", g); !s.ok()) return s;
  if (g.layout != ImageLayout::kNchw) {
    return absl::InvalidArgumentError("maxpool2d: takes images in NCHW only");
  }
  return absl::OkStatus();
}

absl::Status CheckAvgPool2d(const Pool2dGeometry& g, const Backend& backend) {
  if (absl::Status s = CheckPool2d("avgpool2d", g); !s.ok()) return s;
  return CheckImageLayout("avgpool2d", g.layout, g.channels, backend);
}

absl::Status CheckFusableMaxPool(const Conv2dGeometry& g, const Pool2dGeometry& pool) {
  if (absl::Status s = CheckMaxPool2d(pool); !s.ok()) return s;
  if (pool.stride_h != pool.kernel_h || pool.stride_w != pool.kernel_w || pool.padding_h != 0 ||
      pool.padding_w != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "maxpool2d fused into conv2d: needs stride == kernel and no padding, got kernel ",
        pool.kernel_h, "x", pool.kernel_w, " stride ", pool.stride_h, "x", pool.stride_w,
        " padding ", pool.padding_h, "x", pool.padding_w));
  }
  if (g.x_layout != ImageLayout::kNchw || g.y_layout != ImageLayout::kNchw) {
    return absl::InvalidArgumentError("maxpool2d fused into conv2d: takes images in NCHW only");
  }
  if (int64_t{pool.kernel_h} * pool.kernel_w >= kMaskedWinner) {
    return absl::InvalidArgumentError(absl::StrCat(
        "maxpool2d fused into conv2d: a ", pool.kernel_h, "x", pool.kernel_w,
        " window has more positions than a byte records (at most ", kMaskedWinner - 1, ")"));
  }
  if (pool.batch != g.batch || pool.channels != g.out_channels || pool.in_h != g.out_h() ||
      pool.in_w != g.out_w()) {
    return absl::InvalidArgumentError(
        absl::StrCat("maxpool2d fused into conv2d: pools ", pool.batch, "x", pool.channels, "x",
                     pool.in_h, "x", pool.in_w, " but the convolution gives ", g.batch, "x",
                     g.out_channels, "x", g.out_h(), "x", g.out_w()));
  }
  return absl::OkStatus();
}

absl::Status CheckSoftmaxCrossEntropy(int rows, int cols, float label_smoothing) {
  if (rows < 0 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat("softmax cross-entropy over ", rows, " rows of ",
                                                   cols, " classes: needs at least one class"));
  }
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label smoothing must be in [0, 1], got ", label_smoothing));
  }
  return absl::OkStatus();
}

absl::Status CheckCopy2D(int64_t rows, int64_t cols, int64_t src_stride, int64_t dst_stride) {
  if (rows < 0 || cols < 0 || cols > src_stride || cols > dst_stride) {
    return absl::InvalidArgumentError(absl::StrCat("Copy2D: ", rows, " rows of ", cols,
                                                   " floats do not fit strides ", src_stride,
                                                   " and ", dst_stride));
  }
  return absl::OkStatus();
}

absl::Status CheckLayerNorm(int64_t rows, int cols, float eps) {
  if (rows < 0 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat("layernorm over ", rows, " rows of ", cols,
                                                   " values: needs rows >= 0 and cols >= 1"));
  }
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(absl::StrCat("layernorm: eps must be > 0, got ", eps));
  }
  return absl::OkStatus();
}

absl::Status CheckEmbedding(int64_t count, int vocab, int dim) {
  if (count < 0 || vocab < 1 || dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("embedding of ", count, " ids into a table of ",
                                                   vocab, " x ", dim,
                                                   ": needs count >= 0, vocab >= 1 and dim >= 1"));
  }
  return absl::OkStatus();
}

absl::Status CheckGemmStridedBatched(int m, int n, int k, int64_t stride_a, int64_t stride_b,
                                     int64_t stride_c, int batch) {
  if (m < 0 || n < 0 || k < 0 || batch < 0 || stride_a < 0 || stride_b < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batched GEMM of ", batch, " x (", m, " x ", k, ") * (", k, " x ", n, ") with strides ",
        stride_a, " and ", stride_b, ": no extent or stride may be negative"));
  }
  if (batch > 1 && stride_c < int64_t{m} * n) {
    return absl::InvalidArgumentError(absl::StrCat("batched GEMM: stride_c ", stride_c,
                                                   " would overlap the ", m, " x ", n, " results"));
  }
  return absl::OkStatus();
}

absl::Status CheckCausalSoftmax(int64_t batch, int t, float scale) {
  if (batch < 0 || t < 1) {
    return absl::InvalidArgumentError(absl::StrCat("causal softmax over ", batch, " x ", t, " x ",
                                                   t, " scores: needs batch >= 0 and t >= 1"));
  }
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("causal softmax: scale must be finite and > 0, got ", scale));
  }
  return absl::OkStatus();
}

absl::Status CheckCausalSoftmaxAt(int64_t batch, int queries, int keys, int offset, float scale) {
  // In int64: offset + queries must not wrap.
  if (batch < 0 || queries < 1 || offset < 0 || int64_t{offset} + queries > keys) {
    return absl::InvalidArgumentError(absl::StrCat(
        "causal softmax of ", batch, " x ", queries, " queries at offset ", offset, " over ", keys,
        " keys: needs batch >= 0, queries >= 1, offset >= 0 and offset + queries <= keys"));
  }
  return CheckCausalSoftmax(batch, keys, scale);
}

absl::Status CheckTranspose0213(int64_t a, int64_t b, int64_t c, int64_t d) {
  if (a < 0 || b < 0 || c < 0 || d < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Transpose0213 of (", a, ", ", b, ", ", c, ", ",
                                                   d, "): no extent may be negative"));
  }
  return absl::OkStatus();
}

absl::Status CheckSumOfSquares(int64_t n, const float* out) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SumOfSquares of ", n, " values: the count may not be negative"));
  }
  if (out == nullptr) return absl::InvalidArgumentError("SumOfSquares needs an output scalar");
  return absl::OkStatus();
}

}  // namespace kiln
