// Every backend under test against the CPU reference backend, one test body per op run over each
// of them (as ggml's test-backend-ops does): every op on the same fresh random inputs, relative
// error ||tested - cpu|| / ||cpu|| under 1e-5 (CUDA with TF32 off), over every launch branch of
// each kernel; then a whole training step, 50 steps of both reference models, and checkpoints
// that move between the backend and the CPU. The backends under test are the registry's device
// names other than the reference "cpu" (BackendsUnderTest below); a test skips itself, saying
// why, where its backend is not present. Last, what only the CUDA backend has (its allocator's
// counters, TF32, out of device memory, asynchronous errors, the cache the backends of one device
// share), in a CUDA-only fixture that skips itself where no CUDA device is found.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/data/dataset.h"
#include "engine/loss.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/optim/optimizer.h"
#include "engine/trainer.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

#if KILN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda/cuda_allocator.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_device.h"
#endif

namespace kiln {
namespace {

using testing::RandomValues;
using testing::TempDir;

constexpr double kOpTolerance = 1e-5;

// The backends compared with the CPU: every device name the registry knows other than the
// reference "cpu". Another backend (a oneDNN CPU backend, say) is one more name here.
std::vector<std::string> BackendsUnderTest() { return {"cuda:0"}; }

// The CPU reference, and the backend under test.
enum Side { kCpu = 0, kTested = 1 };

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The same tensor on both backends.
struct Both {
  Tensor t[2];
  float* f(Side s) const { return t[s].f32(); }
  int32_t* i(Side s) const { return t[s].i32(); }
  uint8_t* u(Side s) const { return t[s].u8(); }
};

// --- calls only some backends have: each helper does nothing for the others ----------------------

#if KILN_WITH_CUDA
const CudaBackend* AsCuda(const Backend& b) { return dynamic_cast<const CudaBackend*>(&b); }

// The algorithm cuDNN runs for one pass ("fwd", "bwd_data", "bwd_filter") of g's shape, from
// CudaBackend::ConvolutionAlgorithms(g): "WINOGRAD_NONFUSED", or "" before the first use.
std::string PassAlgorithm(const std::string& algorithms, const std::string& pass) {
  const size_t at = algorithms.find(" " + pass + "=");
  if (at == std::string::npos) return "";
  const size_t from = at + pass.size() + 2;
  return algorithms.substr(from, algorithms.find('(', from) - from);
}
#endif

// The backend for `device` as CreateBackend makes it for a job of precision fp32 (TF32 off on
// CUDA): the op tolerances are float32's.
absl::StatusOr<std::unique_ptr<Backend>> CreateFloat32Backend(const std::string& device) {
#if KILN_WITH_CUDA
  if (device.rfind("cuda:", 0) == 0) {
    auto cuda = CudaBackend::Create(std::stoi(device.substr(5)));
    if (!cuda.ok()) return cuda.status();
    return std::unique_ptr<Backend>(std::move(*cuda));
  }
#endif
  return CreateBackend(device);
}

// How the log names a backend: CudaBackend::Description() ("NVIDIA H200, 139 GiB, sm_90"), or
// the backend's name.
std::string Description(const Backend& b) {
#if KILN_WITH_CUDA
  if (const CudaBackend* cuda = AsCuda(b)) return cuda->Description();
#endif
  return b.name();
}

// Every convolution algorithm the backend has chosen so far (CudaBackend::ConvolutionAlgorithms,
// cuDNN's per shape and pass); "" for a backend that does not say.
std::string ConvolutionAlgorithms(const Backend& b) {
#if KILN_WITH_CUDA
  if (const CudaBackend* cuda = AsCuda(b)) return cuda->ConvolutionAlgorithms();
#endif
  (void)b;
  return "";
}

// The algorithm one pass ("fwd", "bwd_data", "bwd_filter") of g's shape runs, for a failure
// message and the tolerance: "cuDNN WINOGRAD_NONFUSED"; "" for a backend that does not say.
std::string ConvolutionAlgorithm(const Backend& b, const Conv2dGeometry& g,
                                 const std::string& pass) {
#if KILN_WITH_CUDA
  if (const CudaBackend* cuda = AsCuda(b)) {
    return "cuDNN " + PassAlgorithm(cuda->ConvolutionAlgorithms(g), pass);
  }
#endif
  (void)b, (void)g, (void)pass;
  return "";
}

// " with cuDNN WINOGRAD_NONFUSED" after an output's name, or nothing.
std::string With(const std::string& algorithm) {
  return algorithm.empty() ? "" : " with " + algorithm;
}

// The "# cuDNN algorithms: ..." line of a CUDA backend; nothing for the others.
void PrintConvolutionAlgorithms(const Backend& b) {
#if KILN_WITH_CUDA
  if (AsCuda(b) != nullptr) {
    std::printf("# cuDNN algorithms: %s\n", ConvolutionAlgorithms(b).c_str());
  }
#endif
  (void)b;
}

// --- the comparison ------------------------------------------------------------------------------

// The same ops on the CPU reference and on a backend under test, and their results compared.
class ParityTest : public ::testing::Test {
 protected:
  Backend& backend(Side s) { return s == kCpu ? *cpu_ : *tested_; }

  Both Upload(const std::vector<float>& v) {
    Both b;
    for (Side s : {kCpu, kTested}) {
      auto t = backend(s).Allocate(DType::kF32, {static_cast<int64_t>(v.size())});
      EXPECT_OK(t) << t.status();
      EXPECT_OK(backend(s).CopyFromHost(v.data(), v.size() * sizeof(float), &*t));
      b.t[s] = *t;
    }
    return b;
  }
  Both UploadI32(const std::vector<int32_t>& v) {
    Both b;
    for (Side s : {kCpu, kTested}) {
      auto t = backend(s).Allocate(DType::kI32, {static_cast<int64_t>(v.size())});
      EXPECT_OK(t) << t.status();
      EXPECT_OK(backend(s).CopyFromHost(v.data(), v.size() * sizeof(int32_t), &*t));
      b.t[s] = *t;
    }
    return b;
  }
  Both UploadU8(const std::vector<uint8_t>& v) {
    Both b;
    for (Side s : {kCpu, kTested}) {
      auto t = backend(s).Allocate(DType::kU8, {static_cast<int64_t>(v.size())});
      EXPECT_OK(t) << t.status();
      EXPECT_OK(backend(s).CopyFromHost(v.data(), v.size(), &*t));
      b.t[s] = *t;
    }
    return b;
  }
  // Filled with the same random values on both sides: an output that must be overwritten.
  Both Garbage(int64_t n, uint32_t seed = 777) { return Upload(RandomValues(n, seed, -9, 9)); }

  std::vector<float> Get(Side s, const Tensor& t) {
    std::vector<float> out(t.numel());
    const absl::Status st = backend(s).CopyToHost(t, out.data(), out.size() * sizeof(float));
    EXPECT_OK(st) << st;
    return out;
  }
  std::vector<int32_t> GetI32(Side s, const Tensor& t) {
    std::vector<int32_t> out(t.numel());
    const absl::Status st = backend(s).CopyToHost(t, out.data(), out.size() * sizeof(int32_t));
    EXPECT_OK(st) << st;
    return out;
  }

  // Runs op on the CPU, then on the backend under test, and waits for the latter: the first
  // failure, naming its backend.
  template <typename Op>
  absl::Status RunBoth(Op op) {
    for (Side s : {kCpu, kTested}) {
      absl::Status st = op(backend(s), s);
      if (st.ok() && s == kTested) st = tested_->Synchronize();
      if (!st.ok()) {
        return absl::Status(st.code(), backend(s).name() + ": " + std::string(st.message()));
      }
    }
    return absl::OkStatus();
  }

  void ExpectClose(const Both& b, const std::string& what, double tol = kOpTolerance) {
    const std::vector<float> want = Get(kCpu, b.t[kCpu]), got = Get(kTested, b.t[kTested]);
    ASSERT_EQ(want.size(), got.size());
    const double err = RelativeError(got, want);
    EXPECT_LT(err, tol) << what << ": relative error " << err << " over " << want.size()
                        << " values";
  }
  // For element-wise ops: every element within `tol` of the CPU's, relative to its magnitude
  // (absolute below 1), so a few wrong elements cannot hide in a whole tensor's error.
  void ExpectCloseEach(const Both& b, const std::string& what, double tol = kOpTolerance) {
    const std::vector<float> want = Get(kCpu, b.t[kCpu]), got = Get(kTested, b.t[kTested]);
    ASSERT_EQ(want.size(), got.size());
    int64_t wrong = 0, first = -1;
    for (size_t i = 0; i < want.size(); ++i) {
      const bool both_nan = std::isnan(want[i]) && std::isnan(got[i]);
      const double err = std::abs(static_cast<double>(got[i]) - want[i]) /
                         std::max(1.0, std::abs(static_cast<double>(want[i])));
      if (!both_nan && !(err < tol)) {
        if (wrong++ == 0) first = static_cast<int64_t>(i);
      }
    }
    EXPECT_EQ(wrong, 0) << what << ": " << wrong << " of " << want.size()
                        << " elements off by more than " << tol << ", the first at " << first
                        << ": " << (first >= 0 ? got[first] : 0.0f) << " vs the CPU's "
                        << (first >= 0 ? want[first] : 0.0f);
  }
  void ExpectSameBits(const Both& b, const std::string& what) {
    EXPECT_TRUE(SameBits(Get(kCpu, b.t[kCpu]), Get(kTested, b.t[kTested]))) << what;
  }
  void ExpectSameI32(const Both& b, const std::string& what) {
    EXPECT_EQ(GetI32(kCpu, b.t[kCpu]), GetI32(kTested, b.t[kTested])) << what;
  }

  Backend* cpu_ = nullptr;     // the reference
  Backend* tested_ = nullptr;  // the backend under test
};

// One test body per op, run over every backend under test: the parameter is its device name.
class OpParity : public ParityTest, public ::testing::WithParamInterface<std::string> {
 protected:
  static void SetUpTestSuite() {
    reference_ = new CpuBackend(4);
    made_ = new std::map<std::string, absl::StatusOr<std::unique_ptr<Backend>>>;
  }
  static void TearDownTestSuite() {
    delete made_;
    delete reference_;
    made_ = nullptr;
    reference_ = nullptr;
  }
  // Each backend under test is made once, by its first test, and kept for the others.
  void SetUp() override {
    const std::string absent = testing::AbsentDeviceReason(GetParam());
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto it = made_->find(GetParam());
    if (it == made_->end()) {
      it = made_->emplace(GetParam(), CreateFloat32Backend(GetParam())).first;
      if (it->second.ok()) std::printf("# %s\n", Description(**it->second).c_str());
    }
    ASSERT_OK(it->second) << "making the " << GetParam() << " backend";
    cpu_ = reference_;
    tested_ = it->second->get();
  }

  // One training step and one evaluation of `config` on both backends (defined with its test).
  void ExpectBatchNormModelStepAndEvaluationMatch(const ModelConfig& config);

