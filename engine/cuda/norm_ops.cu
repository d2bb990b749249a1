// CudaBackend's batch normalisation: (batch, features) tensors (spatial size 1) by kernels of
// kiln's own (below, where cuDNN is slow), the rest through cuDNN's legacy batch-norm calls, mode
// SPATIAL over x described as (batch, channels, spatial, 1): statistics per channel over batch and
// spatial, batchnorm2d (spatial = H*W) and batchnorm1d over a length L alike. cuDNN updates the
// running variance with the unbiased batch variance, and its exponentialAverageFactor is
// PyTorch's momentum.
#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cudnn_library.h"

// Batch normalisation over (batch, features), the case cuDNN's SPATIAL mode serves worst
// (PyTorch measured it 12-18x slower than a kernel of its own for 2-D inputs, and stopped
// calling cuDNN there). A block takes a tile of kTile features side by side, so each row's read
// is coalesced, and kRowThreads threads per feature walk the batch. Sums run in double, as on the
// CPU (engine/cpu/norm_ops.cc), reduced in a fixed order, so every run gives the same bits; there
// is no batch limit. Training updates the running statistics with the unbiased variance; the
// backward adds to dgamma and dbeta and writes dx only when it is not null.
namespace kiln::cuda_kernels {

namespace {

constexpr int kTile = 32;        // features per block: a warp reads 32 neighbouring floats
constexpr int kRowThreads = 16;  // threads down the batch for each feature

// The sum of `v` over the kRowThreads threads of this thread's feature, in a fixed order, given
// to all of them. Every thread of the block calls it.
__device__ double FeatureSum(double v) {
  __shared__ double part[kRowThreads][kTile];
  part[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  double total = 0;
  for (int r = 0; r < kRowThreads; ++r) total += part[r][threadIdx.x];
  __syncthreads();  // every thread has read `part` before a later call writes it
  return total;
}

__global__ void forward_training_kernel(int batch, int features, double eps, double momentum,
                                        const float* x, const float* gamma, const float* beta,
                                        float* y, float* running_mean, float* running_var,
                                        float* saved_mean, float* saved_invstd) {
  const int f = blockIdx.x * kTile + threadIdx.x;
  const bool active = f < features;
  const double n = static_cast<double>(batch);
  double sum = 0;
  if (active) {
    for (int i = threadIdx.y; i < batch; i += kRowThreads) sum += x[int64_t{i} * features + f];
  }
  const double mean = FeatureSum(sum) / n;
  double squares = 0;
  if (active) {
    for (int i = threadIdx.y; i < batch; i += kRowThreads) {
      const double d = x[int64_t{i} * features + f] - mean;
      squares += d * d;
    }
  }
  const double total_squares = FeatureSum(squares);
  if (!active) return;  // after the block's last synchronisation
  const double invstd = 1.0 / sqrt(total_squares / n + eps);
  if (threadIdx.y == 0) {
    saved_mean[f] = static_cast<float>(mean);
    saved_invstd[f] = static_cast<float>(invstd);
    running_mean[f] = static_cast<float>((1 - momentum) * running_mean[f] + momentum * mean);
    running_var[f] = static_cast<float>((1 - momentum) * running_var[f] +
                                        momentum * (total_squares / (n - 1)));
  }
  const double s = gamma[f] * invstd;
  const float scale = static_cast<float>(s), shift = static_cast<float>(beta[f] - mean * s);
  for (int i = threadIdx.y; i < batch; i += kRowThreads) {
    const int64_t k = int64_t{i} * features + f;
    y[k] = x[k] * scale + shift;
  }
}

__global__ void inference_kernel(int64_t n, int features, double eps, const float* x,
                                 const float* gamma, const float* beta, const float* running_mean,
                                 const float* running_var, float* y) {
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int f = static_cast<int>(k % features);
    const double s = gamma[f] / sqrt(static_cast<double>(running_var[f]) + eps);
    y[k] = x[k] * static_cast<float>(s) + static_cast<float>(beta[f] - running_mean[f] * s);
  }
}

__global__ void backward_kernel(int batch, int features, const float* x, const float* gamma,
                                const float* saved_mean, const float* saved_invstd,
                                const float* dy, float* dgamma, float* dbeta, float* dx) {
  const int f = blockIdx.x * kTile + threadIdx.x;
  const bool active = f < features;
  const double mean = active ? saved_mean[f] : 0.0, invstd = active ? saved_invstd[f] : 0.0;
  double sum_dy = 0, sum_dy_xhat = 0;
  if (active) {
    for (int i = threadIdx.y; i < batch; i += kRowThreads) {
      const int64_t k = int64_t{i} * features + f;
      const double d = dy[k];
      sum_dy += d;
      sum_dy_xhat += d * (x[k] - mean) * invstd;
    }
  }
  sum_dy = FeatureSum(sum_dy);
  sum_dy_xhat = FeatureSum(sum_dy_xhat);
  if (!active) return;
  if (threadIdx.y == 0) {
    dgamma[f] += static_cast<float>(sum_dy_xhat);
    dbeta[f] += static_cast<float>(sum_dy);
  }
  if (dx == nullptr) return;
  const double n = static_cast<double>(batch);
  const float scale = static_cast<float>(gamma[f] * invstd);
  const float mean_dy = static_cast<float>(sum_dy / n);
  const float mean_dy_xhat = static_cast<float>(sum_dy_xhat / n);
  const float m = static_cast<float>(mean), is = static_cast<float>(invstd);
  for (int i = threadIdx.y; i < batch; i += kRowThreads) {
    const int64_t k = int64_t{i} * features + f;
    dx[k] = scale * (dy[k] - mean_dy - (x[k] - m) * is * mean_dy_xhat);
  }
}

dim3 TileGrid(int features) { return dim3(static_cast<unsigned>((features + kTile - 1) / kTile)); }

cudaError_t batchnorm_features_forward_training(cudaStream_t stream, int batch, int features,
                                                double eps, double momentum, const float* x,
                                                const float* gamma, const float* beta, float* y,
                                                float* running_mean, float* running_var,
                                                float* saved_mean, float* saved_invstd) {
  if (batch <= 0 || features <= 0) return cudaSuccess;
  forward_training_kernel<<<TileGrid(features), dim3(kTile, kRowThreads), 0, stream>>>(
      batch, features, eps, momentum, x, gamma, beta, y, running_mean, running_var, saved_mean,
      saved_invstd);
  return cudaGetLastError();
}

cudaError_t batchnorm_features_inference(cudaStream_t stream, int batch, int features,
                                         double eps, const float* x, const float* gamma,
                                         const float* beta, const float* running_mean,
                                         const float* running_var, float* y) {
  const int64_t n = int64_t{batch} * features;
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  inference_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(
      n, features, eps, x, gamma, beta, running_mean, running_var, y);
  return cudaGetLastError();
}

cudaError_t batchnorm_features_backward(cudaStream_t stream, int batch, int features,
                                        const float* x, const float* gamma,
                                        const float* saved_mean, const float* saved_invstd,
                                        const float* dy, float* dgamma, float* dbeta, float* dx) {
  if (batch <= 0 || features <= 0) return cudaSuccess;
  backward_kernel<<<TileGrid(features), dim3(kTile, kRowThreads), 0, stream>>>(
      batch, features, x, gamma, saved_mean, saved_invstd, dy, dgamma, dbeta, dx);
  return cudaGetLastError();
}

}  // namespace

}  // namespace kiln::cuda_kernels

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
namespace ck = cuda_kernels;

