// PLACEHOLDER until the sequence ops land (replaced whole by their implementation; never merged
// to main as it is): every op answers Unimplemented.
#include "engine/cuda/cuda_backend.h"

namespace kiln {
namespace {
absl::Status NotYet(const char* op) {
  return absl::UnimplementedError(absl::StrCat(op, ": not implemented yet"));
}
}  // namespace

absl::Status CudaBackend::LayerNormForward(int64_t, int, float, const float*, const float*, const float*,
                                    float*, float*, float*) {
  return NotYet("LayerNormForward");
}
absl::Status CudaBackend::LayerNormBackward(int64_t, int, const float*, const float*, const float*,
                                     const float*, const float*, float*, float*, float*) {
  return NotYet("LayerNormBackward");
}
absl::Status CudaBackend::EmbeddingForward(int64_t, int, int, const int32_t*, const float*, float*) {
  return NotYet("EmbeddingForward");
}
absl::Status CudaBackend::EmbeddingBackward(int64_t, int, int, const int32_t*, const float*, float*) {
  return NotYet("EmbeddingBackward");
}
absl::Status CudaBackend::GemmStridedBatched(Transpose, Transpose, int, int, int, float, const float*,
                                      int64_t, const float*, int64_t, float, float*, int64_t, int) {
  return NotYet("GemmStridedBatched");
}
absl::Status CudaBackend::CausalSoftmaxForward(int64_t, int, float, const float*, float*) {
  return NotYet("CausalSoftmaxForward");
}
absl::Status CudaBackend::CausalSoftmaxBackward(int64_t, int, float, const float*, const float*, float*) {
  return NotYet("CausalSoftmaxBackward");
}
absl::Status CudaBackend::Transpose0213(int64_t, int64_t, int64_t, int64_t, const float*, float*) {
  return NotYet("Transpose0213");
}

}  // namespace kiln
