#include "engine/model/model_graph.h"

#include <algorithm>
#include <map>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"

namespace kiln {

namespace {

constexpr size_t kMaxNameLength = 128;

// Letters, digits, '_' and '.', with no empty segment between dots.
bool IsValidNodeName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  if (name.front() == '.' || name.back() == '.') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.';
    if (!ok || (c == '.' && name[i + 1] == '.')) return false;
  }
  return true;
}

bool TakesSeveralInputs(const LayerConfig& layer) {
  return std::visit([](const auto& c) { return kTakesSeveralInputs<std::decay_t<decltype(c)>>; },
                    layer);
}

// A name as messages show it: cut after kMaxNameLength characters, so that a hostile spec's
// megabyte of name is not echoed back.
std::string Shown(const std::string& name) {
  if (name.size() <= kMaxNameLength) return name;
  return absl::StrCat(name.substr(0, kMaxNameLength), "... (", name.size(), " characters)");
}

absl::Status NodeError(const ModelConfig& config, size_t i, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(NodeLabel(config, i), ": ", problem));
}

}  // namespace

std::string NodeLabel(const ModelConfig& config, size_t i) {
  if (i < config.names.size() && !config.names[i].empty()) {
    return absl::StrCat("node ", Shown(config.names[i]));
  }
  return absl::StrCat("layer ", i, " ", LayerTypeName(config.layers[i]));
}

std::string StateDictName(const std::string& node, const std::string& tensor) {
  return absl::StrCat(node, ".", tensor);
}

absl::StatusOr<ModelGraph> ResolveGraph(const ModelConfig& config) {
  const size_t n = config.layers.size();
  if (config.names.size() > n || config.inputs.size() > n) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", n, " layers but ",
                                                   config.names.size(), " names and ",
                                                   config.inputs.size(), " input lists"));
  }
  ModelGraph g;
  std::map<std::string, size_t> index;  // name -> node
  for (size_t i = 0; i < n; ++i) {
    const bool named = i < config.names.size() && !config.names[i].empty();
    const std::string name = NodeName(config, i);
    if (named) {
      if (!IsValidNodeName(name)) {
        return NodeError(config, i,
                         "a name is letters, digits, '_' and '.' (no empty part between dots), "
                         "at most 128 characters");
      }
      if (name == kModelInput) {
        return NodeError(config, i, "the name \"input\" is reserved for the model's input");
      }
      if (name == "optimizer" || name.rfind("optimizer.", 0) == 0) {
        return NodeError(config, i,
                         "names starting with \"optimizer\" are reserved for the optimizer's "
                         "state in checkpoints");
      }
    }
    auto [it, inserted] = index.emplace(name, i);
    if (!inserted) {
      return NodeError(config, i,
                       absl::StrCat("the name ", Shown(name), " is also layer ", it->second, "'s"));
    }
    g.names.push_back(name);
  }
  g.readers.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const std::vector<std::string>& written = NodeInputs(config, i);
    std::vector<int> values;
    if (written.empty()) {
      values.push_back(static_cast<int>(i));  // the previous node's output, or the model input
    } else if (written.size() > static_cast<size_t>(kMaxNodeInputs)) {
      return NodeError(
          config, i,
          absl::StrCat(written.size(), " inputs; at most ", kMaxNodeInputs, " are allowed"));
    }
    for (const std::string& in : written) {
      if (in == kModelInput) {
        values.push_back(0);
        continue;
      }
      auto it = index.find(in);
      if (it == index.end()) {
        return NodeError(config, i,
                         absl::StrCat("input ", Shown(in),
                                      " names no node (inputs name "
                                      "earlier nodes or \"input\")"));
      }
      if (it->second == i) {
        return NodeError(config, i,
                         absl::StrCat("input ", Shown(in),
                                      " is the node itself (inputs name "
                                      "earlier nodes, so the graph has no cycles)"));
      }
      if (it->second > i) {
        return NodeError(config, i,
                         absl::StrCat("input ", Shown(in), " is layer ", it->second,
                                      ", which comes later (inputs name earlier nodes, so the "
                                      "graph has no cycles)"));
      }
      values.push_back(static_cast<int>(it->second) + 1);
    }
    const bool several = TakesSeveralInputs(config.layers[i]);
    if (several && values.size() < 2) {
      return NodeError(config, i,
                       absl::StrCat(LayerTypeName(config.layers[i]),
                                    " needs at least 2 inputs, got ", values.size()));
    }
    if (!several && values.size() != 1) {
      return NodeError(
          config, i,
          absl::StrCat(LayerTypeName(config.layers[i]), " takes one input, got ", values.size()));
    }
    for (int v : values) ++g.readers[v];
    g.inputs.push_back(std::move(values));
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    if (g.readers[i + 1] == 0) {
      return NodeError(config, i,
                       "its output is not used (no later node reads it and only the last node's "
                       "output is the model's)");
    }
  }
  // Backward runs from the last node to the first: the first slot to reach a value writes its
  // gradient, every later one sums into it.
  g.sums_gradient.resize(n);
  std::vector<bool> written(n + 1, false);
  for (size_t i = n; i-- > 0;) {
    g.sums_gradient[i].assign(g.inputs[i].size(), false);
    for (size_t s = 0; s < g.inputs[i].size(); ++s) {
      const int v = g.inputs[i][s];
      if (v == 0) continue;
      g.sums_gradient[i][s] = written[v];
      written[v] = true;
    }
  }
  return g;
}

std::vector<int64_t> GradientScratchElements(const ModelGraph& graph,
                                             const std::vector<Shape>& shapes) {
  std::vector<int64_t> slots;
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    for (size_t s = 0; s < graph.inputs[i].size(); ++s) {
      if (!graph.sums_gradient[i][s]) continue;
      if (slots.size() <= s) slots.resize(s + 1, 0);
      slots[s] = std::max(slots[s], NumElements(shapes[graph.inputs[i][s]]));
    }
  }
  return slots;
}

}  // namespace kiln
