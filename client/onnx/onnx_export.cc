#include "client/onnx/onnx_export.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/onnx/onnx_graph_builder.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/model/model_graph.h"
#include "engine/model/sequence_model.h"
#include "engine/model/safetensors.h"

namespace kiln::client {
namespace {

using ::onnx::TensorProto;

// Emits one node's ops. Tensors are named after the node ("layer1.0.conv1"; the helpers of a
// several-op layer "gelu/erf"), the last node's output "logits" (or "probabilities").
class NodeEmitter {
 public:
  // `length` names the int64 [1] tensor holding the sequence length T ("" for models without
  // position embeddings or attention): position tables and the causal mask are sliced to it.
  NodeEmitter(const ModelConfig& config, const SafetensorsContents& weights,
              const std::vector<Shape>& shapes, const std::string& length, OnnxGraphBuilder& g)
      : config_(config), weights_(weights), shapes_(shapes), length_(length), g_(g) {}

  // Node i reads `inputs` (tensor names; `input_values` their InferShapes value numbers) and
  // writes `output`; returns the name of the tensor that holds its result.
  absl::StatusOr<std::string> Emit(size_t i, const std::vector<std::string>& inputs,
                                   const std::vector<int>& input_values,
                                   const std::string& output) {
    node_ = NodeName(config_, i);
    label_ = NodeLabel(config_, i);
    in_ = inputs;
    in_shape_ = shapes_[input_values[0]];
    out_ = output;
    return std::visit([this](const auto& c) { return Layer(c); }, config_.layers[i]);
  }

