// CpuBackend's memory, GEMM and bias ops; the other op families are in the *_ops.cc files beside
// it, named as engine/cuda/ names its kernels.
#include "engine/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "engine/backend_checks.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/cpu/dnnl_primitives.h"

namespace kiln {

using cpu_internal::kParallelMin;

namespace {

double PhysicalMemoryBytes() {
  static const double bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  return bytes > 0 ? bytes : 1e300;
}

}  // namespace

CpuBackend::CpuBackend(int threads, Precision precision)
    : threads_(threads > 0 ? threads : omp_get_num_procs()),
      dnnl_(std::make_unique<cpu_internal::DnnlPrimitives>(precision == Precision::kBf16)) {
  openblas_set_num_threads(threads_);
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::BindCallingThread() { omp_set_num_threads(threads_); }

float* CpuBackend::Scratch(std::vector<float>* buf, size_t elems) {
  if (buf->size() < elems) {
    // More than the machine's memory can never be used: refuse it rather than trust the
    // allocator, which under overcommit (vm.overcommit_memory=1) hands out terabytes that the
    // zero-fill below then faults in until the OOM killer ends the process.
    const double bytes = static_cast<double>(elems) * sizeof(float);
    if (bytes > PhysicalMemoryBytes()) return nullptr;
    try {
      buf->resize(elems);
    } catch (const std::exception&) {  // bad_alloc or length_error: an error, never a crash
      return nullptr;
    }
  }
  return buf->data();
}

absl::StatusOr<Tensor> CpuBackend::Allocate(DType dtype, const Shape& shape) {
  for (int64_t d : shape) {
    if (d < 0)
      return absl::InvalidArgumentError(absl::StrCat("negative dimension in ", ShapeString(shape)));
  }
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  // 64-byte alignment for SIMD loads; at least one line so empty tensors have an address.
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu: out of memory allocating ", bytes, " bytes for ", ShapeString(shape)));
  }
  std::memset(p, 0, rounded);
  auto buffer = std::shared_ptr<Buffer>(new Buffer{p, bytes}, [](Buffer* b) {
    std::free(b->data);
    delete b;
  });
  return Tensor(std::move(buffer), dtype, shape);
}

absl::Status CpuBackend::CopyFromHost(const void* host, size_t bytes, Tensor* dst) {
  if (auto s = CheckCopyFits("CopyFromHost", bytes, dst->capacity_bytes()); !s.ok()) return s;
  std::memcpy(dst->raw(), host, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(const Tensor& src, void* host, size_t bytes) {
  if (auto s = CheckCopyFits("CopyToHost", bytes, src.capacity_bytes()); !s.ok()) return s;
  std::memcpy(host, src.raw(), bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Copy(const Tensor& src, Tensor* dst, size_t bytes) {
  if (auto s = CheckCopyFits("Copy", bytes, std::min(src.capacity_bytes(), dst->capacity_bytes()));
      !s.ok()) {
    return s;
  }
  std::memmove(dst->raw(), src.raw(), bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Fill(Tensor* t, float value) {
  if (t->dtype() == DType::kF32) {
    std::fill_n(t->f32(), t->numel(), value);
  } else if (t->dtype() == DType::kI32) {
    std::fill_n(t->i32(), t->numel(), static_cast<int32_t>(value));
  } else {
    std::fill_n(t->u8(), t->numel(), static_cast<uint8_t>(value));
  }
  return absl::OkStatus();
}

// Products of more than one row go to oneDNN's matmul: on this machine's Zen 5 OpenBLAS runs its
// Haswell AVX2 kernel (OPENBLAS_CORETYPE=Haswell is pinned), oneDNN picks AVX-512 at run time.
absl::Status CpuBackend::Gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                              const float* a, const float* b, float beta, float* c) {
  const bool bt = tb == Transpose::kYes;
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {  // an empty product: C = beta * C (beta 0 clears, even NaNs, as BLAS does)
    for (int64_t i = 0; i < int64_t{m} * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return absl::OkStatus();
  }
  if (m == 1 && !dnnl_->bf16()) {
    // One row (batch-1 inference): sgemv reads B once, where sgemm would first pack all of it.
    // A 1 x k matrix is a contiguous vector whether or not it is transposed.
    if (bt) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, alpha, b, k, a, 1, beta, c, 1);
    } else {
      cblas_sgemv(CblasRowMajor, CblasTrans, k, n, alpha, b, n, a, 1, beta, c, 1);
    }
    return absl::OkStatus();
  }
  return dnnl_->matmuls().Run(dnnl_->stream(), ta, tb, m, n, k, alpha, a, b, beta, c);
}

absl::Status CpuBackend::BiasForward(int rows, int cols, const float* bias, float* y) {
#pragma omp parallel for num_threads(threads_) if (int64_t{rows} * cols > kParallelMin)
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<int64_t>(r) * cols;
#pragma omp simd
    for (int c = 0; c < cols; ++c) yr[c] += bias[c];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BiasBackward(int rows, int cols, const float* dy, float* dbias) {
  // Rows are summed in order per column: deterministic for any thread count.
  for (int r = 0; r < rows; ++r) {
    const float* d = dy + static_cast<int64_t>(r) * cols;
#pragma omp simd
    for (int c = 0; c < cols; ++c) dbias[c] += d[c];
  }
  return absl::OkStatus();
}

}  // namespace kiln
