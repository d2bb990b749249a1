#include "engine/cuda/conv_cudnn.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cudnn_library.h"

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
// workspace limit, keeps the precision asked for and, when asked, is deterministic.
template <typename Perf, typename Algo>
bool Pick(const std::vector<Perf>& results, int count, const CudnnConvOptions& options,
          bool need_determinism, Choice<Algo>* out) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = results[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > options.workspace_limit) continue;
    if (need_determinism && p.determinism != CUDNN_DETERMINISTIC) continue;
    // (TF32 is a float32 matter: bfloat16 data take any math type.)
    if (!options.allow_tf32 && !options.bf16 && p.mathType != CUDNN_FMA_MATH) continue;
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

// How one pass (forward, backward-data, backward-filter) asks cuDNN for its algorithms.
template <typename Perf, typename Algo>
struct PassCalls {
  std::function<cudnnStatus_t(int* max)> max_count;
  std::function<cudnnStatus_t(int max, int* count, Perf* results)> heuristics;
  // Times every algorithm on the call's buffers with `bytes` of workspace at `work`.
  std::function<cudnnStatus_t(int max, int* count, Perf* results, void* work, size_t bytes)> find;
  std::function<cudnnStatus_t(Algo algo, size_t* bytes)> workspace_size;
  Algo fallback;            // needs no workspace and is deterministic
  size_t find_scratch = 0;  // extra bytes the timed search needs after its workspace
};

// Deterministic: the heuristics' first deterministic fit (a function of shape, device and
// library only). Otherwise the timed search over the heuristics' candidates, its workspace the
// largest any of them that fits needs. At last the fallback algorithm.
template <typename Perf, typename Algo>
absl::Status ChooseAlgorithm(const CudnnConvOptions& options, const PassCalls<Perf, Algo>& calls,
                             const WorkspaceFn& workspace, Choice<Algo>* out) {
  int max = 0;
  KILN_CUDA_CHECK(calls.max_count(&max));
  std::vector<Perf> results(std::max(max, 1));
  int count = 0;
  const bool listed = calls.heuristics(max, &count, results.data()) == CUDNN_STATUS_SUCCESS;
  if (listed && options.deterministic && Pick(results, count, options, true, out)) {
    return absl::OkStatus();
  }
  if (listed && !options.deterministic) {
    size_t search_bytes = 0;
    for (int i = 0; i < count; ++i) {
      if (results[i].status == CUDNN_STATUS_SUCCESS &&
          results[i].memory <= options.workspace_limit) {
        search_bytes = std::max(search_bytes, results[i].memory);
      }
    }
    std::vector<Perf> timed(results.size());
    int timed_count = 0;
    absl::StatusOr<void*> work = workspace(search_bytes + calls.find_scratch);
    if (work.ok() &&
        calls.find(max, &timed_count, timed.data(), *work, search_bytes) == CUDNN_STATUS_SUCCESS &&
        Pick(timed, timed_count, options, false, out)) {
      return absl::OkStatus();
    }
    cudaGetLastError();  // a failed search may leave an out-of-memory error behind
    if (Pick(results, count, options, false, out)) return absl::OkStatus();
  }
  *out = {true, calls.fallback, options.bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH, 0};
  KILN_CUDA_CHECK(calls.workspace_size(out->algo, &out->workspace));
  return absl::OkStatus();
}

}  // namespace

struct CudnnConvolutions::Plan {
  const CudnnLibrary* dnn = nullptr;
  Key key{};
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Choice<cudnnConvolutionFwdAlgo_t> fwd;
  Choice<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  Choice<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;

  ~Plan() {
    if (x != nullptr) dnn->DestroyTensorDescriptor(x);
    if (y != nullptr) dnn->DestroyTensorDescriptor(y);
    if (w != nullptr) dnn->DestroyFilterDescriptor(w);
    if (conv != nullptr) dnn->DestroyConvolutionDescriptor(conv);
  }
};

bool CudnnConvolutions::Key::operator==(const Key& o) const {
  return n == o.n && c == o.c && h == o.h && w == o.w && oc == o.oc && kh == o.kh && kw == o.kw &&
         stride_h == o.stride_h && stride_w == o.stride_w && pad_h == o.pad_h && pad_w == o.pad_w;
}