 private:
  absl::StatusOr<std::string> Layer(const LinearConfig& c) {
    std::string x = in_[0];
    // A tied weight is the embedding's table, one initializer under the embedding's name.
    const std::string weight = c.tie_weight.empty() ? StateDictName(node_, "weight")
                                                    : StateDictName(c.tie_weight, "weight");
    KILN_ASSIGN_OR_RETURN(std::string w, ParamNamed(weight, {c.out_features, c.in_features}));
    if (NumElements(in_shape_) != c.in_features) {  // over a sequence's positions, as kiln's
      std::string b;
      if (c.bias) {
        KILN_ASSIGN_OR_RETURN(b, Param("bias", {c.out_features}));
      }
      return LastDimLinear(x, w, b, node_, out_);
    }
    // kiln's linear reads any sample shape as a vector (PyTorch would need a Flatten first).
    if (in_shape_.size() > 1) x = Flatten(x, node_ + "/flatten");
    std::vector<std::string> args = {x, w};
    if (c.bias) {
      KILN_ASSIGN_OR_RETURN(std::string b, Param("bias", {c.out_features}));
      args.push_back(b);
    }
    SetAttribute(g_.AddNode("Gemm", node_, args, {out_}), "transB", int64_t{1});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const Conv2dConfig& c) {
    KILN_ASSIGN_OR_RETURN(
        std::string w, Param("weight", {c.out_channels, c.in_channels, c.KernelH(), c.KernelW()}));
    std::vector<std::string> args = {in_[0], w};
    if (c.bias) {
      KILN_ASSIGN_OR_RETURN(std::string b, Param("bias", {c.out_channels}));
      args.push_back(b);
    }
    ::onnx::NodeProto* n = g_.AddNode("Conv", node_, args, {out_});
    SetAttribute(n, "kernel_shape", std::vector<int64_t>{c.KernelH(), c.KernelW()});
    SetAttribute(n, "strides", std::vector<int64_t>{c.StrideH(), c.StrideW()});
    SetAttribute(n, "pads",
                 std::vector<int64_t>{c.PaddingH(), c.PaddingW(), c.PaddingH(), c.PaddingW()});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const MaxPool2dConfig& c) {
    // ONNX pads MaxPool with -inf, so padded positions never win, as in kiln.
    return Pool("MaxPool", c.kernel_size, c.stride, c.padding);
  }
  absl::StatusOr<std::string> Layer(const AvgPool2dConfig& c) {
    KILN_ASSIGN_OR_RETURN(std::string out, Pool("AveragePool", c.kernel_size, c.stride, c.padding));
    SetAttribute(LastNode(), "count_include_pad", int64_t{1});  // kiln counts padding as zeros
    return out;
  }
  absl::StatusOr<std::string> Layer(const AdaptiveAvgPool2dConfig& c) {
    if (c.output_h == 1 && c.output_w == 1) return Op("GlobalAveragePool");
    // InferShapes made sure the output divides the input: even windows, input / output apart.
    const int64_t kh = in_shape_[1] / c.output_h, kw = in_shape_[2] / c.output_w;
    ::onnx::NodeProto* n = g_.AddNode("AveragePool", node_, {in_[0]}, {out_});
    SetAttribute(n, "kernel_shape", std::vector<int64_t>{kh, kw});
    SetAttribute(n, "strides", std::vector<int64_t>{kh, kw});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const ReluConfig&) { return Op("Relu"); }
  absl::StatusOr<std::string> Layer(const TanhConfig&) { return Op("Tanh"); }
  absl::StatusOr<std::string> Layer(const SigmoidConfig&) { return Op("Sigmoid"); }
  absl::StatusOr<std::string> Layer(const LeakyReluConfig& c) {
    const std::string out = Op("LeakyRelu");
    SetAttribute(LastNode(), "alpha", c.negative_slope);
    return out;
  }
  absl::StatusOr<std::string> Layer(const SiluConfig&) {
    const std::string s = node_ + "/sigmoid";
    g_.AddNode("Sigmoid", s, {in_[0]}, {s});
    g_.AddNode("Mul", node_, {in_[0], s}, {out_});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const GeluConfig&) {
    // Exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))): opsets before 20 have no Gelu op.
    const std::string scaled = node_ + "/div", erf = node_ + "/erf", plus = node_ + "/add",
                      half = node_ + "/mul";
    g_.AddNode("Div", scaled, {in_[0], Constant("kiln.sqrt2", std::sqrt(2.0f))}, {scaled});
    g_.AddNode("Erf", erf, {scaled}, {erf});
    g_.AddNode("Add", plus, {erf, Constant("kiln.one", 1.0f)}, {plus});
    g_.AddNode("Mul", half, {in_[0], plus}, {half});
    g_.AddNode("Mul", node_, {half, Constant("kiln.half", 0.5f)}, {out_});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const FlattenConfig&) { return Flatten(in_[0], out_, node_); }
  absl::StatusOr<std::string> Layer(const DropoutConfig&) {
    // Identity at inference: the next node reads the input itself, unless this is the output.
    if (out_ == kOnnxLogits || out_ == kOnnxProbabilities) return Op("Identity");
    return in_[0];
  }
  absl::StatusOr<std::string> Layer(const SoftmaxConfig&) {
    // Opset 13's Softmax normalises along one axis, as kiln's over the last dimension.
    const std::string out = Op("Softmax");
    SetAttribute(LastNode(), "axis", int64_t{-1});
    return out;
  }
  absl::StatusOr<std::string> Layer(const BatchNorm2dConfig& c) { return BatchNorm(c); }
  absl::StatusOr<std::string> Layer(const BatchNorm1dConfig& c) { return BatchNorm(c); }
  absl::StatusOr<std::string> Layer(const AddConfig&) {
    std::string sum = in_[0];
    for (size_t k = 1; k < in_.size(); ++k) {
      const bool last = k + 1 == in_.size();
      const std::string name = last ? node_ : absl::StrCat(node_, "/sum", k);
      g_.AddNode("Add", name, {sum, in_[k]}, {last ? out_ : name});
      sum = last ? out_ : name;
    }
    return sum;
  }
  absl::StatusOr<std::string> Layer(const ConcatConfig&) {
    // kiln joins along the first per-sample dimension: axis 1 with the batch in front.
    SetAttribute(g_.AddNode("Concat", node_, in_, {out_}), "axis", int64_t{1});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const EmbeddingConfig& c) {
    // kiln's InferShapes lets only the model's input (int64 ids here) reach an embedding.
    KILN_ASSIGN_OR_RETURN(std::string w, Param("weight", {c.num_embeddings, c.embedding_dim}));
    SetAttribute(g_.AddNode("Gather", node_, {w, in_[0]}, {out_}), "axis", int64_t{0});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const PositionEmbeddingConfig& c) {
    KILN_ASSIGN_OR_RETURN(std::string w, Param("weight", {c.block_size, c.embedding_dim}));
    // The first T rows of the table, broadcast over the batch.
    const std::string rows = node_ + "/rows";
    g_.AddNode("Slice", rows, {w, ConstantI64({0}), length_, ConstantI64({0})}, {rows});
    g_.AddNode("Add", node_, {in_[0], rows}, {out_});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const LayerNormConfig& c) {
    if (in_shape_.empty() || in_shape_.back() != c.normalized_shape) {
      return absl::InvalidArgumentError(absl::StrCat(label_, ": normalized_shape ",
                                                     c.normalized_shape, " but input is ",
                                                     ShapeString(in_shape_)));
    }
    // Opset 13 has no LayerNormalization: (x - mean) / sqrt(var + eps) over the last dimension,
    // var the biased variance as PyTorch's, then the scale and shift.
    const std::string n = node_ + "/";
    AxisMean(in_[0], n + "mean");
    g_.AddNode("Sub", n + "centred", {in_[0], n + "mean"}, {n + "centred"});
    g_.AddNode("Mul", n + "square", {n + "centred", n + "centred"}, {n + "square"});
    AxisMean(n + "square", n + "var");
    const std::string eps = g_.AddInitializer(node_ + ".onnx_eps", {}, {static_cast<float>(c.eps)});
    g_.AddNode("Add", n + "var_eps", {n + "var", eps}, {n + "var_eps"});
    g_.AddNode("Sqrt", n + "std", {n + "var_eps"}, {n + "std"});
    std::string y = n + "normalized";
    const bool scale = c.affine, shift = c.affine && c.bias;
    g_.AddNode("Div", scale ? y : node_, {n + "centred", n + "std"}, {scale ? y : out_});
    if (!scale) return out_;
    KILN_ASSIGN_OR_RETURN(std::string gamma, Param("weight", {c.normalized_shape}));
    g_.AddNode("Mul", shift ? n + "scaled" : node_, {y, gamma}, {shift ? n + "scaled" : out_});
    if (!shift) return out_;
    KILN_ASSIGN_OR_RETURN(std::string beta, Param("bias", {c.normalized_shape}));
    g_.AddNode("Add", node_, {n + "scaled", beta}, {out_});
    return out_;
  }
  absl::StatusOr<std::string> Layer(const CausalSelfAttentionConfig& c);