  static CpuBackend* reference_;
  static std::map<std::string, absl::StatusOr<std::unique_ptr<Backend>>>* made_;
};

CpuBackend* OpParity::reference_ = nullptr;
std::map<std::string, absl::StatusOr<std::unique_ptr<Backend>>>* OpParity::made_ = nullptr;

std::vector<int32_t> RandomLabels(int n, int classes, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, classes - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// --- memory and copies ---------------------------------------------------------------------------

TEST_P(OpParity, AllocateZeroFillsAndCopiesRoundTripExactly) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
    SCOPED_TRACE(n);
    auto t = tested_->Allocate(DType::kF32, {n});
    ASSERT_OK(t) << t.status();
    EXPECT_EQ(t->capacity_bytes(), static_cast<size_t>(n) * 4);
    EXPECT_EQ(Get(kTested, *t), std::vector<float>(n, 0.0f));
    const std::vector<float> v = RandomValues(n, 5);
    ASSERT_OK(tested_->CopyFromHost(v.data(), v.size() * 4, &*t));
    EXPECT_TRUE(SameBits(Get(kTested, *t), v));  // small reads go through pinned staging
    auto u = tested_->Allocate(DType::kF32, {n});
    ASSERT_OK(u);
    ASSERT_OK(tested_->Copy(*t, &*u, v.size() * 4));
    EXPECT_TRUE(SameBits(Get(kTested, *u), v));
  }
  auto small = tested_->Allocate(DType::kI32, {4});
  ASSERT_OK(small);
  std::vector<int32_t> host(8);
  EXPECT_EQ(tested_->CopyToHost(*small, host.data(), 32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tested_->CopyFromHost(host.data(), 32, &*small).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tested_->Allocate(DType::kF32, {-1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A view of `n` floats starting `offset` floats into t's buffer (the buffer stays t's).
Tensor View(const Tensor& t, int64_t offset, int64_t n) {
  return Tensor(std::shared_ptr<Buffer>(new Buffer{t.f32() + offset, static_cast<size_t>(n) * 4}),
                DType::kF32, {n});
}

TEST_P(OpParity, CopyBetweenOverlappingViewsActsLikeMemmove) {
  Both b = Upload(RandomValues(1000, 8));
  ASSERT_OK(RunBoth([&](Backend& be, Side s) {
    Tensor head = View(b.t[s], 0, 900), tail = View(b.t[s], 100, 900);
    return be.Copy(head, &tail, 900 * 4);
  }));
  ExpectSameBits(b, "forward overlap");
  ASSERT_OK(RunBoth([&](Backend& be, Side s) {
    Tensor head = View(b.t[s], 0, 900), tail = View(b.t[s], 100, 900);
    return be.Copy(tail, &head, 900 * 4);
  }));
  ExpectSameBits(b, "backward overlap");
}

TEST_P(OpParity, FillWritesEveryDtypeAsTheCpuDoes) {
  for (float value : {0.0f, -0.0f, 1.5f, -7.0f}) {
    SCOPED_TRACE(value);
    Both f = Garbage(1001);
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.Fill(&f.t[s], value); }));
    ExpectSameBits(f, "f32");
    Both i = UploadI32(RandomLabels(77, 1000, 3));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.Fill(&i.t[s], value); }));
    ExpectSameI32(i, "i32");
  }
  Both u = UploadU8(std::vector<uint8_t>(333, 9));
  ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.Fill(&u.t[s], 200.0f); }));
  for (Side s : {kCpu, kTested}) {
    std::vector<uint8_t> host(333);
    ASSERT_OK(backend(s).CopyToHost(u.t[s], host.data(), host.size()));
    EXPECT_EQ(host, std::vector<uint8_t>(333, 200));
  }
}

// --- dense algebra -------------------------------------------------------------------------------

TEST_P(OpParity, GemmMatchesForEveryTransposeAndOddShapes) {
  struct Case {
    int m, n, k;
  };
  for (Case c : {Case{1, 1, 1}, Case{17, 33, 65}, Case{64, 512, 784}, Case{128, 10, 256},
                 Case{3, 1000, 7}}) {
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        for (float beta : {0.0f, 0.5f}) {
          SCOPED_TRACE(::testing::Message()
                       << c.m << "x" << c.n << "x" << c.k << " ta " << (ta == Transpose::kYes)
                       << " tb " << (tb == Transpose::kYes) << " beta " << beta);
          Both a = Upload(RandomValues(int64_t{c.m} * c.k, 1));
          Both b = Upload(RandomValues(int64_t{c.k} * c.n, 2));
          Both out = Upload(RandomValues(int64_t{c.m} * c.n, 3));
          ASSERT_OK(RunBoth([&](Backend& be, Side s) {
            return be.Gemm(ta, tb, c.m, c.n, c.k, 0.7f, a.f(s), b.f(s), beta, out.f(s));
          }));
          ExpectClose(out, "gemm");
        }
      }
    }
  }
}

TEST_P(OpParity, BiasForwardAddsAndBackwardAccumulates) {
  struct Case {
    int rows, cols;
  };
  for (Case c : {Case{1, 1}, Case{7, 33}, Case{64, 512}, Case{1000, 10}, Case{3, 1000}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols);
    Both y = Upload(RandomValues(int64_t{c.rows} * c.cols, 4));
    Both bias = Upload(RandomValues(c.cols, 5));
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.BiasForward(c.rows, c.cols, bias.f(s), y.f(s)); }));
    ExpectCloseEach(y, "bias forward");
    Both dbias = Upload(RandomValues(c.cols, 6));  // accumulates onto what is there
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.BiasBackward(c.rows, c.cols, y.f(s), dbias.f(s)); }));
    ExpectClose(dbias, "bias backward");
  }
}

// --- element-wise --------------------------------------------------------------------------------

TEST_P(OpParity, ReluForwardAndBackwardMatchBitForBit) {
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{100003}}) {
    SCOPED_TRACE(n);
    Both x = Upload(RandomValues(n, 7)), y = Garbage(n), dy = Upload(RandomValues(n, 8));
    Both dx = Garbage(n, 9);
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.ReluForward(n, x.f(s), y.f(s)); }));
    ExpectSameBits(y, "relu forward");
    ASSERT_OK(
        RunBoth([&](Backend& be, Side s) { return be.ReluBackward(n, y.f(s), dy.f(s), dx.f(s)); }));
    ExpectSameBits(dx, "relu backward");
  }
  const float inf = std::numeric_limits<float>::infinity();
  Both special = Upload({std::nanf(""), -std::nanf(""), inf, -inf, 0.0f, -0.0f}), out = Garbage(6);
  ASSERT_OK(
      RunBoth([&](Backend& be, Side s) { return be.ReluForward(6, special.f(s), out.f(s)); }));
  ExpectSameBits(out, "relu of NaN, inf and signed zeros");
}

TEST_P(OpParity, ActivationsMatchForEveryKind) {
  for (ActivationKind kind :
       {ActivationKind::kTanh, ActivationKind::kSigmoid, ActivationKind::kGelu,
        ActivationKind::kLeakyRelu, ActivationKind::kSilu}) {
    for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{100003}}) {
      SCOPED_TRACE(::testing::Message() << "kind " << static_cast<int>(kind) << " n " << n);
      std::vector<float> xv = RandomValues(n, 27, -6, 6);
      if (n > 8) {
        // Saturation: exp overflows, tanh and sigmoid flatten.
        xv[0] = 0.0f;
        xv[1] = -0.0f;
        xv[2] = 90.0f;
        xv[3] = -90.0f;
      }
      Both x = Upload(xv), y = Garbage(n), dy = Upload(RandomValues(n, 28)), dx = Garbage(n, 29);
      ASSERT_OK(RunBoth([&](Backend& be, Side s) {
        return be.ActivationForward(kind, 0.1f, n, x.f(s), y.f(s));
      }));
      ExpectCloseEach(y, "activation forward");
      ASSERT_OK(RunBoth([&](Backend& be, Side s) {
        return be.ActivationBackward(kind, 0.1f, n, x.f(s), y.f(s), dy.f(s), dx.f(s));
      }));
      ExpectCloseEach(dx, "activation backward");
    }
  }
}

TEST_P(OpParity, AddMatchesBitForBitIntoAThirdBufferAndInPlace) {
  for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{100003}}) {
    SCOPED_TRACE(n);
    Both a = Upload(RandomValues(n, 10)), b = Upload(RandomValues(n, 11)), y = Garbage(n, 12);
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.Add(n, a.f(s), b.f(s), y.f(s)); }));
    ExpectSameBits(y, "add");
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.Add(n, a.f(s), b.f(s), a.f(s)); }));
    ExpectSameBits(a, "add into its first operand");
    const std::vector<float> av = Get(kCpu, a.t[kCpu]), yv = Get(kCpu, y.t[kCpu]);
    EXPECT_TRUE(SameBits(av, yv)) << "in place and out of place agree";
  }
}

TEST_P(OpParity, Copy2DMovesStridedRowsAndNothingElse) {
  // Rows of 3 out of 5 into rows of 7 at column 2 (a concat's slice), then back out; then a
  // row count that takes the CPU's parallel path.
  for (int64_t rows : {int64_t{1}, int64_t{4}, int64_t{5000}}) {
    SCOPED_TRACE(rows);
    Both src = Upload(RandomValues(rows * 5, 13)), dst = Garbage(rows * 7, 14);
    const std::vector<float> before = Get(kCpu, dst.t[kCpu]);
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.Copy2D(rows, 3, src.f(s), 5, dst.f(s) + 2, 7); }));
    ExpectSameBits(dst, "copy2d");
    const std::vector<float> sv = Get(kCpu, src.t[kCpu]), dv = Get(kCpu, dst.t[kCpu]);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < 7; ++c) {
        const float want = c >= 2 && c < 5 ? sv[r * 5 + c - 2] : before[r * 7 + c];
        ASSERT_EQ(dv[r * 7 + c], want) << r << "," << c;
      }
    }
  }
  EXPECT_EQ(tested_->Copy2D(2, 6, nullptr, 5, nullptr, 7).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(OpParity, DropoutMasksAreIdenticalOnBothBackends) {
  struct Case {
    int64_t n;
    float p;
    uint64_t seed, offset;
  };
  for (Case c : {Case{1, 0.5f, 1, 0}, Case{1001, 0.3f, 42, 7}, Case{65537, 0.5f, 9, 1ull << 40},
                 Case{100, 1.0f, 3, 0}, Case{100, 0.0f, 3, 0}}) {
    SCOPED_TRACE(::testing::Message() << c.n << " p " << c.p << " offset " << c.offset);
    Both x = Upload(RandomValues(c.n, 10)), mask = Garbage(c.n), y = Garbage(c.n, 11);
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.DropoutForward(c.n, c.p, c.seed, c.offset, x.f(s), mask.f(s), y.f(s));
    }));
    ExpectSameBits(mask, "mask");
    ExpectSameBits(y, "dropout forward");
    Both dy = Upload(RandomValues(c.n, 12)), dx = Garbage(c.n, 13);
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.DropoutBackward(c.n, mask.f(s), dy.f(s), dx.f(s)); }));
    ExpectSameBits(dx, "dropout backward");
  }
}

TEST_P(OpParity, SoftmaxForwardMatchesForNarrowAndWideRows) {
  struct Case {
    int rows, cols;
  };
  for (Case c : {Case{1, 1}, Case{7, 10}, Case{3, 33}, Case{64, 1000}, Case{1000, 10}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols);
    Both x = Upload(RandomValues(int64_t{c.rows} * c.cols, 14, -5, 5));
    Both y = Garbage(int64_t{c.rows} * c.cols);
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.SoftmaxForward(c.rows, c.cols, x.f(s), y.f(s)); }));
    ExpectClose(y, "softmax");
  }
}

// --- sequences (transformers) --------------------------------------------------------------------

TEST_P(OpParity, LayerNormMatchesForNarrowAndWideRowsWithAndWithoutAffine) {
  struct Case {
    int64_t rows;
    int cols;
  };
  // One value, odd widths, GPT-2's 768 and a row wider than a thread block's 1024.
  for (Case c :
       {Case{1, 1}, Case{7, 5}, Case{33, 64}, Case{64, 130}, Case{300, 768}, Case{5, 4099}}) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols << " affine " << affine);
      const int64_t n = c.rows * c.cols;
      Both x = Upload(RandomValues(n, 60, -2, 3)), gamma = Upload(RandomValues(c.cols, 61));
      Both beta = Upload(RandomValues(c.cols, 62)), y = Garbage(n);
      Both mean = Garbage(c.rows, 63), rstd = Garbage(c.rows, 64);
      ASSERT_OK(RunBoth([&](Backend& be, Side s) {
        return be.LayerNormForward(c.rows, c.cols, 1e-5f, x.f(s), affine ? gamma.f(s) : nullptr,
                                   affine ? beta.f(s) : nullptr, y.f(s), mean.f(s), rstd.f(s));
      }));
      ExpectClose(y, "layernorm y");
      ExpectClose(mean, "layernorm mean");
      ExpectClose(rstd, "layernorm rstd");
      Both dy = Upload(RandomValues(n, 65)), dx = Garbage(n, 66);
      Both dgamma = Upload(RandomValues(c.cols, 67)), dbeta = Upload(RandomValues(c.cols, 68));
      ASSERT_OK(RunBoth([&](Backend& be, Side s) {
        return be.LayerNormBackward(c.rows, c.cols, x.f(s), affine ? gamma.f(s) : nullptr,
                                    mean.f(s), rstd.f(s), dy.f(s), dx.f(s), dgamma.f(s),
                                    dbeta.f(s));
      }));
      ExpectClose(dx, "layernorm dx");
      ExpectClose(dgamma, "layernorm dgamma (+=)");
      ExpectClose(dbeta, "layernorm dbeta (+=)");
    }
  }
}