size_t CudnnConvolutions::KeyHash::operator()(const Key& k) const {
  size_t h = 0;
  for (int v : {k.n, k.c, k.h, k.w, k.oc, k.kh, k.kw, k.stride_h, k.stride_w, k.pad_h, k.pad_w}) {
    h = h * 1000003u ^ static_cast<size_t>(static_cast<unsigned>(v));
  }
  return h;
}

CudnnConvolutions::CudnnConvolutions(const CudnnLibrary* dnn, cudnnHandle_t handle,
                                     const CudnnConvOptions& options)
    : dnn_(dnn), handle_(handle), options_(options) {}

CudnnConvolutions::Key CudnnConvolutions::KeyOf(const Conv2dGeometry& g) {
  return {g.batch,    g.in_channels, g.in_h,     g.in_w,      g.out_channels, g.kernel_h,
          g.kernel_w, g.stride_h,    g.stride_w, g.padding_h, g.padding_w};
}

CudnnConvolutions::~CudnnConvolutions() = default;

absl::StatusOr<CudnnConvolutions::Plan*> CudnnConvolutions::GetPlan(const Conv2dGeometry& g) {
  const Key key = KeyOf(g);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (g.batch < 1 || g.in_channels < 1 || g.out_channels < 1 || g.kernel_h < 1 || g.kernel_w < 1 ||
      g.stride_h < 1 || g.stride_w < 1 || g.padding_h < 0 || g.padding_w < 0 || g.out_h() < 1 ||
      g.out_w() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "conv2d: invalid geometry batch ", g.batch, " in ", g.in_channels, "x", g.in_h, "x", g.in_w,
        " out_channels ", g.out_channels, " kernel ", g.kernel_h, "x", g.kernel_w, " stride ",
        g.stride_h, "x", g.stride_w, " padding ", g.padding_h, "x", g.padding_w));
  }
  auto plan = std::make_unique<Plan>();
  plan->dnn = dnn_;
  plan->key = key;
  // The tensors' type; the convolution itself accumulates in float32 either way.
  const cudnnDataType_t data = options_.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  KILN_CUDA_CHECK(dnn_->CreateTensorDescriptor(&plan->x));
  KILN_CUDA_CHECK(dnn_->SetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, data, g.batch,
                                              g.in_channels, g.in_h, g.in_w));
  KILN_CUDA_CHECK(dnn_->CreateFilterDescriptor(&plan->w));
  KILN_CUDA_CHECK(dnn_->SetFilter4dDescriptor(plan->w, data, CUDNN_TENSOR_NCHW, g.out_channels,
                                              g.in_channels, g.kernel_h, g.kernel_w));
  KILN_CUDA_CHECK(dnn_->CreateConvolutionDescriptor(&plan->conv));
  KILN_CUDA_CHECK(dnn_->SetConvolution2dDescriptor(plan->conv, g.padding_h, g.padding_w, g.stride_h,
                                                   g.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT));
  // FMA_MATH keeps float32 convolutions off TF32 tensor cores (DEFAULT_MATH allows them on
  // Ampere and later); the math type set here is what the algorithm searches consider.
  KILN_CUDA_CHECK(dnn_->SetConvolutionMathType(
      plan->conv, options_.allow_tf32 && !options_.bf16 ? CUDNN_DEFAULT_MATH : BaseMath()));
  int n = 0, c = 0, h = 0, w = 0;
  KILN_CUDA_CHECK(
      dnn_->GetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->w, &n, &c, &h, &w));
  if (n != g.batch || c != g.out_channels || h != g.out_h() || w != g.out_w()) {
    return absl::InternalError(absl::StrCat("conv2d: cuDNN computes an output of ", n, "x", c, "x",
                                            h, "x", w, " where kiln expects ", g.batch, "x",
                                            g.out_channels, "x", g.out_h(), "x", g.out_w()));
  }
  KILN_CUDA_CHECK(dnn_->CreateTensorDescriptor(&plan->y));
  KILN_CUDA_CHECK(dnn_->SetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, data, n, c, h, w));
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

