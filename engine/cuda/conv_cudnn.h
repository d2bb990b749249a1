// 2-D convolutions through cuDNN 9's legacy API for one backend: descriptors and the chosen
// forward, backward-data and backward-filter algorithms are cached per shape. Internal to
// engine/cuda/; bias and the fused ReLU are CudaBackend's own kernels.
//
// Deterministic (the default): every pass takes the first deterministic algorithm of cuDNN's
// heuristics, which depend only on the shape, the device and the library, so every backend,
// process and resumed job on the same machine picks the same algorithms and gets the same bits.
// Otherwise each pass is timed once per shape (cudnnFind*Ex, trial buffers from the backend's
// caching allocator) and the fastest that fits is kept.
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace kiln {

struct CudnnLibrary;

struct CudnnConvOptions {
  bool allow_tf32 = false;  // CUDNN_FMA_MATH unless true
  // x, w and y (and dy, dw, dx) are bfloat16 buffers, accumulated in float32 on tensor cores
  // (cuDNN's PSEUDO_BFLOAT16_CONFIG); float32 otherwise.
  bool bf16 = false;
  bool deterministic = true;   // deterministic algorithms chosen by heuristics, not by timing
  size_t workspace_limit = 0;  // bytes of workspace an algorithm may use
};

// Device memory of at least `bytes` for the duration of one call, on the backend's stream.
using WorkspaceFn = std::function<absl::StatusOr<void*>(size_t bytes)>;

class CudnnConvolutions {
 public:
  // `handle` is the backend's, already bound to its stream; it and `dnn` must outlive this object.
  CudnnConvolutions(const CudnnLibrary* dnn, cudnnHandle_t handle, const CudnnConvOptions& options);
  ~CudnnConvolutions();
  CudnnConvolutions(const CudnnConvolutions&) = delete;
  CudnnConvolutions& operator=(const CudnnConvolutions&) = delete;

  // Buffers hold float, or bfloat16 under CudnnConvOptions::bf16.
  // y = conv(x, w) (cross-correlation, as PyTorch), y overwritten.
  absl::Status Forward(const Conv2dGeometry& g, const void* x, const void* w, void* y,
                       const WorkspaceFn& workspace);
  // dw += d conv / d w for output gradient dy.
  absl::Status BackwardFilter(const Conv2dGeometry& g, const void* x, const void* dy, void* dw,
                              const WorkspaceFn& workspace);
  // dx = d conv / d x for output gradient dy, dx overwritten.
  absl::Status BackwardData(const Conv2dGeometry& g, const void* w, const void* dy, void* dx,
                            const WorkspaceFn& workspace);

  // "2x3x9x11 k3x3 s1x1 p0x0 -> 5: fwd=IMPLICIT_PRECOMP_GEMM(0 B) ..." for every shape seen, for
  // logs.
  std::string Describe() const;
  // The same for the shape of `g` alone ("" before its first use), for a failing test's message.
  std::string Describe(const Conv2dGeometry& g) const;

 private:
  struct Plan;
  struct Key {
    int n, c, h, w, oc, kh, kw, stride_h, stride_w, pad_h, pad_w;
    bool operator==(const Key& o) const;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };

  static Key KeyOf(const Conv2dGeometry& g);
  static std::string DescribePlan(const Plan& plan);
  absl::StatusOr<Plan*> GetPlan(const Conv2dGeometry& g);
  // Each pass's choice, made on the pass's first use with the call's own buffers.
  absl::Status ChooseForward(Plan* plan, const void* x, const void* w, void* y,
                             const WorkspaceFn& workspace);
  absl::Status ChooseBackwardData(Plan* plan, const void* w, const void* dy, void* dx,
                                  const WorkspaceFn& workspace);
  absl::Status ChooseBackwardFilter(Plan* plan, const void* x, const void* dy,
                                    const WorkspaceFn& workspace);
  // The math type a pass starts from: FMA for float32 (TF32 only where allowed), tensor cores for
  // bfloat16.
  cudnnMathType_t BaseMath() const;

  const CudnnLibrary* dnn_;
  cudnnHandle_t handle_;
  CudnnConvOptions options_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace kiln
