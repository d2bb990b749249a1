#include "engine/sequence_model.h"

#include <algorithm>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model.h"
#include "engine/model_graph.h"

namespace kiln {

namespace {

constexpr char kWhatGenerationNeeds[] =
    "generation needs a sequence model (T int32 token ids in, read by an embedding; "
    "(T, vocab) logits out)";

}  // namespace

absl::StatusOr<SequenceModelShape> SequenceModelShapeOf(const ModelConfig& config) {
  KILN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, InferShapes(config));
  KILN_ASSIGN_OR_RETURN(ModelGraph graph, ResolveGraph(config));
  SequenceModelShape out;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const std::vector<int>& in = graph.inputs[i];
    const auto* embedding = std::get_if<EmbeddingConfig>(&config.layers[i]);
    if (embedding == nullptr || std::find(in.begin(), in.end(), 0) == in.end()) continue;
    out.token_ids = out.token_ids == 0 ? embedding->num_embeddings
                                       : std::min(out.token_ids, embedding->num_embeddings);
  }
  // InferShapes let only embeddings read ids, so a model with none reads floats.
  if (out.token_ids == 0 || config.input_shape.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(kWhatGenerationNeeds, "; this model takes ",
                                                   ShapeString(config.input_shape), " floats"));
  }
  out.context = config.input_shape[0];
  const Shape& last = shapes.back();
  if (last.size() != 2 || last[0] != out.context) {
    return absl::InvalidArgumentError(absl::StrCat(kWhatGenerationNeeds, "; this model gives ",
                                                   ShapeString(last), " for ", out.context,
                                                   " token ids"));
  }
  out.vocab = last[1];
  if (out.vocab > out.token_ids) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhatGenerationNeeds, "; this model gives ", out.vocab, " logits per position but embeds ",
        out.token_ids, " token ids, so a generated token could not be read back"));
  }
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const Shape& s = shapes[i + 1];
    if (s.size() < 2 || s[0] != out.context) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhatGenerationNeeds, "; ", NodeLabel(config, i), " gives ", ShapeString(s),
                       ", not a value per position (", out.context, "x...)"));
    }
  }
  return out;
}

}  // namespace kiln