  // A layer kind added to kiln without an ONNX form here.
  template <typename C>
  absl::StatusOr<std::string> Layer(const C& c) {
    return absl::UnimplementedError(absl::StrCat(
        label_, ": layer type ", LayerTypeName(LayerConfig(c)), " has no ONNX export"));
  }

  absl::StatusOr<std::string> BatchNorm(const BatchNormFields& c) {
    const int64_t f = c.num_features;
    std::string scale, bias;
    if (c.affine) {
      KILN_ASSIGN_OR_RETURN(scale, Param("weight", {f}));
      KILN_ASSIGN_OR_RETURN(bias, Param("bias", {f}));
    } else {  // without affine parameters, gamma 1 and beta 0
      scale = g_.AddInitializer(node_ + ".onnx_scale", {f}, std::vector<float>(f, 1.0f));
      bias = g_.AddInitializer(node_ + ".onnx_bias", {f}, std::vector<float>(f, 0.0f));
    }
    KILN_ASSIGN_OR_RETURN(std::string mean, Param("running_mean", {f}));
    KILN_ASSIGN_OR_RETURN(std::string var, Param("running_var", {f}));
    // Inference mode: the running statistics, as kiln's evaluation and serving use them.
    ::onnx::NodeProto* n =
        g_.AddNode("BatchNormalization", node_, {in_[0], scale, bias, mean, var}, {out_});
    SetAttribute(n, "epsilon", static_cast<float>(c.eps));
    return out_;
  }

