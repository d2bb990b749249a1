// The checks the layers' shape rules share. Messages name the field; the model prefixes the layer
// ("layer 3 conv2d: kernel_size must be positive, got 0").
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tensor.h"

namespace kiln {

inline absl::Status CheckPositive(const char* field, int64_t v) {
  if (v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be positive, got ", v));
}

// `what` ("conv2d") needs a CxHxW input.
inline absl::Status CheckImageInput(const char* what, const Shape& in) {
  if (in.size() == 3) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " needs a CxHxW input but input is ", ShapeString(in)));
}

}  // namespace kiln
