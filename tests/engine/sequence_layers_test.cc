// The layers of a GPT over per-sample (T, d) sequences: shape rules and config errors, and
// numeric gradient checks (central differences) of each layer against its Backward, over every
// backend ("cpu", "cuda:0"); a backend not present on this machine skips, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/layers/layers.h"
#include "engine/loss.h"
#include "engine/model/model.h"
#include "engine/model/model_config_json.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::MakeTensor;
using testing::RandomValues;
using testing::ToHost;

constexpr float kEps = 1e-2f;
constexpr double kTolerance = 2e-2;  // relative, float32 central differences

double RelativeError(double analytic, double numeric) {
  return std::abs(analytic - numeric) / std::max({1e-3, std::abs(analytic), std::abs(numeric)});
}

// The message of the error InferShapes gives for `config`, or "" when it builds.
std::string ShapeError(const ModelConfig& config) {
  auto shapes = InferShapes(config);
  return shapes.ok() ? "" : std::string(shapes.status().message());
}

class SequenceLayers : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string absent = testing::AbsentDeviceReason(GetParam());
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto b = CreateBackend(GetParam(), {2});
    ASSERT_OK(b) << b.status();
    backend_ = std::move(*b);
  }

  // The layer of `config` over a per-sample `input`, built as the model builds it.
  std::unique_ptr<Layer> Build(const LayerConfig& config, const Shape& input) {
    auto shapes = InferShapes({input, {config}});
    EXPECT_OK(shapes) << shapes.status();
    if (!shapes.ok()) return nullptr;
    LayerContext ctx;
    ctx.backend = backend_.get();
    ctx.input = (*shapes)[0];
    ctx.inputs = {ctx.input};
    ctx.output = (*shapes)[1];
    ctx.rng = &rng_;
    ctx.stream_seed = 11;
    auto layer = std::visit([&](const auto& c) { return MakeLayer(c, ctx); }, config);
    EXPECT_OK(layer) << layer.status();
    return layer.ok() ? *std::move(layer) : nullptr;
  }

  // L = sum(y * r) for a fixed random r, so dL/dy = r. Checks dL/dparams and, for a float
  // input, dL/dx.
  void CheckLayer(Layer& layer, Tensor& x) {
    Backend& b = *backend_;
    Shape ys = layer.output_shape();
    ys.insert(ys.begin(), x.dim(0));
    auto y = b.Allocate(DType::kF32, ys);
    ASSERT_OK(y);
    const std::vector<float> r = RandomValues(y->numel(), 99);
    Tensor dy = MakeTensor(b, ys, r);
    const bool float_input = x.dtype() == DType::kF32;
    auto dx = b.Allocate(DType::kF32, x.shape());
    ASSERT_OK(dx);
    auto loss = [&]() {
      // Each pass draws the same dropout masks, so a layer with dropout is a fixed function.
      if (layer.has_random_stream()) layer.set_random_offset(0);
      EXPECT_OK(layer.Forward(x, &*y, Mode::kTrain));
      const std::vector<float> yv = ToHost(b, *y);
      double l = 0;
      for (size_t i = 0; i < yv.size(); ++i) l += static_cast<double>(yv[i]) * r[i];
      return l;
    };
    loss();
    for (Parameter* p : layer.parameters()) ASSERT_OK(b.Fill(&p->grad, 0));
    ASSERT_OK(layer.Backward(x, *y, dy, float_input ? &*dx : nullptr));
    const std::vector<float> dx_analytic = ToHost(b, *dx);

    auto check = [&](Tensor& t, const std::vector<float>& analytic, const std::string& what) {
      std::vector<float> v = ToHost(b, t);
      for (size_t i = 0; i < v.size(); ++i) {
        const float keep = v[i];
        v[i] = keep + kEps;
        ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &t));
        const double up = loss();
        v[i] = keep - kEps;
        ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &t));
        const double down = loss();
        v[i] = keep;
        ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &t));
        const double numeric = (up - down) / (2 * kEps);
        ASSERT_LT(RelativeError(analytic[i], numeric), kTolerance)
            << layer.type() << " " << what << "[" << i << "]: backward " << analytic[i]
            << " vs numeric " << numeric;
      }
    };
    if (float_input) check(x, dx_analytic, "input");
    for (Parameter* p : layer.parameters()) {
      const std::vector<float> g = ToHost(b, p->grad);
      check(p->value, g, p->name);
    }
  }

  // A tiny GPT's parameter gradients (TinyGptJson) against central differences, end to end.
  void CheckGptGradient(bool tied);

  // An int32 tensor of token ids.
  Tensor Ids(const Shape& shape, const std::vector<int32_t>& ids) {
    auto t = backend_->Allocate(DType::kI32, shape);
    EXPECT_OK(t);
    EXPECT_OK(backend_->CopyFromHost(ids.data(), ids.size() * sizeof(int32_t), &*t));
    return *t;
  }

  std::unique_ptr<Backend> backend_;
  Rng rng_{7};
};

// --- linear over positions ---------------------------------------------------------------------