  absl::StatusOr<std::string> Pool(const std::string& op, int64_t k, int64_t stride, int64_t pad) {
    const int64_t s = stride == 0 ? k : stride;  // stride 0 means the kernel, as in PyTorch
    ::onnx::NodeProto* n = g_.AddNode(op, node_, {in_[0]}, {out_});
    SetAttribute(n, "kernel_shape", std::vector<int64_t>{k, k});
    SetAttribute(n, "strides", std::vector<int64_t>{s, s});
    SetAttribute(n, "pads", std::vector<int64_t>{pad, pad, pad, pad});
    return out_;
  }

  // x [N, T, in] @ w^T (+ b) -> `out` [N, T, out]; w [out, in] as the state dict keeps it.
  std::string LastDimLinear(const std::string& x, const std::string& w, const std::string& b,
                            const std::string& name, const std::string& out) {
    const std::string wt = name + "/weight_t", product = b.empty() ? out : name + "/matmul";
    SetAttribute(g_.AddNode("Transpose", wt, {w}, {wt}), "perm", std::vector<int64_t>{1, 0});
    g_.AddNode("MatMul", b.empty() ? name : product, {x, wt}, {product});
    if (!b.empty()) g_.AddNode("Add", name, {product, b}, {out});
    return out;
  }
  // The mean over the last dimension, kept as a dimension of 1 (opset 13: axes an attribute).
  void AxisMean(const std::string& x, const std::string& out) {
    ::onnx::NodeProto* n = g_.AddNode("ReduceMean", out, {x}, {out});
    SetAttribute(n, "axes", std::vector<int64_t>{-1});
    SetAttribute(n, "keepdims", int64_t{1});
  }

  std::string Op(const std::string& op) {
    g_.AddNode(op, node_, {in_[0]}, {out_});
    return out_;
  }
  std::string Flatten(const std::string& x, const std::string& out, std::string name = "") {
    if (name.empty()) name = out;
    SetAttribute(g_.AddNode("Flatten", name, {x}, {out}), "axis", int64_t{1});
    return out;
  }
  ::onnx::NodeProto* LastNode() { return g_.last_node(); }

  // A scalar float constant shared by every node that uses it.
  std::string Constant(const std::string& name, float value) {
    if (constants_.insert(name).second) g_.AddInitializer(name, {}, {value});
    return name;
  }

  // An int64 constant [values.size()], shared by every node that uses the same values.
  std::string ConstantI64(const std::vector<int64_t>& values) {
    const std::string name = absl::StrCat("kiln.i64.", absl::StrJoin(values, "_"));
    if (constants_.insert(name).second) {
      g_.AddInitializerI64(name, {static_cast<int64_t>(values.size())}, values);
    }
    return name;
  }

  // The node's state-dict tensor `tensor` as an initializer of the same name, after checking
  // that the checkpoint holds it as F32 of `shape`.
  absl::StatusOr<std::string> Param(const std::string& tensor, const Shape& shape) {
    return ParamNamed(StateDictName(node_, tensor), shape);
  }
  // The checkpoint's tensor `name` as an initializer, added once however many nodes read it.
  absl::StatusOr<std::string> ParamNamed(const std::string& name, const Shape& shape) {
    if (params_.contains(name)) return name;
    const HostTensor* t = weights_.Find(name);
    if (t == nullptr) {
      return absl::DataLossError(absl::StrCat(label_, ": the checkpoint has no tensor ", name));
    }
    std::vector<float> values(NumElements(shape));
    KILN_RETURN_IF_ERROR(CopyF32(*t, shape, values.data()));
    params_.insert(name);
    return g_.AddInitializer(name, shape, values);
  }