TEST_P(OpParity, EmbeddingGathersBitForBitAndScattersInIndexOrder) {
  struct Case {
    int64_t count;
    int vocab, dim;
  };
  for (Case c : {Case{1, 1, 1}, Case{7, 3, 5}, Case{33, 65, 64}, Case{768, 50304, 128},
                 Case{3000, 7, 130}}) {
    SCOPED_TRACE(::testing::Message() << c.count << " ids, " << c.vocab << " x " << c.dim);
    const int64_t n = c.count * c.dim;
    Both table = Upload(RandomValues(int64_t{c.vocab} * c.dim, 69));
    std::vector<int32_t> host_ids = RandomLabels(static_cast<int>(c.count), c.vocab, 70);
    Both ids = UploadI32(host_ids), y = Garbage(n);
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.EmbeddingForward(c.count, c.vocab, c.dim, ids.i(s), table.f(s), y.f(s));
    }));
    ExpectSameBits(y, "embedding forward");
    // Ids out of range are skipped by the backward on every backend.
    if (c.count > 3) host_ids[1] = -1, host_ids[2] = c.vocab;
    Both scatter_ids = UploadI32(host_ids), dy = Upload(RandomValues(n, 71));
    Both dtable = Upload(std::vector<float>(int64_t{c.vocab} * c.dim, 0.0f));
    Both dtable_onto = Upload(RandomValues(int64_t{c.vocab} * c.dim, 72));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      absl::Status st =
          be.EmbeddingBackward(c.count, c.vocab, c.dim, scatter_ids.i(s), dy.f(s), dtable.f(s));
      if (!st.ok()) return st;
      return be.EmbeddingBackward(c.count, c.vocab, c.dim, scatter_ids.i(s), dy.f(s),
                                  dtable_onto.f(s));
    }));
    ExpectSameBits(dtable, "embedding backward from zero (each row's sum in index order)");
    ExpectClose(dtable_onto, "embedding backward onto a table (+=)");
  }
}

TEST_P(OpParity, GemmStridedBatchedMatchesForEveryTransposeAndStride) {
  struct Case {
    int m, n, k, batch;
    int64_t extra_a, extra_b, extra_c;  // added to the packed strides; -1 for a stride of 0
  };
  // One matrix, attention's shapes (48 heads of 64 x 64 x 32, 72 of 256 x 256 x 64), odd shapes
  // with gaps between matrices, and a or b repeated for every matrix.
  for (Case c :
       {Case{1, 1, 1, 1, 0, 0, 0}, Case{17, 33, 65, 5, 0, 0, 0}, Case{64, 64, 32, 48, 0, 0, 0},
        Case{256, 64, 256, 72, 0, 0, 0}, Case{5, 7, 3, 3, 3, 5, 7}, Case{16, 8, 4, 4, -1, 0, 0},
        Case{16, 8, 4, 4, 0, -1, 0}}) {
    const int64_t pa = int64_t{c.m} * c.k, pb = int64_t{c.k} * c.n, pc = int64_t{c.m} * c.n;
    const int64_t sa = c.extra_a < 0 ? 0 : pa + c.extra_a, sb = c.extra_b < 0 ? 0 : pb + c.extra_b;
    const int64_t sc = pc + c.extra_c;
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        for (float beta : {0.0f, 0.5f}) {
          SCOPED_TRACE(::testing::Message()
                       << c.batch << " x " << c.m << "x" << c.n << "x" << c.k << " strides " << sa
                       << "," << sb << "," << sc << " ta " << (ta == Transpose::kYes) << " tb "
                       << (tb == Transpose::kYes) << " beta " << beta);
          Both a = Upload(RandomValues((c.batch - 1) * sa + pa, 73));
          Both b = Upload(RandomValues((c.batch - 1) * sb + pb, 74));
          Both out = Upload(RandomValues((c.batch - 1) * sc + pc, 75));
          ASSERT_OK(RunBoth([&](Backend& be, Side s) {
            return be.GemmStridedBatched(ta, tb, c.m, c.n, c.k, 0.7f, a.f(s), sa, b.f(s), sb, beta,
                                         out.f(s), sc, c.batch);
          }));
          ExpectClose(out, "batched gemm");
        }
      }
    }
  }
}

TEST_P(OpParity, CausalSoftmaxMatchesForShortAndLongRowsAndInPlace) {
  // t = 1 (one live value), odd t, attention's 64 and 256, and rows longer than 1024.
  for (int t : {1, 3, 17, 64, 256, 1100}) {
    const int64_t batch = t > 256 ? 2 : 5, n = batch * t * t;
    SCOPED_TRACE(::testing::Message() << batch << " x " << t);
    const float scale = 1.0f / std::sqrt(64.0f);
    Both x = Upload(RandomValues(n, 76, -10, 10)), y = Garbage(n),
         in_place = Upload(Get(kCpu, x.t[kCpu]));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.CausalSoftmaxForward(batch, t, scale, x.f(s), y.f(s));
    }));
    ExpectClose(y, "causal softmax");
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.CausalSoftmaxForward(batch, t, scale, in_place.f(s), in_place.f(s));
    }));
    ExpectClose(in_place, "causal softmax in place");
    Both dy = Upload(RandomValues(n, 77)), dx = Garbage(n, 78),
         dx_in_place = Upload(Get(kCpu, dy.t[kCpu]));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.CausalSoftmaxBackward(batch, t, scale, y.f(s), dy.f(s), dx.f(s));
    }));
    ExpectClose(dx, "causal softmax backward");
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.CausalSoftmaxBackward(batch, t, scale, y.f(s), dx_in_place.f(s), dx_in_place.f(s));
    }));
    ExpectClose(dx_in_place, "causal softmax backward in place");
  }
}

TEST_P(OpParity, CausalSoftmaxForwardAtMatchesForDecodingPrefillAndLongRows) {
  struct Case {
    int64_t batch;
    int queries, keys, offset;
  };
  // One new position against short and long caches (the warp kernels' widths and the block
  // kernel's), a prefill, a block in the middle with masked keys after it.
  for (Case c : {Case{4, 1, 1, 0}, Case{4, 1, 33, 32}, Case{2, 1, 300, 299}, Case{2, 1, 1100, 1000},
                 Case{2, 16, 16, 0}, Case{3, 5, 70, 40}}) {
    const int64_t n = c.batch * c.queries * c.keys;
    SCOPED_TRACE(::testing::Message()
                 << c.batch << " x " << c.queries << " x " << c.keys << " offset " << c.offset);
    const float scale = 1.0f / std::sqrt(64.0f);
    Both x = Upload(RandomValues(n, 79, -10, 10)), y = Garbage(n),
         in_place = Upload(Get(kCpu, x.t[kCpu]));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.CausalSoftmaxForwardAt(c.batch, c.queries, c.keys, c.offset, scale, x.f(s), y.f(s));
    }));
    ExpectClose(y, "causal softmax at an offset");
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.CausalSoftmaxForwardAt(c.batch, c.queries, c.keys, c.offset, scale, in_place.f(s),
                                       in_place.f(s));
    }));
    ExpectClose(in_place, "causal softmax at an offset, in place");
  }
}

TEST_P(OpParity, Transpose0213MatchesBitForBit) {
  struct Case {
    int64_t a, b, c, d;
  };
  // Odd shapes with b > c and b < c, d = 1, and attention's head split and merge (B=12, T=64,
  // H=4, hd=32): (1, B*T, 3, C), (3B, T, H, hd), (B, H, T, hd).
  for (Case c : {Case{1, 1, 1, 1}, Case{2, 3, 5, 1}, Case{3, 5, 2, 7}, Case{1, 768, 3, 128},
                 Case{36, 64, 4, 32}, Case{12, 4, 64, 32}}) {
    SCOPED_TRACE(::testing::Message() << c.a << "," << c.b << "," << c.c << "," << c.d);
    const int64_t n = c.a * c.b * c.c * c.d;
    Both x = Upload(RandomValues(n, 79)), y = Garbage(n);
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.Transpose0213(c.a, c.b, c.c, c.d, x.f(s), y.f(s)); }));
    ExpectSameBits(y, "Transpose0213");
  }
}

// --- convolution and pooling ---------------------------------------------------------------------

std::vector<Conv2dGeometry> ConvGeometries() {
  // stride_w and pad_w default to the square stride and pad.
  auto g = [](int n, int c, int h, int w, int oc, int kh, int kw, int stride, int pad,
              int stride_w = -1, int pad_w = -1) {
    Conv2dGeometry out;
    out.batch = n;
    out.in_channels = c;
    out.in_h = h;
    out.in_w = w;
    out.out_channels = oc;
    out.kernel_h = kh;
    out.kernel_w = kw;
    out.stride_h = stride;
    out.stride_w = stride_w >= 0 ? stride_w : stride;
    out.padding_h = pad;
    out.padding_w = pad_w >= 0 ? pad_w : pad;
    return out;
  };
  return {g(2, 3, 9, 11, 5, 3, 3, 1, 0), g(2, 3, 9, 11, 5, 3, 3, 2, 1),
          g(3, 2, 8, 8, 4, 5, 5, 1, 2), g(1, 4, 7, 7, 6, 1, 1, 1, 0), g(2, 3, 10, 9, 2, 3, 2, 3, 1),
          g(64, 1, 28, 28, 32, 3, 3, 1, 0), g(64, 32, 13, 13, 64, 3, 3, 1, 0),
          // Per-axis stride and padding, rectangular kernels (1x7 and 7x1 as in Inception).
          g(2, 3, 9, 11, 4, 1, 7, 1, 0, 1, 3), g(2, 3, 11, 9, 4, 7, 1, 1, 3, 1, 0),
          g(2, 3, 10, 12, 5, 3, 5, 2, 1, 1, 2), g(1, 1, 9, 8, 3, 2, 3, 1, 0, 2, 1)};
}

std::string Describe(const Conv2dGeometry& g) {
  return ::testing::PrintToString(
      std::vector<int>{g.batch, g.in_channels, g.in_h, g.in_w, g.out_channels, g.kernel_h,
                       g.kernel_w, g.stride_h, g.stride_w, g.padding_h, g.padding_w});
}

// How far a correct (cuDNN) result may be from the CPU's, by relative L2 error. Each output is a
// float32 sum of `reduction` products; two summation orders differ by about 2^-24 * sqrt(K)
// relative (rounding errors add as a random walk), so 4x that, and never below 1e-5 (the op
// tolerance). FFT and Winograd algorithms also round in their transforms, whose constants grow
// with the tile: they get a 1e-4 floor (measured fp32 Winograd F(4x4,3x3) errors are ~1e-5 to
// 1e-4 relative). With K = 64*26*26 (the reference CNN's first weight gradient) the bound is 5e-5.
double ConvTolerance(int64_t reduction, const std::string& algorithm) {
  const double by_order = 4.0 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(reduction));
  const bool transform =
      algorithm.find("FFT") != std::string::npos || algorithm.find("WINOGRAD") != std::string::npos;
  return std::max(by_order, transform ? 1e-4 : kOpTolerance);
}

TEST_P(OpParity, ConvForwardMatchesWithAndWithoutBiasAndFusedRelu) {
  for (const Conv2dGeometry& g : ConvGeometries()) {
    const int64_t x_n = int64_t{g.batch} * g.in_channels * g.in_h * g.in_w;
    const int64_t w_n = int64_t{g.out_channels} * g.in_channels * g.kernel_h * g.kernel_w;
    const int64_t y_n = int64_t{g.batch} * g.out_channels * g.out_h() * g.out_w();
    Both x = Upload(RandomValues(x_n, 15)), w = Upload(RandomValues(w_n, 16, -0.3f, 0.3f));
    Both bias = Upload(RandomValues(g.out_channels, 17));
    for (Activation act : {Activation::kNone, Activation::kRelu}) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(Describe(g) + (act == Activation::kRelu ? " relu" : "") +
                     (with_bias ? " bias" : ""));
        Both y = Garbage(y_n);
        ASSERT_OK(RunBoth([&](Backend& be, Side s) {
          return be.Conv2dForward(g, x.f(s), w.f(s), with_bias ? bias.f(s) : nullptr, act, y.f(s));
        }));
        const std::string algo = ConvolutionAlgorithm(*tested_, g, "fwd");
        ExpectClose(y, "conv forward" + With(algo),
                    ConvTolerance(int64_t{g.in_channels} * g.kernel_h * g.kernel_w, algo));
      }
    }
  }
  PrintConvolutionAlgorithms(*tested_);
}

