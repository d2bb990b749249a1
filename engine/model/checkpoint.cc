#include "engine/model/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/model/model_config_json.h"
#include "engine/model/safetensors.h"

namespace kiln {

namespace {

constexpr char kOptimizerPrefix[] = "optimizer.";
// Metadata names, written and read only here.
constexpr char kFormatKey[] = "format";
constexpr char kModelKey[] = "kiln.model";
constexpr char kNormKey[] = "kiln.norm";
constexpr char kVocabularyKey[] = "kiln.vocabulary";

// "scale,mean,std" with enough digits to read back the same floats, then for a per-channel
// normalisation ";m0,m1,...;s0,s1,..." and ";features" for float inputs (which readers of the
// scalar form refuse, rather than serve with the wrong statistics).
std::string PixelNormToString(const PixelNorm& n) {
  auto g9 = [](float v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    return std::string(buf);
  };
  std::string out = absl::StrCat(g9(n.scale), ",", g9(n.mean), ",", g9(n.std));
  if (!n.channel_mean.empty()) {
    auto join = [&](const std::vector<float>& v) {
      std::vector<std::string> parts;
      for (float x : v) parts.push_back(g9(x));
      return absl::StrJoin(parts, ",");
    };
    absl::StrAppend(&out, ";", join(n.channel_mean), ";", join(n.channel_std));
    if (n.input == NormInput::kFeatures) absl::StrAppend(&out, ";features");
  }
  return out;
}

absl::StatusOr<PixelNorm> PixelNormFromString(const std::string& path, const std::string& text) {
  std::vector<std::string> sections = absl::StrSplit(text, ';');
  std::vector<std::string> parts = absl::StrSplit(sections[0], ',');
  PixelNorm n;
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": normalisation \"", text,
                     "\" is not \"scale,mean,std[;means;stds]\" with every std > 0"));
  };
  if (parts.size() != 3 || !absl::SimpleAtof(parts[0], &n.scale) ||
      !absl::SimpleAtof(parts[1], &n.mean) || !absl::SimpleAtof(parts[2], &n.std) ||
      !(n.std > 0.0f) || sections.size() == 2 || sections.size() > 4 ||
      (sections.size() == 4 && sections[3] != "features")) {
    return bad();
  }
  if (sections.size() == 4) n.input = NormInput::kFeatures;
  if (sections.size() >= 3) {
    for (int k : {1, 2}) {
      std::vector<float>& dst = k == 1 ? n.channel_mean : n.channel_std;
      for (absl::string_view part : absl::StrSplit(sections[k], ',')) {
        float v = 0;
        if (!absl::SimpleAtof(part, &v)) return bad();
        dst.push_back(v);
      }
    }
    if (n.channel_mean.size() != n.channel_std.size() ||
        n.channel_mean.size() > static_cast<size_t>(kMaxNormChannels)) {
      return bad();
    }
    for (float v : n.channel_std) {
      if (!(v > 0.0f)) return bad();
    }
  }
  return n;
}

absl::StatusOr<HostTensor> ToHost(Backend* backend, const std::string& name, const Tensor& t) {
  std::vector<float> host(t.numel());
  KILN_RETURN_IF_ERROR(backend->CopyToHost(t, host.data(), host.size() * sizeof(float)));
  return HostTensorFromF32(name, host.data(), t.shape());
}

// A 0-dim I64 tensor, as PyTorch stores num_batches_tracked.
HostTensor I64Scalar(const std::string& name, int64_t value) {
  HostTensor t{name, SafetensorDType::kI64, {}, std::vector<uint8_t>(sizeof(value))};
  std::memcpy(t.bytes.data(), &value, sizeof(value));
  return t;
}

std::string JoinU64(const std::vector<uint64_t>& v) { return absl::StrJoin(v, ","); }

absl::StatusOr<std::vector<uint64_t>> SplitU64(const std::string& path, const std::string& key,
                                               const std::string& text) {
  std::vector<uint64_t> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    uint64_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::DataLossError(
          absl::StrCat(path, ": metadata ", key, " is not a list of integers"));
    }
    out.push_back(v);
  }
  return out;
}

// A required metadata entry parsed as a number.
template <typename T>
absl::Status GetNumber(const std::string& path, const std::map<std::string, std::string>& meta,
                       const std::string& key, T* out) {
  auto it = meta.find(key);
  if (it == meta.end()) {
    return absl::DataLossError(absl::StrCat(path, ": checkpoint metadata lacks ", key));
  }
  bool ok;
  if constexpr (std::is_floating_point_v<T>) {
    double d;
    ok = absl::SimpleAtod(it->second, &d);
    *out = static_cast<T>(d);
  } else {
    ok = absl::SimpleAtoi(it->second, out);
  }
  if (!ok) {
    return absl::DataLossError(absl::StrCat(path, ": checkpoint metadata ", key, " = \"",
                                            it->second, "\" is not a number"));
  }
  return absl::OkStatus();
}