  // The additive causal mask [T, T]: 0 on and below the diagonal, -inf above (a position attends
  // to itself and the past), sliced from one [block, block] constant.
  std::string CausalMask(int64_t block) {
    const std::string mask = "kiln.causal_mask/rows";
    if (params_.insert("kiln.causal_mask").second) {
      std::vector<float> m(block * block, 0.0f);
      for (int64_t i = 0; i < block; ++i) {
        for (int64_t j = i + 1; j < block; ++j) m[i * block + j] = -INFINITY;
      }
      g_.AddInitializer("kiln.causal_mask", {block, block}, m);
      const std::string both = "kiln.causal_mask/length";
      SetAttribute(g_.AddNode("Concat", both, {length_, length_}, {both}), "axis", int64_t{0});
      g_.AddNode("Slice", mask,
                 {"kiln.causal_mask", ConstantI64({0, 0}), both, ConstantI64({0, 1})}, {mask});
    }
    return mask;
  }

  const ModelConfig& config_;
  const SafetensorsContents& weights_;
  const std::vector<Shape>& shapes_;
  const std::string length_;
  OnnxGraphBuilder& g_;
  std::set<std::string> constants_, params_;
  std::string node_, label_, out_;
  std::vector<std::string> in_;
  Shape in_shape_;
};

// nanoGPT's CausalSelfAttention over x [N, T, d]: one projection to q, k, v, n_head heads of
// softmax(q k^T / sqrt(d / n_head) + mask) v, the heads joined and projected by c_proj. Dropout is
// the identity at inference.
absl::StatusOr<std::string> NodeEmitter::Layer(const CausalSelfAttentionConfig& c) {
  const int64_t d = c.n_embd, heads = c.n_head, hd = c.n_embd / c.n_head;
  const std::string n = node_ + "/";
  KILN_ASSIGN_OR_RETURN(std::string attn_w, Param("c_attn.weight", {3 * d, d}));
  KILN_ASSIGN_OR_RETURN(std::string proj_w, Param("c_proj.weight", {d, d}));
  std::string attn_b, proj_b;
  if (c.bias) {
    KILN_ASSIGN_OR_RETURN(attn_b, Param("c_attn.bias", {3 * d}));
    KILN_ASSIGN_OR_RETURN(proj_b, Param("c_proj.bias", {d}));
  }
  LastDimLinear(in_[0], attn_w, attn_b, n + "c_attn", n + "qkv");
  SetAttribute(g_.AddNode("Split", n + "split", {n + "qkv", ConstantI64({d, d, d})},
                          {n + "q", n + "k", n + "v"}),
               "axis", int64_t{2});
  // [N, T, d] -> [N, T, heads, hd] -> q, v [N, heads, T, hd]; k [N, heads, hd, T].
  for (const char* z : {"q", "k", "v"}) {
    const std::string split = n + z, four = split + "/heads", out = split + "/t";
    g_.AddNode("Reshape", four, {split, ConstantI64({0, 0, heads, hd})}, {four});
    const bool key = z[0] == 'k';
    SetAttribute(g_.AddNode("Transpose", out, {four}, {out}), "perm",
                 key ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 2, 1, 3});
  }
  g_.AddNode("MatMul", n + "scores", {n + "q/t", n + "k/t"}, {n + "scores"});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  g_.AddNode("Mul", n + "scaled",
             {n + "scores", Constant(absl::StrCat("kiln.attention_scale_", hd), scale)},
             {n + "scaled"});
  g_.AddNode("Add", n + "masked", {n + "scaled", CausalMask(in_shape_[0])}, {n + "masked"});
  SetAttribute(g_.AddNode("Softmax", n + "weights", {n + "masked"}, {n + "weights"}), "axis",
               int64_t{-1});
  g_.AddNode("MatMul", n + "context", {n + "weights", n + "v/t"}, {n + "context"});
  SetAttribute(g_.AddNode("Transpose", n + "joined", {n + "context"}, {n + "joined"}), "perm",
               std::vector<int64_t>{0, 2, 1, 3});
  g_.AddNode("Reshape", n + "merged", {n + "joined", ConstantI64({0, 0, d})}, {n + "merged"});
  return LastDimLinear(n + "merged", proj_w, proj_b, node_ + "/c_proj", out_);
}

// Whether a layer sizes itself by the sequence length T (the input's first sample dimension).
bool NeedsLength(const ModelConfig& config) {
  for (const LayerConfig& layer : config.layers) {
    if (std::holds_alternative<PositionEmbeddingConfig>(layer) ||
        std::holds_alternative<CausalSelfAttentionConfig>(layer)) {
      return true;
    }
  }
  return false;
}

// Adds the nodes from the graph input to the normalised model input; returns its name.
// Pixels: Cast to float, then (x * scale - mean) / std; features: (x - mean) / std.
absl::StatusOr<std::string> EmitNormalization(const PixelNorm& norm, const Shape& input_shape,
                                              OnnxGraphBuilder& g) {
  const int c = norm.channels();
  if (norm.channel_mean.size() != norm.channel_std.size()) {
    return absl::DataLossError("kiln.norm: channel means and stds differ in number");
  }
  // Constants broadcast over the batch: scalars, or one value per channel (the first
  // per-sample dimension) shaped [1, C, 1, ...].
  std::vector<int64_t> dims;
  if (c > 1) {
    if (input_shape.empty() || input_shape[0] != c) {
      return absl::UnimplementedError(absl::StrCat(
          "kiln.norm: ", c, " channels do not match the input shape ", ShapeString(input_shape),
          " (its first dimension), which ONNX broadcasting needs"));
    }
    dims.assign(input_shape.size() + 1, 1);
    dims[1] = c;
  }
  std::vector<float> mean(c), std(c);
  for (int i = 0; i < c; ++i) {
    mean[i] = norm.channel_mean.empty() ? norm.mean : norm.channel_mean[i];
    std[i] = norm.channel_std.empty() ? norm.std : norm.channel_std[i];
  }
  std::string x = kOnnxInput;
  if (norm.input == NormInput::kPixels) {
    SetAttribute(g.AddNode("Cast", "input/cast", {x}, {"input/float"}), "to",
                 int64_t{TensorProto::FLOAT});
    x = "input/float";
  }
  if (norm.scale != 1.0f) {
    g.AddNode("Mul", "input/scale", {x, g.AddInitializer("kiln.norm.scale", {}, {norm.scale})},
              {"input/scaled"});
    x = "input/scaled";
  }
  g.AddNode("Sub", "input/sub_mean", {x, g.AddInitializer("kiln.norm.mean", dims, mean)},
            {"input/centred"});
  g.AddNode("Div", "input/div_std", {"input/centred", g.AddInitializer("kiln.norm.std", dims, std)},
            {"input/normalized"});
  return std::string("input/normalized");
}

std::vector<int64_t> Dims(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

}  // namespace

absl::StatusOr<::onnx::ModelProto> CheckpointToOnnx(const std::string& checkpoint_path) {
  KILN_ASSIGN_OR_RETURN(CheckpointInfo info, ReadCheckpointInfo(checkpoint_path));
  KILN_ASSIGN_OR_RETURN(SafetensorsContents weights, ReadSafetensors(checkpoint_path));
  using Metadata = std::map<std::string, std::string>;
  KILN_ASSIGN_OR_RETURN(Metadata metadata, ReadCheckpointMetadata(checkpoint_path));
  const ModelConfig& config = info.model;
  KILN_ASSIGN_OR_RETURN(ModelGraph graph, ResolveGraph(config));
  KILN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, InferShapes(config));
  if (config.layers.empty()) return absl::InvalidArgumentError("the model has no layers");

