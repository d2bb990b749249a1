// CudaBackend's memory, stream, handles, GEMM and the dispatch of every other op to cuDNN
// (conv_cudnn.cc) or to kiln's kernels (the *_kernels.cu files).
#include "engine/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/adam_constants.h"
#include "engine/backend_checks.h"
#include "engine/cuda/conv_cudnn.h"
#include "engine/cuda/cublas_library.h"
#include "engine/cuda/cuda_allocator.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_device.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/cudnn_library.h"
#include "engine/cuda/device_guard.h"

namespace kiln {

namespace {

namespace ck = cuda_kernels;

// Pinned staging for device-to-host copies up to this size; larger ones go straight to the
// caller's memory.
constexpr size_t kStagingBytes = 64 << 10;

// Prefixes an error with what the op was working on; OK passes through.
absl::Status Annotate(absl::Status s, const std::string& context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

std::string ConvContext(const Conv2dGeometry& g, const char* pass) {
  return absl::StrCat("conv2d ", pass, " ", g.batch, "x", g.in_channels, "x", g.in_h, "x", g.in_w,
                      " -> ", g.out_channels, " kernel ", g.kernel_h, "x", g.kernel_w, " stride ",
                      g.stride_h, "x", g.stride_w, " padding ", g.padding_h, "x", g.padding_w);
}

static_assert(static_cast<int>(ActivationKind::kTanh) == ck::kTanh &&
                  static_cast<int>(ActivationKind::kSigmoid) == ck::kSigmoid &&
                  static_cast<int>(ActivationKind::kGelu) == ck::kGelu &&
                  static_cast<int>(ActivationKind::kLeakyRelu) == ck::kLeakyRelu &&
                  static_cast<int>(ActivationKind::kSilu) == ck::kSilu,
              "cuda_kernels' activation codes follow ActivationKind");

ck::PoolShape ToPoolShape(const Pool2dGeometry& g) {
  return {g.batch * g.channels, g.in_h,      g.in_w,      g.kernel_h, g.kernel_w, g.stride_h,
          g.stride_w,           g.padding_h, g.padding_w, g.out_h(),  g.out_w()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    int device, const CudaBackendOptions& options) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  if (device < 0 || device >= count) {
    return absl::NotFoundError(
        absl::StrCat("device cuda:", device,
                     " not found: ", count == 0 ? why : absl::StrCat(count, " CUDA devices")));
  }
  auto backend = std::unique_ptr<CudaBackend>(new CudaBackend(device, options));
  KILN_RETURN_IF_ERROR(Annotate(backend->Init(), backend->name()));
  return backend;
}

CudaBackend::CudaBackend(int device, const CudaBackendOptions& options)
    : device_(device), options_(options) {}

absl::Status CudaBackend::Init() {
  // The libraries first: without them nothing below is worth creating.
  KILN_ASSIGN_OR_RETURN(blas_, Cublas());
  KILN_ASSIGN_OR_RETURN(dnn_, Cudnn());
  KILN_CUDA_CHECK(cudaSetDevice(device_));
  allocator_ = CudaCachingAllocator::ForDevice(device_);
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  pool_ = allocator_->AttachStream(stream_);
  KILN_CUDA_CHECK(blas_->Create(&cublas_));
  KILN_CUDA_CHECK(blas_->SetStream(cublas_, stream_));
  // Default math is true float32 for SGEMM; TF32 only when asked for.
  KILN_CUDA_CHECK(blas_->SetMathMode(
      cublas_, options_.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  KILN_CUDA_CHECK(dnn_->Create(&cudnn_));
  KILN_CUDA_CHECK(dnn_->SetStream(cudnn_, stream_));
  CudnnConvOptions conv;
  conv.allow_tf32 = options_.allow_tf32;
  conv.deterministic = options_.deterministic;
  conv.workspace_limit = options_.conv_workspace_limit;
  convs_ = std::make_unique<CudnnConvolutions>(dnn_, cudnn_, conv);
  KILN_CUDA_CHECK(cudaMallocHost(&staging_, kStagingBytes + sizeof(ck::KernelErrorRecord)));
  KILN_ASSIGN_OR_RETURN(kernel_error_, allocator_->Allocate(pool_, sizeof(ck::KernelErrorRecord)));
  KILN_CUDA_CHECK(cudaMemsetAsync(kernel_error_, 0, sizeof(ck::KernelErrorRecord), stream_));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  // Teardown cannot report: each step is best effort, and the driver reclaims what is left.
  CudaDeviceGuard guard(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  convs_.reset();  // its descriptors before the cuDNN handle
  if (cudnn_ != nullptr) dnn_->Destroy(cudnn_);
  if (cublas_ != nullptr) blas_->Destroy(cublas_);
  if (allocator_ != nullptr) {
    allocator_->Free(pool_, temp_.data, temp_.bytes);
    allocator_->Free(pool_, workspace_.data, workspace_.bytes);
    allocator_->Free(pool_, kernel_error_, sizeof(ck::KernelErrorRecord));
    // The stream has finished: its blocks, and those of tensors that outlive the backend, are
    // free for any other backend on the device.
    allocator_->DetachStream(pool_);
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  cudaGetLastError();
}

std::string CudaBackend::name() const { return absl::StrCat("cuda:", device_); }

std::string CudaBackend::Description() const {
  int runtime = 0, driver = 0, cublas = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  if (cublas_ != nullptr) blas_->GetVersion(cublas_, &cublas);
  cudaGetLastError();
  return absl::StrCat(CudaDeviceDescription(device_), "; CUDA runtime ", runtime, ", driver ",
                      driver, ", cuBLAS ", cublas, ", cuDNN ",
                      dnn_ != nullptr ? dnn_->GetVersion() : 0,
                      options_.allow_tf32 ? "; TF32 allowed" : "; TF32 off");
}

std::string CudaBackend::ConvolutionAlgorithms() const {
  return convs_ != nullptr ? convs_->Describe() : "";
}

std::string CudaBackend::ConvolutionAlgorithms(const Conv2dGeometry& g) const {
  return convs_ != nullptr ? convs_->Describe(g) : "";
}

size_t CudaBackend::bytes_in_use() const { return allocator_->stats(pool_).in_use_bytes; }
size_t CudaBackend::bytes_cached() const { return allocator_->stats(pool_).cached_bytes; }
int64_t CudaBackend::device_allocations() const { return allocator_->stats(pool_).device_allocs; }

absl::Status CudaBackend::Activate() {
  int current = -1;
  KILN_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_) KILN_CUDA_CHECK(cudaSetDevice(device_));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaBackend::GetScratch(Scratch slot, size_t bytes) {
  ScratchBuffer& buf = slot == Scratch::kTemp ? temp_ : workspace_;
  if (buf.data != nullptr && buf.bytes >= bytes) return buf.data;
  // Stream order makes the swap safe: work queued on the old buffer runs before any reuse.
  allocator_->Free(pool_, buf.data, buf.bytes);
  buf = {};
  KILN_ASSIGN_OR_RETURN(void* data, allocator_->Allocate(pool_, bytes));
  buf = {data, CudaCachingAllocator::BlockSize(bytes)};
  return data;
}

absl::Status CudaBackend::SyncAndCheckKernelErrors() {
  const bool check = kernel_error_pending_;
  auto* record =
      reinterpret_cast<ck::KernelErrorRecord*>(static_cast<char*>(staging_) + kStagingBytes);
  if (check) {
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(record, kernel_error_, sizeof(*record), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaMemsetAsync(kernel_error_, 0, sizeof(*record), stream_));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (!check) return absl::OkStatus();
  kernel_error_pending_ = false;
  if (record->code == ck::kNoKernelError) return absl::OkStatus();
  const char* op = record->op == ck::kOpSoftmaxCrossEntropy ? "SoftmaxCrossEntropy" : "OneHot";
  return absl::InvalidArgumentError(absl::StrCat("label ", record->value, " out of range for ",
                                                 record->limit, " classes (found by ", op, " on ",
                                                 name(), ")"));
}

// --- memory ---------------------------------------------------------------------------------

absl::StatusOr<Tensor> CudaBackend::Allocate(DType dtype, const Shape& shape) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative dimension in ", ShapeString(shape)));
    }
  }
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  KILN_RETURN_IF_ERROR(Activate());
  KILN_ASSIGN_OR_RETURN(void* data, allocator_->Allocate(pool_, bytes));
  if (bytes > 0) {
    const cudaError_t rc = cudaMemsetAsync(data, 0, bytes, stream_);
    if (rc != cudaSuccess) {
      allocator_->Free(pool_, data, bytes);
      return cuda_internal::CallError(rc, "cudaMemsetAsync(data, 0, bytes, stream_)", __FILE__,
                                      __LINE__);
    }
  }
  auto buffer = std::shared_ptr<Buffer>(new Buffer{data, bytes},
                                        [allocator = allocator_, pool = pool_](Buffer* b) {
                                          allocator->Free(pool, b->data, b->bytes);
                                          delete b;
                                        });
  return Tensor(std::move(buffer), dtype, shape);
}

absl::Status CudaBackend::CopyFromHost(const void* host, size_t bytes, Tensor* dst) {
  KILN_RETURN_IF_ERROR(CheckCopyFits("CopyFromHost", bytes, dst->capacity_bytes()));
  if (bytes == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst->raw(), host, bytes, cudaMemcpyHostToDevice, stream_));
  // From pageable memory the driver may still be reading `host` after the call returns; the
  // caller may free it as soon as we do.
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(const Tensor& src, void* host, size_t bytes) {
  KILN_RETURN_IF_ERROR(CheckCopyFits("CopyToHost", bytes, src.capacity_bytes()));
  KILN_RETURN_IF_ERROR(Activate());
  if (bytes == 0) return SyncAndCheckKernelErrors();
  if (bytes <= kStagingBytes) {
    // Small reads (the step's loss and correct count) go through pinned memory: one DMA, no
    // pageable staging by the driver.
    KILN_CUDA_CHECK(cudaMemcpyAsync(staging_, src.raw(), bytes, cudaMemcpyDeviceToHost, stream_));
    KILN_RETURN_IF_ERROR(SyncAndCheckKernelErrors());
    std::memcpy(host, staging_, bytes);
    return absl::OkStatus();
  }
  KILN_CUDA_CHECK(cudaMemcpyAsync(host, src.raw(), bytes, cudaMemcpyDeviceToHost, stream_));
  return SyncAndCheckKernelErrors();
}

absl::Status CudaBackend::Copy(const Tensor& src, Tensor* dst, size_t bytes) {
  KILN_RETURN_IF_ERROR(
      CheckCopyFits("Copy", bytes, std::min(src.capacity_bytes(), dst->capacity_bytes())));
  if (bytes == 0 || src.raw() == dst->raw()) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst->raw());
  if (s < d + bytes && d < s + bytes) {
    // Overlapping views of one buffer (memmove semantics): go through scratch.
    KILN_ASSIGN_OR_RETURN(void* tmp, GetScratch(Scratch::kTemp, bytes));
    KILN_CUDA_CHECK(cudaMemcpyAsync(tmp, s, bytes, cudaMemcpyDeviceToDevice, stream_));
    KILN_CUDA_CHECK(cudaMemcpyAsync(d, tmp, bytes, cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }
  KILN_CUDA_CHECK(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Fill(Tensor* t, float value) {
  const int64_t n = t->numel();
  if (n == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  if (t->dtype() == DType::kU8) {
    KILN_CUDA_CHECK(cudaMemsetAsync(t->raw(), static_cast<uint8_t>(value), n, stream_));
    return absl::OkStatus();
  }
  uint32_t bits = 0;
  if (t->dtype() == DType::kF32) {
    std::memcpy(&bits, &value, sizeof(bits));
  } else {
    const int32_t v = static_cast<int32_t>(value);
    std::memcpy(&bits, &v, sizeof(bits));
  }
  if (bits == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(t->raw(), 0, static_cast<size_t>(n) * 4, stream_));
  } else {
    KILN_CUDA_CHECK(ck::fill_u32(stream_, n, bits, t->raw()));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Synchronize() {
  KILN_RETURN_IF_ERROR(Activate());
  return SyncAndCheckKernelErrors();
}

// --- dense algebra --------------------------------------------------------------------------

absl::Status CudaBackend::Gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                               const float* a, const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  // Row-major C(m,n) is column-major C^T(n,m) = op(B)^T op(A)^T: the operands swap places and
  // keep their leading dimensions (the stored row lengths).
  const bool at = ta == Transpose::kYes, bt = tb == Transpose::kYes;
  const int lda = std::max(1, at ? m : k), ldb = std::max(1, bt ? k : n);
  KILN_CUDA_CHECK(blas_->Sgemm(cublas_, bt ? CUBLAS_OP_T : CUBLAS_OP_N,
                               at ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda,
                               &beta, c, n));
  return absl::OkStatus();
}

absl::Status CudaBackend::BiasForward(int rows, int cols, const float* bias, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::bias_forward(stream_, rows, cols, bias, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::BiasBackward(int rows, int cols, const float* dy, float* dbias) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::bias_backward(stream_, rows, cols, dy, dbias));
  return absl::OkStatus();
}

// --- element-wise ---------------------------------------------------------------------------

absl::Status CudaBackend::ReluForward(int64_t n, const float* x, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::relu_forward(stream_, n, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReluBackward(int64_t n, const float* y, const float* dy, float* dx) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::relu_backward(stream_, n, y, dy, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::DropoutForward(int64_t n, float p, uint64_t seed, uint64_t offset,
                                         const float* x, float* mask, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  KILN_CUDA_CHECK(ck::dropout_forward(stream_, n, p, keep_scale, seed, offset, x, mask, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::DropoutBackward(int64_t n, const float* mask, const float* dy,
                                          float* dx) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::multiply(stream_, n, dy, mask, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::SoftmaxForward(int rows, int cols, const float* x, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::softmax_forward(stream_, rows, cols, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::ActivationForward(ActivationKind kind, float param, int64_t n,
                                            const float* x, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::activation_forward(stream_, static_cast<int>(kind), param, n, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::ActivationBackward(ActivationKind kind, float param, int64_t n,
                                             const float* x, const float* y, const float* dy,
                                             float* dx) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::activation_backward(stream_, static_cast<int>(kind), param, n, x, y, dy, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::Add(int64_t n, const float* a, const float* b, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::add(stream_, n, a, b, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::Scale(int64_t n, float alpha, float* x) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::scale(stream_, n, alpha, x));
  return absl::OkStatus();
}

absl::Status CudaBackend::Copy2D(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                                 float* dst, int64_t dst_stride) {
  KILN_RETURN_IF_ERROR(CheckCopy2D(rows, cols, src_stride, dst_stride));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  constexpr size_t kF = sizeof(float);
  KILN_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * kF, src,
                                    static_cast<size_t>(src_stride) * kF,
                                    static_cast<size_t>(cols) * kF, static_cast<size_t>(rows),
                                    cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

// --- convolution and pooling ----------------------------------------------------------------

absl::Status CudaBackend::Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                                        const float* bias, Activation act, float* y) {
  if (g.batch == 0) return absl::OkStatus();  // as on the CPU: nothing to do
  KILN_RETURN_IF_ERROR(Activate());
  const WorkspaceFn workspace = [this](size_t bytes) {
    return GetScratch(Scratch::kWorkspace, bytes);
  };
  if (absl::Status s = convs_->Forward(g, x, w, y, workspace); !s.ok()) {
    return Annotate(s, ConvContext(g, "forward"));
  }
  const int64_t plane = int64_t{g.out_h()} * g.out_w();
  KILN_CUDA_CHECK(ck::conv_bias_act_forward(
      stream_, g.batch, g.out_channels, plane, bias,
      act == Activation::kRelu ? ck::ConvActivation::kRelu : ck::ConvActivation::kNone, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                                         const float* y, const float* dy, Activation act, float* dw,
                                         float* dbias, float* dx) {
  if (g.batch == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  const int64_t plane = int64_t{g.out_h()} * g.out_w();
  const int64_t out_elems = int64_t{g.batch} * g.out_channels * plane;
  // The gradient at the convolution's output: dy through the fused ReLU's mask when there is one.
  const float* grad = dy;
  if (act == Activation::kRelu) {
    KILN_ASSIGN_OR_RETURN(void* tmp, GetScratch(Scratch::kTemp, out_elems * sizeof(float)));
    float* masked = static_cast<float*>(tmp);
    if (dbias != nullptr) {
      KILN_CUDA_CHECK(ck::conv_bias_act_backward(stream_, g.batch, g.out_channels, plane, y, dy,
                                                 masked, dbias));
    } else {
      KILN_CUDA_CHECK(ck::relu_backward(stream_, out_elems, y, dy, masked));
    }
    grad = masked;
  } else if (dbias != nullptr) {
    KILN_CUDA_CHECK(ck::conv_bias_act_backward(stream_, g.batch, g.out_channels, plane, nullptr, dy,
                                               nullptr, dbias));
  }
  const WorkspaceFn workspace = [this](size_t bytes) {
    return GetScratch(Scratch::kWorkspace, bytes);
  };
  if (dw != nullptr) {
    if (absl::Status s = convs_->BackwardFilter(g, x, grad, dw, workspace); !s.ok()) {
      return Annotate(s, ConvContext(g, "backward-filter"));
    }
  }
  if (dx != nullptr) {
    if (absl::Status s = convs_->BackwardData(g, w, grad, dx, workspace); !s.ok()) {
      return Annotate(s, ConvContext(g, "backward-data"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                                           int32_t* argmax) {
  KILN_RETURN_IF_ERROR(CheckPool2d("maxpool2d", g));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::maxpool_forward(stream_, ToPoolShape(g), x, y, argmax));
  return absl::OkStatus();
}

absl::Status CudaBackend::MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                                            const int32_t* argmax, float* dx) {
  KILN_RETURN_IF_ERROR(CheckPool2d("maxpool2d", g));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::maxpool_backward(stream_, ToPoolShape(g), dy, argmax, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::AvgPool2dForward(const Pool2dGeometry& g, const float* x, float* y) {
  KILN_RETURN_IF_ERROR(CheckPool2d("avgpool2d", g));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::avgpool_forward(stream_, ToPoolShape(g), x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::AvgPool2dBackward(const Pool2dGeometry& g, const float* dy, float* dx) {
  KILN_RETURN_IF_ERROR(CheckPool2d("avgpool2d", g));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::avgpool_backward(stream_, ToPoolShape(g), dy, dx));
  return absl::OkStatus();
}

// --- losses ---------------------------------------------------------------------------------

absl::Status CudaBackend::SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                                              const int32_t* labels, float label_smoothing,
                                              float* loss, int32_t* correct, float* dlogits) {
  KILN_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(rows, cols, label_smoothing));
  KILN_RETURN_IF_ERROR(Activate());
  if (rows == 0) {
    // As on the CPU: the mean over no rows is NaN, and no row is correct.
    KILN_CUDA_CHECK(ck::fill_u32(stream_, 1, 0x7fc00000u, loss));
    KILN_CUDA_CHECK(cudaMemsetAsync(correct, 0, sizeof(int32_t), stream_));
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(void* scratch,
                        GetScratch(Scratch::kTemp, static_cast<size_t>(std::max(rows, 1)) * 8));
  kernel_error_pending_ = true;
  KILN_CUDA_CHECK(ck::softmax_xent(stream_, rows, cols, logits, labels, label_smoothing, loss,
                                   correct, dlogits, scratch,
                                   static_cast<ck::KernelErrorRecord*>(kernel_error_)));
  return absl::OkStatus();
}

absl::Status CudaBackend::MeanSquaredError(int64_t n, const float* y, const float* target,
                                           float* loss, float* dy) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_ASSIGN_OR_RETURN(
      void* scratch, GetScratch(Scratch::kTemp, static_cast<size_t>(std::max<int64_t>(
                                                    ck::mean_squared_error_scratch_bytes(n), 8))));
  KILN_CUDA_CHECK(ck::mean_squared_error(stream_, n, y, target, loss, dy, scratch));
  return absl::OkStatus();
}

absl::Status CudaBackend::OneHot(int rows, int cols, const int32_t* labels, float* onehot) {
  KILN_RETURN_IF_ERROR(Activate());
  kernel_error_pending_ = true;
  KILN_CUDA_CHECK(ck::one_hot(stream_, rows, cols, labels, onehot,
                              static_cast<ck::KernelErrorRecord*>(kernel_error_)));
  return absl::OkStatus();
}

absl::Status CudaBackend::Argmax(int rows, int cols, const float* x, int32_t* out) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::argmax_rows(stream_, rows, cols, x, out));
  return absl::OkStatus();
}

absl::Status CudaBackend::CountCorrect(int rows, int cols, const float* x, const int32_t* labels,
                                       int32_t* correct) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::count_correct(stream_, rows, cols, x, labels, correct));
  return absl::OkStatus();
}

// --- optimizers -----------------------------------------------------------------------------

absl::Status CudaBackend::SgdUpdate(int64_t n, const SgdHyper& h, MomentumBuffer buffer,
                                    float* param, const float* grad, float* momentum_buf) {
  if (h.momentum != 0.0f && momentum_buf == nullptr) {
    return absl::InvalidArgumentError("SgdUpdate: momentum needs a momentum buffer");
  }
  KILN_RETURN_IF_ERROR(Activate());
  const ck::SgdConstants c{h.lr,           h.momentum, h.dampening,
                           h.weight_decay, h.nesterov, buffer == MomentumBuffer::kSeed};
  KILN_CUDA_CHECK(ck::sgd_update(stream_, n, c, param, grad, momentum_buf));
  return absl::OkStatus();
}

absl::Status CudaBackend::AdamUpdate(int64_t n, const AdamHyper& h, float* param, const float* grad,
                                     float* exp_avg, float* exp_avg_sq) {
  KILN_RETURN_IF_ERROR(Activate());
  // The CPU backend's constants (FoldAdamHyper), so both run the same float arithmetic.
  KILN_CUDA_CHECK(ck::adam_update(stream_, n, FoldAdamHyper(h), param, grad, exp_avg, exp_avg_sq));
  return absl::OkStatus();
}

// --- data -----------------------------------------------------------------------------------

// The folded normalisation as the kernels take it, by value.
absl::StatusOr<ck::NormFold> KernelNorm(const PixelNorm& norm, int64_t sample_elems) {
  static_assert(ck::kMaxFoldChannels == kMaxNormChannels);
  KILN_ASSIGN_OR_RETURN(const FoldedNorm f, FoldPixelNorm(norm, sample_elems));
  ck::NormFold k{};
  k.channels = static_cast<int>(f.a.size());
  k.plane = f.plane;
  for (int c = 0; c < k.channels; ++c) {
    k.a[c] = f.a[c];
    k.b[c] = f.b[c];
  }
  return k;
}

absl::Status CudaBackend::GatherNormalize(int count, int64_t sample_elems, const int32_t* index,
                                          const uint8_t* pixels, const int32_t* labels,
                                          const PixelNorm& norm, float* out, int32_t* labels_out) {
  KILN_RETURN_IF_ERROR(Activate());
  // x = (u8 * scale - mean[c]) / std[c], folded into one multiply-add per pixel as on the CPU.
  KILN_ASSIGN_OR_RETURN(const ck::NormFold k, KernelNorm(norm, sample_elems));
  KILN_CUDA_CHECK(ck::gather_normalize(stream_, count, sample_elems, index, pixels, labels, k, out,
                                       labels_out));
  return absl::OkStatus();
}

absl::Status CudaBackend::GatherNormalizeF32(int count, int64_t sample_elems, const int32_t* index,
                                             const float* features, const int32_t* labels,
                                             const PixelNorm& norm, float* out,
                                             int32_t* labels_out) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_ASSIGN_OR_RETURN(const ck::NormFold k, KernelNorm(norm, sample_elems));
  KILN_CUDA_CHECK(ck::gather_normalize_f32(stream_, count, sample_elems, index, features, labels, k,
                                           out, labels_out));
  return absl::OkStatus();
}

absl::Status CudaBackend::GatherAugmentNormalize(int count, const AugmentGeometry& g,
                                                 const int32_t* index, const uint8_t* pixels,
                                                 const int32_t* labels, const CropFlip* decisions,
                                                 const PixelNorm& norm, float* out,
                                                 int32_t* labels_out) {
  static_assert(sizeof(ck::CropFlipDecision) == sizeof(CropFlip) &&
                offsetof(ck::CropFlipDecision, dx) == offsetof(CropFlip, dx) &&
                offsetof(ck::CropFlipDecision, flip) == offsetof(CropFlip, flip));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_RETURN_IF_ERROR(CheckAugmentGeometry(g, norm.channels()));
  KILN_ASSIGN_OR_RETURN(const ck::NormFold k, KernelNorm(norm, g.sample_elems()));
  const ck::AugmentShape shape{g.channels, g.height, g.width, g.padding};
  KILN_CUDA_CHECK(ck::gather_augment_normalize(
      stream_, count, shape, index, pixels, labels,
      reinterpret_cast<const ck::CropFlipDecision*>(decisions), k, out, labels_out));
  return absl::OkStatus();
}

absl::Status CudaBackend::Normalize(int count, int64_t sample_elems, const float* x,
                                    const PixelNorm& norm, float* out) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_ASSIGN_OR_RETURN(const ck::NormFold k, KernelNorm(norm, sample_elems));  // as Gather...
  KILN_CUDA_CHECK(ck::normalize(stream_, int64_t{count} * sample_elems, x, k, out));
  return absl::OkStatus();
}

}  // namespace kiln