TEST_P(OpParity, ConvBackwardAccumulatesWeightsAndOverwritesInputGradient) {
  for (const Conv2dGeometry& g : ConvGeometries()) {
    const int64_t x_n = int64_t{g.batch} * g.in_channels * g.in_h * g.in_w;
    const int64_t w_n = int64_t{g.out_channels} * g.in_channels * g.kernel_h * g.kernel_w;
    const int64_t y_n = int64_t{g.batch} * g.out_channels * g.out_h() * g.out_w();
    Both x = Upload(RandomValues(x_n, 18)), w = Upload(RandomValues(w_n, 19, -0.3f, 0.3f));
    Both dy = Upload(RandomValues(y_n, 20));
    for (Activation act : {Activation::kNone, Activation::kRelu}) {
      // The fused ReLU's mask comes from y: both sides get the CPU's forward output.
      std::vector<float> y_host(y_n);
      {
        Both y = Garbage(y_n);
        ASSERT_OK(cpu_->Conv2dForward(g, x.f(kCpu), w.f(kCpu), nullptr, act, y.f(kCpu)));
        y_host = Get(kCpu, y.t[kCpu]);
      }
      Both y = Upload(y_host);
      for (bool all_outputs : {true, false}) {
        SCOPED_TRACE(Describe(g) + (act == Activation::kRelu ? " relu" : "") +
                     (all_outputs ? " dbias+dx" : " dw only"));
        Both dw = Upload(RandomValues(w_n, 21)), dbias = Upload(RandomValues(g.out_channels, 22));
        Both dx = Garbage(x_n);
        ASSERT_OK(RunBoth([&](Backend& be, Side s) {
          return be.Conv2dBackward(g, x.f(s), w.f(s), y.f(s), dy.f(s), act, dw.f(s),
                                   all_outputs ? dbias.f(s) : nullptr,
                                   all_outputs ? dx.f(s) : nullptr);
        }));
        const std::string filter_algo = ConvolutionAlgorithm(*tested_, g, "bwd_filter");
        const int64_t per_plane = int64_t{g.out_h()} * g.out_w();
        ExpectClose(dw, "dw" + With(filter_algo), ConvTolerance(g.batch * per_plane, filter_algo));
        if (all_outputs) {
          ExpectClose(dbias, "dbias", ConvTolerance(g.batch * per_plane, ""));
          const std::string data_algo = ConvolutionAlgorithm(*tested_, g, "bwd_data");
          ExpectClose(dx, "dx" + With(data_algo),
                      ConvTolerance(int64_t{g.out_channels} * g.kernel_h * g.kernel_w, data_algo));
        }
      }
    }
  }
  PrintConvolutionAlgorithms(*tested_);
}

TEST_P(OpParity, MaxPoolPicksTheSameWinnersForEveryWindowShape) {
  struct Case {
    int n, c, h, w, kernel, stride, pad = 0;
  };
  for (Case k : {Case{2, 3, 8, 8, 2, 2}, Case{1, 2, 7, 9, 2, 2}, Case{2, 2, 9, 9, 3, 2},
                 Case{1, 3, 9, 7, 3, 3}, Case{1, 1, 6, 6, 2, 1}, Case{2, 1, 5, 5, 1, 1},
                 Case{64, 32, 26, 26, 2, 2}, Case{2, 3, 8, 8, 2, 2, 1}, Case{2, 2, 9, 7, 3, 2, 1},
                 Case{1, 3, 7, 9, 5, 1, 2}, Case{8, 16, 32, 32, 3, 2, 1}}) {
    Pool2dGeometry g;
    g.batch = k.n;
    g.channels = k.c;
    g.in_h = k.h;
    g.in_w = k.w;
    g.kernel_h = g.kernel_w = k.kernel;
    g.stride_h = g.stride_w = k.stride;
    g.padding_h = g.padding_w = k.pad;
    SCOPED_TRACE(::testing::Message() << k.n << "x" << k.c << "x" << k.h << "x" << k.w << " k"
                                      << k.kernel << " s" << k.stride << " p" << k.pad);
    const int64_t x_n = int64_t{k.n} * k.c * k.h * k.w;
    const int64_t y_n = int64_t{k.n} * k.c * g.out_h() * g.out_w();
    std::vector<float> xv = RandomValues(x_n, 23);
    for (int64_t i = 0; i < x_n; i += 37) xv[i] = std::nanf("");  // NaN rule, several positions
    for (int64_t i = 5; i < x_n; i += 41) xv[i] = xv[i - 1];      // exact ties
    Both x = Upload(xv), y = Garbage(y_n);
    Both argmax = UploadI32(std::vector<int32_t>(y_n, -1));
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.MaxPool2dForward(g, x.f(s), y.f(s), argmax.i(s)); }));
    ExpectSameBits(y, "pool forward");
    ExpectSameI32(argmax, "argmax");
    // Backward from the same winners on both sides.
    Both am = UploadI32(GetI32(kCpu, argmax.t[kCpu]));
    Both dy = Upload(RandomValues(y_n, 24)), dx = Garbage(x_n);
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.MaxPool2dBackward(g, dy.f(s), am.i(s), dx.f(s)); }));
    ExpectCloseEach(dx, "pool backward", 1e-6);
  }
}

TEST_P(OpParity, AvgPoolMatchesForEveryWindowShape) {
  struct Case {
    int n, c, h, w, kh, kw, sh, sw, ph, pw;
  };
  for (Case k : {Case{2, 3, 8, 8, 2, 2, 2, 2, 0, 0}, Case{1, 2, 7, 9, 3, 3, 2, 2, 1, 1},
                 Case{2, 2, 9, 7, 3, 3, 1, 1, 1, 1}, Case{1, 3, 5, 6, 5, 6, 5, 6, 0, 0},
                 Case{2, 4, 6, 9, 2, 3, 2, 3, 1, 1}, Case{64, 32, 8, 8, 8, 8, 1, 1, 0, 0},
                 Case{8, 16, 32, 32, 3, 3, 2, 2, 1, 1}}) {
    Pool2dGeometry g;
    g.batch = k.n;
    g.channels = k.c;
    g.in_h = k.h;
    g.in_w = k.w;
    g.kernel_h = k.kh;
    g.kernel_w = k.kw;
    g.stride_h = k.sh;
    g.stride_w = k.sw;
    g.padding_h = k.ph;
    g.padding_w = k.pw;
    SCOPED_TRACE(::testing::Message()
                 << k.n << "x" << k.c << "x" << k.h << "x" << k.w << " k" << k.kh << "x" << k.kw
                 << " s" << k.sh << "x" << k.sw << " p" << k.ph << "x" << k.pw);
    const int64_t x_n = int64_t{k.n} * k.c * k.h * k.w;
    const int64_t y_n = int64_t{k.n} * k.c * g.out_h() * g.out_w();
    Both x = Upload(RandomValues(x_n, 25)), y = Garbage(y_n);
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.AvgPool2dForward(g, x.f(s), y.f(s)); }));
    // The same sums in the same order on both sides.
    ExpectSameBits(y, "avgpool forward");
    Both dy = Upload(RandomValues(y_n, 26)), dx = Garbage(x_n);
    ASSERT_OK(
        RunBoth([&](Backend& be, Side s) { return be.AvgPool2dBackward(g, dy.f(s), dx.f(s)); }));
    ExpectSameBits(dx, "avgpool backward");
  }
}

// --- losses --------------------------------------------------------------------------------------

TEST_P(OpParity, SoftmaxCrossEntropyMatchesLossCountAndGradient) {
  struct Case {
    int rows, cols;
    float smoothing = 0;
  };
  for (Case c : {Case{1, 1}, Case{7, 10}, Case{64, 10}, Case{1000, 10}, Case{5, 1000}, Case{33, 37},
                 Case{64, 10, 0.1f}, Case{5, 1000, 0.3f}, Case{3, 4, 1.0f}}) {
    for (bool with_grad : {true, false}) {
      SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols << " smoothing " << c.smoothing
                                        << (with_grad ? " grad" : ""));
      const int64_t n = int64_t{c.rows} * c.cols;
      Both logits = Upload(RandomValues(n, 25, -4, 4));
      Both labels = UploadI32(RandomLabels(c.rows, c.cols, 26));
      Both loss = Garbage(1), dlogits = Garbage(n);
      Both correct = UploadI32({-5});
      ASSERT_OK(RunBoth([&](Backend& be, Side s) {
        return be.SoftmaxCrossEntropy(c.rows, c.cols, logits.f(s), labels.i(s), c.smoothing,
                                      loss.f(s), correct.i(s), with_grad ? dlogits.f(s) : nullptr);
      }));
      ExpectClose(loss, "loss");
      ExpectSameI32(correct, "correct");
      if (with_grad) ExpectClose(dlogits, "dlogits");
    }
  }
}

TEST_P(OpParity, ArgmaxRulesForTiesNansAndInfinitiesMatch) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  std::vector<float> rows = {1,    3,    3, 2, nan, 5, 1,     0,    0,  nan, 7, 7, -inf, -inf,
                             -inf, -inf, 2, 2, 2,   2, -0.0f, 0.0f, -1, -2,  4, 4, nan,  9};
  const int cols = 4, n_rows = static_cast<int>(rows.size()) / cols;
  Both x = Upload(rows);
  Both out = UploadI32(std::vector<int32_t>(n_rows, -1));
  ASSERT_OK(
      RunBoth([&](Backend& be, Side s) { return be.Argmax(n_rows, cols, x.f(s), out.i(s)); }));
  ExpectSameI32(out, "argmax of special rows");
  // A wide row takes the warp-strided path: its maximum and a later tie.
  std::vector<float> wide = RandomValues(3 * 100, 27);
  wide[70] = wide[95] = 5.0f;
  wide[100 + 3] = nan;
  wide[200] = nan;
  Both wx = Upload(wide), wout = UploadI32({-1, -1, -1});
  ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.Argmax(3, 100, wx.f(s), wout.i(s)); }));
  ExpectSameI32(wout, "argmax of wide rows");
  Both labels = UploadI32({70, 3, 0});
  Both correct = UploadI32({-1});
  ASSERT_OK(RunBoth([&](Backend& be, Side s) {
    return be.CountCorrect(3, 100, wx.f(s), labels.i(s), correct.i(s));
  }));
  ExpectSameI32(correct, "count correct");
}

TEST_P(OpParity, CountCorrectAndArgmaxMatchOnRandomRows) {
  for (int rows : {1, 63, 1000}) {
    Both x = Upload(RandomValues(int64_t{rows} * 10, 28));
    Both labels = UploadI32(RandomLabels(rows, 10, 29));
    Both correct = UploadI32({-1}), out = UploadI32(std::vector<int32_t>(rows, -1));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      absl::Status st = be.CountCorrect(rows, 10, x.f(s), labels.i(s), correct.i(s));
      return st.ok() ? be.Argmax(rows, 10, x.f(s), out.i(s)) : st;
    }));
    ExpectSameI32(correct, "count correct");
    ExpectSameI32(out, "argmax");
  }
}

TEST_P(OpParity, MeanSquaredErrorMatchesWithAndWithoutGradient) {
  for (int64_t n : {int64_t{1}, int64_t{640}, int64_t{1001}, int64_t{300000}}) {
    for (bool with_grad : {true, false}) {
      SCOPED_TRACE(::testing::Message() << n << (with_grad ? " grad" : ""));
      Both y = Upload(RandomValues(n, 30)), target = Upload(RandomValues(n, 31));
      Both loss = Garbage(1), dy = Garbage(n);
      ASSERT_OK(RunBoth([&](Backend& be, Side s) {
        return be.MeanSquaredError(n, y.f(s), target.f(s), loss.f(s),
                                   with_grad ? dy.f(s) : nullptr);
      }));
      ExpectClose(loss, "mse");
      if (with_grad) ExpectCloseEach(dy, "mse gradient");
    }
  }
}

TEST_P(OpParity, OneHotMatches) {
  for (int rows : {1, 7, 64}) {
    Both labels = UploadI32(RandomLabels(rows, 10, 32));
    Both onehot = Garbage(int64_t{rows} * 10);
    ASSERT_OK(RunBoth(
        [&](Backend& be, Side s) { return be.OneHot(rows, 10, labels.i(s), onehot.f(s)); }));
    ExpectSameBits(onehot, "one-hot");
  }
}

// --- optimizers ----------------------------------------------------------------------------------

TEST_P(OpParity, SgdUpdatesMatchForEveryMomentumVariant) {
  auto h = [](float lr, float momentum, float dampening, float wd, bool nesterov) {
    SgdHyper out;
    out.lr = lr;
    out.momentum = momentum;
    out.dampening = dampening;
    out.weight_decay = wd;
    out.nesterov = nesterov;
    return out;
  };
  const int64_t n = 4099;
  for (SgdHyper hyper :
       {h(0.1f, 0, 0, 0, false), h(0.1f, 0, 0, 0.01f, false), h(0.05f, 0.9f, 0, 0, false),
        h(0.05f, 0.9f, 0.1f, 1e-3f, false), h(0.05f, 0.9f, 0, 1e-4f, true)}) {
    SCOPED_TRACE(::testing::Message()
                 << "momentum " << hyper.momentum << " dampening " << hyper.dampening << " wd "
                 << hyper.weight_decay << " nesterov " << hyper.nesterov);
    Both param = Upload(RandomValues(n, 34)), buf = Garbage(n);
    for (int step = 0; step < 3; ++step) {
      Both grad = Upload(RandomValues(n, 35 + step));
      const MomentumBuffer mode = step == 0 ? MomentumBuffer::kSeed : MomentumBuffer::kAccumulate;
      ASSERT_OK(RunBoth([&](Backend& be, Side s) {
        return be.SgdUpdate(n, hyper, mode, param.f(s), grad.f(s),
                            hyper.momentum != 0 ? buf.f(s) : nullptr);
      }));
    }
    ExpectCloseEach(param, "param");
    if (hyper.momentum != 0) ExpectCloseEach(buf, "momentum buffer");
  }
}

