// The sequence ops (engine/backend.h: layer normalisation, embeddings, the strided batched GEMM,
// the causal softmax, Transpose0213) on the CPU backend, the reference of every other backend:
// each against a plain double-precision reference written from its contract, on odd shapes and
// with aliasing and accumulation; their backwards, and causal attention built from them (the
// recipe the GPT layers follow), against central differences of their forwards; the same bits on
// any thread count where the contract promises it; and the checks' refusals, on every backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "engine/backend.h"
#include "engine/backend_registry.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::RandomValues;

// Each value within tol of the reference, relative to max(1, |reference|).
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), tol * std::max(1.0, std::abs(want[i])))
        << what << "[" << i << "]: " << got[i] << " against the reference's " << want[i];
  }
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see an empty vector's null data (UBSan).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<int32_t> RandomIds(int64_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = dist(gen);
  return ids;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

constexpr double kTolerance = 1e-5;  // float32 results against double references

// --- references, plainly from the contracts, in double ------------------------------------------

struct LayerNormResult {
  std::vector<double> y, mean, rstd;
};

// gamma and beta empty: no affine.
LayerNormResult LayerNormReference(int64_t rows, int cols, double eps, const std::vector<float>& x,
                                   const std::vector<float>& gamma,
                                   const std::vector<float>& beta) {
  LayerNormResult out;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < cols; ++c) mean += x[r * cols + c];
    mean /= cols;
    for (int c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    var /= cols;
    const double rstd = 1.0 / std::sqrt(var + eps);
    out.mean.push_back(mean);
    out.rstd.push_back(rstd);
    for (int c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - mean) * rstd;
      out.y.push_back(xhat * (gamma.empty() ? 1.0 : gamma[c]) + (beta.empty() ? 0.0 : beta[c]));
    }
  }
  return out;
}

struct LayerNormGrads {
  std::vector<double> dx, dgamma, dbeta;
};

// dgamma and dbeta start from `dgamma0` and `dbeta0` (the accumulation).
LayerNormGrads LayerNormBackwardReference(int64_t rows, int cols, double eps,
                                          const std::vector<float>& x,
                                          const std::vector<float>& gamma,
                                          const std::vector<float>& dy,
                                          const std::vector<float>& dgamma0,
                                          const std::vector<float>& dbeta0) {
  const LayerNormResult f = LayerNormReference(rows, cols, eps, x, {}, {});
  LayerNormGrads out;
  out.dgamma.assign(dgamma0.begin(), dgamma0.end());
  out.dbeta.assign(dbeta0.begin(), dbeta0.end());
  for (int64_t r = 0; r < rows; ++r) {
    double mean_g = 0, mean_gx = 0;
    for (int c = 0; c < cols; ++c) {
      const double g = dy[r * cols + c] * (gamma.empty() ? 1.0 : gamma[c]);
      mean_g += g / cols;
      mean_gx += g * f.y[r * cols + c] / cols;  // f.y is xhat
    }
    for (int c = 0; c < cols; ++c) {
      const double g = dy[r * cols + c] * (gamma.empty() ? 1.0 : gamma[c]);
      out.dx.push_back(f.rstd[r] * (g - mean_g - f.y[r * cols + c] * mean_gx));
      out.dgamma[c] += dy[r * cols + c] * f.y[r * cols + c];
      out.dbeta[c] += dy[r * cols + c];
    }
  }
  return out;
}

struct GemmCase {
  Transpose ta, tb;
  int m, n, k, batch;
  int64_t stride_a, stride_b, stride_c;
  float alpha, beta;
};

// c_i = alpha op(a_i) op(b_i) + beta c_i (beta 0: c is never read).
std::vector<double> GemmReference(const GemmCase& g, const std::vector<float>& a,
                                  const std::vector<float>& b, const std::vector<float>& c) {
  std::vector<double> out(c.begin(), c.end());
  for (int i = 0; i < g.batch; ++i) {
    const float* ai = a.data() + i * g.stride_a;
    const float* bi = b.data() + i * g.stride_b;
    for (int r = 0; r < g.m; ++r) {
      for (int col = 0; col < g.n; ++col) {
        double s = 0;
        for (int p = 0; p < g.k; ++p) {
          const double av = g.ta == Transpose::kYes ? ai[p * g.m + r] : ai[r * g.k + p];
          const double bv = g.tb == Transpose::kYes ? bi[col * g.k + p] : bi[p * g.n + col];
          s += av * bv;
        }
        double& cv = out[i * g.stride_c + r * g.n + col];
        cv = g.alpha * s + (g.beta == 0.0f ? 0.0 : g.beta * cv);
      }
    }
  }
  return out;
}

std::vector<double> CausalSoftmaxReference(int64_t batch, int t, double scale,
                                           const std::vector<float>& x) {
  std::vector<double> y(x.size(), 0.0);
  for (int64_t row = 0; row < batch * t; ++row) {
    const int i = static_cast<int>(row % t);
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int j = 0; j <= i; ++j) mx = std::max(mx, scale * x[row * t + j]);
    for (int j = 0; j <= i; ++j) sum += std::exp(scale * x[row * t + j] - mx);
    for (int j = 0; j <= i; ++j) y[row * t + j] = std::exp(scale * x[row * t + j] - mx) / sum;
  }
  return y;
}

// The weights of `queries` new positions offset.. against `keys` cached ones: row i of each
// (queries, keys) matrix keeps columns j <= offset + i.
std::vector<double> CausalSoftmaxAtReference(int64_t batch, int queries, int keys, int offset,
                                             double scale, const std::vector<float>& x) {
  std::vector<double> y(x.size(), 0.0);
  for (int64_t row = 0; row < batch * queries; ++row) {
    const int live = offset + static_cast<int>(row % queries) + 1;
    const float* xr = x.data() + row * keys;
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int j = 0; j < live; ++j) mx = std::max(mx, scale * xr[j]);
    for (int j = 0; j < live; ++j) sum += std::exp(scale * xr[j] - mx);
    for (int j = 0; j < live; ++j) y[row * keys + j] = std::exp(scale * xr[j] - mx) / sum;
  }
  return y;
}

