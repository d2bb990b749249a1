#include "engine/cuda/conv_cudnn.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_check.h"
#include "engine/status_macros.h"

namespace kiln {

namespace {

template <typename Algo>
struct Choice {
  bool chosen = false;
  Algo algo{};
  cudnnMathType_t math = CUDNN_FMA_MATH;
  size_t workspace = 0;
};

const char* AlgoName(cudnnConvolutionFwdAlgo_t a) {
  static const char* const kNames[] = {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
      "WINOGRAD",      "WINOGRAD_NONFUSED"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < 8 ? kNames[i] : "?";
}
const char* AlgoName(cudnnConvolutionBwdDataAlgo_t a) {
  static const char* const kNames[] = {"ALGO_0",     "ALGO_1",   "FFT",
                                       "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < 6 ? kNames[i] : "?";
}
const char* AlgoName(cudnnConvolutionBwdFilterAlgo_t a) {
  static const char* const kNames[] = {
      "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < 7 ? kNames[i] : "?";
}

// The fastest measured (or, from the heuristics, the most promising) result that fits the
// workspace limit, keeps the precision asked for and, for backward passes, is deterministic.
template <typename Perf, typename Algo>
bool Pick(const std::vector<Perf>& results, int count, const CudnnConvOptions& options,
          bool need_determinism, Choice<Algo>* out) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = results[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > options.workspace_limit) continue;
    if (need_determinism && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (!options.allow_tf32 && p.mathType != CUDNN_FMA_MATH) continue;
    out->chosen = true;
    out->algo = p.algo;
    out->math = p.mathType;
    out->workspace = p.memory;
    return true;
  }
  return false;
}

template <typename Algo>
std::string DescribeChoice(const char* pass, const Choice<Algo>& c) {
  if (!c.chosen) return "";
  return absl::StrCat(" ", pass, "=", AlgoName(c.algo), c.math == CUDNN_FMA_MATH ? "" : "+TC", "(",
                      c.workspace, " B)");
}

}  // namespace

struct CudnnConvolutions::Plan {
  Key key{};
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Choice<cudnnConvolutionFwdAlgo_t> fwd;
  Choice<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  Choice<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;

  ~Plan() {
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
  }
};

bool CudnnConvolutions::Key::operator==(const Key& o) const {
  return n == o.n && c == o.c && h == o.h && w == o.w && oc == o.oc && kh == o.kh && kw == o.kw &&
         stride == o.stride && pad == o.pad;
}

size_t CudnnConvolutions::KeyHash::operator()(const Key& k) const {
  size_t h = 0;
  for (int v : {k.n, k.c, k.h, k.w, k.oc, k.kh, k.kw, k.stride, k.pad}) {
    h = h * 1000003u ^ static_cast<size_t>(static_cast<unsigned>(v));
  }
  return h;
}

CudnnConvolutions::CudnnConvolutions(cudnnHandle_t handle, const CudnnConvOptions& options)
    : handle_(handle), options_(options) {}

CudnnConvolutions::~CudnnConvolutions() = default;

absl::StatusOr<CudnnConvolutions::Plan*> CudnnConvolutions::GetPlan(const Conv2dGeometry& g) {
  const Key key{g.batch,    g.in_channels, g.in_h,   g.in_w,   g.out_channels,
                g.kernel_h, g.kernel_w,    g.stride, g.padding};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (g.batch < 1 || g.in_channels < 1 || g.out_channels < 1 || g.kernel_h < 1 || g.kernel_w < 1 ||
      g.stride < 1 || g.padding < 0 || g.out_h() < 1 || g.out_w() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("conv2d: invalid geometry batch ", g.batch, " in ", g.in_channels, "x", g.in_h,
                     "x", g.in_w, " out_channels ", g.out_channels, " kernel ", g.kernel_h, "x",
                     g.kernel_w, " stride ", g.stride, " padding ", g.padding));
  }
  auto plan = std::make_unique<Plan>();
  plan->key = key;
  KILN_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  KILN_CUDA_CHECK(cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g.batch,
                                             g.in_channels, g.in_h, g.in_w));
  KILN_CUDA_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  KILN_CUDA_CHECK(cudnnSetFilter4dDescriptor(plan->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                             g.out_channels, g.in_channels, g.kernel_h,
                                             g.kernel_w));
  KILN_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv));
  KILN_CUDA_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, g.padding, g.padding, g.stride,
                                                  g.stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
  // FMA_MATH keeps float32 convolutions off TF32 tensor cores (DEFAULT_MATH allows them on
  // Ampere and later); the math type set here is what the algorithm searches consider.
  KILN_CUDA_CHECK(cudnnSetConvolutionMathType(
      plan->conv, options_.allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  int n = 0, c = 0, h = 0, w = 0;
  KILN_CUDA_CHECK(
      cudnnGetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->w, &n, &c, &h, &w));
  if (n != g.batch || c != g.out_channels || h != g.out_h() || w != g.out_w()) {
    return absl::InternalError(absl::StrCat("conv2d: cuDNN computes an output of ", n, "x", c, "x",
                                            h, "x", w, " where kiln expects ", g.batch, "x",
                                            g.out_channels, "x", g.out_h(), "x", g.out_w()));
  }
  KILN_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  KILN_CUDA_CHECK(
      cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

// Each Choose* runs cuDNN's timed search once per shape (it allocates its own trial buffers),
// falls back to the heuristics when the search fails or nothing fits, and at last to the one
// algorithm that needs no workspace and is deterministic.
absl::Status CudnnConvolutions::ChooseForward(Plan* p) {
  int max = 0;
  KILN_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle_, &max));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> results(std::max(max, 1));
  int count = 0;
  if (cudnnFindConvolutionForwardAlgorithm(handle_, p->x, p->w, p->conv, p->y, max, &count,
                                           results.data()) == CUDNN_STATUS_SUCCESS &&
      Pick(results, count, options_, false, &p->fwd)) {
    return absl::OkStatus();
  }
  cudaGetLastError();  // a failed search may leave an out-of-memory error behind
  if (cudnnGetConvolutionForwardAlgorithm_v7(handle_, p->x, p->w, p->conv, p->y, max, &count,
                                             results.data()) == CUDNN_STATUS_SUCCESS &&
      Pick(results, count, options_, false, &p->fwd)) {
    return absl::OkStatus();
  }
  p->fwd = {true, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_FMA_MATH, 0};
  KILN_CUDA_CHECK(cudnnSetConvolutionMathType(p->conv, p->fwd.math));
  KILN_CUDA_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle_, p->x, p->w, p->conv, p->y,
                                                          p->fwd.algo, &p->fwd.workspace));
  return absl::OkStatus();
}

