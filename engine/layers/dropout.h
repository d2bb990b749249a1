// Dropout (inverted): in training zeroes each element with probability p and scales the rest by
// 1/(1-p); in evaluation it is the identity.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// The same shape as its input; p must lie in [0, 1); no parameters.
absl::StatusOr<Shape> OutputShape(const DropoutConfig& c, const Shape& input);
inline int64_t ParameterCount(const DropoutConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const DropoutConfig& c, const LayerContext& ctx);

class Dropout final : public Layer {
 public:
  Dropout(const DropoutConfig& config, Backend* backend, const Shape& shape, uint64_t seed)
      : Layer(backend, shape, shape), config_(config), seed_(seed) {}
  const char* type() const override { return "dropout"; }
  // An identity in eval mode, the only one ForwardAt runs.
  Incremental incremental() const override { return Incremental::kPositionWise; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  // Elements drawn so far: the position in this layer's random stream, for checkpoints.
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  bool has_random_stream() const override { return true; }
  uint64_t random_offset() const override { return offset_; }
  void set_random_offset(uint64_t offset) override { offset_ = offset; }

 private:
  DropoutConfig config_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  Tensor mask_;
};

}  // namespace kiln