std::vector<double> CausalSoftmaxBackwardReference(int64_t batch, int t, double scale,
                                                   const std::vector<float>& y,
                                                   const std::vector<float>& dy) {
  std::vector<double> dx(y.size(), 0.0);
  for (int64_t row = 0; row < batch * t; ++row) {
    const int i = static_cast<int>(row % t);
    double dot = 0;
    for (int j = 0; j <= i; ++j) dot += static_cast<double>(dy[row * t + j]) * y[row * t + j];
    for (int j = 0; j <= i; ++j) dx[row * t + j] = scale * y[row * t + j] * (dy[row * t + j] - dot);
  }
  return dx;
}

std::vector<float> Transpose0213Reference(int64_t a, int64_t b, int64_t c, int64_t d,
                                          const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (int64_t i = 0; i < a; ++i) {
    for (int64_t j = 0; j < b; ++j) {
      for (int64_t k = 0; k < c; ++k) {
        for (int64_t e = 0; e < d; ++e) {
          y[((i * c + k) * b + j) * d + e] = x[((i * b + j) * c + k) * d + e];
        }
      }
    }
  }
  return y;
}

// The CPU backend, its pointers plain host memory (vectors here).
class SequenceOps : public ::testing::Test {
 protected:
  void SetUp() override { cpu_.BindCallingThread(); }
  CpuBackend cpu_{2};
};

// --- layer normalisation -------------------------------------------------------------------------

struct Affine {
  bool gamma, beta;
};

TEST_F(SequenceOps, LayerNormForwardMatchesTheReferenceWithAndWithoutAffine) {
  for (int64_t rows : {1, 7, 33}) {
    for (int cols : {1, 5, 64, 130}) {
      for (Affine affine : {Affine{true, true}, Affine{true, false}, Affine{false, false}}) {
        SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " gamma " << affine.gamma
                                          << " beta " << affine.beta);
        const std::vector<float> x = RandomValues(rows * cols, 1, -2, 3);
        const std::vector<float> gamma =
            affine.gamma ? RandomValues(cols, 2, 0.5, 1.5) : std::vector<float>();
        const std::vector<float> beta = affine.beta ? RandomValues(cols, 3) : std::vector<float>();
        std::vector<float> y = RandomValues(rows * cols, 4, -9, 9), mean(rows), rstd(rows);
        ASSERT_OK(cpu_.LayerNormForward(
            rows, cols, 1e-5f, x.data(), affine.gamma ? gamma.data() : nullptr,
            affine.beta ? beta.data() : nullptr, y.data(), mean.data(), rstd.data()));
        const LayerNormResult want = LayerNormReference(rows, cols, 1e-5, x, gamma, beta);
        ExpectNear(y, want.y, kTolerance, "y");
        ExpectNear(mean, want.mean, kTolerance, "mean");
        ExpectNear(rstd, want.rstd, kTolerance, "rstd");
      }
    }
  }
}

TEST_F(SequenceOps, LayerNormForwardInPlaceAndFarFromZeroKeepsItsAccuracy) {
  // A row of large mean and small spread: the variance about the mean stays exact.
  const int64_t rows = 7;
  const int cols = 64;
  std::vector<float> x = RandomValues(rows * cols, 5, 999.0f, 1001.0f);
  const std::vector<float> gamma = RandomValues(cols, 6), beta = RandomValues(cols, 7);
  const LayerNormResult want = LayerNormReference(rows, cols, 1e-5, x, gamma, beta);
  std::vector<float> mean(rows), rstd(rows);
  ASSERT_OK(cpu_.LayerNormForward(rows, cols, 1e-5f, x.data(), gamma.data(), beta.data(), x.data(),
                                  mean.data(), rstd.data()));
  // The mean, kept as a float near 1000, is up to 3e-5 off: xhat by that times rstd.
  ExpectNear(x, want.y, 1e-4, "y written over x");
  ExpectNear(rstd, want.rstd, kTolerance, "rstd");
}

TEST_F(SequenceOps, LayerNormBackwardMatchesTheReferenceAndAccumulatesParameterGradients) {
  for (int64_t rows : {1, 7, 33}) {
    for (int cols : {1, 5, 64, 130}) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " affine " << affine);
        const std::vector<float> x = RandomValues(rows * cols, 8, -2, 3);
        const std::vector<float> gamma =
            affine ? RandomValues(cols, 9, 0.5, 1.5) : std::vector<float>();
        const std::vector<float> dy = RandomValues(rows * cols, 10);
        std::vector<float> y(rows * cols), mean(rows), rstd(rows);
        ASSERT_OK(cpu_.LayerNormForward(rows, cols, 1e-5f, x.data(),
                                        affine ? gamma.data() : nullptr, nullptr, y.data(),
                                        mean.data(), rstd.data()));
        const std::vector<float> dgamma0 = RandomValues(cols, 11), dbeta0 = RandomValues(cols, 12);
        std::vector<float> dx = RandomValues(rows * cols, 13, -9, 9);
        std::vector<float> dgamma = dgamma0, dbeta = dbeta0;
        ASSERT_OK(cpu_.LayerNormBackward(rows, cols, x.data(), affine ? gamma.data() : nullptr,
                                         mean.data(), rstd.data(), dy.data(), dx.data(),
                                         dgamma.data(), dbeta.data()));
        const LayerNormGrads want =
            LayerNormBackwardReference(rows, cols, 1e-5, x, gamma, dy, dgamma0, dbeta0);
        ExpectNear(dx, want.dx, kTolerance, "dx");
        ExpectNear(dgamma, want.dgamma, kTolerance, "dgamma (+=)");
        ExpectNear(dbeta, want.dbeta, kTolerance, "dbeta (+=)");
      }
    }
  }
}