// The tensor `name` with exactly `shape`, or an error naming both.
absl::StatusOr<const HostTensor*> Expect(const std::string& path, const SafetensorsContents& c,
                                         const std::string& name, const Shape& shape) {
  const HostTensor* t = c.Find(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor ", name));
  if (t->dtype != SafetensorDType::kF32 || t->shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor ", name, " is ", SafetensorDTypeName(t->dtype), " ",
                     ShapeString(t->shape), " but the model needs F32 ", ShapeString(shape)));
  }
  return t;
}

// The position entries of a checkpoint's metadata.
absl::StatusOr<TrainingPosition> ParsePosition(const std::string& path,
                                               const std::map<std::string, std::string>& meta) {
  TrainingPosition p;
  KILN_RETURN_IF_ERROR(GetNumber(path, meta, "epochs_done", &p.epochs_done));
  KILN_RETURN_IF_ERROR(GetNumber(path, meta, "step_in_epoch", &p.step_in_epoch));
  KILN_RETURN_IF_ERROR(GetNumber(path, meta, "global_step", &p.global_step));
  KILN_RETURN_IF_ERROR(GetNumber(path, meta, "epoch_loss_sum", &p.epoch_loss_sum));
  KILN_RETURN_IF_ERROR(GetNumber(path, meta, "epoch_seconds", &p.epoch_seconds));
  KILN_RETURN_IF_ERROR(GetNumber(path, meta, "epoch_correct", &p.epoch_correct));
  KILN_RETURN_IF_ERROR(GetNumber(path, meta, "epoch_samples", &p.epoch_samples));
  auto rng_text = meta.find("epoch_rng");
  KILN_ASSIGN_OR_RETURN(
      std::vector<uint64_t> rng,
      SplitU64(path, "epoch_rng", rng_text != meta.end() ? rng_text->second : ""));
  if (rng.size() != p.epoch_rng.size()) {
    return absl::DataLossError(absl::StrCat(path, ": metadata epoch_rng needs 4 integers"));
  }
  std::copy(rng.begin(), rng.end(), p.epoch_rng.begin());
  return p;
}

// Whether the file says it is a kiln checkpoint.
absl::Status CheckFormat(const std::string& path, const std::map<std::string, std::string>& meta) {
  auto fmt = meta.find(kFormatKey);
  if (fmt == meta.end() || fmt->second != kCheckpointFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a kiln checkpoint (metadata format is not ", kCheckpointFormat, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& path, Model& model, Optimizer* optimizer,
                             const TrainingPosition& p, const PixelNorm& norm,
                             const std::string& vocabulary) {
  Backend* backend = model.backend();
  std::vector<HostTensor> tensors;
  for (const NamedParameter& np : model.parameters()) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, ToHost(backend, np.name, np.param->value));
    tensors.push_back(std::move(t));
  }
  for (const NamedBuffer& nb : model.buffers()) {
    if (nb.buffer->kind == BufferKind::kI64Count) {
      tensors.push_back(I64Scalar(nb.name, nb.buffer->count));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(HostTensor t, ToHost(backend, nb.name, nb.buffer->value));
    tensors.push_back(std::move(t));
  }
  std::map<std::string, std::string> meta;
  meta[kNormKey] = PixelNormToString(norm);
  if (!vocabulary.empty()) meta[kVocabularyKey] = vocabulary;
  if (optimizer != nullptr) {
    for (const NamedState& s : optimizer->state()) {
      KILN_ASSIGN_OR_RETURN(HostTensor t, ToHost(backend, kOptimizerPrefix + s.name, *s.tensor));
      tensors.push_back(std::move(t));
    }
    meta["optimizer_steps"] = absl::StrCat(optimizer->steps());
  }
  meta[kFormatKey] = kCheckpointFormat;
  meta[kModelKey] = ModelConfigToJson(model.config());
  meta["epochs_done"] = absl::StrCat(p.epochs_done);
  meta["step_in_epoch"] = absl::StrCat(p.step_in_epoch);
  meta["global_step"] = absl::StrCat(p.global_step);
  meta["epoch_rng"] = JoinU64({p.epoch_rng.begin(), p.epoch_rng.end()});
  // %.17g round-trips a double exactly; absl::StrCat keeps only 6 digits.
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", p.epoch_loss_sum);
  meta["epoch_loss_sum"] = buf;
  std::snprintf(buf, sizeof(buf), "%.17g", p.epoch_seconds);
  meta["epoch_seconds"] = buf;
  meta["epoch_correct"] = absl::StrCat(p.epoch_correct);
  meta["epoch_samples"] = absl::StrCat(p.epoch_samples);
  meta["random_offsets"] = JoinU64(model.random_offsets());
  return WriteSafetensors(path, tensors, meta);
}

absl::StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(SafetensorsContents c, ReadSafetensors(path));
  return c.metadata;
}

