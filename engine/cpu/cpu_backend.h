// The CPU backend: oneDNN matmul and convolution primitives (OpenBLAS's sgemv for one-row
// products), and OpenMP loops that share their thread pool (all three use libgomp), so they never
// oversubscribe the cores.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/precision.h"

namespace kiln {

namespace cpu_internal {
class DnnlPrimitives;
}

class CpuBackend final : public Backend {
 public:
  // threads <= 0 means every core. Precision::kBf16 rounds the inputs of GEMMs and convolutions
  // to bfloat16 (products accumulate in float32); kTf32 computes as kFp32, there being no TF32
  // units on a CPU.
  explicit CpuBackend(int threads, Precision precision = Precision::kFp32);

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }
  int threads() const { return threads_; }
  void BindCallingThread() override;
  bool IssuesFromAnyThread() const override { return true; }

  absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) override;
  absl::Status CopyFromHost(const void* host, size_t bytes, Tensor* dst) override;
  absl::Status CopyToHost(const Tensor& src, void* host, size_t bytes) override;
  absl::Status Copy(const Tensor& src, Tensor* dst, size_t bytes) override;
  absl::Status Fill(Tensor* t, float value) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status Gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override;
  absl::Status BiasForward(int rows, int cols, const float* bias, float* y) override;
  absl::Status BiasBackward(int rows, int cols, const float* dy, float* dbias) override;

  absl::Status ReluForward(int64_t n, const float* x, float* y) override;
  absl::Status ReluBackward(int64_t n, const float* y, const float* dy, float* dx) override;
  absl::Status DropoutForward(int64_t n, float p, uint64_t seed, uint64_t offset, const float* x,
                              float* mask, float* y) override;
  absl::Status DropoutBackward(int64_t n, const float* mask, const float* dy, float* dx) override;
  absl::Status SoftmaxForward(int rows, int cols, const float* x, float* y) override;
  absl::Status ActivationForward(ActivationKind kind, float param, int64_t n, const float* x,
                                 float* y) override;
  absl::Status ActivationBackward(ActivationKind kind, float param, int64_t n, const float* x,
                                  const float* y, const float* dy, float* dx) override;
  absl::Status Add(int64_t n, const float* a, const float* b, float* y) override;
  absl::Status Scale(int64_t n, float alpha, float* x) override;
  absl::Status Copy2D(int64_t rows, int64_t cols, const float* src, int64_t src_stride, float* dst,
                      int64_t dst_stride) override;

  absl::Status Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                             const float* bias, Activation act, float* y) override;
  absl::Status Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                              const float* y, const float* dy, Activation act, float* dw,
                              float* dbias, float* dx) override;
  bool FusesConvMaxPool() const override { return true; }
  bool TakesNchw16c() const override { return true; }
  absl::Status Conv2dMaxPoolForward(const Conv2dGeometry& g, const Pool2dGeometry& pool,
                                    const float* x, const float* w, const float* bias,
                                    Activation act, uint8_t* winners, float* y) override;
  absl::Status Conv2dMaxPoolBackward(const Conv2dGeometry& g, const Pool2dGeometry& pool,
                                     const float* x, const float* w, const uint8_t* winners,
                                     const float* dy, Activation act, float* dw, float* dbias,
                                     float* dx) override;
  absl::Status MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                                int32_t* argmax) override;
  absl::Status MaxPool2dBackward(const Pool2dGeometry& g, const float* dy, const int32_t* argmax,
                                 float* dx) override;
  absl::Status AvgPool2dForward(const Pool2dGeometry& g, const float* x, float* y) override;
  absl::Status AvgPool2dBackward(const Pool2dGeometry& g, const float* dy, float* dx) override;

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
  // In one pass over nChw16c images; over NCHW the two ops one after the other.
  bool FusesBatchNormRelu() const override { return true; }
  absl::Status BatchNormReluForwardTraining(const BatchNormGeometry& g, double eps, double momentum,
                                            const float* x, const float* gamma, const float* beta,
                                            float* y, float* running_mean, float* running_var,
                                            float* saved_mean, float* saved_invstd) override;
  absl::Status BatchNormReluForwardInference(const BatchNormGeometry& g, double eps, const float* x,
                                             const float* gamma, const float* beta,
                                             const float* running_mean, const float* running_var,
                                             float* y) override;
  absl::Status BatchNormReluBackward(const BatchNormGeometry& g, double eps, const float* x,
                                     const float* gamma, const float* saved_mean,
                                     const float* saved_invstd, const float* y, const float* dy,
                                     float* dgamma, float* dbeta, float* dx) override;

  // Sequence ops (transformers): sequence_ops.cc.
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

  // The workspace (bytes) a convolution of geometry `g` takes on `threads` threads in
  // `precision`: the blocked
  // copies of its operands and oneDNN's scratchpad, from the very plan the op makes. One
  // workspace is kept and shared by every convolution of the backend, grown to the largest asked
  // for; the memory plan counts a job's with this. The largest int64 for a geometry oneDNN cannot
  // run.
  static int64_t ConvWorkspaceBytes(const Conv2dGeometry& g, int threads, bool backward,
                                    Precision precision);
  // What the backend holds now for its convolutions' workspace, in bytes.
  int64_t conv_workspace_held_bytes() const {
    return static_cast<int64_t>(workspace_.size() * sizeof(float));
  }

  ~CpuBackend() override;

 private:
  // Scratch grown on demand and kept between steps; null when it cannot be allocated.
  float* Scratch(std::vector<float>* buf, size_t elems);
  // The convolution workspace of a plan of `plan_bytes`, 64-byte aligned; null when it cannot be
  // allocated.
  char* ConvWorkspace(size_t plan_bytes);

  // The im2col convolutions (where oneDNN has only its reference kernel, and the backward of one
  // input channel), which run in NCHW: operands in nChw16c are converted on the way in and out.
  absl::Status Im2colForward(const Conv2dGeometry& g, const float* x, const float* w,
                             const float* bias, Activation act, float* y);
  absl::Status Im2colBackward(const Conv2dGeometry& g, const float* x, const float* w,
                              const float* y, const float* dy, Activation act, float* dw,
                              float* dbias, float* dx);
  // x in NCHW: x itself, or its conversion from `layout` into nchw_copies_[slot]; null when that
  // cannot be allocated.
  const float* AsNchw(ImageLayout layout, int batch, int channels, int64_t hw, const float* x,
                      int slot);

  // How Conv2dMaxPool{Forward,Backward} run for convolution g (conv_ops.cc).
  enum class FusedPoolPath { kIm2col, kBlocked16, kPlain };
  absl::StatusOr<FusedPoolPath> FusedPoolPathFor(const Conv2dGeometry& g, bool bias,
                                                 Activation act);

  int threads_;
  std::vector<float> workspace_;
  // For a fused max pooling: the convolution's output, which only the pooling reads, and the
  // pooling's input gradient where the convolution's backward takes it plain.
  std::vector<float> conv_out_, pool_grad_;
  // The ReLU's masked gradient before an NCHW batch norm's backward (BatchNormReluBackward).
  std::vector<float> masked_grad_;
  // NCHW copies of an im2col convolution's operands given in nChw16c: x, y, dy, and its output.
  std::vector<float> nchw_copies_[4];
  std::unique_ptr<cpu_internal::DnnlPrimitives> dnnl_;
};

}  // namespace kiln