TEST_F(SequenceOps, LayerNormBackwardWritesOnlyTheGradientsItIsGiven) {
  const int64_t rows = 5;
  const int cols = 33;
  const std::vector<float> x = RandomValues(rows * cols, 14), dy = RandomValues(rows * cols, 15);
  const std::vector<float> gamma = RandomValues(cols, 16);
  std::vector<float> y(rows * cols), mean(rows), rstd(rows);
  ASSERT_OK(cpu_.LayerNormForward(rows, cols, 1e-5f, x.data(), gamma.data(), nullptr, y.data(),
                                  mean.data(), rstd.data()));
  const LayerNormGrads want = LayerNormBackwardReference(
      rows, cols, 1e-5, x, gamma, dy, std::vector<float>(cols), std::vector<float>(cols));
  std::vector<float> dgamma(cols), dbeta(cols);
  ASSERT_OK(cpu_.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(),
                                   dy.data(), nullptr, dgamma.data(), dbeta.data()));
  ExpectNear(dgamma, want.dgamma, kTolerance, "dgamma without dx");
  ExpectNear(dbeta, want.dbeta, kTolerance, "dbeta without dx");
  std::vector<float> dx(rows * cols), only_dbeta(cols);
  ASSERT_OK(cpu_.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(),
                                   dy.data(), dx.data(), nullptr, only_dbeta.data()));
  ExpectNear(dx, want.dx, kTolerance, "dx without dgamma");
  EXPECT_TRUE(SameBits(only_dbeta, dbeta)) << "dbeta alone is the same sum";
}

// --- embeddings ----------------------------------------------------------------------------------

TEST_F(SequenceOps, EmbeddingForwardGathersTableRows) {
  for (int dim : {1, 5, 64, 130}) {
    for (int64_t count : {0, 1, 7, 33}) {
      SCOPED_TRACE(::testing::Message() << count << " ids of dim " << dim);
      const int vocab = 11;
      const std::vector<float> table = RandomValues(int64_t{vocab} * dim, 17);
      const std::vector<int32_t> ids = RandomIds(count, vocab, 18);
      std::vector<float> y = RandomValues(count * dim, 19, -9, 9);
      ASSERT_OK(cpu_.EmbeddingForward(count, vocab, dim, ids.data(), table.data(), y.data()));
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(std::memcmp(y.data() + i * dim, table.data() + int64_t{ids[i]} * dim, dim * 4), 0)
            << "row " << i << " (id " << ids[i] << ")";
      }
    }
  }
}

TEST_F(SequenceOps, EmbeddingForwardRefusesAnOutOfRangeIdNamingItAndWritesNothing) {
  const std::vector<float> table = RandomValues(5 * 3, 20);
  for (int32_t bad : {-1, 5, 1 << 30}) {
    const std::vector<int32_t> ids = {0, 4, bad, 1};
    std::vector<float> y(4 * 3, 7.0f);
    const absl::Status s = cpu_.EmbeddingForward(4, 5, 3, ids.data(), table.data(), y.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("embedding"), std::string::npos) << s;
    EXPECT_NE(s.message().find("id " + std::to_string(bad) + " at position 2"), std::string::npos)
        << s;
    EXPECT_EQ(y, std::vector<float>(4 * 3, 7.0f)) << "nothing written";
  }
}

TEST_F(SequenceOps, EmbeddingBackwardAddsRowsInIndexOrderAndSkipsIdsOutOfRange) {
  for (int dim : {1, 5, 64, 130}) {
    for (int64_t count : {1, 7, 33, 2000}) {
      SCOPED_TRACE(::testing::Message() << count << " ids of dim " << dim);
      const int vocab = 6;  // many repeats
      std::vector<int32_t> ids = RandomIds(count, vocab, 21);
      if (count > 3) ids[3] = -1, ids[count - 1] = vocab;  // skipped
      const std::vector<float> dy = RandomValues(count * dim, 22);
      std::vector<float> dtable = RandomValues(int64_t{vocab} * dim, 23);
      std::vector<float> want = dtable;
      for (int64_t i = 0; i < count; ++i) {
        if (ids[i] < 0 || ids[i] >= vocab) continue;
        for (int c = 0; c < dim; ++c) want[int64_t{ids[i]} * dim + c] += dy[i * dim + c];
      }
      ASSERT_OK(cpu_.EmbeddingBackward(count, vocab, dim, ids.data(), dy.data(), dtable.data()));
      EXPECT_TRUE(SameBits(dtable, want)) << "each row's sum in index order, onto what was there";
    }
  }
}

// --- the strided batched GEMM --------------------------------------------------------------------

std::vector<GemmCase> GemmCases() {
  std::vector<GemmCase> cases;
  struct Dims {
    int m, n, k;
  };
  for (Dims d :
       {Dims{1, 1, 1}, Dims{5, 7, 3}, Dims{17, 16, 33}, Dims{64, 64, 32}, Dims{64, 32, 64}}) {
    const int64_t sa = int64_t{d.m} * d.k, sb = int64_t{d.k} * d.n, sc = int64_t{d.m} * d.n;
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        for (int batch : {1, 2, 5})
          cases.push_back({ta, tb, d.m, d.n, d.k, batch, sa, sb, sc, 1, 0});
        cases.push_back({ta, tb, d.m, d.n, d.k, 3, sa, sb, sc, 0.7f, 0.5f});  // beta: +=
        cases.push_back({ta, tb, d.m, d.n, d.k, 4, 0, sb, sc, 1, 0});         // one a for all
        cases.push_back({ta, tb, d.m, d.n, d.k, 4, sa, 0, sc, 0.5f, 1});      // one b for all
        cases.push_back({ta, tb, d.m, d.n, d.k, 3, sa + 3, sb + 5, sc + 7, 1, 0.25f});  // gaps
        cases.push_back({ta, tb, d.m, d.n, d.k, 3, 1, sb, sc, 1, 0});    // a's matrices overlap
        cases.push_back({ta, tb, d.m, d.n, d.k, 2, 0, 0, sc, 2, 0.5f});  // both repeated
      }
    }
    cases.push_back({Transpose::kNo, Transpose::kNo, d.m, d.n, 0, 3, 0, 0, sc, 1, 0.5f});  // k = 0
  }
  return cases;
}