TEST_P(OpParity, AdamAndAdamWUpdatesMatchIncludingLateSteps) {
  const int64_t n = 4099;
  for (WeightDecayMode decay : {WeightDecayMode::kL2, WeightDecayMode::kDecoupled}) {
    for (float wd : {0.0f, 0.01f}) {
      SCOPED_TRACE(::testing::Message()
                   << (decay == WeightDecayMode::kL2 ? "adam" : "adamw") << " wd " << wd);
      Both param = Upload(RandomValues(n, 40)), m = Upload(std::vector<float>(n, 0.0f));
      Both v = Upload(std::vector<float>(n, 0.0f));
      for (int64_t step : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{1000}}) {
        AdamHyper hyper;
        hyper.lr = 1e-3f;
        hyper.weight_decay = wd;
        hyper.decay = decay;
        hyper.step = step;
        Both grad = Upload(RandomValues(n, 41 + static_cast<uint32_t>(step)));
        ASSERT_OK(RunBoth([&](Backend& be, Side s) {
          return be.AdamUpdate(n, hyper, param.f(s), grad.f(s), m.f(s), v.f(s));
        }));
      }
      ExpectCloseEach(param, "param");
      ExpectCloseEach(m, "exp_avg");
      ExpectCloseEach(v, "exp_avg_sq");
    }
  }
}

// Every launch branch: one partial block, exactly a block, a ragged tail, and more values than
// the grid's threads (the grid-stride loop goes round); each call adds to the previous total.
TEST_P(OpParity, SumOfSquaresAccumulatesAsTheCpuDoes) {
  Both out = Upload({0.75f});
  for (int64_t n :
       {int64_t{1}, int64_t{255}, int64_t{256}, int64_t{4099}, int64_t{300000}, int64_t{1} << 21}) {
    SCOPED_TRACE(::testing::Message() << n << " values");
    Both x = Upload(RandomValues(n, 50 + static_cast<uint32_t>(n % 1000), -3, 3));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.SumOfSquares(n, x.f(s), out.f(s)); }));
    ExpectClose(out, "sum of squares", 1e-6);
  }
  // Repeatable: the same values give the same bits.
  Both x = Upload(RandomValues(300000, 60));
  float again[2];
  for (float& a : again) {
    Both zero = Upload({0.0f});
    ASSERT_OK(
        RunBoth([&](Backend& be, Side s) { return be.SumOfSquares(300000, x.f(s), zero.f(s)); }));
    a = Get(kTested, zero.t[kTested])[0];
  }
  EXPECT_EQ(again[0], again[1]);
}

// --- data ----------------------------------------------------------------------------------------

TEST_P(OpParity, GatherNormalizeMatchesForVectorAndScalarSampleSizes) {
  struct Case {
    int count;
    int64_t sample_elems;
    bool labels;
  };
  for (Case c : {Case{64, 784, true}, Case{5, 49, false}, Case{3, 3, true}, Case{1000, 784, true},
                 Case{64, 3 * 32 * 32, true}, Case{7, 3 * 5 * 5, false}}) {
    SCOPED_TRACE(::testing::Message() << c.count << " x " << c.sample_elems);
    const int dataset = 97;
    std::mt19937 gen(42);
    std::vector<uint8_t> pixels(dataset * c.sample_elems);
    for (auto& p : pixels) p = static_cast<uint8_t>(gen() & 0xff);
    std::vector<int32_t> index = RandomLabels(c.count, dataset, 43);  // repeats included
    Both px = UploadU8(pixels), idx = UploadI32(index);
    Both labels = UploadI32(RandomLabels(dataset, 10, 44));
    Both out = Garbage(c.count * c.sample_elems),
         labels_out = UploadI32(std::vector<int32_t>(c.count, -1));
    PixelNorm norm;
    norm.mean = 0.1307f;
    norm.std = 0.3081f;
    if (c.sample_elems % 75 == 0 || c.sample_elems == 3 * 32 * 32) {
      norm.channel_mean = {0.4914f, 0.4822f, 0.4465f};  // CIFAR-10's
      norm.channel_std = {0.2470f, 0.2435f, 0.2616f};
    }
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.GatherNormalize(c.count, c.sample_elems, idx.i(s), px.u(s), labels.i(s), norm,
                                out.f(s), c.labels ? labels_out.i(s) : nullptr);
    }));
    ExpectCloseEach(out, "pixels");
    ExpectSameI32(labels_out, "labels");
  }
}

// Training augmentation's gather: random crop offsets in [0, 2P] (and some beyond, which must
// read only padding) with random flips, on CIFAR-, MNIST- and odd-shaped images, with scalar and
// per-channel normalisation; the padding and every moved pixel as the CPU has them.
TEST_P(OpParity, GatherAugmentNormalizeMatchesForEveryCropAndFlip) {
  struct Case {
    AugmentGeometry g;
    int count;
    bool per_channel;
  };
  for (const Case& c : {Case{{3, 32, 32, 4}, 128, true}, Case{{1, 28, 28, 2}, 64, false},
                        Case{{2, 5, 3, 1}, 300, false}, Case{{3, 7, 9, 0}, 5, true}}) {
    const AugmentGeometry& g = c.g;
    SCOPED_TRACE(::testing::Message() << c.count << " x " << g.channels << "x" << g.height << "x"
                                      << g.width << " padding " << g.padding);
    const int64_t elems = g.sample_elems();
    const int dataset = 97;
    std::mt19937 gen(45);
    std::vector<uint8_t> pixels(dataset * elems);
    for (auto& p : pixels) p = static_cast<uint8_t>(gen() & 0xff);
    std::vector<int32_t> decisions;
    for (int i = 0; i < c.count; ++i) {
      const int span = 2 * g.padding + 1 + (i % 7 == 0 ? 4 : 0);  // a few past the padding
      decisions.push_back(static_cast<int32_t>(gen() % span));
      decisions.push_back(static_cast<int32_t>(gen() % span));
      decisions.push_back(static_cast<int32_t>(gen() & 1));
    }
    Both px = UploadU8(pixels), idx = UploadI32(RandomLabels(c.count, dataset, 46));
    Both labels = UploadI32(RandomLabels(dataset, 10, 47)), dec = UploadI32(decisions);
    Both out = Garbage(c.count * elems), labels_out = UploadI32(std::vector<int32_t>(c.count, -1));
    PixelNorm norm(1.0f / 255, 0.1307f, 0.3081f);
    if (c.per_channel) {
      norm.channel_mean = {0.4914f, 0.4822f, 0.4465f};  // CIFAR-10's
      norm.channel_std = {0.2470f, 0.2435f, 0.2616f};
    }
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.GatherAugmentNormalize(c.count, g, idx.i(s), px.u(s), labels.i(s),
                                       reinterpret_cast<const CropFlip*>(dec.i(s)), norm, out.f(s),
                                       labels_out.i(s));
    }));
    ExpectCloseEach(out, "pixels");
    ExpectSameI32(labels_out, "labels");
  }
}

TEST_P(OpParity, NormalizeMatchesInPlaceAndIntoAnotherBuffer) {
  // Serving's FP32 inputs: pixels / 255 normalised with a 255 times larger scale.
  PixelNorm norm;
  norm.scale = 1.0f;
  norm.mean = 0.1307f;
  norm.std = 0.3081f;
  struct Case {
    int count;
    int64_t sample_elems;
    int channels;
  };
  for (Case c : {Case{1, 1, 1}, Case{1, 783, 1}, Case{64, 784, 1}, Case{9, 3 * 32 * 32, 3},
                 Case{5, 3 * 7, 3}}) {
    const int64_t n = c.count * c.sample_elems;
    SCOPED_TRACE(::testing::Message() << n << " values, " << c.channels << " channels");
    PixelNorm cn = norm;
    if (c.channels == 3) {
      cn.channel_mean = {0.4914f, 0.4822f, 0.4465f};
      cn.channel_std = {0.2470f, 0.2435f, 0.2616f};
    }
    const std::vector<float> x = RandomValues(n, 46, 0.0f, 1.0f);
    Both in = Upload(x), out = Garbage(n), in_place = Upload(x);
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.Normalize(c.count, c.sample_elems, in.f(s), cn, out.f(s));
    }));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) {
      return be.Normalize(c.count, c.sample_elems, in_place.f(s), cn, in_place.f(s));
    }));
    ExpectCloseEach(out, "normalized");
    ExpectCloseEach(in_place, "normalized in place");
  }
}

// Table features (CSV, NumPy) gathered by index and normalised, with and without labels; odd
// feature counts and repeated indices included.
TEST_P(OpParity, GatherNormalizeF32MatchesForFeatureRows) {
  for (int64_t features : {int64_t{1}, int64_t{13}, int64_t{784}}) {
    for (bool with_labels : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << features << " features" << (with_labels ? "" : ", no labels"));
      const int rows = 61, count = 40;
      Both table = Upload(RandomValues(rows * features, 47, -50.0f, 50.0f));
      Both idx = UploadI32(RandomLabels(count, rows, 48));
      Both labels = UploadI32(RandomLabels(rows, 7, 49));
      Both out = Garbage(count * features), labels_out = UploadI32(std::vector<int32_t>(count, -1));
      PixelNorm norm;
      norm.scale = 1.0f;
      norm.mean = 3.5f;
      norm.std = 12.25f;
      ASSERT_OK(RunBoth([&](Backend& be, Side s) {
        return be.GatherNormalizeF32(count, features, idx.i(s), table.f(s), labels.i(s), norm,
                                     out.f(s), with_labels ? labels_out.i(s) : nullptr);
      }));
      ExpectCloseEach(out, "features");
      ExpectSameI32(labels_out, "labels");
    }
  }
}

// Scale multiplies in place, element by element (a data-parallel rank's share of the mean).
TEST_P(OpParity, ScaleMultipliesEveryElementInPlace) {
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{300000}}) {
    SCOPED_TRACE(::testing::Message() << n << " values");
    Both x = Upload(RandomValues(n, 50, -9, 9));
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.Scale(n, 0.25f, x.f(s)); }));
    ExpectSameBits(x, "x * 0.25");  // a power of two: exact on both
    ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.Scale(n, 1.0f / 3, x.f(s)); }));
    ExpectSameBits(x, "x / 3");  // one rounded multiply per element on both
  }
}

// --- whole models --------------------------------------------------------------------------------

struct Reference {
  const char* name;
  ModelConfig model;
  OptimizerConfig optimizer;
  int batch;
  PixelNorm norm;
};

std::vector<Reference> ReferenceModels() {
  Reference mlp{"mlp", MnistMlpConfig(), {}, 64, {}};
  mlp.optimizer.kind = OptimizerConfig::Kind::kSgd;
  mlp.optimizer.lr = 0.01f;
  mlp.optimizer.momentum = 0.9f;
  mlp.norm = {1.0f / 255.0f, 0.5f, 0.5f};
  Reference cnn{"cnn", MnistCnnConfig(), {}, 32, {}};
  cnn.optimizer.kind = OptimizerConfig::Kind::kAdam;
  cnn.optimizer.lr = 1e-3f;
  return {mlp, cnn};
}

// Random 28x28 images and labels: no structure to learn, which makes the two runs diverge the
// most they can.
Dataset RandomImages(int64_t n, uint32_t seed) {
  Dataset d;
  d.sample_shape = {28, 28};
  d.size = n;
  d.num_classes = 10;
  d.pixels.resize(n * 784);
  std::mt19937 gen(seed);
  for (auto& p : d.pixels) p = static_cast<uint8_t>(gen() & 0xff);
  d.labels = RandomLabels(static_cast<int>(n), 10, seed + 1);
  return d;
}

// Every layer type issue 19 added, on MNIST-sized inputs: per-axis and bias-less convolutions,
// padded max and average pooling, global average pooling, the five activations.
Reference NewLayersModel() {
  Conv2dConfig wide{1, 16, 3, 1, 1, false};
  wide.kernel_w = 5;
  wide.padding_w = 2;
  Conv2dConfig strided{16, 32, 3, 1, 1};
  strided.stride_h = 2;
  ModelConfig m{{1, 28, 28},
                {wide, GeluConfig{}, MaxPool2dConfig{3, 2, 1}, strided, LeakyReluConfig{0.1f},
                 AvgPool2dConfig{3, 1, 1}, SiluConfig{}, AdaptiveAvgPool2dConfig{}, FlattenConfig{},
                 LinearConfig{32, 32}, TanhConfig{}, LinearConfig{32, 10}, SigmoidConfig{}}};
  Reference ref{"new-layers", m, {}, 16, {}};
  ref.optimizer.kind = OptimizerConfig::Kind::kSgd;
  ref.optimizer.lr = 0.05f;
  return ref;
}

