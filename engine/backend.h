// The op set every device implements. Layers, losses and optimizers call only this interface;
// the CPU and CUDA backends differ only in how they implement it.
//
// Conventions: every array is float32 unless said otherwise, row-major, images NCHW. Pointers are
// device memory of this backend. Ops are issued in order on the backend's stream; results are
// visible to later ops at once and to the host after Synchronize() (or a Copy*Host). Gradients of
// parameters accumulate (+=); gradients of activations overwrite (=).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/tensor.h"

namespace kiln {

enum class DeviceKind { kCpu, kCuda };
enum class Transpose { kNo, kYes };
// An activation fused into the op that produces its input (cuDNN's conv-bias-activation).
enum class Activation { kNone, kRelu };

// Geometry of a 2-D convolution or pooling window over a batch of NCHW images.
struct Conv2dGeometry {
  int batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int out_channels = 0, kernel_h = 0, kernel_w = 0;
  int stride = 1, padding = 0;
  int out_h() const { return (in_h + 2 * padding - kernel_h) / stride + 1; }
  int out_w() const { return (in_w + 2 * padding - kernel_w) / stride + 1; }
};

struct Pool2dGeometry {
  int batch = 0, channels = 0, in_h = 0, in_w = 0;
  int kernel = 2, stride = 2;
  int out_h() const { return (in_h - kernel) / stride + 1; }
  int out_w() const { return (in_w - kernel) / stride + 1; }
};

struct SgdHyper {
  float lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

enum class MomentumBuffer { kSeed, kAccumulate };

enum class WeightDecayMode { kL2 /* Adam: added to the gradient */, kDecoupled /* AdamW */ };
struct AdamHyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  WeightDecayMode decay = WeightDecayMode::kL2;
  int64_t step = 1;  // 1-based step count, for bias correction.
};

// The most workspace a CUDA backend lets one cuDNN convolution use (CudaBackendOptions), here so
// that the memory plan counts it without CUDA headers.
inline constexpr size_t kCudaConvWorkspaceLimit = size_t{256} << 20;

// Normalisation of raw uint8 pixels: x = (u8 * scale - mean) / std; or per channel, when
// channel_mean and channel_std hold C values each (1..kMaxNormChannels), x = (u8 * scale -
// channel_mean[c]) / channel_std[c] with c = j / (sample_elems / C) for sample element j (CHW).
inline constexpr int kMaxNormChannels = 256;
// What a model's inputs are: uint8 pixels (FP32 serving inputs then mean pixel / 255), or float
// features (CSV tables; scale 1, per-feature channels, FP32 inputs taken as they are).
enum class NormInput { kPixels, kFeatures };
struct PixelNorm {
  PixelNorm() = default;
  // The scalar form, as {scale, mean, std}.
  PixelNorm(float scale_, float mean_, float std_) : scale(scale_), mean(mean_), std(std_) {}

  float scale = 1.0f / 255.0f, mean = 0.0f, std = 1.0f;
  std::vector<float> channel_mean, channel_std;  // both empty: the scalar mean and std apply
  NormInput input = NormInput::kPixels;

  int channels() const { return channel_mean.empty() ? 1 : static_cast<int>(channel_mean.size()); }
};

// A PixelNorm folded for samples of `sample_elems`: x = u8 * a[c] + b[c] over planes of `plane`
// elements (one per channel), with the raw value first multiplied by `input_scale`. What every
// backend applies; InvalidArgument when the channels do not divide the sample or are malformed.
struct FoldedNorm {
  int64_t plane = 0;
  std::vector<float> a, b;
};
inline absl::StatusOr<FoldedNorm> FoldPixelNorm(const PixelNorm& n, int64_t sample_elems,
                                                float input_scale = 1.0f) {
  const int c = n.channels();
  if (n.channel_mean.size() != n.channel_std.size() || c > kMaxNormChannels || sample_elems < 0 ||
      (sample_elems > 0 && sample_elems % c != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalisation: ", n.channel_mean.size(), " channel means and ",
                     n.channel_std.size(), " channel stds do not fit samples of ", sample_elems,
                     " values (at most ", kMaxNormChannels, " channels, dividing the sample)"));
  }
  FoldedNorm f;
  f.plane = sample_elems / c;
  for (int i = 0; i < c; ++i) {
    const float mean = n.channel_mean.empty() ? n.mean : n.channel_mean[i];
    const float std = n.channel_std.empty() ? n.std : n.channel_std[i];
    f.a.push_back(n.scale * input_scale / std);
    f.b.push_back(-mean / std);
  }
  return f;
}