TEST_F(SequenceOps, GemmStridedBatchedMatchesTheReferenceForEveryTransposeStrideAndBeta) {
  for (const GemmCase& g : GemmCases()) {
    SCOPED_TRACE(::testing::Message()
                 << g.batch << " x " << g.m << "x" << g.n << "x" << g.k << " ta "
                 << (g.ta == Transpose::kYes) << " tb " << (g.tb == Transpose::kYes) << " strides "
                 << g.stride_a << "," << g.stride_b << "," << g.stride_c << " alpha " << g.alpha
                 << " beta " << g.beta);
    const int64_t a_size = (g.batch - 1) * g.stride_a + int64_t{g.m} * g.k;
    const int64_t b_size = (g.batch - 1) * g.stride_b + int64_t{g.k} * g.n;
    const int64_t c_size = (g.batch - 1) * g.stride_c + int64_t{g.m} * g.n;
    const std::vector<float> a = RandomValues(a_size, 24), b = RandomValues(b_size, 25);
    std::vector<float> c = RandomValues(c_size, 26);
    if (g.beta == 0.0f) {
      // beta 0 never reads c: NaNs there are overwritten (gaps between matrices are kept).
      for (int i = 0; i < g.batch; ++i) {
        std::fill_n(c.begin() + i * g.stride_c, int64_t{g.m} * g.n, std::nanf(""));
      }
    }
    const std::vector<double> want = GemmReference(g, a, b, c);
    ASSERT_OK(cpu_.GemmStridedBatched(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), g.stride_a,
                                      b.data(), g.stride_b, g.beta, c.data(), g.stride_c, g.batch));
    ExpectNear(c, want, kTolerance, "c");
  }
}

TEST_F(SequenceOps, GemmStridedBatchedOfNoMatricesOrEmptyOnesTouchesNothing) {
  std::vector<float> c = {1, 2, 3};
  ASSERT_OK(cpu_.GemmStridedBatched(Transpose::kNo, Transpose::kNo, 1, 1, 1, 1, nullptr, 1, nullptr,
                                    1, 0, c.data(), 1, 0));
  ASSERT_OK(cpu_.GemmStridedBatched(Transpose::kNo, Transpose::kNo, 0, 3, 4, 1, nullptr, 0, nullptr,
                                    12, 0, c.data(), 0, 5));
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3}));
}

// --- the causal softmax --------------------------------------------------------------------------

TEST_F(SequenceOps, CausalSoftmaxForwardMatchesTheReferenceAndZeroesAboveTheDiagonal) {
  for (int64_t batch : {1, 2, 5}) {
    for (int t : {1, 3, 17, 64}) {
      for (float scale : {1.0f, 0.125f}) {
        SCOPED_TRACE(::testing::Message() << batch << " x " << t << " scale " << scale);
        const std::vector<float> x = RandomValues(batch * t * t, 27, -8, 8);
        const std::vector<double> want = CausalSoftmaxReference(batch, t, scale, x);
        std::vector<float> y = RandomValues(x.size(), 28, -9, 9);
        ASSERT_OK(cpu_.CausalSoftmaxForward(batch, t, scale, x.data(), y.data()));
        ExpectNear(y, want, 1e-6, "y");
        for (int64_t row = 0; row < batch * t; ++row) {
          for (int j = static_cast<int>(row % t) + 1; j < t; ++j) {
            ASSERT_EQ(y[row * t + j], 0.0f) << "masked " << row << "," << j;
          }
        }
        std::vector<float> in_place = x;
        ASSERT_OK(cpu_.CausalSoftmaxForward(batch, t, scale, in_place.data(), in_place.data()));
        EXPECT_TRUE(SameBits(in_place, y)) << "y = x gives the same values";
      }
    }
  }
}

TEST_F(SequenceOps, CausalSoftmaxForwardAtKeepsTheKeysUpToEachQuerysPosition) {
  struct Case {
    int64_t batch;
    int queries, keys, offset;
  };
  // One new position (decoding), a prefill (offset 0, square), a block in the middle, and keys
  // beyond the last query (all masked).
  for (Case c : {Case{3, 1, 9, 8}, Case{2, 5, 5, 0}, Case{2, 4, 11, 3}, Case{1, 2, 70, 60}}) {
    SCOPED_TRACE(::testing::Message()
                 << c.batch << " x " << c.queries << " x " << c.keys << " offset " << c.offset);
    const float scale = 0.25f;
    const std::vector<float> x = RandomValues(c.batch * c.queries * c.keys, 29, -8, 8);
    std::vector<float> y = RandomValues(x.size(), 30, -9, 9);
    ASSERT_OK(cpu_.CausalSoftmaxForwardAt(c.batch, c.queries, c.keys, c.offset, scale, x.data(),
                                          y.data()));
    const std::vector<double> want =
        CausalSoftmaxAtReference(c.batch, c.queries, c.keys, c.offset, scale, x);
    ExpectNear(y, want, 1e-6, "y");
    for (size_t i = 0; i < y.size(); ++i) {
      if (want[i] == 0.0) {
        ASSERT_EQ(y[i], 0.0f) << "masked " << i;
      }
    }
    std::vector<float> in_place = x;
    ASSERT_OK(cpu_.CausalSoftmaxForwardAt(c.batch, c.queries, c.keys, c.offset, scale,
                                          in_place.data(), in_place.data()));
    EXPECT_TRUE(SameBits(in_place, y)) << "y = x gives the same values";
  }
}

TEST_F(SequenceOps, CausalSoftmaxForwardAtOfAWholeSequenceIsTheCausalSoftmax) {
  const int t = 17;
  const std::vector<float> x = RandomValues(3 * t * t, 31, -8, 8);
  std::vector<float> square(x.size()), at(x.size());
  ASSERT_OK(cpu_.CausalSoftmaxForward(3, t, 0.5f, x.data(), square.data()));
  ASSERT_OK(cpu_.CausalSoftmaxForwardAt(3, t, t, 0, 0.5f, x.data(), at.data()));
  EXPECT_TRUE(SameBits(square, at));
}

TEST_F(SequenceOps, CausalSoftmaxForwardSurvivesHugeScoresAndUnderflow) {
  // Scores 1e4 apart: exp of the others underflows to 0, and nothing overflows.
  const int t = 4;
  const std::vector<float> x = {3e4f, 0, 0, 0, -1e4f, 1e4f, 0, 0, 1, 2, 3, 0, -200, 0, -200, -90};
  std::vector<float> y(x.size());
  ASSERT_OK(cpu_.CausalSoftmaxForward(1, t, 1.0f, x.data(), y.data()));
  ExpectNear(y, CausalSoftmaxReference(1, t, 1.0, x), 1e-6, "y");
}

