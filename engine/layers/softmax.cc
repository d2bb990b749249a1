#include "engine/layers/softmax.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

absl::StatusOr<Shape> OutputShape(const SoftmaxConfig&, const Shape& in) {
  if (in.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("needs a flat input but input is ",
                                                   ShapeString(in), " (add a flatten layer)"));
  }
  return in;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const SoftmaxConfig&, const LayerContext& ctx) {
  return std::make_unique<Softmax>(ctx.backend, ctx.input);
}

absl::Status Softmax::Forward(const Tensor& x, Tensor* y, Mode) {
  const int cols = static_cast<int>(input_shape_.back());
  return backend_->SoftmaxForward(static_cast<int>(x.numel() / cols), cols, x.f32(), y->f32());
}

absl::Status Softmax::Backward(const Tensor&, const Tensor& y, const Tensor& dy, Tensor* dx) {
  if (dx == nullptr) return absl::OkStatus();
  // Host round trip: this path is for gradient checks, never the training hot loop.
  const int64_t n = y.numel();
  const int cols = static_cast<int>(input_shape_.back());
  std::vector<float> hy(n), hdy(n), hdx(n);
  KILN_RETURN_IF_ERROR(backend_->CopyToHost(y, hy.data(), n * sizeof(float)));
  KILN_RETURN_IF_ERROR(backend_->CopyToHost(dy, hdy.data(), n * sizeof(float)));
  for (int64_t r = 0; r < n / cols; ++r) {
    double dot = 0;
    for (int c = 0; c < cols; ++c) dot += hdy[r * cols + c] * hy[r * cols + c];
    for (int c = 0; c < cols; ++c) {
      hdx[r * cols + c] = hy[r * cols + c] * (hdy[r * cols + c] - static_cast<float>(dot));
    }
  }
  return backend_->CopyFromHost(hdx.data(), n * sizeof(float), dx);
}

}  // namespace kiln
