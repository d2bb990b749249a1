#include "engine/model/sequence_model.h"

#include <algorithm>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/model.h"
#include "engine/model/model_graph.h"

namespace kiln {

namespace {

constexpr char kWhatGenerationNeeds[] =
    "a sequence model reads T int32 token ids (an embedding reads the input) and gives (T, vocab) "
    "logits";

// The ids the embeddings reading the model's input take, [0, n): the smallest table's; 0 when no
// embedding reads it.
int64_t EmbeddedTokenIds(const ModelConfig& config, const ModelGraph& graph) {
  int64_t ids = 0;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const std::vector<int>& in = graph.inputs[i];
    const auto* embedding = std::get_if<EmbeddingConfig>(&config.layers[i]);
    if (embedding == nullptr || std::find(in.begin(), in.end(), 0) == in.end()) continue;
    ids = ids == 0 ? embedding->num_embeddings : std::min(ids, embedding->num_embeddings);
  }
  return ids;
}

}  // namespace

bool ReadsTokenIds(const ModelConfig& config) {
  absl::StatusOr<ModelGraph> graph = ResolveGraph(config);
  return graph.ok() && EmbeddedTokenIds(config, *graph) > 0;
}

absl::Status CheckModelFitsTokens(const ModelConfig& config, int64_t vocab_size,
                                  std::string_view which_view) {
  const std::string which(which_view);  // Debian's Abseil: StrCat takes no std::string_view
  absl::StatusOr<SequenceModelShape> shape = SequenceModelShapeOf(config);
  if (!shape.ok()) {
    return absl::Status(shape.status().code(), absl::StrCat(which, " holds token ids: ",
                                                            shape.status().message()));
  }
  if (vocab_size > shape->vocab) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", shape->vocab,
                                                   " logits per position but ", which,
                                                   " has a vocabulary of ", vocab_size, " tokens"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SequenceModelShape> SequenceModelShapeOf(const ModelConfig& config) {
  KILN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, InferShapes(config));
  KILN_ASSIGN_OR_RETURN(ModelGraph graph, ResolveGraph(config));
  SequenceModelShape out;
  out.token_ids = EmbeddedTokenIds(config, graph);
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