TEST_F(SequenceOps, CausalSoftmaxBackwardMatchesTheReferenceIntoAnotherBufferAndInPlace) {
  for (int64_t batch : {1, 2, 5}) {
    for (int t : {1, 3, 17, 64}) {
      SCOPED_TRACE(::testing::Message() << batch << " x " << t);
      const float scale = 0.25f;
      const std::vector<float> x = RandomValues(batch * t * t, 29, -4, 4);
      std::vector<float> y(x.size());
      ASSERT_OK(cpu_.CausalSoftmaxForward(batch, t, scale, x.data(), y.data()));
      const std::vector<float> dy = RandomValues(x.size(), 30);
      const std::vector<double> want = CausalSoftmaxBackwardReference(batch, t, scale, y, dy);
      std::vector<float> dx = RandomValues(x.size(), 31, -9, 9);
      ASSERT_OK(cpu_.CausalSoftmaxBackward(batch, t, scale, y.data(), dy.data(), dx.data()));
      ExpectNear(dx, want, 1e-6, "dx");
      std::vector<float> in_place = dy;
      ASSERT_OK(
          cpu_.CausalSoftmaxBackward(batch, t, scale, y.data(), in_place.data(), in_place.data()));
      EXPECT_TRUE(SameBits(in_place, dx)) << "dx = dy gives the same values";
    }
  }
}

// --- Transpose0213 -------------------------------------------------------------------------------

TEST_F(SequenceOps, Transpose0213SwapsTheMiddleAxesExactlyAndTwiceIsTheIdentity) {
  struct Case {
    int64_t a, b, c, d;
  };
  // b >= c and b < c take different loops; d under and over the memcpy threshold; attention's
  // head split and merge; empty extents.
  for (Case s : {Case{1, 1, 1, 1}, Case{2, 3, 5, 1}, Case{3, 5, 2, 7}, Case{2, 4, 3, 20},
                 Case{1, 2, 7, 33}, Case{1, 96, 3, 64}, Case{6, 64, 4, 32}, Case{4, 4, 64, 32},
                 Case{0, 3, 4, 5}, Case{2, 0, 4, 5}, Case{2, 3, 4, 0}}) {
    SCOPED_TRACE(::testing::Message() << s.a << "," << s.b << "," << s.c << "," << s.d);
    const std::vector<float> x = RandomValues(s.a * s.b * s.c * s.d, 32);
    std::vector<float> y = RandomValues(x.size(), 33), back(x.size());
    ASSERT_OK(cpu_.Transpose0213(s.a, s.b, s.c, s.d, x.data(), y.data()));
    EXPECT_TRUE(SameBits(y, Transpose0213Reference(s.a, s.b, s.c, s.d, x)));
    ASSERT_OK(cpu_.Transpose0213(s.a, s.c, s.b, s.d, y.data(), back.data()));
    EXPECT_TRUE(SameBits(back, x));
  }
}

// --- gradients against central differences -------------------------------------------------------

// As gradient_check_test.cc: float32 central differences of L = sum(y * r) through the backend's
// own forward, step 1e-2, relative error under 2e-2 (floored at 1e-3).
constexpr float kStep = 1e-2f;
constexpr double kGradTolerance = 2e-2;

double RelativeError(double analytic, double numeric) {
  return std::abs(analytic - numeric) / std::max({1e-3, std::abs(analytic), std::abs(numeric)});
}

// Perturbs each value of `values` (which `loss` reads) both ways and compares (up - down) / 2h
// with `analytic`.
void ExpectGradient(std::vector<float>& values, const std::vector<float>& analytic,
                    const std::function<double()>& loss, const std::string& what) {
  ASSERT_EQ(values.size(), analytic.size()) << what;
  for (size_t i = 0; i < values.size(); ++i) {
    const float keep = values[i];
    values[i] = keep + kStep;
    const double up = loss();
    values[i] = keep - kStep;
    const double down = loss();
    values[i] = keep;
    const double numeric = (up - down) / (2 * kStep);
    ASSERT_LT(RelativeError(analytic[i], numeric), kGradTolerance)
        << what << "[" << i << "]: backward " << analytic[i] << " vs numeric " << numeric;
  }
}

TEST_F(SequenceOps, LayerNormGradientsMatchFiniteDifferences) {
  for (int cols : {5, 16}) {
    SCOPED_TRACE(cols);
    const int64_t rows = 3;
    std::vector<float> x = RandomValues(rows * cols, 34, -2, 2);
    std::vector<float> gamma = RandomValues(cols, 35, 0.5, 1.5), beta = RandomValues(cols, 36);
    const std::vector<float> r = RandomValues(rows * cols, 37);
    std::vector<float> y(rows * cols), mean(rows), rstd(rows);
    auto loss = [&] {
      EXPECT_OK(cpu_.LayerNormForward(rows, cols, 1e-5f, x.data(), gamma.data(), beta.data(),
                                      y.data(), mean.data(), rstd.data()));
      return Dot(y, r);
    };
    loss();
    std::vector<float> dx(rows * cols), dgamma(cols), dbeta(cols);
    ASSERT_OK(cpu_.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(),
                                     r.data(), dx.data(), dgamma.data(), dbeta.data()));
    ExpectGradient(x, dx, loss, "x");
    ExpectGradient(gamma, dgamma, loss, "gamma");
    ExpectGradient(beta, dbeta, loss, "beta");
  }
}

TEST_F(SequenceOps, CausalSoftmaxGradientMatchesFiniteDifferences) {
  const int64_t batch = 2;
  const int t = 6;
  const float scale = 0.5f;
  std::vector<float> x = RandomValues(batch * t * t, 38, -2, 2);
  const std::vector<float> r = RandomValues(x.size(), 39);
  std::vector<float> y(x.size());
  auto loss = [&] {
    EXPECT_OK(cpu_.CausalSoftmaxForward(batch, t, scale, x.data(), y.data()));
    return Dot(y, r);
  };
  loss();
  std::vector<float> dx(x.size());
  ASSERT_OK(cpu_.CausalSoftmaxBackward(batch, t, scale, y.data(), r.data(), dx.data()));
  ExpectGradient(x, dx, loss, "x");
}