absl::StatusOr<CheckpointInfo> ReadCheckpointInfo(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(SafetensorsContents c, ReadSafetensors(path));
  KILN_RETURN_IF_ERROR(CheckFormat(path, c.metadata));
  CheckpointInfo info;
  auto model = c.metadata.find(kModelKey);
  if (model == c.metadata.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": checkpoint has no ", kModelKey, " metadata"));
  }
  KILN_ASSIGN_OR_RETURN(info.model, ModelConfigFromJson(model->second));
  if (auto norm = c.metadata.find(kNormKey); norm != c.metadata.end()) {
    KILN_ASSIGN_OR_RETURN(info.norm, PixelNormFromString(path, norm->second));
  }
  KILN_ASSIGN_OR_RETURN(info.position, ParsePosition(path, c.metadata));
  if (auto v = c.metadata.find(kVocabularyKey); v != c.metadata.end()) info.vocabulary = v->second;
  return info;
}

absl::Status ReadCheckpoint(const std::string& path, Model& model, Optimizer* optimizer,
                            TrainingPosition* position) {
  KILN_ASSIGN_OR_RETURN(SafetensorsContents c, ReadSafetensors(path));
  KILN_RETURN_IF_ERROR(CheckFormat(path, c.metadata));
  // Validate everything first, so a mismatch changes nothing.
  std::vector<std::pair<const HostTensor*, Tensor*>> loads;
  for (const NamedParameter& np : model.parameters()) {
    KILN_ASSIGN_OR_RETURN(const HostTensor* t, Expect(path, c, np.name, np.param->value.shape()));
    loads.push_back({t, &np.param->value});
  }
  std::vector<std::pair<int64_t, int64_t*>> counts;
  for (const NamedBuffer& nb : model.buffers()) {
    if (nb.buffer->kind == BufferKind::kF32) {
      KILN_ASSIGN_OR_RETURN(const HostTensor* t,
                            Expect(path, c, nb.name, nb.buffer->value.shape()));
      loads.push_back({t, &nb.buffer->value});
      continue;
    }
    const HostTensor* t = c.Find(nb.name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor ", nb.name));
    }
    if (t->dtype != SafetensorDType::kI64 || !t->shape.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", nb.name, " is ", SafetensorDTypeName(t->dtype), " ",
                       ShapeString(t->shape), " but the model needs an I64 scalar"));
    }
    int64_t value;
    std::memcpy(&value, t->bytes.data(), sizeof(value));
    counts.push_back({value, &nb.buffer->count});
  }
  int64_t optimizer_steps = 0;
  if (optimizer != nullptr) {
    for (const NamedState& s : optimizer->state()) {
      KILN_ASSIGN_OR_RETURN(const HostTensor* t,
                            Expect(path, c, kOptimizerPrefix + s.name, s.tensor->shape()));
      loads.push_back({t, s.tensor});
    }
    KILN_RETURN_IF_ERROR(GetNumber(path, c.metadata, "optimizer_steps", &optimizer_steps));
  }
  TrainingPosition p;
  std::vector<uint64_t> offsets;
  if (position != nullptr) {
    KILN_ASSIGN_OR_RETURN(p, ParsePosition(path, c.metadata));
    KILN_ASSIGN_OR_RETURN(offsets, SplitU64(path, "random_offsets", c.metadata["random_offsets"]));
    if (offsets.size() != model.random_offsets().size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": checkpoint has ", offsets.size(),
                                                     " dropout streams, model has ",
                                                     model.random_offsets().size()));
    }
  }
  Backend* backend = model.backend();
  for (auto& [host, dev] : loads) {
    KILN_RETURN_IF_ERROR(backend->CopyFromHost(host->bytes.data(), host->bytes.size(), dev));
  }
  for (auto& [value, count] : counts) *count = value;
  if (optimizer != nullptr) optimizer->set_steps(optimizer_steps);
  if (position != nullptr) {
    KILN_RETURN_IF_ERROR(model.set_random_offsets(offsets));
    *position = p;
  }
  return absl::OkStatus();
}

}  // namespace kiln
