// The CUDA backend: one stream per instance, cuBLAS and cuDNN handles bound to it, a caching
// device allocator, cuDNN convolutions with per-shape algorithm choice, and kiln's own kernels for
// everything else. Results match the CPU backend to float rounding (TF32 is off by default).
//
// Threading: like every backend, one thread at a time issues ops; tensors may be freed from any
// thread. Every failing CUDA, cuBLAS or cuDNN call comes back as a Status naming the call, file
// and line; out of device memory is ResourceExhausted. Bad labels found by a kernel come back as
// InvalidArgument from the next Synchronize() or CopyToHost().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_backend_options.h"

// The CUDA handle types, declared so that this header needs no CUDA headers.
struct CUstream_st;
struct cublasContext;
namespace kiln {
struct CublasLibrary;
struct CudnnLibrary;
}  // namespace kiln
struct cudnnContext;

namespace kiln {

class CudaCachingAllocator;
class CudnnConvolutions;

class CudaBackend final : public Backend {
 public:
  // Backend for CUDA device `device` (cuda:N): NotFound when there is no such device, and any
  // failure of the driver or libraries (no driver, cuDNN missing) as a Status; nothing aborts.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      int device, const CudaBackendOptions& options = {});
  ~CudaBackend() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override;
  int device() const { return device_; }
  const CudaBackendOptions& options() const { return options_; }
  // The device, its memory and the library versions: "NVIDIA H200, 139 GiB, sm_90; cuBLAS ...".
  std::string Description() const;
  // The cuDNN algorithms chosen so far, one entry per convolution shape.
  std::string ConvolutionAlgorithms() const;
  // Those chosen for the shape of `g` ("" before its first use).
  std::string ConvolutionAlgorithms(const Conv2dGeometry& g) const;
  // Device memory held by this backend (its pool of the device's allocator): in tensors and
  // scratch, and waiting in its cache.
  size_t bytes_in_use() const;
  size_t bytes_cached() const;
  int64_t device_allocations() const;  // cudaMalloc calls so far
  // The stream every op is issued on, for work that must run in order with them (NCCL).
  CUstream_st* stream() const { return stream_; }

  absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) override;
  // Returns once `host` may be reused (the copy is queued in stream order).
  absl::Status CopyFromHost(const void* host, size_t bytes, Tensor* dst) override;
  // Waits for every op issued so far, then copies: `host` holds the result on return.
  absl::Status CopyToHost(const Tensor& src, void* host, size_t bytes) override;
  absl::Status Copy(const Tensor& src, Tensor* dst, size_t bytes) override;
  absl::Status Fill(Tensor* t, float value) override;
  absl::Status Synchronize() override;

  absl::Status Gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override;
  absl::Status BiasForward(int rows, int cols, const float* bias, float* y) override;
  absl::Status BiasBackward(int rows, int cols, const float* dy, float* dbias) override;

  absl::Status ReluForward(int64_t n, const float* x, float* y) override;
  absl::Status ReluBackward(int64_t n, const float* y, const float* dy, float* dx) override;
  absl::Status ActivationForward(ActivationKind kind, float param, int64_t n, const float* x,
                                 float* y) override;
  absl::Status ActivationBackward(ActivationKind kind, float param, int64_t n, const float* x,
                                  const float* y, const float* dy, float* dx) override;
  absl::Status DropoutForward(int64_t n, float p, uint64_t seed, uint64_t offset, const float* x,
                              float* mask, float* y) override;
  absl::Status DropoutBackward(int64_t n, const float* mask, const float* dy, float* dx) override;
  absl::Status SoftmaxForward(int rows, int cols, const float* x, float* y) override;
  absl::Status Add(int64_t n, const float* a, const float* b, float* y) override;
  absl::Status Scale(int64_t n, float alpha, float* x) override;
  absl::Status Copy2D(int64_t rows, int64_t cols, const float* src, int64_t src_stride, float* dst,
                      int64_t dst_stride) override;

