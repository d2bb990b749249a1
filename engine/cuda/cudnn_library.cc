#include "engine/cuda/cudnn_library.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/shared_library.h"

namespace kiln {

namespace {

absl::StatusOr<CudnnLibrary> Load() {
  KILN_ASSIGN_OR_RETURN(const cuda_internal::OpenedLibrary so,
                        cuda_internal::OpenLibrary(
                            "cuDNN", {absl::StrCat("libcudnn.so.", CUDNN_MAJOR), "libcudnn.so"}));
  CudnnLibrary lib;
  std::string missing;
  // The version first: a library of another major version may lack (or change) the rest.
  cuda_internal::ResolveSymbol(so, "cudnnGetVersion", &lib.GetVersion, &missing);
  if (lib.GetVersion == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuDNN at ", so.path, " lacks cudnnGetVersion"));
  }
  // cudnnGetVersion() is MAJOR * 10000 + MINOR * 100 + PATCH from cuDNN 9 on.
  KILN_RETURN_IF_ERROR(cuda_internal::CheckMajorVersion(
      "cuDNN", so.path, static_cast<int>(lib.GetVersion() / 10000), CUDNN_MAJOR));
#define KILN_CUDNN_SYMBOL(name) cuda_internal::ResolveSymbol(so, "cudnn" #name, &lib.name, &missing)
  KILN_CUDNN_SYMBOL(GetErrorString);
  KILN_CUDNN_SYMBOL(GetLastErrorString);
  KILN_CUDNN_SYMBOL(Create);
  KILN_CUDNN_SYMBOL(Destroy);
  KILN_CUDNN_SYMBOL(SetStream);
  KILN_CUDNN_SYMBOL(CreateTensorDescriptor);
  KILN_CUDNN_SYMBOL(SetTensor4dDescriptor);
  KILN_CUDNN_SYMBOL(DestroyTensorDescriptor);
  KILN_CUDNN_SYMBOL(CreateFilterDescriptor);
  KILN_CUDNN_SYMBOL(SetFilter4dDescriptor);
  KILN_CUDNN_SYMBOL(DestroyFilterDescriptor);
  KILN_CUDNN_SYMBOL(CreateConvolutionDescriptor);
  KILN_CUDNN_SYMBOL(SetConvolution2dDescriptor);
  KILN_CUDNN_SYMBOL(SetConvolutionMathType);
  KILN_CUDNN_SYMBOL(DestroyConvolutionDescriptor);
  KILN_CUDNN_SYMBOL(GetConvolution2dForwardOutputDim);
  KILN_CUDNN_SYMBOL(GetConvolutionForwardAlgorithmMaxCount);
  KILN_CUDNN_SYMBOL(GetConvolutionForwardAlgorithm_v7);
  KILN_CUDNN_SYMBOL(FindConvolutionForwardAlgorithmEx);
  KILN_CUDNN_SYMBOL(GetConvolutionForwardWorkspaceSize);
  KILN_CUDNN_SYMBOL(ConvolutionForward);
  KILN_CUDNN_SYMBOL(GetConvolutionBackwardDataAlgorithmMaxCount);
  KILN_CUDNN_SYMBOL(GetConvolutionBackwardDataAlgorithm_v7);
  KILN_CUDNN_SYMBOL(FindConvolutionBackwardDataAlgorithmEx);
  KILN_CUDNN_SYMBOL(GetConvolutionBackwardDataWorkspaceSize);
  KILN_CUDNN_SYMBOL(ConvolutionBackwardData);
  KILN_CUDNN_SYMBOL(GetConvolutionBackwardFilterAlgorithmMaxCount);
  KILN_CUDNN_SYMBOL(GetConvolutionBackwardFilterAlgorithm_v7);
  KILN_CUDNN_SYMBOL(FindConvolutionBackwardFilterAlgorithmEx);
  KILN_CUDNN_SYMBOL(GetConvolutionBackwardFilterWorkspaceSize);
  KILN_CUDNN_SYMBOL(ConvolutionBackwardFilter);
#undef KILN_CUDNN_SYMBOL
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cuDNN at ", so.path, " lacks ", missing));
  }
  std::string batch_norm;
#define KILN_CUDNN_OPTIONAL_SYMBOL(name) \
  cuda_internal::ResolveSymbol(so, "cudnn" #name, &lib.name, &batch_norm)
  KILN_CUDNN_OPTIONAL_SYMBOL(BatchNormalizationForwardTraining);
  KILN_CUDNN_OPTIONAL_SYMBOL(BatchNormalizationForwardInference);
  KILN_CUDNN_OPTIONAL_SYMBOL(BatchNormalizationBackward);
#undef KILN_CUDNN_OPTIONAL_SYMBOL
  if (!batch_norm.empty()) {
    lib.batch_norm_missing = absl::StrCat("cuDNN at ", so.path, " lacks ", batch_norm);
  }
  return lib;
}

}  // namespace

absl::Status CudnnLibrary::BatchNormAvailable() const {
  if (batch_norm_missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      batch_norm_missing, " (deprecated in cuDNN 9): batch normalisation on CUDA needs them"));
}

absl::StatusOr<const CudnnLibrary*> Cudnn() {
  // Loaded once; the handle stays open for the life of the process.
  static const absl::StatusOr<CudnnLibrary>* const loaded =
      new absl::StatusOr<CudnnLibrary>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace kiln