TEST(SequenceShapes, LinearAppliesToTheLastDimensionOfASequence) {
  auto shapes = InferShapes({{5, 8}, {LinearConfig{8, 3}}});
  ASSERT_OK(shapes);
  EXPECT_EQ((*shapes)[1], (Shape{5, 3}));
  // The whole sample still wins where it is in_features: flat inputs and images as before.
  shapes = InferShapes({{5, 8}, {LinearConfig{40, 3}}});
  ASSERT_OK(shapes);
  EXPECT_EQ((*shapes)[1], (Shape{3}));
  shapes = InferShapes({{2, 3, 4}, {LinearConfig{24, 6}}});
  ASSERT_OK(shapes);
  EXPECT_EQ((*shapes)[1], (Shape{6}));
  shapes = InferShapes({{2, 3, 4}, {LinearConfig{4, 6}}});
  ASSERT_OK(shapes);
  EXPECT_EQ((*shapes)[1], (Shape{2, 3, 6}));
  EXPECT_EQ(ShapeError({{5, 8}, {LinearConfig{7, 3}}}),
            "layer 0 linear: in_features 7 but input is 5x8 = 40 (or per position 8)");
  EXPECT_EQ(ShapeError({{5}, {LinearConfig{7, 3}}}),
            "layer 0 linear: in_features 7 but input is 5");
}

TEST(SequenceShapes, ElementWiseLayersKeepASequenceShape) {
  for (const LayerConfig& layer :
       {LayerConfig{GeluConfig{}}, LayerConfig{DropoutConfig{0.1f}}, LayerConfig{ReluConfig{}}}) {
    auto shapes = InferShapes({{6, 4}, {layer}});
    ASSERT_OK(shapes);
    EXPECT_EQ((*shapes)[1], (Shape{6, 4})) << LayerTypeName(layer);
  }
  ModelConfig residual{{6, 4}, {LinearConfig{4, 4}, AddConfig{}}};
  residual.inputs = {{}, {"input", "0"}};
  auto shapes = InferShapes(residual);
  ASSERT_OK(shapes) << shapes.status();
  EXPECT_EQ((*shapes)[2], (Shape{6, 4}));
}

TEST_P(SequenceLayers, LinearOverPositions) {
  for (bool bias : {true, false}) {
    auto layer = Build(LinearConfig{4, 3, bias}, {5, 4});
    ASSERT_NE(layer, nullptr);
    EXPECT_EQ(layer->output_shape(), (Shape{5, 3}));
    Tensor x = MakeTensor(*backend_, {2, 5, 4}, RandomValues(40, 1));
    CheckLayer(*layer, x);
  }
}

TEST_P(SequenceLayers, GeluOverASequence) {
  auto layer = Build(GeluConfig{}, {3, 4});
  ASSERT_NE(layer, nullptr);
  Tensor x = MakeTensor(*backend_, {2, 3, 4}, RandomValues(24, 2));
  CheckLayer(*layer, x);
}

TEST_P(SequenceLayers, AddOverASequenceGivesEveryInputTheGradient) {
  Backend& b = *backend_;
  auto shapes_model = ModelConfig{{3, 4}, {GeluConfig{}, AddConfig{}}};
  shapes_model.inputs = {{}, {"input", "0"}};
  auto model = Model::Build(shapes_model, &b, 3);
  ASSERT_OK(model) << model.status();
  const std::vector<float> xv = RandomValues(24, 5);
  Tensor x = MakeTensor(b, {2, 3, 4}, xv);
  auto y = (*model)->Forward(x, Mode::kTrain);
  ASSERT_OK(y);
  const std::vector<float> yv = ToHost(b, **y);
  ASSERT_EQ(yv.size(), xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i];
    const double gelu = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    EXPECT_NEAR(yv[i], v + gelu, 1e-5) << i;
  }
}

// --- layernorm -------------------------------------------------------------------------------

TEST(SequenceShapes, LayerNormNormalisesTheLastDimensionOfAnyRank) {
  for (const Shape& in : {Shape{8}, Shape{5, 8}, Shape{2, 3, 8}}) {
    auto shapes = InferShapes({in, {LayerNormConfig{8}}});
    ASSERT_OK(shapes);
    EXPECT_EQ((*shapes)[1], in);
  }
  EXPECT_EQ(CountParameters({{5, 8}, {LayerNormConfig{8}}}), 16);
  EXPECT_EQ(CountParameters({{5, 8}, {LayerNormConfig{8, 1e-5, true, false}}}), 8);
  EXPECT_EQ(CountParameters({{5, 8}, {LayerNormConfig{8, 1e-5, false, true}}}), 0);
  EXPECT_EQ(
      ShapeError({{5, 8}, {LayerNormConfig{5}}}),
      "layer 0 layernorm: normalized_shape 5 but the input's last dimension is 8 (input 5x8)");
  EXPECT_EQ(ShapeError({{5, 8}, {LayerNormConfig{0}}}),
            "layer 0 layernorm: normalized_shape must be positive, got 0");
  EXPECT_EQ(ShapeError({{5, 8}, {LayerNormConfig{8, 0.0}}}),
            "layer 0 layernorm: eps must be > 0, got 0");
}