TEST_P(OpParity, OneTrainingStepOfEachReferenceModelMatches) {
  std::vector<Reference> models = ReferenceModels();
  models.push_back(NewLayersModel());
  for (const Reference& ref : models) {
    SCOPED_TRACE(ref.name);
    const int batch = ref.batch;
    Shape input = ref.model.input_shape;
    input.insert(input.begin(), batch);
    const std::vector<float> xv = RandomValues(NumElements(input), 50);
    const std::vector<int32_t> yv = RandomLabels(batch, 10, 51);
    std::unique_ptr<Model> model[2];
    std::unique_ptr<Optimizer> opt[2];
    Tensor logits[2], grads_out[2];
    std::vector<float> loss_host(2);
    for (Side s : {kCpu, kTested}) {
      Backend& be = backend(s);
      auto m = Model::Build(ref.model, &be, 7);
      ASSERT_OK(m) << m.status();
      model[s] = std::move(*m);
      auto o = Optimizer::Create(ref.optimizer, &be, model[s]->parameters());
      ASSERT_OK(o) << o.status();
      opt[s] = std::move(*o);
      Tensor x = testing::MakeTensor(be, input, xv);
      auto labels = be.Allocate(DType::kI32, {batch});
      ASSERT_OK(labels);
      ASSERT_OK(be.CopyFromHost(yv.data(), yv.size() * 4, &*labels));
      auto loss = be.Allocate(DType::kF32, {1});
      auto correct = be.Allocate(DType::kI32, {1});
      auto dout = be.Allocate(DType::kF32, {batch, 10});
      ASSERT_TRUE(loss.ok() && correct.ok() && dout.ok());
      ASSERT_OK(model[s]->ZeroGrad());
      auto out = model[s]->Forward(x, Mode::kTrain);
      ASSERT_OK(out) << out.status();
      logits[s] = **out;
      Loss loss_fn(LossKind::kCrossEntropy, &be);
      ASSERT_OK(loss_fn.Compute(**out, *labels, loss->f32(), correct->i32(), &*dout));
      ASSERT_OK(model[s]->Backward(*dout));
      loss_host[s] = Get(s, *loss)[0];
    }
    EXPECT_LT(RelativeError({loss_host[kTested]}, {loss_host[kCpu]}), 1e-5) << "loss";
    EXPECT_LT(RelativeError(Get(kTested, logits[kTested]), Get(kCpu, logits[kCpu])), 1e-5)
        << "logits";
    auto cpu_params = model[kCpu]->parameters(), tested_params = model[kTested]->parameters();
    ASSERT_EQ(cpu_params.size(), tested_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_TRUE(SameBits(Get(kTested, tested_params[i].param->value),
                           Get(kCpu, cpu_params[i].param->value)))
          << "initial " << cpu_params[i].name;
      const double err = RelativeError(Get(kTested, tested_params[i].param->grad),
                                       Get(kCpu, cpu_params[i].param->grad));
      EXPECT_LT(err, 1e-4) << "gradient of " << cpu_params[i].name;
    }
    for (Side s : {kCpu, kTested}) ASSERT_OK(opt[s]->Step(ref.optimizer.lr));
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      const double err = RelativeError(Get(kTested, tested_params[i].param->value),
                                       Get(kCpu, cpu_params[i].param->value));
      // Adam's first step moves by about lr * sign(gradient): looser than one op.
      EXPECT_LT(err, 1e-4) << "updated " << cpu_params[i].name;
    }
  }
}

TrainConfig TrainConfigFor(const Reference& ref, int epochs) {
  TrainConfig c;
  c.model = ref.model;
  c.optimizer = ref.optimizer;
  c.epochs = epochs;
  c.batch_size = ref.batch;
  c.seed = 5;
  c.norm = ref.norm;
  return c;
}

std::vector<std::vector<float>> Weights(Backend& be, Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const NamedParameter& p : t.model().parameters()) {
    out.push_back(testing::ToHost(be, p.param->value));
  }
  return out;
}

// Tolerances of the 50-step runs. A correct backend differs from the CPU by rounding in every op
// (1e-6 relative for most, up to 5e-5 for long convolution reductions), and training amplifies
// that. How much was measured on the CPU alone (CpuAmplification below: the same 50 steps from
// initial weights perturbed by 1e-6, 1e-5 and 1e-4 relative):
//   mlp (SGD, momentum):  loss 1e-7 / 1e-7 / 5e-6,  weights 6e-7 / 3e-5 / 5e-4
//   cnn (Adam):           loss 1e-7 / 4e-4 / 2e-3,  weights 2e-4 / 0.11 / 0.26, norms 2e-6 / 0.015
//   / 0.022
// Adam's early steps move each weight by about lr * sign(gradient), and random labels leave many
// gradients near zero, so rounding turns individual CNN weights around: they are compared by
// their tensors' norms, not one by one. Each tolerance is at least twice the drift of the 1e-4
// perturbation, ten times the op tolerance.
struct FiftyStepTolerance {
  double loss;     // per-step loss, relative
  double weights;  // per parameter tensor, relative L2 (0: not compared one by one)
  double norms;    // per parameter tensor, relative difference of the L2 norms
};

FiftyStepTolerance FiftyStepToleranceFor(const std::string& model) {
  if (model == "mlp") return {1e-3, 2e-3, 1e-3};
  return {1e-2, 0, 0.05};  // cnn
}

struct FiftySteps {
  std::vector<float> losses;
  std::vector<std::vector<float>> weights;
};

// 50 steps of `ref` on `data`; every initial weight w becomes w * (1 + e), e uniform in
// [-perturb, perturb], when perturb > 0.
FiftySteps TrainFiftySteps(Backend& be, const Reference& ref, const Dataset& data,
                           float perturb = 0) {
  FiftySteps out;
  auto t = Trainer::Create(TrainConfigFor(ref, 1), &be, &data, nullptr);
  EXPECT_OK(t);
  if (!t.ok()) return out;
  if (perturb > 0) {
    std::mt19937 gen(99);
    std::uniform_real_distribution<float> e(-perturb, perturb);
    for (const NamedParameter& p : (*t)->model().parameters()) {
      std::vector<float> w = testing::ToHost(be, p.param->value);
      for (float& v : w) v *= 1.0f + e(gen);
      EXPECT_OK(be.CopyFromHost(w.data(), w.size() * sizeof(float), &p.param->value));
    }
  }
  Trainer::Callbacks cb;
  cb.on_step = [&](const StepEvent& e) { out.losses.push_back(e.loss); };
  EXPECT_OK((*t)->Run(cb));
  out.weights = Weights(be, **t);
  return out;
}

// The worst relative differences between two runs: per-step loss, per-parameter weights, and
// per-parameter L2 norm of the weights.
struct Drift {
  double loss = 0, weights = 0, norms = 0;
};

