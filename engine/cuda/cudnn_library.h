// cuDNN, opened at run time (dlopen) instead of linked: a CUDA build of kilnd starts and trains on
// the CPU where cuDNN is not installed, and only asking for a CUDA device needs it.
#pragma once

#include <cudnn.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

// The cuDNN entry points kiln calls, resolved once from libcudnn.so.9 (or libcudnn.so, whose
// major version is checked against the headers kiln was compiled with).
struct CudnnLibrary {
  decltype(&cudnnGetVersion) GetVersion;
  decltype(&cudnnGetErrorString) GetErrorString;
  decltype(&cudnnGetLastErrorString) GetLastErrorString;
  decltype(&cudnnCreate) Create;
  decltype(&cudnnDestroy) Destroy;
  decltype(&cudnnSetStream) SetStream;

  decltype(&cudnnCreateTensorDescriptor) CreateTensorDescriptor;
  decltype(&cudnnSetTensor4dDescriptor) SetTensor4dDescriptor;
  decltype(&cudnnDestroyTensorDescriptor) DestroyTensorDescriptor;
  decltype(&cudnnCreateFilterDescriptor) CreateFilterDescriptor;
  decltype(&cudnnSetFilter4dDescriptor) SetFilter4dDescriptor;
  decltype(&cudnnDestroyFilterDescriptor) DestroyFilterDescriptor;
  decltype(&cudnnCreateConvolutionDescriptor) CreateConvolutionDescriptor;
  decltype(&cudnnSetConvolution2dDescriptor) SetConvolution2dDescriptor;
  decltype(&cudnnSetConvolutionMathType) SetConvolutionMathType;
  decltype(&cudnnDestroyConvolutionDescriptor) DestroyConvolutionDescriptor;
  decltype(&cudnnGetConvolution2dForwardOutputDim) GetConvolution2dForwardOutputDim;

  decltype(&cudnnGetConvolutionForwardAlgorithmMaxCount) GetConvolutionForwardAlgorithmMaxCount;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) GetConvolutionForwardAlgorithm_v7;
  decltype(&cudnnFindConvolutionForwardAlgorithmEx) FindConvolutionForwardAlgorithmEx;
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) GetConvolutionForwardWorkspaceSize;
  decltype(&cudnnConvolutionForward) ConvolutionForward;

  decltype(&cudnnGetConvolutionBackwardDataAlgorithmMaxCount)
      GetConvolutionBackwardDataAlgorithmMaxCount;
  decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) GetConvolutionBackwardDataAlgorithm_v7;
  decltype(&cudnnFindConvolutionBackwardDataAlgorithmEx) FindConvolutionBackwardDataAlgorithmEx;
  decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) GetConvolutionBackwardDataWorkspaceSize;
  decltype(&cudnnConvolutionBackwardData) ConvolutionBackwardData;

  decltype(&cudnnGetConvolutionBackwardFilterAlgorithmMaxCount)
      GetConvolutionBackwardFilterAlgorithmMaxCount;
  decltype(&cudnnGetConvolutionBackwardFilterAlgorithm_v7) GetConvolutionBackwardFilterAlgorithm_v7;
  decltype(&cudnnFindConvolutionBackwardFilterAlgorithmEx) FindConvolutionBackwardFilterAlgorithmEx;
  decltype(&cudnnGetConvolutionBackwardFilterWorkspaceSize)
      GetConvolutionBackwardFilterWorkspaceSize;
  decltype(&cudnnConvolutionBackwardFilter) ConvolutionBackwardFilter;

  // Deprecated in cuDNN 9 and optional here: a cuDNN without them keeps convolutions working,
  // and batch normalisation alone answers BatchNormAvailable()'s error.
  decltype(&cudnnBatchNormalizationForwardTraining) BatchNormalizationForwardTraining;
  decltype(&cudnnBatchNormalizationForwardInference) BatchNormalizationForwardInference;
  decltype(&cudnnBatchNormalizationBackward) BatchNormalizationBackward;
  std::string batch_norm_missing;  // the absent ones, with the library's path; empty if none

  // FailedPrecondition naming the missing batch-norm entry points, else OK.
  absl::Status BatchNormAvailable() const;
};

// The library, loaded on first use; thread-safe. FailedPrecondition naming what is missing (no
// cuDNN on the library path, another major version, a symbol it lacks).
absl::StatusOr<const CudnnLibrary*> Cudnn();

}  // namespace kiln