TEST(SequenceShapes, LayerNormJsonRoundTripsAndNamesBadFields) {
  auto config = ModelConfigFromJson(
      R"({"input_shape": [4, 6], "layers": [{"type": "layernorm", "normalized_shape": 6,
          "bias": false}]})");
  ASSERT_OK(config) << config.status();
  const auto* ln = std::get_if<LayerNormConfig>(&config->layers[0]);
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(ln->normalized_shape, 6);
  EXPECT_EQ(ln->eps, 1e-5);
  EXPECT_TRUE(ln->affine);
  EXPECT_FALSE(ln->bias);
  auto again = ModelConfigFromJson(ModelConfigToJson(*config));
  ASSERT_OK(again);
  EXPECT_EQ(ModelConfigToJson(*again), ModelConfigToJson(*config));
  auto bad = ModelConfigFromJson(
      R"({"input_shape": [6], "layers": [{"type": "layernorm", "normalized_shape": "6"}]})");
  EXPECT_EQ(bad.status().message(), "layer 0 layernorm: normalized_shape must be an integer");
}

TEST_P(SequenceLayers, LayerNorm) {
  for (const LayerNormConfig& c : {LayerNormConfig{6}, LayerNormConfig{6, 1e-5, true, false},
                                   LayerNormConfig{6, 1e-5, false, false}}) {
    auto layer = Build(c, {3, 6});
    ASSERT_NE(layer, nullptr);
    // Affine parameters away from their initial ones and zeros, so each one matters.
    for (Parameter* p : layer->parameters()) {
      const std::vector<float> v = RandomValues(p->value.numel(), 17, 0.5f, 1.5f);
      ASSERT_OK(backend_->CopyFromHost(v.data(), v.size() * 4, &p->value));
    }
    Tensor x = MakeTensor(*backend_, {2, 3, 6}, RandomValues(36, 3));
    CheckLayer(*layer, x);
  }
}

// --- embeddings ------------------------------------------------------------------------------

TEST(SequenceShapes, EmbeddingsShapesAndErrors) {
  auto shapes = InferShapes({{5}, {EmbeddingConfig{11, 4}, PositionEmbeddingConfig{8, 4}}});
  ASSERT_OK(shapes) << shapes.status();
  EXPECT_EQ((*shapes)[1], (Shape{5, 4}));
  EXPECT_EQ((*shapes)[2], (Shape{5, 4}));
  EXPECT_EQ(CountParameters({{5}, {EmbeddingConfig{11, 4}, PositionEmbeddingConfig{8, 4}}}),
            11 * 4 + 8 * 4);
  EXPECT_EQ(ShapeError({{5}, {EmbeddingConfig{0, 4}}}),
            "layer 0 embedding: num_embeddings must be positive, got 0");
  EXPECT_EQ(ShapeError({{5}, {EmbeddingConfig{11, 0}}}),
            "layer 0 embedding: embedding_dim must be positive, got 0");
  EXPECT_EQ(ShapeError({{5, 2}, {EmbeddingConfig{11, 4}}}),
            "layer 0 embedding: needs T token ids per sample but input is 5x2");
  EXPECT_EQ(ShapeError({{9}, {EmbeddingConfig{11, 4}, PositionEmbeddingConfig{8, 4}}}),
            "layer 1 position_embedding: sequence length 9 exceeds block_size 8");
  EXPECT_EQ(ShapeError({{5}, {EmbeddingConfig{11, 4}, PositionEmbeddingConfig{8, 3}}}),
            "layer 1 position_embedding: needs a (T, 3) input but input is 5x4");
}

TEST(SequenceShapes, OnlyEmbeddingsReadTokenIds) {
  // An embedding reads the model's input and nothing else.
  EXPECT_EQ(ShapeError({{5, 4}, {LinearConfig{4, 4}, EmbeddingConfig{11, 4}}}),
            "layer 1 embedding: reads token ids, so its input must be the model's input, not 0");
  // Nothing else reads the ids.
  ModelConfig both{{5}, {EmbeddingConfig{11, 5}, LinearConfig{5, 5}, AddConfig{}}};
  both.inputs = {{}, {"input"}, {"0", "1"}};
  EXPECT_EQ(ShapeError(both),
            "layer 1 linear: reads the model's input, which holds the token ids of layer 0 "
            "embedding; only an embedding may read them");
}

TEST(SequenceShapes, EmbeddingsJsonRoundTrips) {
  auto config = ModelConfigFromJson(R"({"input_shape": [6], "layers": [
      {"type": "embedding", "num_embeddings": 13, "embedding_dim": 8},
      {"type": "position_embedding", "block_size": 16, "embedding_dim": 8},
      {"type": "causal_self_attention", "n_head": 2, "n_embd": 8, "dropout": 0.25}]})");
  ASSERT_OK(config) << config.status();
  const auto* e = std::get_if<EmbeddingConfig>(&config->layers[0]);
  const auto* p = std::get_if<PositionEmbeddingConfig>(&config->layers[1]);
  const auto* a = std::get_if<CausalSelfAttentionConfig>(&config->layers[2]);
  ASSERT_TRUE(e != nullptr && p != nullptr && a != nullptr);
  EXPECT_EQ(e->num_embeddings, 13);
  EXPECT_EQ(p->block_size, 16);
  EXPECT_EQ(a->n_head, 2);
  EXPECT_TRUE(a->bias);
  EXPECT_EQ(a->dropout, 0.25f);
  auto again = ModelConfigFromJson(ModelConfigToJson(*config));
  ASSERT_OK(again);
  EXPECT_EQ(ModelConfigToJson(*again), ModelConfigToJson(*config));
  auto bad = ModelConfigFromJson(
      R"({"input_shape": [6], "layers": [{"type": "causal_self_attention", "n_head": 2.5}]})");
  EXPECT_EQ(bad.status().message(), "layer 0 causal_self_attention: n_head must be an integer");
}