absl::Status CudnnConvolutions::ChooseBackwardData(Plan* p) {
  int max = 0;
  KILN_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle_, &max));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> results(std::max(max, 1));
  int count = 0;
  const bool det = options_.deterministic;
  if (cudnnFindConvolutionBackwardDataAlgorithm(handle_, p->w, p->y, p->conv, p->x, max, &count,
                                                results.data()) == CUDNN_STATUS_SUCCESS &&
      Pick(results, count, options_, det, &p->bwd_data)) {
    return absl::OkStatus();
  }
  cudaGetLastError();
  if (cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, p->w, p->y, p->conv, p->x, max, &count,
                                                  results.data()) == CUDNN_STATUS_SUCCESS &&
      Pick(results, count, options_, det, &p->bwd_data)) {
    return absl::OkStatus();
  }
  p->bwd_data = {true, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_FMA_MATH, 0};
  KILN_CUDA_CHECK(cudnnSetConvolutionMathType(p->conv, p->bwd_data.math));
  KILN_CUDA_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
      handle_, p->w, p->y, p->conv, p->x, p->bwd_data.algo, &p->bwd_data.workspace));
  return absl::OkStatus();
}

absl::Status CudnnConvolutions::ChooseBackwardFilter(Plan* p) {
  int max = 0;
  KILN_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle_, &max));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> results(std::max(max, 1));
  int count = 0;
  const bool det = options_.deterministic;
  if (cudnnFindConvolutionBackwardFilterAlgorithm(handle_, p->x, p->y, p->conv, p->w, max, &count,
                                                  results.data()) == CUDNN_STATUS_SUCCESS &&
      Pick(results, count, options_, det, &p->bwd_filter)) {
    return absl::OkStatus();
  }
  cudaGetLastError();
  if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, p->x, p->y, p->conv, p->w, max, &count,
                                                    results.data()) == CUDNN_STATUS_SUCCESS &&
      Pick(results, count, options_, det, &p->bwd_filter)) {
    return absl::OkStatus();
  }
  p->bwd_filter = {true, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_FMA_MATH, 0};
  KILN_CUDA_CHECK(cudnnSetConvolutionMathType(p->conv, p->bwd_filter.math));
  KILN_CUDA_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
      handle_, p->x, p->y, p->conv, p->w, p->bwd_filter.algo, &p->bwd_filter.workspace));
  return absl::OkStatus();
}

