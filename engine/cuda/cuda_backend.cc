// CudaBackend's construction, memory, stream, handles and GEMM. Every other op sits with its
// kernels, one file per op family as on the CPU: elementwise_ops.cu, conv_ops.cu, pool_ops.cu,
// norm_ops.cc (cuDNN), loss_ops.cu, optimizer_ops.cu, data_ops.cu, sequence_ops.cu.
#include "engine/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
  KILN_RETURN_IF_ERROR(cuda_internal::Annotate(backend->Init(), backend->name()));
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
  conv.bf16 = options_.bf16;
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
    allocator_->Free(pool_, bf16_copies_.data, bf16_copies_.bytes);
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
                      options_.allow_tf32 ? "; TF32 allowed" : "; TF32 off",
                      options_.bf16 ? "; bf16 GEMMs and convolutions" : "");
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
  ScratchBuffer& buf = slot == Scratch::kTemp        ? temp_
                       : slot == Scratch::kWorkspace ? workspace_
                                                     : bf16_copies_;
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
  if (options_.bf16) {
    KILN_CUDA_CHECK(blas_->GemmEx(cublas_, bt ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  at ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_32F,
                                  ldb, a, CUDA_R_32F, lda, &beta, c, CUDA_R_32F, n,
                                  CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  KILN_CUDA_CHECK(blas_->Sgemm(cublas_, bt ? CUBLAS_OP_T : CUBLAS_OP_N,
                               at ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda,
                               &beta, c, n));
  return absl::OkStatus();
}

}  // namespace kiln
