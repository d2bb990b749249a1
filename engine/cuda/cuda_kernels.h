// Launch wrappers of kiln's own CUDA kernels, one per op, each beside its kernel in the .cu file
// named after its group. All run on the given stream, return the launch's cudaError_t, and launch
// nothing for empty inputs. Pointers are device memory; shapes follow engine/backend.h.
// Internal to engine/cuda/: CudaBackend checks the inputs and the results.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/adam_constants.h"

namespace kiln::cuda_kernels {

// Bad input a kernel found, written to host-mapped memory with the first failure winning, and
// read by the host after the stream is synchronised.
enum KernelErrorCode : int32_t { kNoKernelError = 0, kLabelOutOfRange = 1 };
enum KernelOp : int32_t { kOpSoftmaxCrossEntropy = 1, kOpOneHot = 2 };
struct KernelErrorRecord {
  int32_t code;   // KernelErrorCode
  int32_t op;     // KernelOp
  int32_t value;  // the offending label
  int32_t limit;  // the number of classes
};

// --- elementwise_kernels.cu ------------------------------------------------------------------
// dst[0:n] = the 32-bit pattern `bits` (a float or an int32).
cudaError_t fill_u32(cudaStream_t stream, int64_t n, uint32_t bits, void* dst);
cudaError_t relu_forward(cudaStream_t stream, int64_t n, const float* x, float* y);
cudaError_t relu_backward(cudaStream_t stream, int64_t n, const float* y, const float* dy,
                          float* dx);
// mask[i] = CounterUniform(seed, offset + i) >= p ? keep_scale : 0 (engine/rng.h, bit for bit);
// y = x * mask.
cudaError_t dropout_forward(cudaStream_t stream, int64_t n, float p, float keep_scale,
                            uint64_t seed, uint64_t offset, const float* x, float* mask, float* y);
// y = a + b element-wise; y may be a or b.
cudaError_t add(cudaStream_t stream, int64_t n, const float* a, const float* b, float* y);
// x(n) *= alpha.
cudaError_t scale(cudaStream_t stream, int64_t n, float alpha, float* x);
// out = a * b element-wise (dropout's backward).
cudaError_t multiply(cudaStream_t stream, int64_t n, const float* a, const float* b, float* out);
// y(rows, cols) += bias(cols).
cudaError_t bias_forward(cudaStream_t stream, int rows, int cols, const float* bias, float* y);
// dbias(cols) += column sums of dy(rows, cols), in a fixed order.
cudaError_t bias_backward(cudaStream_t stream, int rows, int cols, const float* dy, float* dbias);
// y(rows, cols) = softmax of each row of x.
cudaError_t softmax_forward(cudaStream_t stream, int rows, int cols, const float* x, float* y);
// y = f(x) and dx = dy * f'(x) for the activation `kind` (an ActivationCode: engine/backend.h's
// ActivationKind as int, this header staying free of the engine's); activation_math.h's formulas.
enum ActivationCode : int { kTanh = 0, kSigmoid = 1, kGelu = 2, kLeakyRelu = 3, kSilu = 4 };
cudaError_t activation_forward(cudaStream_t stream, int kind, float param, int64_t n,
                               const float* x, float* y);
cudaError_t activation_backward(cudaStream_t stream, int kind, float param, int64_t n,
                                const float* x, const float* y, const float* dy, float* dx);

enum class ConvActivation { kNone, kRelu };
// y(batch, channels, plane) = act(y + bias[channel]); bias may be null.
cudaError_t conv_bias_act_forward(cudaStream_t stream, int batch, int channels, int64_t plane,
                                  const float* bias, ConvActivation act, float* y);
// Per channel of dy(batch, channels, plane): d = relu_y ? (relu_y > 0 ? dy : 0) : dy; writes d to
// masked (when not null) and adds its sum over batch and plane to dbias (when not null), in a
// fixed order.
cudaError_t conv_bias_act_backward(cudaStream_t stream, int batch, int channels, int64_t plane,
                                   const float* relu_y, const float* dy, float* masked,
                                   float* dbias);

// --- loss_kernels.cu -------------------------------------------------------------------------
// Fused log-softmax cross-entropy over logits(rows, cols): loss[0] = mean row loss (summed in
// double, in a fixed order), correct[0] = rows whose first maximum is the label, dlogits =
// (softmax - target) / rows when not null, the target smoothed as Backend::SoftmaxCrossEntropy
// says. scratch holds 8 * rows bytes.
cudaError_t softmax_xent(cudaStream_t stream, int rows, int cols, const float* logits,
                         const int32_t* labels, float label_smoothing, float* loss,
                         int32_t* correct, float* dlogits, void* scratch, KernelErrorRecord* error);
// Bytes of scratch mean_squared_error needs.
int64_t mean_squared_error_scratch_bytes(int64_t n);
// loss[0] = mean of (y - target)^2 (summed in double, fixed order); dy = 2 (y - target) / n
// when not null.
cudaError_t mean_squared_error(cudaStream_t stream, int64_t n, const float* y, const float* target,
                               float* loss, float* dy, void* scratch);
cudaError_t one_hot(cudaStream_t stream, int rows, int cols, const int32_t* labels, float* onehot,
                    KernelErrorRecord* error);
// out[r] = index of the first maximum of row r (std::max_element's choice).
cudaError_t argmax_rows(cudaStream_t stream, int rows, int cols, const float* x, int32_t* out);
cudaError_t count_correct(cudaStream_t stream, int rows, int cols, const float* x,
                          const int32_t* labels, int32_t* correct);

// --- optimizer_kernels.cu --------------------------------------------------------------------
struct SgdConstants {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool seed_buffer;  // first step: the momentum buffer becomes the gradient
};
cudaError_t sgd_update(cudaStream_t stream, int64_t n, const SgdConstants& c, float* param,
                       const float* grad, float* momentum_buf);
// One Adam/AdamW step with the constants FoldAdamHyper gives (engine/adam_constants.h).
cudaError_t adam_update(cudaStream_t stream, int64_t n, const AdamConstants& c, float* param,
                        const float* grad, float* exp_avg, float* exp_avg_sq);

// --- data_kernels.cu -------------------------------------------------------------------------
// A folded per-channel normalisation, passed by value (2 KiB of kernel parameters): element j of
// a sample is in channel (j / plane) % channels and becomes x * a[c] + b[c].
inline constexpr int kMaxFoldChannels = 256;
struct NormFold {
  int channels;
  int64_t plane;
  float a[kMaxFoldChannels];
  float b[kMaxFoldChannels];
};
// out(count, sample_elems) = pixels[index[i]] * a[c] + b[c]; labels_out[i] = labels[index[i]]
// when labels_out is not null.
cudaError_t gather_normalize(cudaStream_t stream, int count, int64_t sample_elems,
                             const int32_t* index, const uint8_t* pixels, const int32_t* labels,
                             const NormFold& norm, float* out, int32_t* labels_out);
// The same from a float dataset (features).
cudaError_t gather_normalize_f32(cudaStream_t stream, int count, int64_t sample_elems,
                                 const int32_t* index, const float* features, const int32_t* labels,
                                 const NormFold& norm, float* out, int32_t* labels_out);
// Crop-and-flip augmentation (CudaBackend::GatherAugmentNormalize, engine/backend.h): images of
// channels x height x width, cropped from the image padded by `padding` zeros on each side.
struct AugmentShape {
  int channels, height, width, padding;
};
// One sample's crop corner in the padded image and its flip, as engine/backend.h's CropFlip.
struct CropFlipDecision {
  int32_t dy, dx, flip;
};
// out(count, C*H*W) = norm(padded pixels[index[i]] cropped at decisions[i], mirrored when its
// flip is set); a padded pixel is norm(0). labels_out[i] = labels[index[i]] when not null.
cudaError_t gather_augment_normalize(cudaStream_t stream, int count, const AugmentShape& shape,
                                     const int32_t* index, const uint8_t* pixels,
                                     const int32_t* labels, const CropFlipDecision* decisions,
                                     const NormFold& norm, float* out, int32_t* labels_out);
// out(n) = x * a[c] + b[c] over whole samples (n a multiple of channels * plane); out may be x.
cudaError_t normalize(cudaStream_t stream, int64_t n, const float* x, const NormFold& norm,
                      float* out);

// --- pool_kernels.cu -------------------------------------------------------------------------
struct PoolShape {
  int planes, in_h, in_w;  // planes = batch * channels
  int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  int out_h, out_w;
};
// y = window maxima, argmax = the winner's flat index within its input plane (the CPU backend's
// order and NaN rule; padded positions never win).
cudaError_t maxpool_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y,
                            int32_t* argmax);
// dx = sum of dy over the windows whose argmax is that pixel (overwrites dx, fixed order).
cudaError_t maxpool_backward(cudaStream_t stream, const PoolShape& s, const float* dy,
                             const int32_t* argmax, float* dx);
// y = window sums / (kernel_h * kernel_w), padding counted as zeros (the CPU backend's order).
cudaError_t avgpool_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y);
// dx = sum of dy / (kernel_h * kernel_w) over the windows holding each pixel, in output order.
cudaError_t avgpool_backward(cudaStream_t stream, const PoolShape& s, const float* dy, float* dx);

}  // namespace kiln::cuda_kernels