// cuDNN's legacy batch-norm calls have refused batches over 65,535 samples: inference runs in
// chunks of at most this many (its statistics are per channel and fixed, so chunks are
// independent); training, whose statistics span the whole batch, refuses more. (The kernels of
// the (batch, features) case have no such limit.)
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
  KILN_RETURN_IF_ERROR(CheckBatchNorm(g, eps, /*training=*/true, *this));
  KILN_RETURN_IF_ERROR(Activate());
  if (g.spatial == 1) {
    KILN_CUDA_CHECK(ck::batchnorm_features_forward_training(
        stream_, g.batch, g.channels, eps, momentum, x, gamma, beta, y, running_mean, running_var,
        saved_mean, saved_invstd));
    return absl::OkStatus();
  }
  KILN_RETURN_IF_ERROR(CheckTrainingBatch(g));
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
  KILN_RETURN_IF_ERROR(CheckBatchNorm(g, eps, /*training=*/false, *this));
  if (g.batch == 0) return absl::OkStatus();  // as on the CPU: nothing to do
  KILN_RETURN_IF_ERROR(Activate());
  if (g.spatial == 1) {
    KILN_CUDA_CHECK(ck::batchnorm_features_inference(stream_, g.batch, g.channels, eps, x, gamma,
                                                     beta, running_mean, running_var, y));
    return absl::OkStatus();
  }
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
  KILN_RETURN_IF_ERROR(CheckBatchNorm(g, eps, /*training=*/true, *this));
  KILN_RETURN_IF_ERROR(Activate());
  if (g.spatial == 1) {  // writes dx only when asked: no scratch
    KILN_CUDA_CHECK(ck::batchnorm_features_backward(stream_, g.batch, g.channels, x, gamma,
                                                    saved_mean, saved_invstd, dy, dgamma, dbeta,
                                                    dx));
    return absl::OkStatus();
  }
  KILN_RETURN_IF_ERROR(CheckTrainingBatch(g));
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
