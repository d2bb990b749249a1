// Opening cuBLAS and cuDNN at run time (engine/cuda/shared_library.h): these run without a GPU,
// since loading a library needs none.
#include <gtest/gtest.h>

#if KILN_WITH_CUDA

#include <string>

#include "engine/cuda/cublas_library.h"
#include "engine/cuda/cudnn_library.h"
#include "engine/cuda/shared_library.h"
#include "tests/support/status_matchers.h"

namespace kiln::cuda_internal {
namespace {

TEST(CudaLibraries, AMissingLibraryIsFailedPreconditionNamingEveryFileTried) {
  auto lib = OpenLibrary("cuFOO", {"libkiln-no-such-library.so.1", "libkiln-no-such-library.so"});
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(lib.status().message());
  EXPECT_NE(message.find("cannot load cuFOO"), std::string::npos) << message;
  EXPECT_NE(message.find("libkiln-no-such-library.so.1"), std::string::npos) << message;
  EXPECT_NE(message.find("libkiln-no-such-library.so:"), std::string::npos) << message;
}

TEST(CudaLibraries, AnotherMajorVersionIsRefusedWithBothVersionsAndThePath) {
  EXPECT_OK(CheckMajorVersion("cuBLAS", "/x/libcublas.so", 13, 13));
  const absl::Status s = CheckMajorVersion("cuBLAS", "/opt/old/libcublas.so", 12, 13);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "cuBLAS 12 found at /opt/old/libcublas.so, but this build of kiln needs cuBLAS 13");
}

TEST(CudaLibraries, SymbolsResolveOrAreNamedAsMissing) {
  auto libc = OpenLibrary("libc", {"libc.so.6"});
  ASSERT_OK(libc);
  EXPECT_NE(libc->path.find("libc.so.6"), std::string::npos) << libc->path;
  size_t (*strlen_fn)(const char*) = nullptr;
  int (*missing_fn)() = nullptr;
  std::string missing;
  ResolveSymbol(*libc, "strlen", &strlen_fn, &missing);
  ASSERT_NE(strlen_fn, nullptr);
  EXPECT_EQ(strlen_fn("kiln"), 4u);
  EXPECT_EQ(missing, "");
  ResolveSymbol(*libc, "kiln_no_such_symbol", &missing_fn, &missing);
  ResolveSymbol(*libc, "kiln_nor_this", &missing_fn, &missing);
  EXPECT_EQ(missing, "kiln_no_such_symbol, kiln_nor_this");
}

// Where the toolkit's libraries are installed (this machine, CI), they load and pass the
// version check; elsewhere the error says which library is missing.
TEST(CudaLibraries, TheInstalledCublasAndCudnnLoadWithTheCompiledMajorVersion) {
  auto blas = Cublas();
  if (blas.ok()) {
    int major = 0;
    ASSERT_EQ((*blas)->GetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(major, CUBLAS_VER_MAJOR);
  } else {
    EXPECT_NE(blas.status().message().find("cannot load cuBLAS"), std::string::npos)
        << blas.status();
  }
  auto dnn = Cudnn();
  if (dnn.ok()) {
    EXPECT_EQ(static_cast<int>((*dnn)->GetVersion() / 10000), CUDNN_MAJOR);
  } else {
    EXPECT_NE(dnn.status().message().find("cannot load cuDNN"), std::string::npos) << dnn.status();
  }
  if (!blas.ok() || !dnn.ok()) GTEST_SKIP() << "cuBLAS or cuDNN is not installed here";
}

}  // namespace
}  // namespace kiln::cuda_internal

#else  // !KILN_WITH_CUDA

TEST(CudaLibraries, NeedsACudaBuild) { GTEST_SKIP() << "this build of kiln has no CUDA support"; }

#endif  // KILN_WITH_CUDA