  ::onnx::ModelProto model;
  model.set_ir_version(7);  // the IR version of opset 13
  model.set_producer_name("kiln");
  model.set_doc_string(
      "Exported by kiln from a checkpoint. The input normalisation (kiln.norm) is folded in: "
      "feed raw pixel values 0..255 (UINT8) or, for table models, raw feature values (FLOAT).");
  ::onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  // What the checkpoint says of the model and its normalisation, for readers of the file.
  for (const char* key : {"kiln.model", "kiln.norm"}) {
    if (auto it = metadata.find(key); it != metadata.end()) {
      ::onnx::StringStringEntryProto* p = model.add_metadata_props();
      p->set_key(key);
      p->set_value(it->second);
    }
  }
  ::onnx::GraphProto* onnx_graph = model.mutable_graph();
  onnx_graph->set_name("kiln");
  OnnxGraphBuilder g(onnx_graph);

  // Tensor names per value (0 the model input, i + 1 node i's output).
  std::vector<std::string> values(config.layers.size() + 1);
  // A token model takes int64 ids [N, T], T any length up to the block size; its length tensor
  // sizes the position table and the causal mask.
  const bool tokens = ReadsTokenIds(config);
  const std::string length_param = tokens ? kOnnxLength : "";
  if (tokens) {
    g.AddInput(kOnnxInput, TensorProto::INT64, Dims(config.input_shape), length_param);
    values[0] = kOnnxInput;
  } else {
    const bool pixels = info.norm.input == NormInput::kPixels;
    g.AddInput(kOnnxInput, pixels ? TensorProto::UINT8 : TensorProto::FLOAT,
               Dims(config.input_shape));
    KILN_ASSIGN_OR_RETURN(values[0], EmitNormalization(info.norm, config.input_shape, g));
  }
  std::string length;  // int64 [1]: T, the input's dimension after the batch
  if (NeedsLength(config)) {
    length = "input/length";
    g.AddNode("Shape", "input/shape", {kOnnxInput}, {"input/shape"});
    g.AddNode("Slice", length,
              {"input/shape", g.AddInitializerI64("kiln.input_length_start", {1}, {1}),
               g.AddInitializerI64("kiln.input_length_end", {1}, {2})},
              {length});
  }