  absl::Status Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                             const float* bias, Activation act, float* y) override;
  absl::Status Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                              const float* y, const float* dy, Activation act, float* dw,
                              float* dbias, float* dx) override;
  absl::Status MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                                int32_t* argmax) override;
  absl::Status AvgPool2dForward(const Pool2dGeometry& g, const float* x, float* y) override;
  absl::Status AvgPool2dBackward(const Pool2dGeometry& g, const float* dy, float* dx) override;
  absl::Status MaxPool2dBackward(const Pool2dGeometry& g, const float* dy, const int32_t* argmax,
                                 float* dx) override;
  absl::Status BatchNormForwardTraining(const BatchNormGeometry& g, double eps, double momentum,
                                        const float* x, const float* gamma, const float* beta,
                                        float* y, float* running_mean, float* running_var,
                                        float* saved_mean, float* saved_invstd) override;
  absl::Status BatchNormForwardInference(const BatchNormGeometry& g, double eps, const float* x,
                                         const float* gamma, const float* beta,
                                         const float* running_mean, const float* running_var,
                                         float* y) override;
  absl::Status BatchNormBackward(const BatchNormGeometry& g, double eps, const float* x,
                                 const float* gamma, const float* saved_mean,
                                 const float* saved_invstd, const float* dy, float* dgamma,
                                 float* dbeta, float* dx) override;

  // Sequence ops (transformers): sequence_ops.cu.
  absl::Status LayerNormForward(int64_t rows, int cols, float eps, const float* x,
                                const float* gamma, const float* beta, float* y, float* mean,
                                float* rstd) override;
  absl::Status LayerNormBackward(int64_t rows, int cols, const float* x, const float* gamma,
                                 const float* mean, const float* rstd, const float* dy, float* dx,
                                 float* dgamma, float* dbeta) override;
  absl::Status EmbeddingForward(int64_t count, int vocab, int dim, const int32_t* ids,
                                const float* table, float* y) override;
  absl::Status EmbeddingBackward(int64_t count, int vocab, int dim, const int32_t* ids,
                                 const float* dy, float* dtable) override;
  absl::Status GemmStridedBatched(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                                  const float* a, int64_t stride_a, const float* b,
                                  int64_t stride_b, float beta, float* c, int64_t stride_c,
                                  int batch) override;
  absl::Status CausalSoftmaxForward(int64_t batch, int t, float scale, const float* x,
                                    float* y) override;
  absl::Status CausalSoftmaxForwardAt(int64_t batch, int queries, int keys, int offset, float scale,
                                      const float* x, float* y) override;
  absl::Status CausalSoftmaxBackward(int64_t batch, int t, float scale, const float* y,
                                     const float* dy, float* dx) override;
  absl::Status Transpose0213(int64_t a, int64_t b, int64_t c, int64_t d, const float* x,
                             float* y) override;

  absl::Status SoftmaxCrossEntropy(int rows, int cols, const float* logits, const int32_t* labels,
                                   float label_smoothing, float* loss, int32_t* correct,
                                   float* dlogits) override;
  absl::Status MeanSquaredError(int64_t n, const float* y, const float* target, float* loss,
                                float* dy) override;
  absl::Status OneHot(int rows, int cols, const int32_t* labels, float* onehot) override;
  absl::Status Argmax(int rows, int cols, const float* x, int32_t* out) override;
  absl::Status CountCorrect(int rows, int cols, const float* x, const int32_t* labels,
                            int32_t* correct) override;

  absl::Status SgdUpdate(int64_t n, const SgdHyper& hyper, MomentumBuffer buffer, float* param,
                         const float* grad, float* momentum_buf) override;
  absl::Status AdamUpdate(int64_t n, const AdamHyper& hyper, float* param, const float* grad,
                          float* exp_avg, float* exp_avg_sq) override;
  absl::Status SumOfSquares(int64_t n, const float* x, float* out) override;

  absl::Status GatherNormalize(int count, int64_t sample_elems, const int32_t* index,
                               const uint8_t* pixels, const int32_t* labels, const PixelNorm& norm,
                               float* out, int32_t* labels_out) override;
  absl::Status GatherNormalizeF32(int count, int64_t sample_elems, const int32_t* index,
                                  const float* features, const int32_t* labels,
                                  const PixelNorm& norm, float* out, int32_t* labels_out) override;
  absl::Status GatherAugmentNormalize(int count, const AugmentGeometry& g, const int32_t* index,
                                      const uint8_t* pixels, const int32_t* labels,
                                      const CropFlip* decisions, const PixelNorm& norm, float* out,
                                      int32_t* labels_out) override;
  absl::Status Normalize(int count, int64_t sample_elems, const float* x, const PixelNorm& norm,
                         float* out) override;

 private:
  // Device memory kept between ops and grown on demand: kTemp for kiln's kernels, kWorkspace
  // for cuDNN. An op may use both, never two requests of one slot at once.
  // kBf16Copies: a convolution's bfloat16 copies of its operands and outputs (conv_ops.cu).
  enum class Scratch { kTemp, kWorkspace, kBf16Copies };
  struct ScratchBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };

  CudaBackend(int device, const CudaBackendOptions& options);
  absl::Status Init();
  // Makes this backend's device current on the calling thread (ops may come from any thread).
  absl::Status Activate();
  absl::StatusOr<void*> GetScratch(Scratch slot, size_t bytes);
  // Conv2dBackward's products under bf16 from the gradient at the convolution's output (masked
  // by the fused ReLU already): dw += d/dw, dx = d/dx, on bfloat16 copies (conv_ops.cu).
  absl::Status Conv2dBackwardBf16(const Conv2dGeometry& g, const float* x, const float* w,
                                  const float* grad, float* dw, float* dx);
  // Waits for the stream; then reports (and clears) a bad input a kernel recorded.
  absl::Status SyncAndCheckKernelErrors();

  const int device_;
  const CudaBackendOptions options_;
  std::shared_ptr<CudaCachingAllocator> allocator_;  // the device's, shared
  uint64_t pool_ = 0;                                // this backend's stream's pool in it
  CUstream_st* stream_ = nullptr;
  const CublasLibrary* blas_ = nullptr;  // loaded at Init
  const CudnnLibrary* dnn_ = nullptr;    // loaded at Init
  cublasContext* cublas_ = nullptr;
  cudnnContext* cudnn_ = nullptr;
  std::unique_ptr<CudnnConvolutions> convs_;
  ScratchBuffer temp_, workspace_, bf16_copies_;
  // Pinned host memory for small device-to-host copies (the per-step loss and accuracy).
  void* staging_ = nullptr;
  // A KernelErrorRecord in device memory, and whether a kernel that may write it ran since the
  // last check.
  void* kernel_error_ = nullptr;
  bool kernel_error_pending_ = false;
};

}  // namespace kiln