TEST_P(SequenceLayers, EmbeddingLooksUpAndScattersItsGradient) {
  auto layer = Build(EmbeddingConfig{7, 3}, {5});
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->input_dtype(), DType::kI32);
  ASSERT_EQ(layer->parameters().size(), 1u);
  EXPECT_EQ(layer->parameters()[0]->name, "weight");
  // Repeated ids (3 three times) sum their rows' gradients.
  Tensor ids = Ids({2, 5}, {3, 0, 6, 3, 1, 2, 3, 5, 5, 0});
  CheckLayer(*layer, ids);
  const std::vector<float> table = ToHost(*backend_, layer->parameters()[0]->value);
  auto y = backend_->Allocate(DType::kF32, {2, 5, 3});
  ASSERT_OK(y);
  ASSERT_OK(layer->Forward(ids, &*y, Mode::kEval));
  const std::vector<float> yv = ToHost(*backend_, *y);
  EXPECT_EQ(yv[2 * 3 + 1], table[6 * 3 + 1]);
  EXPECT_EQ(yv[7 * 3 + 2], table[5 * 3 + 2]);
}

TEST_P(SequenceLayers, EmbeddingInitIsNormalWithStd002) {
  auto layer = Build(EmbeddingConfig{500, 40}, {5});
  ASSERT_NE(layer, nullptr);
  const std::vector<float> v = ToHost(*backend_, layer->parameters()[0]->value);
  double sum = 0, squares = 0;
  for (float x : v) {
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  const double mean = sum / v.size(), std = std::sqrt(squares / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std, 0.02, 0.001);
}

TEST_P(SequenceLayers, PositionEmbeddingAddsTheFirstRows) {
  auto layer = Build(PositionEmbeddingConfig{6, 3}, {4, 3});
  ASSERT_NE(layer, nullptr);
  Tensor x = MakeTensor(*backend_, {2, 4, 3}, RandomValues(24, 4));
  CheckLayer(*layer, x);
}

TEST_P(SequenceLayers, AModelReadsInt32TokenIdsAndRefusesFloats) {
  ModelConfig config{{4}, {EmbeddingConfig{9, 3}, PositionEmbeddingConfig{4, 3}}};
  auto model = Model::Build(config, backend_.get(), 1);
  ASSERT_OK(model) << model.status();
  Tensor ids = Ids({2, 4}, {1, 2, 3, 8, 0, 0, 7, 6});
  auto y = (*model)->Forward(ids, Mode::kTrain);
  ASSERT_OK(y) << y.status();
  EXPECT_EQ((*y)->shape(), (Shape{2, 4, 3}));
  Tensor dy = MakeTensor(*backend_, {2, 4, 3}, RandomValues(24, 6));
  EXPECT_OK((*model)->Backward(dy));
  Tensor floats = MakeTensor(*backend_, {2, 4}, RandomValues(8, 6));
  EXPECT_EQ((*model)->Forward(floats, Mode::kTrain).status().message(),
            "model input is F32 but layer 0 embedding reads I32 token ids");
  ModelConfig plain{{4}, {LinearConfig{4, 2}}};
  auto mlp = Model::Build(plain, backend_.get(), 1);
  ASSERT_OK(mlp);
  EXPECT_EQ((*mlp)->Forward(ids, Mode::kTrain).status().message(),
            "model input is I32 but layer 0 linear reads F32");
}

// --- causal self-attention ---------------------------------------------------------------------

TEST(SequenceShapes, AttentionShapesAndErrors) {
  auto shapes = InferShapes({{5, 8}, {CausalSelfAttentionConfig{2, 8}}});
  ASSERT_OK(shapes);
  EXPECT_EQ((*shapes)[1], (Shape{5, 8}));
  EXPECT_EQ(CountParameters({{5, 8}, {CausalSelfAttentionConfig{2, 8}}}), 4 * 64 + 4 * 8);
  EXPECT_EQ(CountParameters({{5, 8}, {CausalSelfAttentionConfig{2, 8, false}}}), 4 * 64);
  EXPECT_EQ(ShapeError({{5, 10}, {CausalSelfAttentionConfig{3, 10}}}),
            "layer 0 causal_self_attention: n_embd 10 is not a multiple of n_head 3");
  EXPECT_EQ(ShapeError({{5, 8}, {CausalSelfAttentionConfig{0, 8}}}),
            "layer 0 causal_self_attention: n_head must be positive, got 0");
  EXPECT_EQ(ShapeError({{5, 8}, {CausalSelfAttentionConfig{2, 0}}}),
            "layer 0 causal_self_attention: n_embd must be positive, got 0");
  EXPECT_EQ(ShapeError({{5, 8}, {CausalSelfAttentionConfig{2, 6}}}),
            "layer 0 causal_self_attention: needs a (T, 6) input but input is 5x8");
  EXPECT_EQ(ShapeError({{40}, {CausalSelfAttentionConfig{2, 8}}}),
            "layer 0 causal_self_attention: needs a (T, 8) input but input is 40");
  EXPECT_EQ(ShapeError({{5, 8}, {CausalSelfAttentionConfig{2, 8, true, 1.0f}}}),
            "layer 0 causal_self_attention: dropout must be in [0, 1), got 1");
}

// nanoGPT's CausalSelfAttention.forward in double on the host, from the layer's parameters:
// y (batch, T, C).
std::vector<double> AttentionLayerReference(const std::vector<float>& x, int batch, int t, int c,
                                            int heads, const std::vector<float>& wa,
                                            const std::vector<float>& ba,
                                            const std::vector<float>& wp,
                                            const std::vector<float>& bp) {
  const int hd = c / heads;
  std::vector<double> y(static_cast<size_t>(batch) * t * c);
  for (int n = 0; n < batch; ++n) {
    std::vector<double> qkv(static_cast<size_t>(t) * 3 * c), merged(static_cast<size_t>(t) * c);
    for (int i = 0; i < t; ++i) {
      for (int o = 0; o < 3 * c; ++o) {
        double v = ba.empty() ? 0 : ba[o];
        for (int k = 0; k < c; ++k) v += double{wa[o * c + k]} * x[(n * t + i) * c + k];
        qkv[i * 3 * c + o] = v;
      }
    }
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < t; ++i) {
        std::vector<double> w(i + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= i; ++j) {
          for (int e = 0; e < hd; ++e)
            w[j] += qkv[i * 3 * c + h * hd + e] * qkv[j * 3 * c + c + h * hd + e];
          w[j] /= std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, w[j]);
        }
        for (int j = 0; j <= i; ++j) sum += (w[j] = std::exp(w[j] - mx));
        for (int e = 0; e < hd; ++e) {
          double v = 0;
          for (int j = 0; j <= i; ++j) v += w[j] / sum * qkv[j * 3 * c + 2 * c + h * hd + e];
          merged[i * c + h * hd + e] = v;
        }
      }
    }
    for (int i = 0; i < t; ++i) {
      for (int o = 0; o < c; ++o) {
        double v = bp.empty() ? 0 : bp[o];
        for (int k = 0; k < c; ++k) v += double{wp[o * c + k]} * merged[i * c + k];
        y[(n * t + i) * c + o] = v;
      }
    }
  }
  return y;
}

