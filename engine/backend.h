// The op set every device implements. Layers, losses and optimizers call only this interface;
// the CPU and CUDA backends differ only in how they implement it.
//
// Conventions: every array is float32 unless said otherwise, row-major, images NCHW (or nChw16c
// where a geometry's ImageLayout says so, on a backend that TakesNchw16c). Pointers are
// device memory of this backend. Ops are issued in order on the backend's stream; results are
// visible to later ops at once and to the host after Synchronize() (or a Copy*Host). Gradients of
// parameters accumulate (+=); gradients of activations overwrite (=). The checks an op's inputs
// must pass on every backend ("CheckPool2d's rules") are in engine/backend_checks.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/augment_geometry.h"
#include "engine/pixel_norm.h"
#include "engine/tensor.h"

namespace kiln {

enum class DeviceKind { kCpu, kCuda };
enum class Transpose { kNo, kYes };
// An activation fused into the op that produces its input (cuDNN's conv-bias-activation).
enum class Activation { kNone, kRelu };

// The element-wise activation layers besides ReLU (which keeps its own ops and conv fusion), with
// PyTorch's formulas: tanh; sigmoid 1/(1+exp(-x)); GELU exact, x/2 (1 + erf(x/sqrt 2)); leaky
// ReLU x > 0 ? x : slope x; SiLU x sigmoid(x).
enum class ActivationKind { kTanh, kSigmoid, kGelu, kLeakyRelu, kSilu };

// How a batch of images lies in memory. kNchw: plain. kNchw16c: oneDNN's blocked layout on
// AVX-512, (batch, channels / 16, h, w, 16), for channel counts that are multiples of 16 (so as
// many floats as NCHW; with h = w = 1 the two are the same bytes). A model keeps the activations
// between ops that take it in nChw16c on a backend that does (Backend::TakesNchw16c), so that its
// convolutions run without a reorder on either side.
enum class ImageLayout { kNchw, kNchw16c };
inline const char* ImageLayoutName(ImageLayout l) {
  return l == ImageLayout::kNchw16c ? "nChw16c" : "NCHW";
}

// Geometry of a 2-D convolution over a batch of images; stride and zero padding per axis. The
// layouts: x_layout of x and dx, y_layout of y and dy.
struct Conv2dGeometry {
  int batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int out_channels = 0, kernel_h = 0, kernel_w = 0;
  int stride_h = 1, stride_w = 1, padding_h = 0, padding_w = 0;
  ImageLayout x_layout = ImageLayout::kNchw, y_layout = ImageLayout::kNchw;
  int out_h() const { return (in_h + 2 * padding_h - kernel_h) / stride_h + 1; }
  int out_w() const { return (in_w + 2 * padding_w - kernel_w) / stride_w + 1; }
};

// Geometry of a pooling window over a batch of images (floor mode). Padding is implicit:
// max pooling never picks a padded position, average pooling counts it as a zero
// (PyTorch's count_include_pad=True), so every window divides by kernel_h * kernel_w. `layout`
// is x's and y's (max pooling takes NCHW only).
struct Pool2dGeometry {
  int batch = 0, channels = 0, in_h = 0, in_w = 0;
  int kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, padding_h = 0, padding_w = 0;
  ImageLayout layout = ImageLayout::kNchw;
  int out_h() const { return (in_h + 2 * padding_h - kernel_h) / stride_h + 1; }
  int out_w() const { return (in_w + 2 * padding_w - kernel_w) / stride_w + 1; }
};

// Batch normalisation over x viewed as (batch, channels, spatial): statistics per channel over
// batch and spatial (spatial = H*W for batchnorm2d, 1 or L for batchnorm1d). `layout`: of x, y,
// dy and dx as images (batchnorm2d's; kNchw16c where the model keeps them blocked).
struct BatchNormGeometry {
  int batch = 0, channels = 0;
  int64_t spatial = 1;
  ImageLayout layout = ImageLayout::kNchw;
  int64_t values_per_channel() const { return int64_t{batch} * spatial; }
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
  // y = f(x) for the activation `kind`; `param` is leaky ReLU's negative slope (unused by the
  // others). y may be x.
  virtual absl::Status ActivationForward(ActivationKind kind, float param, int64_t n,
                                         const float* x, float* y) = 0;
  // dx = dy * f'(x), from the forward's input x and output y (each kind reads what it needs:
  // tanh and sigmoid y, the others x). dx may be dy.
  virtual absl::Status ActivationBackward(ActivationKind kind, float param, int64_t n,
                                          const float* x, const float* y, const float* dy,
                                          float* dx) = 0;
  // y(n) = a + b element-wise; y may be a or b (add nodes, summed gradients).
  virtual absl::Status Add(int64_t n, const float* a, const float* b, float* y) = 0;
  // x(n) *= alpha in place (data-parallel training's share of the global batch's mean).
  virtual absl::Status Scale(int64_t n, float alpha, float* x) = 0;
  // dst rows of `cols` floats, `dst_stride` apart, = src rows `src_stride` apart (as
  // cudaMemcpy2D, in floats): a concat's slices. CheckCopy2D's rules; the two must not overlap.
  virtual absl::Status Copy2D(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                              float* dst, int64_t dst_stride) = 0;