absl::Status CudnnConvolutions::Forward(const Conv2dGeometry& g, const float* x, const float* w,
                                        float* y, const WorkspaceFn& workspace) {
  KILN_ASSIGN_OR_RETURN(Plan * p, GetPlan(g));
  if (!p->fwd.chosen) KILN_RETURN_IF_ERROR(ChooseForward(p));
  void* work = nullptr;
  if (p->fwd.workspace > 0) {
    KILN_ASSIGN_OR_RETURN(work, workspace(p->fwd.workspace));
  }
  const float one = 1.0f, zero = 0.0f;
  KILN_CUDA_CHECK(cudnnSetConvolutionMathType(p->conv, p->fwd.math));
  KILN_CUDA_CHECK(cudnnConvolutionForward(handle_, &one, p->x, x, p->w, w, p->conv, p->fwd.algo,
                                          work, p->fwd.workspace, &zero, p->y, y));
  return absl::OkStatus();
}

absl::Status CudnnConvolutions::BackwardFilter(const Conv2dGeometry& g, const float* x,
                                               const float* dy, float* dw,
                                               const WorkspaceFn& workspace) {
  KILN_ASSIGN_OR_RETURN(Plan * p, GetPlan(g));
  if (!p->bwd_filter.chosen) KILN_RETURN_IF_ERROR(ChooseBackwardFilter(p));
  void* work = nullptr;
  if (p->bwd_filter.workspace > 0) {
    KILN_ASSIGN_OR_RETURN(work, workspace(p->bwd_filter.workspace));
  }
  const float one = 1.0f;  // beta = 1: parameter gradients accumulate
  KILN_CUDA_CHECK(cudnnSetConvolutionMathType(p->conv, p->bwd_filter.math));
  KILN_CUDA_CHECK(cudnnConvolutionBackwardFilter(handle_, &one, p->x, x, p->y, dy, p->conv,
                                                 p->bwd_filter.algo, work, p->bwd_filter.workspace,
                                                 &one, p->w, dw));
  return absl::OkStatus();
}

absl::Status CudnnConvolutions::BackwardData(const Conv2dGeometry& g, const float* w,
                                             const float* dy, float* dx,
                                             const WorkspaceFn& workspace) {
  KILN_ASSIGN_OR_RETURN(Plan * p, GetPlan(g));
  if (!p->bwd_data.chosen) KILN_RETURN_IF_ERROR(ChooseBackwardData(p));
  void* work = nullptr;
  if (p->bwd_data.workspace > 0) {
    KILN_ASSIGN_OR_RETURN(work, workspace(p->bwd_data.workspace));
  }
  const float one = 1.0f, zero = 0.0f;  // beta = 0: activation gradients overwrite
  KILN_CUDA_CHECK(cudnnSetConvolutionMathType(p->conv, p->bwd_data.math));
  KILN_CUDA_CHECK(cudnnConvolutionBackwardData(handle_, &one, p->w, w, p->y, dy, p->conv,
                                               p->bwd_data.algo, work, p->bwd_data.workspace, &zero,
                                               p->x, dx));
  return absl::OkStatus();
}

std::string CudnnConvolutions::Describe() const {
  std::string out;
  for (const auto& [key, plan] : plans_) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", key.n, "x", key.c, "x", key.h, "x", key.w, " k",
                    key.kh, "x", key.kw, " s", key.stride, " p", key.pad, " -> ", key.oc, ":",
                    DescribeChoice("fwd", plan->fwd), DescribeChoice("bwd_data", plan->bwd_data),
                    DescribeChoice("bwd_filter", plan->bwd_filter));
  }
  return out;
}

}  // namespace kiln