// What every backend's copies check: `bytes` must fit the `capacity` of the tensors involved.
// InvalidArgument naming the op otherwise.
inline absl::Status CheckCopyFits(const char* op, size_t bytes, size_t capacity) {
  if (bytes <= capacity) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", bytes, " bytes do not fit a tensor of ", capacity, " bytes"));
}

// What every backend checks before pooling: a window of at least 1 that fits the input (a
// smaller input would make the window read past it). InvalidArgument naming the geometry.
inline absl::Status CheckPool2d(const Pool2dGeometry& g) {
  if (g.kernel < 1 || g.stride < 1 || g.batch < 0 || g.channels < 0 || g.in_h < 0 || g.in_w < 0) {
    return absl::InvalidArgumentError(absl::StrCat("maxpool2d: invalid geometry kernel ", g.kernel,
                                                   " stride ", g.stride, " over ", g.batch, "x",
                                                   g.channels, "x", g.in_h, "x", g.in_w));
  }
  if (g.in_h < g.kernel || g.in_w < g.kernel) {
    return absl::InvalidArgumentError(absl::StrCat("maxpool2d: input ", g.in_h, "x", g.in_w,
                                                   " is smaller than the ", g.kernel, "x", g.kernel,
                                                   " window"));
  }
  return absl::OkStatus();
}