  // --- convolution and pooling --------------------------------------------------------------
  // y(N,OC,OH,OW) = act(conv(x(N,C,H,W), w(OC,C,KH,KW)) + bias(OC)) (bias may be null).
  virtual absl::Status Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                                     const float* bias, Activation act, float* y) = 0;
  // From dy (the gradient of the activated output y of the forward), dw += d/dw, dbias +=
  // d/dbias (when not null) and dx = the input gradient (when not null).
  virtual absl::Status Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                                      const float* y, const float* dy, Activation act, float* dw,
                                      float* dbias, float* dx) = 0;
  // Whether this backend's convolutions, average pooling and batch normalisation take images in
  // ImageLayout::kNchw16c (the layouts in their geometries); where not, they refuse it.
  virtual bool TakesNchw16c() const { return false; }
  // y = max over each window; argmax(int32, same shape as y) records the winner for backward
  // (its flat index in the unpadded input plane). CheckPool2d's rules for both passes.
  virtual absl::Status MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                                        int32_t* argmax) = 0;
  // dx = scatter of dy to the recorded winners (dx fully overwritten).
  virtual absl::Status MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                                         const int32_t* argmax, float* dx) = 0;
  // A max pooling of non-overlapping windows (CheckFusableMaxPool) run
  // on a convolution's output inside the convolution, so that the output never leaves the
  // backend's preferred layout: whether this backend does it (the model fuses only then).
  virtual bool FusesConvMaxPool() const { return false; }
  // y = maxpool(act(conv(x))) (`pool` over the convolution's output); `winners` (one byte per
  // y value, in a layout of the backend's choosing) records each window's winner for the
  // backward. Same values as Conv2dForward then MaxPool2dForward.
  virtual absl::Status Conv2dMaxPoolForward(const Conv2dGeometry& /*g*/,
                                            const Pool2dGeometry& /*pool*/, const float* /*x*/,
                                            const float* /*w*/, const float* /*bias*/,
                                            Activation /*act*/, uint8_t* /*winners*/,
                                            float* /*y*/) {
    return absl::UnimplementedError(absl::StrCat(name(), " does not fuse max pooling"));
  }
  // From dy (the pooled output's gradient) and the forward's winners: dw += d/dw, dbias +=
  // d/dbias, dx = the input gradient (when not null); the same values as MaxPool2dBackward then
  // Conv2dBackward.
  virtual absl::Status Conv2dMaxPoolBackward(const Conv2dGeometry& /*g*/,
                                             const Pool2dGeometry& /*pool*/, const float* /*x*/,
                                             const float* /*w*/, const uint8_t* /*winners*/,
                                             const float* /*dy*/, Activation /*act*/, float* /*dw*/,
                                             float* /*dbias*/, float* /*dx*/) {
    return absl::UnimplementedError(absl::StrCat(name(), " does not fuse max pooling"));
  }
  // y = mean over each window, padded positions counted as zeros (the divisor is always
  // kernel_h * kernel_w). CheckPool2d's rules for both passes.
  virtual absl::Status AvgPool2dForward(const Pool2dGeometry& g, const float* x, float* y) = 0;
  // dx = for each input pixel, the sum of dy / (kernel_h * kernel_w) over the windows holding it,
  // in a fixed order (dx fully overwritten).
  virtual absl::Status AvgPool2dBackward(const Pool2dGeometry& g, const float* dy, float* dx) = 0;

  // --- normalisation ----------------------------------------------------------------------
  // Training pass of batch normalisation: y = gamma * (x - mean) * invstd + beta with the batch's
  // mean and biased variance, invstd = 1 / sqrt(var + eps). Writes saved_mean and saved_invstd
  // (channels) for the backward pass and updates running_mean and running_var (channels) as
  // running = (1 - momentum) * running + momentum * batch statistic, with the unbiased variance
  // (PyTorch's and cuDNN's rule). x, y are (batch, channels, spatial). CheckBatchNorm's rules.
  virtual absl::Status BatchNormForwardTraining(const BatchNormGeometry& g, double eps,
                                                double momentum, const float* x, const float* gamma,
                                                const float* beta, float* y, float* running_mean,
                                                float* running_var, float* saved_mean,
                                                float* saved_invstd) = 0;
  // Evaluation pass: the same formula with running_mean and running_var.
  virtual absl::Status BatchNormForwardInference(const BatchNormGeometry& g, double eps,
                                                 const float* x, const float* gamma,
                                                 const float* beta, const float* running_mean,
                                                 const float* running_var, float* y) = 0;
  // Backward of the training pass from its saved statistics: dgamma += sum(dy * xhat),
  // dbeta += sum(dy) per channel, dx = the input gradient (when not null).
  virtual absl::Status BatchNormBackward(const BatchNormGeometry& g, double eps, const float* x,
                                         const float* gamma, const float* saved_mean,
                                         const float* saved_invstd, const float* dy, float* dgamma,
                                         float* dbeta, float* dx) = 0;
  // Batch normalisation and the ReLU that alone reads its output, as one op: y = max(0, bn(x)),
  // the same values as the batch norm then ReluForward, in one pass over y. The backward takes
  // that y for the ReLU's mask and gives what ReluBackward then BatchNormBackward give. Whether
  // this backend runs the pair so (the model fuses it only then).
  virtual bool FusesBatchNormRelu() const { return false; }
  virtual absl::Status BatchNormReluForwardTraining(const BatchNormGeometry& /*g*/, double /*eps*/,
                                                    double /*momentum*/, const float* /*x*/,
                                                    const float* /*gamma*/, const float* /*beta*/,
                                                    float* /*y*/, float* /*running_mean*/,
                                                    float* /*running_var*/, float* /*saved_mean*/,
                                                    float* /*saved_invstd*/) {
    return absl::UnimplementedError(absl::StrCat(name(), " does not fuse batch norm and ReLU"));
  }
  virtual absl::Status BatchNormReluForwardInference(const BatchNormGeometry& /*g*/, double /*eps*/,
                                                     const float* /*x*/, const float* /*gamma*/,
                                                     const float* /*beta*/,
                                                     const float* /*running_mean*/,
                                                     const float* /*running_var*/, float* /*y*/) {
    return absl::UnimplementedError(absl::StrCat(name(), " does not fuse batch norm and ReLU"));
  }
  virtual absl::Status BatchNormReluBackward(const BatchNormGeometry& /*g*/, double /*eps*/,
                                             const float* /*x*/, const float* /*gamma*/,
                                             const float* /*saved_mean*/,
                                             const float* /*saved_invstd*/, const float* /*y*/,
                                             const float* /*dy*/, float* /*dgamma*/,
                                             float* /*dbeta*/, float* /*dx*/) {
    return absl::UnimplementedError(absl::StrCat(name(), " does not fuse batch norm and ReLU"));
  }

  // --- sequences (transformers) -----------------------------------------------------------
  // Layer normalisation over the last dimension of x(rows, cols), PyTorch's nn.LayerNorm:
  // y = (x - mean) * rstd * gamma + beta per row, with the biased variance and
  // rstd = 1 / sqrt(var + eps); gamma and beta (cols) both null for no affine. Writes mean and rstd
  // (rows) for the backward. CheckLayerNorm's rules.
  virtual absl::Status LayerNormForward(int64_t rows, int cols, float eps, const float* x,
                                        const float* gamma, const float* beta, float* y,
                                        float* mean, float* rstd) = 0;
  // From the forward's x, mean and rstd: dx = the input gradient (overwritten; when not null),
  // dgamma += sum over rows of dy * xhat, dbeta += sum over rows of dy (when not null; gamma null
  // for no affine).
  virtual absl::Status LayerNormBackward(int64_t rows, int cols, const float* x, const float* gamma,
                                         const float* mean, const float* rstd, const float* dy,
                                         float* dx, float* dgamma, float* dbeta) = 0;
  // y(count, dim) = table[ids[i]] from table(vocab, dim), ids int32 in [0, vocab) (the caller
  // checks ids from outside on the host; a backend never reads outside the table: an id out of
  // range gives a zero row on CUDA and InvalidArgument on the CPU). CheckEmbedding's rules.
  virtual absl::Status EmbeddingForward(int64_t count, int vocab, int dim, const int32_t* ids,
                                        const float* table, float* y) = 0;
  // dtable(vocab, dim) += dy(count, dim) rows scattered to their ids, each table row summing its
  // rows in index order, so the result is the same bits on every run and thread count (no
  // atomics on floats). Ids out of range are skipped.
  virtual absl::Status EmbeddingBackward(int64_t count, int vocab, int dim, const int32_t* ids,
                                         const float* dy, float* dtable) = 0;
  // `batch` GEMMs (Gemm's conventions), the i-th on a + i * stride_a, b + i * stride_b and
  // c + i * stride_c (cuBLAS's strided batched GEMM; attention's per-head products).
  // CheckGemmStridedBatched's rules.
  virtual absl::Status GemmStridedBatched(Transpose ta, Transpose tb, int m, int n, int k,
                                          float alpha, const float* a, int64_t stride_a,
                                          const float* b, int64_t stride_b, float beta, float* c,
                                          int64_t stride_c, int batch) = 0;
  // Causal attention weights from scores x viewed as (batch, t, t): for each row i,
  // y[i][j] = softmax over j <= i of scale * x[i][j], and 0 for j > i (the scale, the causal mask
  // and the softmax in one pass). y may be x. CheckCausalSoftmax's rules.
  virtual absl::Status CausalSoftmaxForward(int64_t batch, int t, float scale, const float* x,
                                            float* y) = 0;
  // Causal attention weights of `queries` new positions offset..offset+queries-1 of a sequence
  // against its first `keys` positions (a KV cache's): x viewed as (batch, queries, keys), row i
  // keeps columns j <= offset + i, y[i][j] = softmax over them of scale * x[i][j], 0 beyond.
  // CausalSoftmaxForward is the case queries = keys = t, offset 0. y may be x.
  // CheckCausalSoftmaxAt's rules (offset + queries <= keys).
  virtual absl::Status CausalSoftmaxForwardAt(int64_t batch, int queries, int keys, int offset,
                                              float scale, const float* x, float* y) = 0;
  // From the forward's y: dx[i][j] = scale * y[i][j] * (dy[i][j] - sum over j' <= i of
  // dy[i][j'] * y[i][j']) for j <= i, 0 above the diagonal (overwritten). dx may be dy.
  virtual absl::Status CausalSoftmaxBackward(int64_t batch, int t, float scale, const float* y,
                                             const float* dy, float* dx) = 0;
  // y(a, c, b, d) = x(a, b, c, d): swaps the middle two axes (splitting attention heads out of
  // (batch, time, heads, head_dim), and merging them back). x and y must not overlap.
  // CheckTranspose0213's rules.
  virtual absl::Status Transpose0213(int64_t a, int64_t b, int64_t c, int64_t d, const float* x,
                                     float* y) = 0;

  // --- losses -------------------------------------------------------------------------------
  // Mean cross-entropy of log-softmax(logits(rows, cols)) against int32 labels smoothed as
  // PyTorch's CrossEntropyLoss(label_smoothing=e) does: the target puts 1-e on the label and e
  // spread evenly over all cols. Writes the mean loss to loss[0] and the number of rows whose
  // argmax equals the label to correct[0] (both device scalars). dlogits (softmax - target) / rows
  // when not null. CheckSoftmaxCrossEntropy's rules; zero rows write NaN and 0. e = 0 gives the
  // plain loss bit for bit.
  virtual absl::Status SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                                           const int32_t* labels, float label_smoothing,
                                           float* loss, int32_t* correct, float* dlogits) = 0;
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
  // out[0] += sum of x(n)^2, out a device scalar: one call per gradient accumulates the squared
  // global norm of gradient clipping (torch.nn.utils.clip_grad_norm_) on the device, and the
  // host reads one float. Squares are summed in double in an order fixed by n alone, so a run
  // repeats bit for bit. n = 0 leaves out as it is. CheckSumOfSquares's rules.
  virtual absl::Status SumOfSquares(int64_t n, const float* x, float* out) = 0;

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
  // GatherNormalize of CxHxW uint8 images with torchvision's RandomCrop(padding) and then
  // RandomHorizontalFlip applied to each before the normalisation: with {dy, dx, flip} =
  // decisions[i] (device memory) and P the image padded by g.padding zeros on each side,
  // out[i](c, y, x) = norm(P(c, y + dy, dx + (flip ? W - 1 - x : x))). A padded pixel becomes
  // norm(0), as torchvision pads the uint8 image before ToTensor and Normalize. Offsets outside
  // [0, 2 padding] only read more padding, never outside the image. CheckAugmentGeometry's rules.
  virtual absl::Status GatherAugmentNormalize(int count, const AugmentGeometry& g,
                                              const int32_t* index, const uint8_t* pixels,
                                              const int32_t* labels, const CropFlip* decisions,
                                              const PixelNorm& norm, float* out,
                                              int32_t* labels_out) = 0;
  // out(count, sample_elems) = norm(x) for pixels already in float: GatherNormalize's formula
  // and folding, so serving's FP32 inputs (x = u8 / 255, normalised with a 255 times larger
  // scale) meet the model as the uint8 ones do. `out` may be `x`.
  virtual absl::Status Normalize(int count, int64_t sample_elems, const float* x,
                                 const PixelNorm& norm, float* out) = 0;
};

}  // namespace kiln