cudnnMathType_t CudnnConvolutions::BaseMath() const {
  return options_.bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

absl::Status CudnnConvolutions::ChooseForward(Plan* p, const void* x, const void* w, void* y,
                                              const WorkspaceFn& workspace) {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  PassCalls<Perf, cudnnConvolutionFwdAlgo_t> calls;
  calls.max_count = [&](int* max) {
    return dnn_->GetConvolutionForwardAlgorithmMaxCount(handle_, max);
  };
  calls.heuristics = [&](int max, int* count, Perf* r) {
    return dnn_->GetConvolutionForwardAlgorithm_v7(handle_, p->x, p->w, p->conv, p->y, max, count,
                                                   r);
  };
  calls.find = [&](int max, int* count, Perf* r, void* work, size_t bytes) {
    return dnn_->FindConvolutionForwardAlgorithmEx(handle_, p->x, x, p->w, w, p->conv, p->y, y, max,
                                                   count, r, work, bytes);
  };
  calls.workspace_size = [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
    const cudnnStatus_t rc = dnn_->SetConvolutionMathType(p->conv, BaseMath());
    if (rc != CUDNN_STATUS_SUCCESS) return rc;
    return dnn_->GetConvolutionForwardWorkspaceSize(handle_, p->x, p->w, p->conv, p->y, algo,
                                                    bytes);
  };
  calls.fallback = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  return ChooseAlgorithm(options_, calls, workspace, &p->fwd);
}

absl::Status CudnnConvolutions::ChooseBackwardData(Plan* p, const void* w, const void* dy, void* dx,
                                                   const WorkspaceFn& workspace) {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  PassCalls<Perf, cudnnConvolutionBwdDataAlgo_t> calls;
  calls.max_count = [&](int* max) {
    return dnn_->GetConvolutionBackwardDataAlgorithmMaxCount(handle_, max);
  };
  calls.heuristics = [&](int max, int* count, Perf* r) {
    return dnn_->GetConvolutionBackwardDataAlgorithm_v7(handle_, p->w, p->y, p->conv, p->x, max,
                                                        count, r);
  };
  calls.find = [&](int max, int* count, Perf* r, void* work, size_t bytes) {
    return dnn_->FindConvolutionBackwardDataAlgorithmEx(handle_, p->w, w, p->y, dy, p->conv, p->x,
                                                        dx, max, count, r, work, bytes);
  };
  calls.workspace_size = [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
    const cudnnStatus_t rc = dnn_->SetConvolutionMathType(p->conv, BaseMath());
    if (rc != CUDNN_STATUS_SUCCESS) return rc;
    return dnn_->GetConvolutionBackwardDataWorkspaceSize(handle_, p->w, p->y, p->conv, p->x, algo,
                                                         bytes);
  };
  calls.fallback = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  return ChooseAlgorithm(options_, calls, workspace, &p->bwd_data);
}

absl::Status CudnnConvolutions::ChooseBackwardFilter(Plan* p, const void* x, const void* dy,
                                                     const WorkspaceFn& workspace) {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  // The timed search overwrites its filter-gradient buffer, and dw accumulates: the search writes
  // into scratch after its workspace instead.
  const Key& k = p->key;
  const size_t dw_bytes =
      static_cast<size_t>(k.oc) * k.c * k.kh * k.kw * (options_.bf16 ? 2 : sizeof(float));
  constexpr size_t kAlign = 256;
  PassCalls<Perf, cudnnConvolutionBwdFilterAlgo_t> calls;
  calls.max_count = [&](int* max) {
    return dnn_->GetConvolutionBackwardFilterAlgorithmMaxCount(handle_, max);
  };
  calls.heuristics = [&](int max, int* count, Perf* r) {
    return dnn_->GetConvolutionBackwardFilterAlgorithm_v7(handle_, p->x, p->y, p->conv, p->w, max,
                                                          count, r);
  };
  calls.find = [&](int max, int* count, Perf* r, void* work, size_t bytes) {
    const size_t at = (bytes + kAlign - 1) / kAlign * kAlign;
    return dnn_->FindConvolutionBackwardFilterAlgorithmEx(handle_, p->x, x, p->y, dy, p->conv, p->w,
                                                          static_cast<char*>(work) + at, max, count,
                                                          r, work, bytes);
  };
  calls.workspace_size = [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
    const cudnnStatus_t rc = dnn_->SetConvolutionMathType(p->conv, BaseMath());
    if (rc != CUDNN_STATUS_SUCCESS) return rc;
    return dnn_->GetConvolutionBackwardFilterWorkspaceSize(handle_, p->x, p->y, p->conv, p->w, algo,
                                                           bytes);
  };
  calls.fallback = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  calls.find_scratch = kAlign + dw_bytes;
  return ChooseAlgorithm(options_, calls, workspace, &p->bwd_filter);
}

absl::Status CudnnConvolutions::Forward(const Conv2dGeometry& g, const void* x, const void* w,
                                        void* y, const WorkspaceFn& workspace) {
  KILN_ASSIGN_OR_RETURN(Plan * p, GetPlan(g));
  if (!p->fwd.chosen) KILN_RETURN_IF_ERROR(ChooseForward(p, x, w, y, workspace));
  void* work = nullptr;
  if (p->fwd.workspace > 0) {
    KILN_ASSIGN_OR_RETURN(work, workspace(p->fwd.workspace));
  }
  const float one = 1.0f, zero = 0.0f;
  KILN_CUDA_CHECK(dnn_->SetConvolutionMathType(p->conv, p->fwd.math));
  KILN_CUDA_CHECK(dnn_->ConvolutionForward(handle_, &one, p->x, x, p->w, w, p->conv, p->fwd.algo,
                                           work, p->fwd.workspace, &zero, p->y, y));
  return absl::OkStatus();
}

absl::Status CudnnConvolutions::BackwardFilter(const Conv2dGeometry& g, const void* x,
                                               const void* dy, void* dw,
                                               const WorkspaceFn& workspace) {
  KILN_ASSIGN_OR_RETURN(Plan * p, GetPlan(g));
  if (!p->bwd_filter.chosen) KILN_RETURN_IF_ERROR(ChooseBackwardFilter(p, x, dy, workspace));
  void* work = nullptr;
  if (p->bwd_filter.workspace > 0) {
    KILN_ASSIGN_OR_RETURN(work, workspace(p->bwd_filter.workspace));
  }
  const float one = 1.0f;  // beta = 1: parameter gradients accumulate
  KILN_CUDA_CHECK(dnn_->SetConvolutionMathType(p->conv, p->bwd_filter.math));
  KILN_CUDA_CHECK(dnn_->ConvolutionBackwardFilter(handle_, &one, p->x, x, p->y, dy, p->conv,
                                                  p->bwd_filter.algo, work, p->bwd_filter.workspace,
                                                  &one, p->w, dw));
  return absl::OkStatus();
}

absl::Status CudnnConvolutions::BackwardData(const Conv2dGeometry& g, const void* w, const void* dy,
                                             void* dx, const WorkspaceFn& workspace) {
  KILN_ASSIGN_OR_RETURN(Plan * p, GetPlan(g));
  if (!p->bwd_data.chosen) KILN_RETURN_IF_ERROR(ChooseBackwardData(p, w, dy, dx, workspace));
  void* work = nullptr;
  if (p->bwd_data.workspace > 0) {
    KILN_ASSIGN_OR_RETURN(work, workspace(p->bwd_data.workspace));
  }
  const float one = 1.0f, zero = 0.0f;  // beta = 0: activation gradients overwrite
  KILN_CUDA_CHECK(dnn_->SetConvolutionMathType(p->conv, p->bwd_data.math));
  KILN_CUDA_CHECK(dnn_->ConvolutionBackwardData(handle_, &one, p->w, w, p->y, dy, p->conv,
                                                p->bwd_data.algo, work, p->bwd_data.workspace,
                                                &zero, p->x, dx));
  return absl::OkStatus();
}

std::string CudnnConvolutions::DescribePlan(const Plan& plan) {
  const Key& k = plan.key;
  return absl::StrCat(k.n, "x", k.c, "x", k.h, "x", k.w, " k", k.kh, "x", k.kw, " s", k.stride_h,
                      "x", k.stride_w, " p", k.pad_h, "x", k.pad_w, " -> ", k.oc, ":",
                      DescribeChoice("fwd", plan.fwd), DescribeChoice("bwd_data", plan.bwd_data),
                      DescribeChoice("bwd_filter", plan.bwd_filter));
}

std::string CudnnConvolutions::Describe() const {
  std::string out;
  for (const auto& [key, plan] : plans_) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", DescribePlan(*plan));
  }
  return out;
}

std::string CudnnConvolutions::Describe(const Conv2dGeometry& g) const {
  auto it = plans_.find(KeyOf(g));
  return it != plans_.end() ? DescribePlan(*it->second) : "";
}

}  // namespace kiln
