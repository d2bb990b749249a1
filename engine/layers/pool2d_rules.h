// The shape rule and backend geometry that max and average pooling share: square windows of
// kernel_size, stride (0 means kernel_size, as in PyTorch) and implicit padding, floor mode.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend.h"
#include "engine/layers/layer_rules.h"
#include "engine/tensor.h"

namespace kiln {

// Output (C, H', W') for a (C, H, W) input, floor((H + 2 padding - kernel) / stride) + 1. `what`
// ("maxpool2d") names the layer in the input check; the model prefixes the layer to the rest.
inline absl::StatusOr<Shape> Pool2dOutputShape(const char* what, int64_t kernel, int64_t stride,
                                               int64_t padding, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("kernel_size", kernel));
  if (stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat("stride must be >= 0, got ", stride));
  }
  if (padding < 0) {
    return absl::InvalidArgumentError(absl::StrCat("padding must be >= 0, got ", padding));
  }
  // PyTorch's rule ("pad should be at most half of effective kernel size"): it also keeps a real
  // pixel in every window.
  if (2 * padding > kernel) {
    return absl::InvalidArgumentError(
        absl::StrCat("padding ", padding, " is more than half of kernel_size ", kernel));
  }
  KILN_RETURN_IF_ERROR(CheckImageInput(what, in));
  const int64_t s = stride > 0 ? stride : kernel;
  const int64_t h = in[1] + 2 * padding, w = in[2] + 2 * padding;
  if (kernel > h || kernel > w) {
    if (padding == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel_size ", kernel, " is larger than the input ", ShapeString(in)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("kernel_size ", kernel, " is larger than the padded input ", h, "x", w));
  }
  return Shape{in[0], (h - kernel) / s + 1, (w - kernel) / s + 1};
}

// The backend's view of a square pooling layer over `batch` samples of `input` (C, H, W).
inline Pool2dGeometry MakePool2dGeometry(int64_t kernel, int64_t stride, int64_t padding,
                                         const Shape& input, int64_t batch) {
  Pool2dGeometry g;
  g.batch = static_cast<int>(batch);
  g.channels = static_cast<int>(input[0]);
  g.in_h = static_cast<int>(input[1]);
  g.in_w = static_cast<int>(input[2]);
  g.kernel_h = g.kernel_w = static_cast<int>(kernel);
  g.stride_h = g.stride_w = static_cast<int>(stride > 0 ? stride : kernel);
  g.padding_h = g.padding_w = static_cast<int>(padding);
  return g;
}

}  // namespace kiln