  const size_t last = config.layers.size() - 1;
  const bool ends_in_softmax = std::holds_alternative<SoftmaxConfig>(config.layers[last]);
  NodeEmitter emitter(config, weights, shapes, length, g);
  for (size_t i = 0; i < config.layers.size(); ++i) {
    std::vector<std::string> inputs;
    for (int v : graph.inputs[i]) inputs.push_back(values[v]);
    std::string output = NodeName(config, i);
    // A node named as a graph output keeps its own tensor apart from it.
    if (output == kOnnxLogits || output == kOnnxProbabilities) output += "/out";
    if (i == last) output = ends_in_softmax ? kOnnxProbabilities : kOnnxLogits;
    KILN_ASSIGN_OR_RETURN(values[i + 1], emitter.Emit(i, inputs, graph.inputs[i], output));
  }
  const std::vector<int64_t> out_dims = Dims(shapes.back());
  if (!ends_in_softmax) {
    g.AddOutput(kOnnxLogits, TensorProto::FLOAT, out_dims, length_param);
    SetAttribute(g.AddNode("Softmax", kOnnxProbabilities, {kOnnxLogits}, {kOnnxProbabilities}),
                 "axis", int64_t{-1});
  }
  g.AddOutput(kOnnxProbabilities, TensorProto::FLOAT, out_dims, length_param);
  return model;
}

absl::Status ExportOnnx(const std::string& checkpoint_path, const std::string& onnx_path) {
  KILN_ASSIGN_OR_RETURN(::onnx::ModelProto model, CheckpointToOnnx(checkpoint_path));
  std::string bytes;
  if (!model.SerializeToString(&bytes)) {
    return absl::InternalError("the ONNX model did not serialise (over 2 GiB?)");
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> file, AtomicFileWriter::Open(onnx_path));
  KILN_RETURN_IF_ERROR(file->Append(bytes));
  return file->Commit();
}

}  // namespace kiln::client
