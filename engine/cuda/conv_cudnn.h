// 2-D convolutions through cuDNN 9's legacy API for one backend: descriptors and the chosen
// forward, backward-data and backward-filter algorithms are cached per shape. Internal to
// engine/cuda/; bias and the fused ReLU are CudaBackend's own kernels.
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

struct CudnnConvOptions {
  bool allow_tf32 = false;     // CUDNN_FMA_MATH unless true
  bool deterministic = true;   // backward algorithms restricted to deterministic ones
  size_t workspace_limit = 0;  // bytes of workspace an algorithm may use
};

// Device memory of at least `bytes` for the duration of one call, on the backend's stream.
using WorkspaceFn = std::function<absl::StatusOr<void*>(size_t bytes)>;

class CudnnConvolutions {
 public:
  // `handle` is the backend's, already bound to its stream; it must outlive this object.
  CudnnConvolutions(cudnnHandle_t handle, const CudnnConvOptions& options);
  ~CudnnConvolutions();
  CudnnConvolutions(const CudnnConvolutions&) = delete;
  CudnnConvolutions& operator=(const CudnnConvolutions&) = delete;

  // y = conv(x, w) (cross-correlation, as PyTorch), y overwritten.
  absl::Status Forward(const Conv2dGeometry& g, const float* x, const float* w, float* y,
                       const WorkspaceFn& workspace);
  // dw += d conv / d w for output gradient dy.
  absl::Status BackwardFilter(const Conv2dGeometry& g, const float* x, const float* dy, float* dw,
                              const WorkspaceFn& workspace);
  // dx = d conv / d x for output gradient dy, dx overwritten.
  absl::Status BackwardData(const Conv2dGeometry& g, const float* w, const float* dy, float* dx,
                            const WorkspaceFn& workspace);

  // "fwd=IMPLICIT_PRECOMP_GEMM(0 B) ..." for every shape seen, for logs and tests.
  std::string Describe() const;

 private:
  struct Plan;
  struct Key {
    int n, c, h, w, oc, kh, kw, stride, pad;
    bool operator==(const Key& o) const;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };

  absl::StatusOr<Plan*> GetPlan(const Conv2dGeometry& g);
  absl::Status ChooseForward(Plan* plan);
  absl::Status ChooseBackwardData(Plan* plan);
  absl::Status ChooseBackwardFilter(Plan* plan);

  cudnnHandle_t handle_;
  CudnnConvOptions options_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace kiln
