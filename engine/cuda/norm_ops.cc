// CudaBackend's batch normalisation through cuDNN's legacy batch-norm calls, mode SPATIAL over x
// described as (batch, channels, spatial, 1): statistics per channel over batch and spatial, which
// is batchnorm2d (spatial = H*W) and batchnorm1d (spatial = 1 or L) alike. cuDNN updates the
// running variance with the unbiased batch variance, and its exponentialAverageFactor is
// PyTorch's momentum.
#include <cudnn.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cudnn_library.h"

namespace kiln {

namespace {

// The two descriptors a batch-norm call takes: x (and y, dy, dx) and the per-channel tensors.
class BatchNormDescriptors {
 public:
  explicit BatchNormDescriptors(const CudnnLibrary* dnn) : dnn_(dnn) {}
  ~BatchNormDescriptors() {
    if (x_ != nullptr) dnn_->DestroyTensorDescriptor(x_);
    if (stats_ != nullptr) dnn_->DestroyTensorDescriptor(stats_);
  }
  BatchNormDescriptors(const BatchNormDescriptors&) = delete;
  BatchNormDescriptors& operator=(const BatchNormDescriptors&) = delete;

  absl::Status Init(const BatchNormGeometry& g) {
    KILN_RETURN_IF_ERROR(dnn_->BatchNormAvailable());  // every batch-norm call passes here
    if (g.spatial > std::numeric_limits<int>::max() ||
        int64_t{g.batch} * g.channels * g.spatial > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("batchnorm: ", g.batch, "x", g.channels, "x",
                                                     g.spatial, " is too large for cuDNN"));
    }
    KILN_CUDA_CHECK(dnn_->CreateTensorDescriptor(&x_));
    KILN_CUDA_CHECK(dnn_->SetTensor4dDescriptor(x_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g.batch,
                                                g.channels, static_cast<int>(g.spatial), 1));
    KILN_CUDA_CHECK(dnn_->CreateTensorDescriptor(&stats_));
    KILN_CUDA_CHECK(dnn_->SetTensor4dDescriptor(stats_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1,
                                                g.channels, 1, 1));
    return absl::OkStatus();
  }
  cudnnTensorDescriptor_t x() const { return x_; }
  cudnnTensorDescriptor_t stats() const { return stats_; }

 private:
  const CudnnLibrary* dnn_;
  cudnnTensorDescriptor_t x_ = nullptr, stats_ = nullptr;
};

constexpr float kOne = 1.0f, kZero = 0.0f;

// cuDNN's legacy batch-norm calls have refused batches over 65,535 samples: inference runs in
// chunks of at most this many (its statistics are per channel and fixed, so chunks are
// independent); training, whose statistics span the whole batch, refuses more.
constexpr int kCudnnMaxBatch = 65535;

absl::Status CheckTrainingBatch(const BatchNormGeometry& g) {
  if (g.batch <= kCudnnMaxBatch) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "batchnorm on CUDA: a training batch of ", g.batch, " samples is over cuDNN's batch-norm ",
      "limit of ", kCudnnMaxBatch, " (use a smaller batch_size, or train on the CPU)"));
}

}  // namespace

absl::Status CudaBackend::BatchNormForwardTraining(const BatchNormGeometry& g, double eps,
                                                   double momentum, const float* x,
                                                   const float* gamma, const float* beta, float* y,
                                                   float* running_mean, float* running_var,
                                                   float* saved_mean, float* saved_invstd) {
  KILN_RETURN_IF_ERROR(CheckBatchNorm(g, eps, /*training=*/true));
  KILN_RETURN_IF_ERROR(CheckTrainingBatch(g));
  KILN_RETURN_IF_ERROR(Activate());
  BatchNormDescriptors d(dnn_);
  KILN_RETURN_IF_ERROR(d.Init(g));
  KILN_CUDA_CHECK(dnn_->BatchNormalizationForwardTraining(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d.x(), x, d.x(), y, d.stats(), gamma, beta,
      momentum, running_mean, running_var, eps, saved_mean, saved_invstd));
  return absl::OkStatus();
}

absl::Status CudaBackend::BatchNormForwardInference(const BatchNormGeometry& g, double eps,
                                                    const float* x, const float* gamma,
                                                    const float* beta, const float* running_mean,
                                                    const float* running_var, float* y) {
  KILN_RETURN_IF_ERROR(CheckBatchNorm(g, eps, /*training=*/false));
  if (g.batch == 0) return absl::OkStatus();  // as on the CPU: nothing to do
  KILN_RETURN_IF_ERROR(Activate());
  const int64_t sample = int64_t{g.channels} * g.spatial;
  for (int first = 0; first < g.batch; first += kCudnnMaxBatch) {
    BatchNormGeometry chunk = g;
    chunk.batch = std::min(kCudnnMaxBatch, g.batch - first);
    BatchNormDescriptors d(dnn_);
    KILN_RETURN_IF_ERROR(d.Init(chunk));
    KILN_CUDA_CHECK(dnn_->BatchNormalizationForwardInference(
        cudnn_, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d.x(), x + first * sample, d.x(),
        y + first * sample, d.stats(), gamma, beta, running_mean, running_var, eps));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::BatchNormBackward(const BatchNormGeometry& g, double eps, const float* x,
                                            const float* gamma, const float* saved_mean,
                                            const float* saved_invstd, const float* dy,
                                            float* dgamma, float* dbeta, float* dx) {
  KILN_RETURN_IF_ERROR(CheckBatchNorm(g, eps, /*training=*/true));
  KILN_RETURN_IF_ERROR(CheckTrainingBatch(g));
  KILN_RETURN_IF_ERROR(Activate());
  BatchNormDescriptors d(dnn_);
  KILN_RETURN_IF_ERROR(d.Init(g));
  // cuDNN always writes dx; without a caller's, it goes to scratch.
  if (dx == nullptr) {
    const size_t bytes = static_cast<size_t>(int64_t{g.batch} * g.channels * g.spatial) * 4;
    KILN_ASSIGN_OR_RETURN(void* tmp, GetScratch(Scratch::kTemp, bytes));
    dx = static_cast<float*>(tmp);
  }
  // Data gradient overwritten (alpha 1, beta 0); parameter gradients accumulate (beta 1).
  KILN_CUDA_CHECK(dnn_->BatchNormalizationBackward(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kOne, d.x(), x, d.x(), dy, d.x(), dx,
      d.stats(), gamma, dgamma, dbeta, eps, saved_mean, saved_invstd));
  return absl::OkStatus();
}

}  // namespace kiln