TEST_P(SequenceLayers, AttentionForwardMatchesNanoGptsDefinition) {
  for (bool bias : {true, false}) {
    const int batch = 2, t = 5, c = 8, heads = 2;
    auto layer = Build(CausalSelfAttentionConfig{heads, c, bias}, {t, c});
    ASSERT_NE(layer, nullptr);
    std::vector<std::vector<float>> p;
    std::vector<std::string> names;
    for (Parameter* param : layer->parameters()) {
      p.push_back(ToHost(*backend_, param->value));
      names.push_back(param->name);
    }
    if (bias) {
      EXPECT_EQ(names, (std::vector<std::string>{"c_attn.weight", "c_attn.bias", "c_proj.weight",
                                                 "c_proj.bias"}));
    } else {
      EXPECT_EQ(names, (std::vector<std::string>{"c_attn.weight", "c_proj.weight"}));
      p = {p[0], {}, p[1], {}};
    }
    const std::vector<float> xv = RandomValues(batch * t * c, 8, -2, 2);
    Tensor x = MakeTensor(*backend_, {batch, t, c}, xv);
    auto y = backend_->Allocate(DType::kF32, {batch, t, c});
    ASSERT_OK(y);
    ASSERT_OK(layer->Forward(x, &*y, Mode::kTrain));
    const std::vector<float> yv = ToHost(*backend_, *y);
    const std::vector<double> want =
        AttentionLayerReference(xv, batch, t, c, heads, p[0], p[1], p[2], p[3]);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(yv[i], want[i], 1e-5) << i;
  }
}

TEST_P(SequenceLayers, AttentionMultiHeadWithBias) {
  auto layer = Build(CausalSelfAttentionConfig{2, 6}, {4, 6});
  ASSERT_NE(layer, nullptr);
  Tensor x = MakeTensor(*backend_, {2, 4, 6}, RandomValues(48, 9));
  CheckLayer(*layer, x);
}

TEST_P(SequenceLayers, AttentionOneHeadWithoutBias) {
  auto layer = Build(CausalSelfAttentionConfig{1, 4, false}, {3, 4});
  ASSERT_NE(layer, nullptr);
  Tensor x = MakeTensor(*backend_, {2, 3, 4}, RandomValues(24, 10));
  CheckLayer(*layer, x);
}

TEST_P(SequenceLayers, AttentionWithDropoutInTraining) {
  auto layer = Build(CausalSelfAttentionConfig{3, 6, true, 0.3f}, {4, 6});
  ASSERT_NE(layer, nullptr);
  EXPECT_TRUE(layer->has_random_stream());
  Tensor x = MakeTensor(*backend_, {2, 4, 6}, RandomValues(48, 12));
  CheckLayer(*layer, x);
  // Both dropouts drew: the weights' (2 x 3 x 4 x 4) and the output's (2 x 4 x 6).
  EXPECT_EQ(layer->random_offset(), 96u + 48u);
}