TEST_F(SequenceOps, EmbeddingTableGradientMatchesFiniteDifferences) {
  const int64_t count = 9;
  const int vocab = 4, dim = 3;
  const std::vector<int32_t> ids = {0, 2, 2, 1, 0, 2, 3, 2, 0};
  std::vector<float> table = RandomValues(vocab * dim, 40);
  const std::vector<float> r = RandomValues(count * dim, 41);
  std::vector<float> y(count * dim);
  auto loss = [&] {
    EXPECT_OK(cpu_.EmbeddingForward(count, vocab, dim, ids.data(), table.data(), y.data()));
    return Dot(y, r);
  };
  std::vector<float> dtable(vocab * dim);
  ASSERT_OK(cpu_.EmbeddingBackward(count, vocab, dim, ids.data(), r.data(), dtable.data()));
  ExpectGradient(table, dtable, loss, "table");
}

// --- causal self-attention from the ops ----------------------------------------------------------

// Causal self-attention as the GPT layers run it, from the sequence ops alone. qkv is c_attn's
// output (B, T, 3, H, hd); two transposes split it into q, k, v of (B, H, T, hd) each (as
// (1, B*T, 3, C) -> (3, B*T, C) = (3B, T, H, hd) -> (3B, H, T, hd)); the weights are
// causal_softmax(q k^T / sqrt(hd)) (B*H, T, T); the output (B, T, H, hd) merges the heads of
// weights * v back.
class CausalAttention {
 public:
  CausalAttention(Backend& backend, int batch, int t, int heads, int head_dim)
      : be_(backend),
        b_(batch),
        t_(t),
        h_(heads),
        hd_(head_dim),
        head_(int64_t{batch} * heads * t * head_dim),
        split_(3 * head_),
        scratch_(3 * head_),
        weights_(int64_t{batch} * heads * t * t),
        dweights_(weights_.size()),
        out_(head_),
        dsplit_(3 * head_) {}

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hd_)); }
  const std::vector<float>& weights() const { return weights_; }

  absl::Status Forward(const float* qkv, float* y) {
    const int64_t c = int64_t{h_} * hd_, rows = int64_t{b_} * t_, bh = int64_t{b_} * h_;
    KILN_RETURN_IF_ERROR(be_.Transpose0213(1, rows, 3, c, qkv, scratch_.data()));
    KILN_RETURN_IF_ERROR(be_.Transpose0213(3 * b_, t_, h_, hd_, scratch_.data(), split_.data()));
    const float *q = split_.data(), *k = q + head_, *v = k + head_;
    const int64_t mat = int64_t{t_} * hd_, sq = int64_t{t_} * t_;
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kNo, Transpose::kYes, t_, t_, hd_, 1, q,
                                                mat, k, mat, 0, weights_.data(), sq, bh));
    KILN_RETURN_IF_ERROR(
        be_.CausalSoftmaxForward(bh, t_, scale(), weights_.data(), weights_.data()));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kNo, Transpose::kNo, t_, hd_, t_, 1,
                                                weights_.data(), sq, v, mat, 0, out_.data(), mat,
                                                bh));
    return be_.Transpose0213(b_, h_, t_, hd_, out_.data(), y);
  }

  // dqkv from dy (B, T, H, hd), after Forward.
  absl::Status Backward(const float* dy, float* dqkv) {
    const int64_t c = int64_t{h_} * hd_, rows = int64_t{b_} * t_, bh = int64_t{b_} * h_;
    const int64_t mat = int64_t{t_} * hd_, sq = int64_t{t_} * t_;
    const float *q = split_.data(), *k = q + head_, *v = k + head_;
    float *dq = dsplit_.data(), *dk = dq + head_, *dv = dk + head_;
    float* dout = out_.data();  // the forward's output is not needed again
    KILN_RETURN_IF_ERROR(be_.Transpose0213(b_, t_, h_, hd_, dy, dout));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kNo, Transpose::kYes, t_, t_, hd_, 1,
                                                dout, mat, v, mat, 0, dweights_.data(), sq, bh));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kYes, Transpose::kNo, t_, hd_, t_, 1,
                                                weights_.data(), sq, dout, mat, 0, dv, mat, bh));
    KILN_RETURN_IF_ERROR(be_.CausalSoftmaxBackward(bh, t_, scale(), weights_.data(),
                                                   dweights_.data(), dweights_.data()));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kNo, Transpose::kNo, t_, hd_, t_, 1,
                                                dweights_.data(), sq, k, mat, 0, dq, mat, bh));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kYes, Transpose::kNo, t_, hd_, t_, 1,
                                                dweights_.data(), sq, q, mat, 0, dk, mat, bh));
    KILN_RETURN_IF_ERROR(be_.Transpose0213(3 * b_, h_, t_, hd_, dsplit_.data(), scratch_.data()));
    return be_.Transpose0213(1, 3, rows, c, scratch_.data(), dqkv);
  }

 private:
  Backend& be_;
  const int b_, t_, h_, hd_;
  const int64_t head_;  // the values of one of q, k, v
  std::vector<float> split_, scratch_, weights_, dweights_, out_, dsplit_;
};

// The attention of qkv (B, T, 3, H, hd) straight from its definition, in double: y (B, T, H, hd).
std::vector<double> AttentionReference(int batch, int t, int heads, int hd,
                                       const std::vector<float>& qkv) {
  const int64_t c = int64_t{heads} * hd;
  auto at = [&](int b, int i, int which, int h, int e) {
    return static_cast<double>(qkv[((int64_t{b} * t + i) * 3 + which) * c + h * hd + e]);
  };
  std::vector<double> y(int64_t{batch} * t * c, 0.0);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < t; ++i) {
        std::vector<double> s(i + 1);
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int j = 0; j <= i; ++j) {
          for (int e = 0; e < hd; ++e) s[j] += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          s[j] /= std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= i; ++j) {
          for (int e = 0; e < hd; ++e) {
            y[(int64_t{b} * t + i) * c + h * hd + e] += s[j] / sum * at(b, j, 2, h, e);
          }
        }
      }
    }
  }
  return y;
}