// What every backend checks before a softmax cross-entropy: at least one class, no negative row
// count. Zero rows is allowed: the loss is NaN (a mean over nothing) and correct is 0.
inline absl::Status CheckSoftmaxCrossEntropy(int rows, int cols) {
  if (rows < 0 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat("softmax cross-entropy over ", rows, " rows of ",
                                                   cols, " classes: needs at least one class"));
  }
  return absl::OkStatus();
}

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"

  // --- threads --------------------------------------------------------------------------------
  // Makes the calling thread ready to issue this backend's ops at the backend's parallelism (the
  // CPU backend sizes the thread's OpenMP team, which its loops and OpenBLAS take their thread
  // count from; creating a CPU backend binds the creating thread). Call it on a thread before it
  // issues ops; cheap.
  virtual void BindCallingThread() {}
  // Whether any thread may issue ops (after BindCallingThread), so a request can run on the
  // thread that brought it; false where one thread feeding the device's stream does better.
  virtual bool IssuesFromAnyThread() const { return false; }

  // --- memory -------------------------------------------------------------------------------
  // Zero-filled tensor of this shape.
  virtual absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) = 0;
  virtual absl::Status CopyFromHost(const void* host, size_t bytes, Tensor* dst) = 0;
  virtual absl::Status CopyToHost(const Tensor& src, void* host, size_t bytes) = 0;
  // dst[0:bytes] = src[0:bytes], both of this backend.
  virtual absl::Status Copy(const Tensor& src, Tensor* dst, size_t bytes) = 0;
  virtual absl::Status Fill(Tensor* t, float value) = 0;
  // Waits until every op issued so far has finished; reports any asynchronous failure.
  virtual absl::Status Synchronize() = 0;

  // --- dense algebra ------------------------------------------------------------------------
  // C(m,n) = alpha * op(A) * op(B) + beta * C, op(A) is (m,k), op(B) is (k,n); row-major with
  // leading dimensions equal to the stored row lengths.
  virtual absl::Status Gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                            const float* a, const float* b, float beta, float* c) = 0;
  // y(rows, cols) += bias(cols) broadcast over rows.
  virtual absl::Status BiasForward(int rows, int cols, const float* bias, float* y) = 0;
  // dbias(cols) += sum over rows of dy(rows, cols).
  virtual absl::Status BiasBackward(int rows, int cols, const float* dy, float* dbias) = 0;

  // --- element-wise -------------------------------------------------------------------------
  virtual absl::Status ReluForward(int64_t n, const float* x, float* y) = 0;
  // dx = dy where y > 0 else 0 (y is the forward output).
  virtual absl::Status ReluBackward(int64_t n, const float* y, const float* dy, float* dx) = 0;
  // Inverted dropout: keep with probability 1-p, scale kept by 1/(1-p); mask holds the factor.
  virtual absl::Status DropoutForward(int64_t n, float p, uint64_t seed, uint64_t offset,
                                      const float* x, float* mask, float* y) = 0;
  virtual absl::Status DropoutBackward(int64_t n, const float* mask, const float* dy,
                                       float* dx) = 0;
  // Row-wise softmax of x(rows, cols).
  virtual absl::Status SoftmaxForward(int rows, int cols, const float* x, float* y) = 0;

  // --- convolution and pooling --------------------------------------------------------------
  // y(N,OC,OH,OW) = act(conv(x(N,C,H,W), w(OC,C,KH,KW)) + bias(OC)) (bias may be null).
  virtual absl::Status Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                                     const float* bias, Activation act, float* y) = 0;
  // From dy (the gradient of the activated output y of the forward), dw += d/dw, dbias +=
  // d/dbias (when not null) and dx = the input gradient (when not null).
  virtual absl::Status Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                                      const float* y, const float* dy, Activation act, float* dw,
                                      float* dbias, float* dx) = 0;
  // y = max over each window; argmax(int32, same shape as y) records the winner for backward.
  // CheckPool2d's rules for both passes.
  virtual absl::Status MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                                        int32_t* argmax) = 0;
  // dx = scatter of dy to the recorded winners (dx fully overwritten).
  virtual absl::Status MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                                         const int32_t* argmax, float* dx) = 0;

  // --- losses -------------------------------------------------------------------------------
  // Mean cross-entropy of log-softmax(logits(rows, cols)) against int32 labels. Writes the mean
  // loss to loss[0] and the number of rows whose argmax equals the label to correct[0] (both
  // device scalars). dlogits (softmax - onehot) / rows when not null. CheckSoftmaxCrossEntropy's
  // rules; zero rows write NaN and 0.
  virtual absl::Status SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                                           const int32_t* labels, float* loss, int32_t* correct,
                                           float* dlogits) = 0;
  // Mean squared error over all elements; dy = 2 (y - target) / n when not null.
  virtual absl::Status MeanSquaredError(int64_t n, const float* y, const float* target, float* loss,
                                        float* dy) = 0;
  // onehot(rows, cols) from int32 labels.
  virtual absl::Status OneHot(int rows, int cols, const int32_t* labels, float* onehot) = 0;
  // Row-wise argmax of x(rows, cols) into int32 out(rows).
  virtual absl::Status Argmax(int rows, int cols, const float* x, int32_t* out) = 0;
  // correct[0] = number of rows of x(rows, cols) whose argmax equals the int32 label.
  virtual absl::Status CountCorrect(int rows, int cols, const float* x, const int32_t* labels,
                                    int32_t* correct) = 0;

  // --- optimizers (PyTorch's formulas) ------------------------------------------------------
  // momentum_buf is used when hyper.momentum != 0; kSeed sets it to the gradient (first step).
  virtual absl::Status SgdUpdate(int64_t n, const SgdHyper& hyper, MomentumBuffer buffer,
                                 float* param, const float* grad, float* momentum_buf) = 0;
  virtual absl::Status AdamUpdate(int64_t n, const AdamHyper& hyper, float* param,
                                  const float* grad, float* exp_avg, float* exp_avg_sq) = 0;

  // --- data ---------------------------------------------------------------------------------
  // out(count, sample_elems) = norm(pixels[index[i]]) gathered from a uint8 dataset of
  // sample_elems per sample; labels_out(count) likewise from int32 labels (when not null).
  virtual absl::Status GatherNormalize(int count, int64_t sample_elems, const int32_t* index,
                                       const uint8_t* pixels, const int32_t* labels,
                                       const PixelNorm& norm, float* out, int32_t* labels_out) = 0;
  // GatherNormalize for a float dataset (features): out = norm(features[index[i]]).
  virtual absl::Status GatherNormalizeF32(int count, int64_t sample_elems, const int32_t* index,
                                          const float* features, const int32_t* labels,
                                          const PixelNorm& norm, float* out,
                                          int32_t* labels_out) = 0;
  // out(count, sample_elems) = norm(x) for pixels already in float: GatherNormalize's formula
  // and folding, so serving's FP32 inputs (x = u8 / 255, normalised with a 255 times larger
  // scale) meet the model as the uint8 ones do. `out` may be `x`.
  virtual absl::Status Normalize(int count, int64_t sample_elems, const float* x,
                                 const PixelNorm& norm, float* out) = 0;
};

}  // namespace kiln