TEST_P(SequenceLayers, AttentionDropoutIsTheIdentityInEvaluation) {
  rng_ = Rng(3);
  auto dropping = Build(CausalSelfAttentionConfig{2, 6, true, 0.5f}, {4, 6});
  rng_ = Rng(3);
  auto plain = Build(CausalSelfAttentionConfig{2, 6, true, 0.0f}, {4, 6});
  ASSERT_TRUE(dropping != nullptr && plain != nullptr);
  Tensor x = MakeTensor(*backend_, {2, 4, 6}, RandomValues(48, 13));
  auto y1 = backend_->Allocate(DType::kF32, {2, 4, 6});
  auto y2 = backend_->Allocate(DType::kF32, {2, 4, 6});
  ASSERT_OK(dropping->Forward(x, &*y1, Mode::kEval));
  ASSERT_OK(plain->Forward(x, &*y2, Mode::kTrain));
  EXPECT_EQ(ToHost(*backend_, *y1), ToHost(*backend_, *y2));
  EXPECT_EQ(dropping->random_offset(), 0u);
}

// --- a whole GPT -------------------------------------------------------------------------------

// One transformer block of nanoGPT, as JSON layers: x + attn(ln_1(x)), then + mlp(ln_2(.)).
// Residual branches are graph nodes: an add names both its inputs.
std::string BlockJson(const std::string& h, const std::string& input, int d, int heads) {
  const std::string D = std::to_string(d), D4 = std::to_string(4 * d);
  return R"({"type": "layernorm", "normalized_shape": )" + D + R"(, "name": ")" + h + R"(.ln_1"},
    {"type": "causal_self_attention", "n_head": )" +
         std::to_string(heads) + R"(, "n_embd": )" + D + R"(, "name": ")" + h + R"(.attn"},
    {"type": "add", "inputs": [")" +
         input + R"(", ")" + h + R"(.attn"], "name": ")" + h +
         R"(.res_1"},
    {"type": "layernorm", "normalized_shape": )" +
         D + R"(, "name": ")" + h + R"(.ln_2"},
    {"type": "linear", "in_features": )" +
         D + R"(, "out_features": )" + D4 + R"(, "name": ")" + h + R"(.mlp.c_fc"},
    {"type": "gelu", "name": ")" +
         h + R"(.mlp.gelu"},
    {"type": "linear", "in_features": )" +
         D4 + R"(, "out_features": )" + D + R"(, "name": ")" + h + R"(.mlp.c_proj"},
    {"type": "add", "inputs": [")" +
         h + R"(.res_1", ")" + h + R"(.mlp.c_proj"], "name": ")" + h + R"(.res_2"})";
}

// A 2-layer character GPT: token and position embeddings, 2 blocks, ln_f, a linear to the vocab.
// With `tied`, lm_head's weight is wte's (nanoGPT's weight tying).
std::string TinyGptJson(int vocab, int t, int d, int heads, bool tied = false) {
  const std::string V = std::to_string(vocab), D = std::to_string(d);
  return R"({"input_shape": [)" + std::to_string(t) + R"(], "layers": [
    {"type": "embedding", "num_embeddings": )" +
         V + R"(, "embedding_dim": )" + D +
         R"(, "name": "wte"},
    {"type": "position_embedding", "block_size": )" +
         std::to_string(t) + R"(, "embedding_dim": )" + D + R"(, "name": "wpe"},
    )" + BlockJson("h.0", "wpe", d, heads) +
         ",\n" + BlockJson("h.1", "h.0.res_2", d, heads) +
         R"(,
    {"type": "layernorm", "normalized_shape": )" +
         D + R"(, "name": "ln_f"},
    {"type": "linear", "in_features": )" +
         D + R"(, "out_features": )" + V + R"(, "bias": false, )" +
         (tied ? R"("tie_weight": "wte", )" : "") + R"("name": "lm_head"}]})";
}

TEST_P(SequenceLayers, ATinyGptFromJsonHasNanoGptsShapesAndNames) {
  auto config = ModelConfigFromJson(TinyGptJson(7, 4, 8, 2));
  ASSERT_OK(config) << config.status();
  auto model = Model::Build(*config, backend_.get(), 5);
  ASSERT_OK(model) << model.status();
  EXPECT_EQ((*model)->output_shape(), (Shape{4, 7}));
  std::vector<std::string> names;
  for (const NamedParameter& p : (*model)->parameters()) names.push_back(p.name);
  EXPECT_EQ(names.front(), "wte.weight");
  EXPECT_EQ(names[1], "wpe.weight");
  EXPECT_EQ(names[4], "h.0.attn.c_attn.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  // nanoGPT's count for these sizes, lm_head untied (7 x 8 more than nanoGPT's tied one).
  const int64_t block = 2 * 16 + (3 * 64 + 24 + 64 + 8) + (8 * 32 + 32 + 32 * 8 + 8);
  EXPECT_EQ((*model)->parameter_count(), 7 * 8 + 4 * 8 + 2 * block + 16 + 7 * 8);
}

// Every parameter's gradient through the whole graph (the residual adds sum their branches'
// gradients) against central differences of L = sum(logits * r) in float32.
TEST_P(SequenceLayers, ATinyGptsGradientMatchesFiniteDifferencesEndToEnd) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "lm_head tied to wte" : "lm_head untied");
    CheckGptGradient(tied);
    if (HasFatalFailure()) return;
  }
}