struct AttentionShape {
  int batch, t, heads, hd;
};

TEST_F(SequenceOps, CausalAttentionFromTheOpsMatchesItsDefinition) {
  for (AttentionShape s : {AttentionShape{1, 1, 1, 4}, AttentionShape{2, 7, 1, 8},
                           AttentionShape{3, 17, 4, 8}, AttentionShape{2, 64, 2, 32}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B " << s.batch << " T " << s.t << " H " << s.heads << " hd " << s.hd);
    const int64_t n = int64_t{s.batch} * s.t * s.heads * s.hd;
    const std::vector<float> qkv = RandomValues(3 * n, 42, -2, 2);
    CausalAttention attention(cpu_, s.batch, s.t, s.heads, s.hd);
    std::vector<float> y(n);
    ASSERT_OK(attention.Forward(qkv.data(), y.data()));
    ExpectNear(y, AttentionReference(s.batch, s.t, s.heads, s.hd, qkv), kTolerance, "y");
  }
}

TEST_F(SequenceOps, CausalAttentionGradientMatchesFiniteDifferences) {
  for (AttentionShape s : {AttentionShape{2, 7, 1, 8}, AttentionShape{2, 5, 3, 4}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B " << s.batch << " T " << s.t << " H " << s.heads << " hd " << s.hd);
    const int64_t n = int64_t{s.batch} * s.t * s.heads * s.hd;
    std::vector<float> qkv = RandomValues(3 * n, 43, -1, 1);
    const std::vector<float> r = RandomValues(n, 44);
    CausalAttention attention(cpu_, s.batch, s.t, s.heads, s.hd);
    std::vector<float> y(n);
    auto loss = [&] {
      EXPECT_OK(attention.Forward(qkv.data(), y.data()));
      return Dot(y, r);
    };
    loss();
    std::vector<float> dqkv = RandomValues(3 * n, 45, -9, 9);  // overwritten
    ASSERT_OK(attention.Backward(r.data(), dqkv.data()));
    ExpectGradient(qkv, dqkv, loss, "qkv");
  }
}

// --- the same bits on any thread count -----------------------------------------------------------

TEST(SequenceOpsDeterminism, LayerNormAndEmbeddingBackwardsGiveTheSameBitsOnAnyThreadCount) {
  // Large enough for every loop to go parallel; 130 columns split differently on 1, 2 and 3
  // threads.
  const int64_t rows = 600;
  const int cols = 130;
  const std::vector<float> x = RandomValues(rows * cols, 46, -2, 3);
  const std::vector<float> gamma = RandomValues(cols, 47), dy = RandomValues(rows * cols, 48);
  const int64_t count = 3000;
  const int vocab = 50, dim = 72;
  const std::vector<int32_t> ids = RandomIds(count, vocab, 49);
  const std::vector<float> dy_rows = RandomValues(count * dim, 50);
  std::vector<std::vector<float>> first;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    CpuBackend cpu(threads);
    cpu.BindCallingThread();
    std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols);
    std::vector<float> dgamma = RandomValues(cols, 51), dbeta = RandomValues(cols, 52);
    std::vector<float> dtable = RandomValues(int64_t{vocab} * dim, 53);
    ASSERT_OK(cpu.LayerNormForward(rows, cols, 1e-5f, x.data(), gamma.data(), nullptr, y.data(),
                                   mean.data(), rstd.data()));
    ASSERT_OK(cpu.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(),
                                    dy.data(), dx.data(), dgamma.data(), dbeta.data()));
    ASSERT_OK(cpu.EmbeddingBackward(count, vocab, dim, ids.data(), dy_rows.data(), dtable.data()));
    const std::vector<std::vector<float>> results = {y, mean, rstd, dx, dgamma, dbeta, dtable};
    if (first.empty()) {
      first = results;
      continue;
    }
    const char* names[] = {"y", "mean", "rstd", "dx", "dgamma", "dbeta", "dtable"};
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_TRUE(SameBits(results[i], first[i])) << names[i] << " differs from 1 thread's";
    }
  }
}

// --- the checks, on every backend ----------------------------------------------------------------

class SequenceOpChecks : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string absent = testing::AbsentDeviceReason(GetParam());
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto b = CreateBackend(GetParam());
    ASSERT_OK(b);
    backend_ = std::move(*b);
    auto t = backend_->Allocate(DType::kF32, {4096});
    ASSERT_OK(t);
    buf_ = *t;
  }

  // Expects InvalidArgument with `op` in the message.
  static void ExpectRefused(const absl::Status& s, const std::string& op) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(op), std::string::npos) << s << " does not name " << op;
  }

  std::unique_ptr<Backend> backend_;
  Tensor buf_;  // big enough for every call below, never read where a check refuses
};