double Norm(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

Drift Divergence(const FiftySteps& got, const FiftySteps& want) {
  Drift d;
  for (size_t i = 0; i < std::min(got.losses.size(), want.losses.size()); ++i) {
    d.loss = std::max(d.loss, RelativeError({got.losses[i]}, {want.losses[i]}));
  }
  for (size_t i = 0; i < std::min(got.weights.size(), want.weights.size()); ++i) {
    d.weights = std::max(d.weights, RelativeError(got.weights[i], want.weights[i]));
    const double a = Norm(got.weights[i]), b = Norm(want.weights[i]);
    d.norms = std::max(d.norms, std::abs(a - b) / std::max(b, 1e-30));
  }
  return d;
}

// Runs without a GPU: how far 50 steps carry small differences in the weights, which a correct
// backend's rounding (CUDA's, say) also makes. The drift from a 1e-4 difference must stay within
// half the tolerances of the backends under test.
TEST(CpuAmplification, FiftyStepsFromSlightlyDifferentWeightsStayWithinHalfTheTolerances) {
  CpuBackend cpu(2);
  for (const Reference& ref : ReferenceModels()) {
    SCOPED_TRACE(ref.name);
    const Dataset data = RandomImages(50 * ref.batch, 60);
    const FiftySteps a = TrainFiftySteps(cpu, ref, data);
    ASSERT_EQ(a.losses.size(), 50u);
    const FiftyStepTolerance tol = FiftyStepToleranceFor(ref.name);
    for (float perturb : {1e-6f, 1e-5f, 1e-4f}) {
      const FiftySteps b = TrainFiftySteps(cpu, ref, data, perturb);
      ASSERT_EQ(b.losses.size(), 50u);
      const Drift d = Divergence(b, a);
      std::printf("# %s: 50 steps from weights %g apart: loss %.3g, weights %.3g, norms %.3g\n",
                  ref.name, perturb, d.loss, d.weights, d.norms);
      if (perturb < 1e-4f) continue;
      EXPECT_LT(d.loss, tol.loss / 2);
      if (tol.weights > 0) {
        EXPECT_LT(d.weights, tol.weights / 2);
      }
      EXPECT_LT(d.norms, tol.norms / 2);
    }
  }
}

TEST_P(OpParity, FiftyStepsOfEachReferenceModelTrackTheCpu) {
  for (const Reference& ref : ReferenceModels()) {
    SCOPED_TRACE(ref.name);
    const Dataset data = RandomImages(50 * ref.batch, 60);
    const FiftySteps cpu = TrainFiftySteps(*cpu_, ref, data);
    const FiftySteps tested = TrainFiftySteps(*tested_, ref, data);
    ASSERT_EQ(cpu.losses.size(), 50u);
    ASSERT_EQ(tested.losses.size(), 50u);
    const Drift d = Divergence(tested, cpu);
    std::printf(
        "# %s: 50 steps, worst per-step loss difference %.3g, weights %.3g, norms %.3g, last loss "
        "cpu %.6f %s %.6f\n",
        ref.name, d.loss, d.weights, d.norms, cpu.losses.back(), GetParam().c_str(),
        tested.losses.back());
    const FiftyStepTolerance tol = FiftyStepToleranceFor(ref.name);
    EXPECT_LT(d.loss, tol.loss) << "per-step loss";
    for (size_t i = 0; i < cpu.weights.size(); ++i) {
      const double err = RelativeError(tested.weights[i], cpu.weights[i]);
      if (tol.weights > 0) {
        EXPECT_LT(err, tol.weights) << "parameter " << i << " after 50 steps";
      }
      const double a = Norm(tested.weights[i]), b = Norm(cpu.weights[i]);
      EXPECT_LT(std::abs(a - b) / b, tol.norms) << "norm of parameter " << i << " after 50 steps";
    }
  }
}

TEST_P(OpParity, TrainingRepeatsBitForBitOnAnotherBackend) {
  // Every reduction (loss, bias and convolution gradients) runs in a fixed order, and cuDNN's
  // algorithms (on CUDA) come from its heuristics (shape and device only), so a second backend
  // of the same device (another job, process or resumed checkpoint) trains the same bits from
  // the same seed. Two fresh backends, so each has chosen algorithms for these models alone.
  auto first = CreateFloat32Backend(GetParam());
  auto second = CreateFloat32Backend(GetParam());
  ASSERT_OK(first);
  ASSERT_OK(second);
  Backend* runs[2] = {first->get(), second->get()};
  for (const Reference& ref : ReferenceModels()) {
    SCOPED_TRACE(ref.name);
    const Dataset data = RandomImages(20 * ref.batch, 80);
    std::vector<std::vector<float>> weights[2];
    std::vector<float> losses[2];
    for (int run = 0; run < 2; ++run) {
      auto t = Trainer::Create(TrainConfigFor(ref, 1), runs[run], &data, nullptr);
      ASSERT_OK(t);
      Trainer::Callbacks cb;
      cb.on_step = [&](const StepEvent& e) { losses[run].push_back(e.loss); };
      ASSERT_OK((*t)->Run(cb));
      weights[run] = Weights(*runs[run], **t);
    }
    EXPECT_EQ(ConvolutionAlgorithms(*runs[0]), ConvolutionAlgorithms(*runs[1]));
    EXPECT_TRUE(SameBits(losses[0], losses[1]));
    for (size_t i = 0; i < weights[0].size(); ++i) {
      EXPECT_TRUE(SameBits(weights[0][i], weights[1][i])) << "parameter " << i;
    }
  }
}

TEST_P(OpParity, CheckpointsMoveBetweenTheBackendAndTheCpuBothWays) {
  const Reference ref = ReferenceModels()[1];  // the CNN: conv, pool and Adam state
  const Dataset data = RandomImages(10 * ref.batch, 70);
  TempDir dir;
  for (Side from : {kTested, kCpu}) {
    const Side to = from == kTested ? kCpu : kTested;
    SCOPED_TRACE(backend(from).name() + " -> " + backend(to).name());
    const std::string path =
        dir.file(from == kTested ? "from_tested.safetensors" : "from_cpu.safetensors");
    auto writer = Trainer::Create(TrainConfigFor(ref, 1), &backend(from), &data, nullptr);
    ASSERT_OK(writer) << writer.status();
    ASSERT_OK((*writer)->Run({}));
    ASSERT_OK((*writer)->SaveCheckpoint(path));
    // The checkpoint resumes on either backend: the weights arrive bit for bit, and one more
    // epoch from there agrees across the two.
    std::unique_ptr<Trainer> resumed[2];
    for (Side s : {kCpu, kTested}) {
      auto t = Trainer::Create(TrainConfigFor(ref, 2), &backend(s), &data, nullptr);
      ASSERT_OK(t) << t.status();
      ASSERT_OK((*t)->LoadCheckpoint(path));
      EXPECT_EQ((*t)->position().epochs_done, 1);
      resumed[s] = std::move(*t);
    }
    const auto saved = Weights(backend(from), **writer);
    const auto loaded = Weights(backend(to), *resumed[to]);
    ASSERT_EQ(saved.size(), loaded.size());
    for (size_t i = 0; i < saved.size(); ++i) EXPECT_TRUE(SameBits(saved[i], loaded[i])) << i;
    for (Side s : {kCpu, kTested}) ASSERT_OK(resumed[s]->Run({}));
    const auto cpu_w = Weights(*cpu_, *resumed[kCpu]);
    const auto tested_w = Weights(*tested_, *resumed[kTested]);
    // Ten Adam steps on random labels from there: compared as the 50-step runs are (by norms).
    const FiftyStepTolerance tol = FiftyStepToleranceFor(ref.name);
    for (size_t i = 0; i < cpu_w.size(); ++i) {
      const double a = Norm(tested_w[i]), b = Norm(cpu_w[i]);
      EXPECT_LT(std::abs(a - b) / b, tol.norms) << "norm of parameter " << i << " after resume";
    }
  }
}

// --- batch normalisation ---------------------------------------------------------------------

// conv - batchnorm2d - relu - pool - linear - batchnorm1d - relu - linear: a ResNet's pieces.
ModelConfig BatchNormCnn() {
  ModelConfig m;
  m.input_shape = {1, 28, 28};
  BatchNorm2dConfig bn2d;
  bn2d.num_features = 8;
  BatchNorm1dConfig bn1d;
  bn1d.num_features = 32;
  m.layers = {
      Conv2dConfig{1, 8, 3, 1, 1, false}, bn2d, ReluConfig{}, MaxPool2dConfig{2},  FlattenConfig{},
      LinearConfig{8 * 14 * 14, 32},      bn1d, ReluConfig{}, LinearConfig{32, 10}};
  return m;
}

// Batch norm as the first layer: its backward wants no input gradient (a path of its own on
// CUDA, where cuDNN writes one to scratch).
ModelConfig BatchNormFirstCnn() {
  ModelConfig m = BatchNormCnn();
  BatchNorm2dConfig first;
  first.num_features = 1;
  m.layers.insert(m.layers.begin(), first);
  return m;
}

// One training step and one evaluation: logits, parameter gradients and running statistics
// (cuDNN's batch norm against the CPU's loops), with batch norm inside and first.
TEST_P(OpParity, BatchNormModelStepAndEvaluationMatch) {
  for (const ModelConfig& config : {BatchNormCnn(), BatchNormFirstCnn()}) {
    SCOPED_TRACE(::testing::Message() << config.layers.size() << " layers");
    ExpectBatchNormModelStepAndEvaluationMatch(config);
  }
}

void OpParity::ExpectBatchNormModelStepAndEvaluationMatch(const ModelConfig& config) {
  const int batch = 16;
  const std::vector<float> xv = RandomValues(batch * 784, 90, 0, 1);
  const std::vector<int32_t> yv = RandomLabels(batch, 10, 91);
  std::unique_ptr<Model> model[2];
  std::vector<float> train_logits[2], eval_logits[2];
  for (Side s : {kCpu, kTested}) {
    Backend& be = backend(s);
    auto m = Model::Build(config, &be, 7);
    ASSERT_OK(m) << m.status();
    model[s] = std::move(*m);
    Tensor x = testing::MakeTensor(be, {batch, 1, 28, 28}, xv);
    auto labels = be.Allocate(DType::kI32, {batch});
    auto loss = be.Allocate(DType::kF32, {1});
    auto correct = be.Allocate(DType::kI32, {1});
    auto dout = be.Allocate(DType::kF32, {batch, 10});
    ASSERT_TRUE(labels.ok() && loss.ok() && correct.ok() && dout.ok());
    ASSERT_OK(be.CopyFromHost(yv.data(), yv.size() * 4, &*labels));
    ASSERT_OK(model[s]->ZeroGrad());
    auto out = model[s]->Forward(x, Mode::kTrain);
    ASSERT_OK(out) << out.status();
    train_logits[s] = Get(s, **out);
    Loss loss_fn(LossKind::kCrossEntropy, &be);
    ASSERT_OK(loss_fn.Compute(**out, *labels, loss->f32(), correct->i32(), &*dout));
    ASSERT_OK(model[s]->Backward(*dout));
    auto eval = model[s]->Forward(x, Mode::kEval);
    ASSERT_OK(eval) << eval.status();
    eval_logits[s] = Get(s, **eval);
  }
  EXPECT_LT(RelativeError(train_logits[kTested], train_logits[kCpu]), 1e-5) << "train logits";
  EXPECT_LT(RelativeError(eval_logits[kTested], eval_logits[kCpu]), 1e-5) << "eval logits";
  auto cpu_params = model[kCpu]->parameters(), tested_params = model[kTested]->parameters();
  ASSERT_EQ(cpu_params.size(), tested_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    EXPECT_LT(RelativeError(Get(kTested, tested_params[i].param->grad),
                            Get(kCpu, cpu_params[i].param->grad)),
              1e-4)
        << "gradient of " << cpu_params[i].name;
  }
  auto cpu_buffers = model[kCpu]->buffers(), tested_buffers = model[kTested]->buffers();
  ASSERT_EQ(cpu_buffers.size(), tested_buffers.size());
  for (size_t i = 0; i < cpu_buffers.size(); ++i) {
    if (cpu_buffers[i].buffer->kind == BufferKind::kI64Count) {
      EXPECT_EQ(tested_buffers[i].buffer->count, cpu_buffers[i].buffer->count);
      continue;
    }
    EXPECT_LT(RelativeError(Get(kTested, tested_buffers[i].buffer->value),
                            Get(kCpu, cpu_buffers[i].buffer->value)),
              1e-5)
        << cpu_buffers[i].name;
  }
}

// cuDNN's batch-norm passes are deterministic: a second backend trains the same bits, running
// statistics included (what a resumed job relies on); with training augmentation too (crop and
// flip gathered on the device from decisions drawn on the host).
TEST_P(OpParity, BatchNormTrainingRepeatsBitForBit) {
  auto first = CreateFloat32Backend(GetParam());
  auto second = CreateFloat32Backend(GetParam());
  ASSERT_OK(first);
  ASSERT_OK(second);
  Backend* runs[2] = {first->get(), second->get()};
  const Dataset data = RandomImages(10 * 32, 92);
  for (bool augment : {false, true}) {
    SCOPED_TRACE(augment ? "augmented" : "not augmented");
    std::vector<std::vector<float>> state[2];
    for (int run = 0; run < 2; ++run) {
      TrainConfig c;
      c.model = BatchNormCnn();
      c.optimizer.kind = OptimizerConfig::Kind::kSgd;
      c.optimizer.lr = 0.01f;
      c.optimizer.momentum = 0.9f;
      c.batch_size = 32;
      c.seed = 5;
      if (augment) c.augment = {4, true};
      auto t = Trainer::Create(c, runs[run], &data, nullptr);
      ASSERT_OK(t) << t.status();
      ASSERT_OK((*t)->Run({}));
      state[run] = Weights(*runs[run], **t);
      for (const NamedBuffer& b : (*t)->model().buffers()) {
        if (b.buffer->kind == BufferKind::kF32) {
          state[run].push_back(testing::ToHost(*runs[run], b.buffer->value));
        }
      }
    }
    ASSERT_EQ(state[0].size(), state[1].size());
    for (size_t i = 0; i < state[0].size(); ++i) {
      EXPECT_TRUE(SameBits(state[0][i], state[1][i])) << "tensor " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BackendParity, OpParity, ::testing::ValuesIn(BackendsUnderTest()),
                         testing::DeviceParamName);

// --- CUDA only -----------------------------------------------------------------------------------

#if KILN_WITH_CUDA

// Runs without a device: the allocator's size classes.
TEST(CudaCachingAllocator, BlockSizesAreBucketedAndStable) {
  EXPECT_EQ(CudaCachingAllocator::BlockSize(0), 512u);
  EXPECT_EQ(CudaCachingAllocator::BlockSize(1), 512u);
  EXPECT_EQ(CudaCachingAllocator::BlockSize(513), 1024u);
  EXPECT_EQ(CudaCachingAllocator::BlockSize(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(CudaCachingAllocator::BlockSize((size_t{1} << 20) + 1), size_t{5} << 18);
  EXPECT_EQ(CudaCachingAllocator::BlockSize((size_t{7} << 20) + 1), size_t{8} << 20);
  for (size_t bytes = 1; bytes < (size_t{1} << 34); bytes = bytes * 3 + 7) {
    const size_t block = CudaCachingAllocator::BlockSize(bytes);
    EXPECT_GE(block, bytes);
    EXPECT_LE(block, std::max<size_t>(512, bytes + bytes / 4 + 512)) << bytes;
    EXPECT_EQ(CudaCachingAllocator::BlockSize(block), block) << bytes;  // a block is its own class
  }
}

// What only the CUDA backend has: its allocator's counters, TF32, running out of device memory,
// errors reported asynchronously (by the next sync), the cache the backends of one device share.
// Compared with the CPU where there is something to compare.
class CudaBackendTest : public ParityTest {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (CudaDeviceCount(&why) == 0) {
      skip_reason_ = new std::string("no CUDA device found: " + why);
      return;
    }
    reference_ = new CpuBackend(4);
    auto cuda = CudaBackend::Create(0);
    if (!cuda.ok()) {
      create_error_ = new std::string(cuda.status().ToString());
      return;
    }
    cuda_ = cuda->release();
  }
  static void TearDownTestSuite() {
    delete cuda_;
    delete reference_;
    delete skip_reason_;
    delete create_error_;
    cuda_ = nullptr;
    reference_ = nullptr;
    skip_reason_ = create_error_ = nullptr;
  }
  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
    ASSERT_NE(cuda_, nullptr) << "CudaBackend::Create(0) failed: "
                              << (create_error_ ? *create_error_ : "");
    cpu_ = reference_;
    tested_ = cuda_;
  }

  static CpuBackend* reference_;
  static CudaBackend* cuda_;
  static std::string* skip_reason_;
  static std::string* create_error_;
};

CpuBackend* CudaBackendTest::reference_ = nullptr;
CudaBackend* CudaBackendTest::cuda_ = nullptr;
std::string* CudaBackendTest::skip_reason_ = nullptr;
std::string* CudaBackendTest::create_error_ = nullptr;

TEST_F(CudaBackendTest, RegistryMakesCudaBackendsAndAutoPrefersTheGpu) {
  EXPECT_EQ(cuda_->name(), "cuda:0");
  EXPECT_EQ(cuda_->kind(), DeviceKind::kCuda);
  auto explicit_backend = CreateBackend("cuda:0");
  ASSERT_OK(explicit_backend) << explicit_backend.status();
  EXPECT_EQ((*explicit_backend)->name(), "cuda:0");
  auto auto_backend = CreateBackend("auto");
  ASSERT_OK(auto_backend) << auto_backend.status();
  EXPECT_EQ((*auto_backend)->name(), "cuda:0");
  const std::string missing = "cuda:" + std::to_string(CudaDeviceCount());
  EXPECT_EQ(CreateBackend(missing).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CudaBackend::Create(-1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CudaBackendTest, FreedBlocksAreReusedWithoutNewDeviceAllocations) {
  { auto warm = cuda_->Allocate(DType::kF32, {12345}); }
  const int64_t before = cuda_->device_allocations();
  void* first = nullptr;
  for (int i = 0; i < 100; ++i) {
    auto t = cuda_->Allocate(DType::kF32, {12345});
    ASSERT_OK(t);
    if (i == 0) first = t->raw();
    EXPECT_EQ(t->raw(), first);
  }
  EXPECT_EQ(cuda_->device_allocations(), before);
  EXPECT_GT(cuda_->bytes_cached(), 0u);
}

TEST_F(CudaBackendTest, OutOfDeviceMemoryIsResourceExhaustedAndTheBackendCarriesOn) {
  auto huge = cuda_->Allocate(DType::kF32, {int64_t{1} << 42});  // 16 TiB
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("out of device memory"), std::string::npos);
  Both x = Upload(RandomValues(100, 1)), y = Garbage(100);
  ASSERT_OK(RunBoth([&](Backend& be, Side s) { return be.ReluForward(100, x.f(s), y.f(s)); }));
  ExpectSameBits(y, "relu after a failed allocation");
}

// A job's precision reaches cuBLAS and cuDNN through CreateBackend, and the backend says so.
TEST_F(CudaBackendTest, CreateBackendAllowsTf32OnlyForPrecisionTf32AndSaysSo) {
  BackendOptions options;
  options.precision = Precision::kTf32;
  auto tf32 = CreateBackend("cuda:0", options);
  ASSERT_OK(tf32) << tf32.status();
  EXPECT_NE(Description(**tf32).find("TF32 allowed"), std::string::npos) << Description(**tf32);
  auto fp32 = CreateBackend("cuda:0");
  ASSERT_OK(fp32) << fp32.status();
  EXPECT_NE(Description(**fp32).find("TF32 off"), std::string::npos) << Description(**fp32);
}

TEST_F(CudaBackendTest, Tf32IsOnlyUsedWhenAllowedAndStaysWithinItsPrecision) {
  CudaBackendOptions options;
  options.allow_tf32 = true;
  auto tf32 = CudaBackend::Create(0, options);
  ASSERT_OK(tf32) << tf32.status();
  const int m = 256, n = 256, k = 512;
  const std::vector<float> av = RandomValues(m * k, 11), bv = RandomValues(k * n, 12);
  Both a = Upload(av), b = Upload(bv), c = Garbage(m * n);
  ASSERT_OK(RunBoth([&](Backend& be, Side s) {
    return be.Gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.f(s), b.f(s), 0.0f, c.f(s));
  }));
  ExpectClose(c, "float32 gemm");
  Backend& t = **tf32;
  Tensor ta = testing::MakeTensor(t, {m * k}, av), tb = testing::MakeTensor(t, {k * n}, bv);
  auto tc = t.Allocate(DType::kF32, {m * n});
  ASSERT_OK(tc);
  ASSERT_OK(
      t.Gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, ta.f32(), tb.f32(), 0.0f, tc->f32()));
  const double err = RelativeError(testing::ToHost(t, *tc), Get(kCpu, c.t[kCpu]));
  std::printf("# TF32 gemm relative error %.3g (float32 must stay under %g)\n", err, kOpTolerance);
  EXPECT_LT(err, 1e-2);
}

// Precision::kBf16 on CUDA (cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF) against the CPU's bf16 GEMMs,
// which round the same inputs to bfloat16 and accumulate in float32 too: the two differ by
// float32 accumulation alone, far less than either differs from the float32 product. Plain and
// batched; the description says bf16.
TEST_F(CudaBackendTest, Bf16GemmsMatchTheCpusBf16GemmsAndNotTheFloat32Ones) {
  BackendOptions options;
  options.precision = Precision::kBf16;
  auto gpu = CreateBackend("cuda:0", options);
  ASSERT_OK(gpu) << gpu.status();
  EXPECT_NE(Description(**gpu).find("bf16 GEMMs"), std::string::npos) << Description(**gpu);
  CpuBackend cpu_bf16(2, Precision::kBf16);
  const int m = 96, n = 80, k = 512, batch = 3;
  const std::vector<float> av = RandomValues(batch * m * k, 13),
                           bv = RandomValues(batch * k * n, 14);
  std::vector<float> want(batch * m * n), plain(batch * m * n);
  ASSERT_OK(cpu_bf16.GemmStridedBatched(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, av.data(),
                                        m * k, bv.data(), k * n, 0.0f, want.data(), m * n, batch));
  ASSERT_OK(cpu_->GemmStridedBatched(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, av.data(),
                                     m * k, bv.data(), k * n, 0.0f, plain.data(), m * n, batch));
  Backend& g = **gpu;
  Tensor ta = testing::MakeTensor(g, {batch * m * k}, av),
         tb = testing::MakeTensor(g, {batch * k * n}, bv);
  auto tc = g.Allocate(DType::kF32, {batch * m * n}), one = g.Allocate(DType::kF32, {m * n});
  ASSERT_TRUE(tc.ok() && one.ok());
  ASSERT_OK(g.GemmStridedBatched(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, ta.f32(), m * k,
                                 tb.f32(), k * n, 0.0f, tc->f32(), m * n, batch));
  ASSERT_OK(
      g.Gemm(Transpose::kNo, Transpose::kYes, m, n, k, 1.0f, ta.f32(), tb.f32(), 0.0f, one->f32()));
  const std::vector<float> got = testing::ToHost(g, *tc), first = testing::ToHost(g, *one);
  const double err = RelativeError(got, want), moved = RelativeError(plain, want);
  std::printf("# bf16 gemm: %.3g from the CPU's bf16, %.3g between bf16 and float32\n", err, moved);
  EXPECT_LT(err, 1e-5);
  EXPECT_GT(moved, 1e-4);
  EXPECT_LT(RelativeError(first, std::vector<float>(want.begin(), want.begin() + m * n)), 1e-5);
}

// Convolutions under Precision::kBf16: both backends read x, w and dy rounded to bfloat16 (to
// nearest even) and accumulate in float32. The CPU writes y, dw and dx in float32; cuDNN's
// legacy API has no bfloat16-in, float32-out form, so CUDA's come out of cuDNN as bfloat16 and
// are widened: the two differ by that one rounding of each output, at most 2^-9 of it (a relative
// L2 error under 2^-9 / sqrt(3) = 1.1e-3 for uniform rounding errors; 4e-3, 2^-8, allowed), far
// less than bf16 moves the float32 results (the inputs' rounding over 288 products each: above
// 1e-3 here, 1e-4 required). Forward with ReLU and both backward passes.
TEST_F(CudaBackendTest, Bf16ConvolutionsReadBfloat16OnCudaAndAgreeWithTheCpusBf16) {
  BackendOptions options;
  options.precision = Precision::kBf16;
  auto gpu_bf16 = CreateBackend("cuda:0", options);
  auto gpu_fp32 = CreateBackend("cuda:0");
  ASSERT_TRUE(gpu_bf16.ok() && gpu_fp32.ok());
  CpuBackend cpu_bf16(2, Precision::kBf16);
  Conv2dGeometry g;
  g.batch = 4;
  g.in_channels = 32;
  g.in_h = g.in_w = 13;
  g.out_channels = 64;
  g.kernel_h = g.kernel_w = 3;
  const int64_t x_n = int64_t{g.batch} * 32 * 13 * 13, w_n = int64_t{64} * 32 * 9;
  const int64_t y_n = int64_t{g.batch} * 64 * 11 * 11;
  const std::vector<float> xv = RandomValues(x_n, 21), wv = RandomValues(w_n, 22),
                           bv = RandomValues(64, 23), dyv = RandomValues(y_n, 24);
  struct Out {
    std::vector<float> y, dw, db, dx;
  };
  auto run = [&](Backend& be) {
    Tensor x = testing::MakeTensor(be, {x_n}, xv), w = testing::MakeTensor(be, {w_n}, wv);
    Tensor b = testing::MakeTensor(be, {64}, bv), dy = testing::MakeTensor(be, {y_n}, dyv);
    Tensor y = testing::MakeTensor(be, {y_n}, std::vector<float>(y_n));
    Tensor dw = testing::MakeTensor(be, {w_n}, std::vector<float>(w_n));
    Tensor db = testing::MakeTensor(be, {64}, std::vector<float>(64));
    Tensor dx = testing::MakeTensor(be, {x_n}, std::vector<float>(x_n));
    EXPECT_OK(be.Conv2dForward(g, x.f32(), w.f32(), b.f32(), Activation::kRelu, y.f32()));
    EXPECT_OK(be.Conv2dBackward(g, x.f32(), w.f32(), y.f32(), dy.f32(), Activation::kRelu, dw.f32(),
                                db.f32(), dx.f32()));
    return Out{testing::ToHost(be, y), testing::ToHost(be, dw), testing::ToHost(be, db),
               testing::ToHost(be, dx)};
  };
  const Out bf16 = run(**gpu_bf16), fp32 = run(**gpu_fp32), cpu = run(cpu_bf16);
  EXPECT_NE(Description(**gpu_bf16).find("bf16 GEMMs and convolutions"), std::string::npos)
      << Description(**gpu_bf16);
  const double y_err = RelativeError(bf16.y, cpu.y), dw_err = RelativeError(bf16.dw, cpu.dw),
               dx_err = RelativeError(bf16.dx, cpu.dx);
  const double y_moved = RelativeError(fp32.y, bf16.y), dw_moved = RelativeError(fp32.dw, bf16.dw),
               dx_moved = RelativeError(fp32.dx, bf16.dx);
  std::printf(
      "# bf16 conv, CUDA against the CPU's bf16: y %.3g, dw %.3g, dx %.3g; against CUDA's "
      "float32: y %.3g, dw %.3g, dx %.3g\n",
      y_err, dw_err, dx_err, y_moved, dw_moved, dx_moved);
  EXPECT_LT(y_err, 4e-3);
  EXPECT_LT(dw_err, 4e-3);
  EXPECT_LT(dx_err, 4e-3);
  EXPECT_GT(y_moved, 1e-4);
  EXPECT_GT(dw_moved, 1e-4);
  EXPECT_GT(dx_moved, 1e-4);
}

TEST_F(CudaBackendTest, LabelsOutOfRangeAreInvalidArgumentByTheNextSync) {
  Both logits = Upload(RandomValues(40, 33)), loss = Garbage(1), dlogits = Garbage(40);
  Both correct = UploadI32({0}), labels = UploadI32({1, 2, 12, 3});
  ASSERT_OK(cuda_->SoftmaxCrossEntropy(4, 10, logits.f(kTested), labels.i(kTested), 0.0f,
                                       loss.f(kTested), correct.i(kTested), dlogits.f(kTested)));
  float host_loss = 0;
  const absl::Status st = cuda_->CopyToHost(loss.t[kTested], &host_loss, sizeof(host_loss));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("label 12 out of range for 10 classes"), std::string::npos) << st;
  EXPECT_EQ(cpu_->SoftmaxCrossEntropy(4, 10, logits.f(kCpu), labels.i(kCpu), 0.0f, loss.f(kCpu),
                                      correct.i(kCpu), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_OK(cuda_->Synchronize());  // reported once, then cleared
  Both onehot = Garbage(40);
  ASSERT_OK(cuda_->OneHot(4, 10, labels.i(kTested), onehot.f(kTested)));
  EXPECT_EQ(cuda_->Synchronize().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_OK(cuda_->Synchronize());
}

TEST_F(CudaBackendTest, BackendsOnOneDeviceShareOneCacheAndOutOfMemoryEmptiesItForAll) {
  auto a = CudaBackend::Create(0), b = CudaBackend::Create(0);
  ASSERT_OK(a);
  ASSERT_OK(b);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  // Two thirds of what is free: held in a's cache after the tensor goes, it leaves too little
  // for b's request of the same size unless b's allocation gives a's cache back first.
  const int64_t floats = static_cast<int64_t>(free_bytes / 3 * 2 / sizeof(float));
  {
    auto big = (*a)->Allocate(DType::kF32, {floats});
    ASSERT_OK(big);
  }
  EXPECT_GT((*a)->bytes_cached(), 0u);
  auto other = (*b)->Allocate(DType::kF32, {floats});
  ASSERT_OK(other);
  EXPECT_EQ((*a)->bytes_cached(), 0u);
  // Blocks a backend leaves behind go to the idle pool and serve the next backend's requests.
  other = absl::InternalError("released");
  const int64_t allocs = (*a)->device_allocations();
  b->reset();
  auto again = (*a)->Allocate(DType::kF32, {floats});
  ASSERT_OK(again);
  EXPECT_EQ((*a)->device_allocations(), allocs);
}

#else  // !KILN_WITH_CUDA

TEST(CudaBackendTest, NeedsACudaBuild) { GTEST_SKIP() << "this build of kiln has no CUDA support"; }

#endif  // KILN_WITH_CUDA

}  // namespace
}  // namespace kiln