// A tied lm_head has no weight of its own: wte.weight is listed once, and its gradient sums both
// of its uses.
TEST_P(SequenceLayers, ATiedLmHeadSharesTheTokenEmbedding) {
  auto untied = ModelConfigFromJson(TinyGptJson(7, 4, 8, 2));
  auto config = ModelConfigFromJson(TinyGptJson(7, 4, 8, 2, /*tied=*/true));
  ASSERT_TRUE(untied.ok() && config.ok()) << config.status();
  EXPECT_EQ(CountParameters(*config), CountParameters(*untied) - 7 * 8);
  auto again = ModelConfigFromJson(ModelConfigToJson(*config));
  ASSERT_OK(again);
  EXPECT_EQ(std::get<LinearConfig>(again->layers.back()).tie_weight, "wte");
  auto model = Model::Build(*config, backend_.get(), 5);
  ASSERT_OK(model) << model.status();
  std::vector<std::string> names;
  for (const NamedParameter& p : (*model)->parameters()) names.push_back(p.name);
  EXPECT_EQ(names.front(), "wte.weight");
  EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head.weight"), 0);
  EXPECT_EQ(names.back(), "ln_f.bias");
  int64_t listed = 0;
  for (const NamedParameter& p : (*model)->parameters()) listed += p.param->value.numel();
  EXPECT_EQ(listed, (*model)->parameter_count());
}

// A checkpoint holds the tied table once, and a model loaded from it gives the same logits.
TEST_P(SequenceLayers, ATiedGptCheckpointRoundTrips) {
  auto config = ModelConfigFromJson(TinyGptJson(7, 4, 8, 2, /*tied=*/true));
  ASSERT_OK(config) << config.status();
  auto saved = Model::Build(*config, backend_.get(), 5);
  auto loaded = Model::Build(*config, backend_.get(), 6);
  ASSERT_TRUE(saved.ok() && loaded.ok());
  testing::TempDir dir;
  const std::string path = dir.file("gpt.safetensors");
  ASSERT_OK(WriteCheckpoint(path, **saved, nullptr, TrainingPosition{}, PixelNorm{}));
  auto info = ReadCheckpointInfo(path);
  ASSERT_OK(info) << info.status();
  EXPECT_EQ(ModelConfigToJson(info->model), ModelConfigToJson(*config));
  ASSERT_OK(ReadCheckpoint(path, **loaded, nullptr, nullptr));
  Tensor ids = Ids({1, 4}, {6, 0, 3, 3});
  auto want = (*saved)->Forward(ids, Mode::kEval);
  ASSERT_OK(want);
  const std::vector<float> want_v = ToHost(*backend_, **want);
  auto got = (*loaded)->Forward(ids, Mode::kEval);
  ASSERT_OK(got);
  EXPECT_EQ(ToHost(*backend_, **got), want_v);
}

// nanoGPT's init: 2-D weights N(0, 0.02), the residual projections (*.c_proj.weight) N(0, 0.02 /
// sqrt(2 n_layer)), biases zero, layer norms' scales one; the rule survives the JSON round trip.
TEST_P(SequenceLayers, TheGpt2InitRuleDrawsNanoGptsWeights) {
  auto config = ModelConfigFromJson(TinyGptJson(64, 4, 32, 2));
  ASSERT_OK(config) << config.status();
  config->init = InitRule::kGpt2;
  auto again = ModelConfigFromJson(ModelConfigToJson(*config));
  ASSERT_OK(again) << again.status();
  EXPECT_EQ(again->init, InitRule::kGpt2);
  EXPECT_FALSE(ModelConfigFromJson(R"({"input_shape": [4], "init": "xavier", "layers": []})").ok());
  auto model = Model::Build(*config, backend_.get(), 5);
  ASSERT_OK(model) << model.status();
  auto stddev = [](const std::vector<float>& v) {
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double{x} * x;
    const double mean = sum / v.size();
    return std::sqrt(sq / v.size() - mean * mean);
  };
  int checked = 0;
  for (const NamedParameter& p : (*model)->parameters()) {
    SCOPED_TRACE(p.name);
    const std::vector<float> v = ToHost(*backend_, p.param->value);
    if (p.name.ends_with("bias")) {
      EXPECT_EQ(*std::max_element(v.begin(), v.end()), 0.0f);
      EXPECT_EQ(*std::min_element(v.begin(), v.end()), 0.0f);
    } else if (p.name.find("ln") != std::string::npos) {
      EXPECT_EQ(v, std::vector<float>(v.size(), 1.0f));
    } else {
      // 2 layers: the projections' std is 0.02 / sqrt(4) = 0.01. Loose: 1024+ draws.
      const double want = p.name.ends_with("c_proj.weight") ? 0.01 : 0.02;
      EXPECT_NEAR(stddev(v), want, want * 0.12);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 + 2 * 4 + 1);  // wte, wpe; per block c_attn, c_proj, c_fc, mlp.c_proj; lm_head
  // The same seed draws the same weights.
  auto twin = Model::Build(*config, backend_.get(), 5);
  ASSERT_OK(twin);
  EXPECT_EQ(ToHost(*backend_, (*twin)->parameters()[4].param->value),
            ToHost(*backend_, (*model)->parameters()[4].param->value));
}

TEST(SequenceShapes, TieWeightErrorsNameTheLinear) {
  ModelConfig c{{4}, {EmbeddingConfig{7, 8}, LinearConfig{8, 7, false, "nope"}}};
  c.names = {"wte", "lm_head"};
  EXPECT_EQ(ShapeError(c), "node lm_head: tie_weight names no node: nope");
  std::get<LinearConfig>(c.layers[1]).tie_weight = "lm_head";
  EXPECT_EQ(ShapeError(c), "node lm_head: tie_weight lm_head is not an embedding");
  c.layers[1] = LinearConfig{8, 6, false, "wte"};
  EXPECT_EQ(ShapeError(c), "node lm_head: tie_weight wte's table is 7x8 but the weight is 6x8");
}

void SequenceLayers::CheckGptGradient(bool tied) {
  Backend& b = *backend_;
  auto config = ModelConfigFromJson(TinyGptJson(5, 4, 8, 2, tied));
  ASSERT_OK(config) << config.status();
  auto built = Model::Build(*config, &b, 5);
  ASSERT_OK(built) << built.status();
  Model& model = **built;
  const int batch = 2;
  Tensor ids = Ids({batch, 4}, {1, 4, 4, 0, 3, 2, 1, 1});
  const std::vector<float> r = RandomValues(batch * 4 * 5, 99);
  Tensor dy = MakeTensor(b, {batch, 4, 5}, r);
  auto loss = [&]() {
    auto y = model.Forward(ids, Mode::kTrain);
    EXPECT_OK(y);
    const std::vector<float> yv = ToHost(b, **y);
    double l = 0;
    for (size_t i = 0; i < yv.size(); ++i) l += static_cast<double>(yv[i]) * r[i];
    return l;
  };
  loss();
  ASSERT_OK(model.ZeroGrad());
  ASSERT_OK(model.Backward(dy));
  for (const NamedParameter& p : model.parameters()) {
    const std::vector<float> analytic = ToHost(b, p.param->grad);
    std::vector<float> v = ToHost(b, p.param->value);
    // The embeddings' values are ~0.02 and ln_1 scales them up ~30 times: a step of 1e-2 would
    // leave the linear regime there; elsewhere float32 rounding needs the larger step.
    const bool embedding = p.name == "wte.weight" || p.name == "wpe.weight";
    const float kStep = embedding ? 1e-3f : kEps;
    for (size_t i = 0; i < v.size(); ++i) {
      const float keep = v[i];
      v[i] = keep + kStep;
      ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &p.param->value));
      const double up = loss();
      v[i] = keep - kStep;
      ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &p.param->value));
      const double down = loss();
      v[i] = keep;
      ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &p.param->value));
      const double numeric = (up - down) / (2 * kStep);
      // Relative, with an absolute floor for float32 rounding through ten layers.
      ASSERT_LE(std::abs(analytic[i] - numeric),
                kTolerance * std::max<double>(std::abs(analytic[i]), std::abs(numeric)) + 5e-4)
          << p.name << "[" << i << "]: backward " << analytic[i] << " vs numeric " << numeric;
    }
  }
}