TEST_P(SequenceOpChecks, LayerNormRefusesNegativeRowsNoColumnsAndABadEps) {
  Backend& b = *backend_;
  float* p = buf_.f32();
  struct Case {
    int64_t rows;
    int cols;
    float eps;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (Case c : {Case{-1, 4, 1e-5f}, Case{2, 0, 1e-5f}, Case{2, 4, 0.0f}, Case{2, 4, -1e-5f},
                 Case{2, 4, std::nanf("")}, Case{2, 4, inf}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols << " eps " << c.eps);
    ExpectRefused(b.LayerNormForward(c.rows, c.cols, c.eps, p, p, p, p, p, p), "layernorm");
  }
  ExpectRefused(b.LayerNormBackward(-1, 4, p, p, p, p, p, p, p, p), "layernorm");
  ExpectRefused(b.LayerNormBackward(2, 0, p, p, p, p, p, p, p, p), "layernorm");
}

TEST_P(SequenceOpChecks, EmbeddingRefusesNegativeCountsAndEmptyTables) {
  Backend& b = *backend_;
  float* p = buf_.f32();
  const int32_t* ids = buf_.i32();
  struct Case {
    int64_t count;
    int vocab, dim;
  };
  for (Case c : {Case{-1, 5, 3}, Case{2, 0, 3}, Case{2, 5, 0}, Case{2, -5, 3}}) {
    SCOPED_TRACE(::testing::Message() << c.count << " ids, " << c.vocab << " x " << c.dim);
    ExpectRefused(b.EmbeddingForward(c.count, c.vocab, c.dim, ids, p, p), "embedding");
    ExpectRefused(b.EmbeddingBackward(c.count, c.vocab, c.dim, ids, p, p), "embedding");
  }
}

TEST_P(SequenceOpChecks, EmbeddingForwardOfAnOutOfRangeIdIsRefusedOnTheCpuAndZeroElsewhere) {
  Backend& b = *backend_;
  auto ids = b.Allocate(DType::kI32, {3});
  ASSERT_OK(ids);
  const std::vector<int32_t> host_ids = {1, 9, 0};
  ASSERT_OK(b.CopyFromHost(host_ids.data(), 12, &*ids));
  const std::vector<float> table = RandomValues(5 * 2, 54);
  ASSERT_OK(b.CopyFromHost(table.data(), table.size() * 4, &buf_));
  float* y = buf_.f32() + 64;
  const absl::Status s = b.EmbeddingForward(3, 5, 2, ids->i32(), buf_.f32(), y);
  if (b.kind() == DeviceKind::kCpu) {
    ExpectRefused(s, "id 9 at position 1");
    return;
  }
  ASSERT_OK(s);
  ASSERT_OK(b.Synchronize());
  std::vector<float> host(4096);
  ASSERT_OK(b.CopyToHost(buf_, host.data(), host.size() * 4));
  EXPECT_EQ(std::vector<float>(host.begin() + 66, host.begin() + 68), std::vector<float>(2, 0.0f))
      << "the out-of-range id's row is zero";
  EXPECT_EQ(host[64], table[2]);
}

TEST_P(SequenceOpChecks, GemmStridedBatchedRefusesNegativeExtentsAndOverlappingResults) {
  Backend& b = *backend_;
  float* p = buf_.f32();
  const Transpose no = Transpose::kNo;
  ExpectRefused(b.GemmStridedBatched(no, no, -1, 2, 2, 1, p, 4, p, 4, 0, p, 4, 2), "batched GEMM");
  ExpectRefused(b.GemmStridedBatched(no, no, 2, -1, 2, 1, p, 4, p, 4, 0, p, 4, 2), "batched GEMM");
  ExpectRefused(b.GemmStridedBatched(no, no, 2, 2, -1, 1, p, 4, p, 4, 0, p, 4, 2), "batched GEMM");
  ExpectRefused(b.GemmStridedBatched(no, no, 2, 2, 2, 1, p, 4, p, 4, 0, p, 4, -1), "batched GEMM");
  ExpectRefused(b.GemmStridedBatched(no, no, 2, 2, 2, 1, p, 4, p, 4, 0, p, 3, 2), "batched GEMM");
  ExpectRefused(b.GemmStridedBatched(no, no, 2, 2, 2, 1, p, 4, p, 4, 0, p, 0, 2), "batched GEMM");
  ExpectRefused(b.GemmStridedBatched(no, no, 2, 2, 2, 1, p, -4, p, 4, 0, p, 4, 2), "stride");
  ExpectRefused(b.GemmStridedBatched(no, no, 2, 2, 2, 1, p, 4, p, -4, 0, p, 4, 2), "stride");
}

TEST_P(SequenceOpChecks, CausalSoftmaxForwardAtRefusesQueriesBeyondTheKeys) {
  Backend& b = *backend_;
  float* p = buf_.f32();
  struct Case {
    int64_t batch;
    int queries, keys, offset;
    float scale;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (Case c : {Case{-1, 1, 4, 0, 1}, Case{2, 0, 4, 0, 1}, Case{2, 1, 4, -1, 1},
                 Case{2, 2, 4, 3, 1}, Case{2, 1, 0, 0, 1}, Case{2, 1, 4, 0, 0},
                 Case{2, 1, 4, 0, std::nanf("")}, Case{2, 1, 4, 0, inf}}) {
    SCOPED_TRACE(::testing::Message() << c.batch << " x " << c.queries << " x " << c.keys
                                      << " offset " << c.offset << " scale " << c.scale);
    ExpectRefused(b.CausalSoftmaxForwardAt(c.batch, c.queries, c.keys, c.offset, c.scale, p, p),
                  "causal softmax");
  }
}

TEST_P(SequenceOpChecks, CausalSoftmaxRefusesNoTimeStepsAndABadScale) {
  Backend& b = *backend_;
  float* p = buf_.f32();
  struct Case {
    int64_t batch;
    int t;
    float scale;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (Case c : {Case{-1, 4, 1}, Case{2, 0, 1}, Case{2, -3, 1}, Case{2, 4, 0}, Case{2, 4, -0.5f},
                 Case{2, 4, std::nanf("")}, Case{2, 4, inf}}) {
    SCOPED_TRACE(::testing::Message() << c.batch << " x " << c.t << " scale " << c.scale);
    ExpectRefused(b.CausalSoftmaxForward(c.batch, c.t, c.scale, p, p), "causal softmax");
    ExpectRefused(b.CausalSoftmaxBackward(c.batch, c.t, c.scale, p, p, p), "causal softmax");
  }
}

TEST_P(SequenceOpChecks, Transpose0213RefusesNegativeExtents) {
  Backend& b = *backend_;
  float* p = buf_.f32();
  ExpectRefused(b.Transpose0213(-1, 2, 3, 4, p, p + 100), "Transpose0213");
  ExpectRefused(b.Transpose0213(1, -2, 3, 4, p, p + 100), "Transpose0213");
  ExpectRefused(b.Transpose0213(1, 2, -3, 4, p, p + 100), "Transpose0213");
  ExpectRefused(b.Transpose0213(1, 2, 3, -4, p, p + 100), "Transpose0213");
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, SequenceOpChecks, ::testing::Values("cpu", "cuda:0"),
                         testing::DeviceParamName);

}  // namespace
}  // namespace kiln