// --- cross-entropy over every position -------------------------------------------------------

// Logits (B, T, V) against int32 targets (B, T): the mean over all B * T positions of
// -log softmax(logits)[target], as PyTorch's cross_entropy(logits.view(-1, V), y.view(-1)); its
// gradient (softmax - onehot) / (B * T); `correct` counts positions.
TEST_P(SequenceLayers, CrossEntropyAveragesOverEveryPosition) {
  Backend& b = *backend_;
  const int batch = 2, t = 3, vocab = 4;
  const std::vector<float> z = RandomValues(batch * t * vocab, 21, -2, 2);
  Tensor logits = MakeTensor(b, {batch, t, vocab}, z);
  const std::vector<int32_t> targets = {0, 3, 2, 1, 1, 3};
  Tensor labels = Ids({batch, t}, targets);
  auto scalar = b.Allocate(DType::kF32, {1});
  auto correct = b.Allocate(DType::kI32, {1});
  auto dz = b.Allocate(DType::kF32, {batch, t, vocab});
  ASSERT_TRUE(scalar.ok() && correct.ok() && dz.ok());
  Loss loss(LossKind::kCrossEntropy, &b);
  ASSERT_OK(loss.Compute(logits, labels, scalar->f32(), correct->i32(), &*dz));
  double want = 0;
  int want_correct = 0;
  std::vector<double> want_dz(z.size());
  for (int r = 0; r < batch * t; ++r) {
    double mx = -1e300, sum = 0;
    int argmax = 0;
    for (int v = 0; v < vocab; ++v) {
      if (z[r * vocab + v] > mx) mx = z[r * vocab + v], argmax = v;
    }
    for (int v = 0; v < vocab; ++v) sum += std::exp(z[r * vocab + v] - mx);
    want -= z[r * vocab + targets[r]] - mx - std::log(sum);
    want_correct += argmax == targets[r];
    for (int v = 0; v < vocab; ++v) {
      want_dz[r * vocab + v] =
          (std::exp(z[r * vocab + v] - mx) / sum - (v == targets[r])) / (batch * t);
    }
  }
  EXPECT_NEAR(ToHost(b, *scalar)[0], want / (batch * t), 1e-5);
  int32_t got_correct = 0;
  ASSERT_OK(b.CopyToHost(*correct, &got_correct, sizeof(got_correct)));
  EXPECT_EQ(got_correct, want_correct);
  const std::vector<float> got_dz = ToHost(b, *dz);
  for (size_t i = 0; i < got_dz.size(); ++i) EXPECT_NEAR(got_dz[i], want_dz[i], 1e-6) << i;
}

INSTANTIATE_TEST_SUITE_P(Devices, SequenceLayers, ::testing::Values("cpu", "cuda:0"),
                         testing::DeviceParamName);

}  // namespace
}  // namespace kiln
