// kiln deploy, undeploy, models and predict: serving checkpoints over KServe v2, with Triton's
// model-repository extension for loading and unloading.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli_status.h"
#include "client/command_env.h"
#include "client/image_file.h"
#include "client/image_resize.h"
#include "client/job_ref.h"
#include "client/spec_file.h"
#include "client/table.h"
#include "common/status_macros.h"
#include "inference/grpc_service.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace kiln::client {
namespace {

using inference::GRPCInferenceService;

struct DeployOptions {
  std::string ref;
  std::string name;
  std::string version;
  std::string device;
  std::string precision;  // as --precision says it; empty: kilnd's default (fp32)
  int64_t max_batch = 0;
  int64_t max_delay_us = -1;
  std::string version_policy;
  bool follow = false;
};

inference::ModelRepositoryParameter StringParam(const std::string& s) {
  inference::ModelRepositoryParameter p;
  p.set_string_param(s);
  return p;
}

inference::ModelRepositoryParameter IntParam(int64_t v) {
  inference::ModelRepositoryParameter p;
  p.set_int64_param(v);
  return p;
}

// The "precision" parameter of `version` of `model` (empty: the default) as ModelMetadata says
// it, with the metadata in *metadata; empty when the call fails or kilnd does not say.
std::string MetadataPrecision(GRPCInferenceService::Stub& stub, Connection& c,
                              const std::string& model, const std::string& version,
                              inference::ModelMetadataResponse* metadata) {
  inference::ModelMetadataRequest request;
  request.set_name(model);
  request.set_version(version);
  auto context = c.NewContext();
  if (!stub.ModelMetadata(context.get(), request, metadata).ok()) return "";
  auto it = metadata->parameters().find("precision");
  return it == metadata->parameters().end() ? "" : it->second.string_param();
}

absl::Status Deploy(CommandEnv& env, const DeployOptions& o) {
  KILN_ASSIGN_OR_RETURN(CheckpointRef ref, ParseCheckpointRef(o.ref));
  std::string precision;  // as kilnd spells it; empty: its default
  if (!o.precision.empty()) {
    KILN_ASSIGN_OR_RETURN(v1::Precision p, ParsePrecisionFlag(o.precision, "--precision"));
    precision = PrecisionWord(p);
  }
  const std::string name = o.name.empty() ? ref.job_id : o.name;
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = GRPCInferenceService::NewStub(c->channel());
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(name);
  // What to load, in the JOB@CKPT form (see grpc_service.proto, RepositoryModelLoadRequest).
  auto& params = *request.mutable_parameters();
  params["checkpoint"] = StringParam(ref.ToString());
  if (o.max_batch > 0) params["max_batch_size"] = IntParam(o.max_batch);
  if (o.max_delay_us >= 0) params["max_queue_delay_us"] = IntParam(o.max_delay_us);
  if (!o.version.empty()) params["version"] = StringParam(o.version);
  if (!o.device.empty()) params["device"] = StringParam(o.device);
  if (!precision.empty()) params["precision"] = StringParam(precision);
  if (!o.version_policy.empty()) params["version_policy"] = StringParam(o.version_policy);
  if (o.follow) params["follow"] = StringParam("true");
  inference::RepositoryModelLoadResponse response;
  auto context = c->NewContext(absl::Minutes(5));
  grpc::Status status = stub->RepositoryModelLoad(context.get(), request, &response);
  if (!status.ok()) return ServerError(status);

  // Which versions are now there, for the user's record.
  inference::RepositoryIndexRequest index_request;
  inference::RepositoryIndexResponse index;
  auto index_context = c->NewContext();
  std::vector<std::string> versions;
  if (stub->RepositoryIndex(index_context.get(), index_request, &index).ok()) {
    for (const auto& m : index.models()) {
      if (m.name() == name && !m.version().empty()) versions.push_back(m.version());
    }
  }
  // What the loaded version computes in, as kilnd says (the default version when unnamed).
  inference::ModelMetadataResponse metadata;
  const std::string served = MetadataPrecision(*stub, *c, name, o.version, &metadata);
  if (env.json()) {
    nlohmann::json out = {{"model", name}, {"checkpoint", ref.ToString()}, {"versions", versions}};
    if (!served.empty()) out["precision"] = served;
    std::fprintf(env.out, "%s\n", out.dump(2).c_str());
  } else {
    // A language model takes token ids (INT64): it generates rather than predicts.
    const bool language = metadata.inputs_size() > 0 && metadata.inputs(0).datatype() == "INT64";
    std::fprintf(
        env.out, "deployed %s as model %s%s%s\n%s\n", ref.ToString().c_str(), name.c_str(),
        versions.empty() ? ""
                         : absl::StrCat(" (versions ", absl::StrJoin(versions, ", "), ")").c_str(),
        served.empty() ? "" : absl::StrCat(", precision ", served).c_str(),
        language ? absl::StrCat("generate with: kiln generate ", name, " PROMPT").c_str()
                 : absl::StrCat("predict with: kiln predict ", name, " IMAGE.png").c_str());
  }
  return absl::OkStatus();
}

absl::Status Undeploy(CommandEnv& env, const std::string& name, const std::string& version) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = GRPCInferenceService::NewStub(c->channel());
  inference::RepositoryModelUnloadRequest request;
  request.set_model_name(name);
  if (!version.empty()) (*request.mutable_parameters())["version"] = StringParam(version);
  inference::RepositoryModelUnloadResponse response;
  auto context = c->NewContext(absl::Minutes(1));
  grpc::Status status = stub->RepositoryModelUnload(context.get(), request, &response);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    std::fprintf(env.out, "%s\n",
                 nlohmann::json({{"model", name}, {"unloaded", true}}).dump(2).c_str());
  } else {
    std::fprintf(env.out, "undeployed model %s\n", name.c_str());
  }
  return absl::OkStatus();
}

absl::Status Models(CommandEnv& env) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = GRPCInferenceService::NewStub(c->channel());
  inference::RepositoryIndexResponse response;
  auto context = c->NewContext();
  grpc::Status status =
      stub->RepositoryIndex(context.get(), inference::RepositoryIndexRequest(), &response);
  if (!status.ok()) return ServerError(status);
  // What each loaded version computes in (ModelMetadata's "precision"); empty for the others.
  std::vector<std::string> precisions;
  for (const auto& m : response.models()) {
    inference::ModelMetadataResponse metadata;
    precisions.push_back(m.state() == "READY" && !m.version().empty()
                             ? MetadataPrecision(*stub, *c, m.name(), m.version(), &metadata)
                             : "");
  }
  if (env.json()) {
    nlohmann::json out = nlohmann::json::parse(MessageToJson(response, false));
    for (size_t i = 0; i < precisions.size(); ++i) {
      if (!precisions[i].empty()) out["models"][i]["precision"] = precisions[i];
    }
    std::fprintf(env.out, "%s\n", out.dump(2).c_str());
    return absl::OkStatus();
  }
  if (response.models().empty()) {
    std::fprintf(env.out, "no models; deploy one with: kiln deploy JOB\n");
    return absl::OkStatus();
  }
  Table table({"NAME", "VERSION", "STATE", "PRECISION", "REASON"});
  for (int i = 0; i < response.models_size(); ++i) {
    const auto& m = response.models(i);
    table.AddRow({m.name(), m.version(), m.state(), precisions[i], m.reason()});
  }
  table.Print(env.out);
  return absl::OkStatus();
}

struct PredictOptions {
  std::string model;
  std::vector<std::string> files;
  std::vector<int64_t> indices;
  std::string version;
  int top = 3;
  std::string label_column;  // CSV rows: the column to drop when a row has one value too many
  bool resize = false;       // image files: resized to the model's height and width
};

struct Sample {
  std::string label;  // "seven.png", "t10k-images-idx3-ubyte#12" or "rows.csv#3"
  Image image;
  std::vector<float> features;  // a CSV row, for models trained on a table
};

bool IsNumber(absl::string_view cell, float* v) {
  return absl::SimpleAtof(absl::StripAsciiWhitespace(cell), v) && std::isfinite(*v);
}

// The rows of a CSV file as feature vectors of `features` values: a row of one value more has
// its label column (`label_column`, default the last) dropped. A first row that is not all
// numbers is a header.
absl::Status LoadCsvRows(const std::string& path, int64_t features, const std::string& label_column,
                         std::vector<Sample>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return UsageError(absl::StrCat("cannot read ", path));
  std::string line;
  int64_t line_no = 0, skip = -1;
  bool first = true;
  std::vector<std::string> header;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<absl::string_view> cells = absl::StrSplit(line, ',');
    float v = 0;
    if (first) {
      first = false;
      bool is_header = false;
      for (absl::string_view c : cells) is_header = is_header || !IsNumber(c, &v);
      if (static_cast<int64_t>(cells.size()) == features + 1) {
        skip = static_cast<int64_t>(cells.size()) - 1;
        if (!label_column.empty()) {
          auto it = std::find_if(cells.begin(), cells.end(), [&](absl::string_view c) {
            return absl::StripAsciiWhitespace(c) == label_column;
          });
          if (is_header && it != cells.end()) {
            skip = it - cells.begin();
          } else if (!absl::SimpleAtoi(label_column, &skip) || skip < 0 || skip > features) {
            return UsageError(absl::StrCat(path, ": --label-column ", label_column,
                                           " is not a column of its header nor an index"));
          }
        }
      }
      if (is_header) continue;
    }
    const int64_t want = skip >= 0 ? features + 1 : features;
    if (static_cast<int64_t>(cells.size()) != want) {
      return UsageError(absl::StrCat(path, ": line ", line_no, " has ", cells.size(),
                                     " cells but the model takes ", features, " features",
                                     skip >= 0 ? " (plus the label column)" : ""));
    }
    Sample s;
    s.label = absl::StrCat(path, "#", line_no);
    for (int64_t i = 0; i < want; ++i) {
      if (i == skip) continue;
      if (!IsNumber(cells[i], &v)) {
        return UsageError(absl::StrCat(path, ": line ", line_no, ", column ", i + 1, ": \"",
                                       std::string(cells[i]), "\" is not a finite number"));
      }
      s.features.push_back(v);
    }
    out->push_back(std::move(s));
  }
  if (out->empty()) return UsageError(absl::StrCat(path, ": no rows"));
  return absl::OkStatus();
}

// The height and width of a model's image input ([H, W], [1, H, W] or [3, H, W]); false for
// other inputs (a flat [F] among them, whose picture size is not known).
bool ModelImageSize(const std::vector<int64_t>& shape, int* height, int* width) {
  const size_t n = shape.size();
  if (!(n == 2 || (n == 3 && (shape[0] == 1 || shape[0] == 3)))) return false;
  if (shape[n - 2] <= 0 || shape[n - 1] <= 0 || shape[n - 2] > kMaxImageSide ||
      shape[n - 1] > kMaxImageSide) {
    return false;
  }
  *height = static_cast<int>(shape[n - 2]);
  *width = static_cast<int>(shape[n - 1]);
  return true;
}

// The samples to send for a model whose samples are `sample_shape`: images (3 channels when it is
// [3, H, W]; with --resize brought to its size) or, for a [F] model given .csv files, table rows.
absl::StatusOr<std::vector<Sample>> LoadSamples(const PredictOptions& o,
                                                const std::vector<int64_t>& sample_shape) {
  std::vector<Sample> samples;
  const int channels = sample_shape.size() == 3 && sample_shape[0] == 3 ? 3 : 1;
  int height = 0, width = 0;
  if (o.resize && !ModelImageSize(sample_shape, &height, &width)) {
    return UsageError(absl::StrCat("--resize: model ", o.model, " takes ",
                                   absl::StrJoin(sample_shape, "x"),
                                   ", not images of [H, W] or [C, H, W]"));
  }
  for (const std::string& file : o.files) {
    if (absl::EndsWith(file, ".csv")) {
      if (sample_shape.size() != 1) {
        return UsageError(absl::StrCat(file, ": a table, but model ", o.model, " takes images of ",
                                       absl::StrJoin(sample_shape, "x")));
      }
      KILN_RETURN_IF_ERROR(LoadCsvRows(file, sample_shape[0], o.label_column, &samples));
      continue;
    }
    if (o.indices.empty()) {
      KILN_ASSIGN_OR_RETURN(Image image, ReadImageFile(file, channels));
      if (o.resize) image = ResizeImage(image, height, width);
      samples.push_back({file, std::move(image), {}});
      continue;
    }
    for (int64_t index : o.indices) {
      KILN_ASSIGN_OR_RETURN(Image image, absl::EndsWith(file, ".bin")
                                             ? ReadCifar10Image(file, index)
                                             : ReadIdxImage(file, index));
      samples.push_back({absl::StrCat(file, "#", index), std::move(image), {}});
    }
  }
  return samples;
}

// The floats of output `i`, from raw_output_contents or the typed contents.
std::vector<float> OutputFloats(const inference::ModelInferResponse& response, int i) {
  const auto& tensor = response.outputs(i);
  if (i < response.raw_output_contents_size()) {
    const std::string& raw = response.raw_output_contents(i);
    std::vector<float> values(raw.size() / sizeof(float));
    std::memcpy(values.data(), raw.data(), values.size() * sizeof(float));
    return values;
  }
  return {tensor.contents().fp32_contents().begin(), tensor.contents().fp32_contents().end()};
}

// A request's input: table rows as FP32 features or images as UINT8 pixels, one kind per request.
struct Payload {
  bool rows = false;
  std::string bytes;
};

// The samples packed for a model whose per-sample shape is `sample_shape`: a usage error naming
// the file where an image has another size, or where rows and images are mixed.
absl::StatusOr<Payload> PackSamples(const std::vector<Sample>& samples,
                                    const std::vector<int64_t>& sample_shape,
                                    const std::string& model) {
  const int64_t elements =
      std::accumulate(sample_shape.begin(), sample_shape.end(), int64_t{1},
                      [](int64_t a, int64_t b) { return a * std::max<int64_t>(b, 1); });
  Payload payload;
  payload.rows = !samples.empty() && !samples[0].features.empty();
  for (const Sample& s : samples) {
    if (payload.rows != !s.features.empty()) {
      return UsageError("tables and images cannot be sent in one request");
    }
    if (payload.rows) {
      payload.bytes.append(reinterpret_cast<const char*>(s.features.data()),
                           s.features.size() * sizeof(float));
      continue;
    }
    if (static_cast<int64_t>(s.image.pixels.size()) != elements) {
      int height = 0, width = 0;
      return UsageError(
          absl::StrFormat("%s is %dx%dx%d (%d values) but model %s takes %d per sample (%s); %s",
                          s.label, s.image.channels, s.image.height, s.image.width,
                          s.image.pixels.size(), model, elements, absl::StrJoin(sample_shape, "x"),
                          ModelImageSize(sample_shape, &height, &width)
                              ? "--resize brings pictures to the model's size"
                              : "MNIST models want 28x28 grayscale, CIFAR-10 ones 32x32 colour"));
    }
    payload.bytes.append(s.image.pixels.begin(), s.image.pixels.end());
  }
  return payload;
}

// Each sample's class, probability and runners-up (o.top of them), as a table or JSON.
void PrintPredictions(CommandEnv& env, const PredictOptions& o, const std::string& version,
                      const std::vector<Sample>& samples, const std::vector<float>& values,
                      size_t classes) {
  nlohmann::json predictions = nlohmann::json::array();
  Table table({"FILE", "CLASS", "PROBABILITY", "RUNNERS-UP"});
  for (size_t s = 0; s < samples.size(); ++s) {
    std::vector<int> order(classes);
    std::iota(order.begin(), order.end(), 0);
    const float* p = values.data() + s * classes;
    std::stable_sort(order.begin(), order.end(), [p](int a, int b) { return p[a] > p[b]; });
    const size_t top = std::min<size_t>(std::max(1, o.top), classes);
    nlohmann::json ranked = nlohmann::json::array();
    std::vector<std::string> runners;
    for (size_t k = 0; k < top; ++k) {
      ranked.push_back({{"class", order[k]}, {"probability", p[order[k]]}});
      if (k > 0) runners.push_back(absl::StrFormat("%d (%.2f%%)", order[k], 100.0 * p[order[k]]));
    }
    predictions.push_back({{"file", samples[s].label}, {"class", order[0]}, {"top", ranked}});
    table.AddRow({samples[s].label, absl::StrCat(order[0]),
                  absl::StrFormat("%.2f%%", 100.0 * p[order[0]]), absl::StrJoin(runners, "  ")});
  }
  if (env.json()) {
    nlohmann::json out = {{"model", o.model}, {"version", version}, {"predictions", predictions}};
    std::fprintf(env.out, "%s\n", out.dump(2).c_str());
  } else {
    table.Print(env.out);
  }
}

absl::Status Predict(CommandEnv& env, const PredictOptions& o) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = GRPCInferenceService::NewStub(c->channel());

  // The model's input: its name and per-sample shape (after the batch dimension).
  inference::ModelMetadataRequest meta_request;
  meta_request.set_name(o.model);
  meta_request.set_version(o.version);
  inference::ModelMetadataResponse metadata;
  auto meta_context = c->NewContext();
  grpc::Status status = stub->ModelMetadata(meta_context.get(), meta_request, &metadata);
  if (!status.ok()) return ServerError(status);
  if (metadata.inputs().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("model ", o.model, " declares no inputs"));
  }
  const auto& input = metadata.inputs(0);
  std::vector<int64_t> sample_shape(input.shape().begin() + std::min(1, input.shape_size()),
                                    input.shape().end());
  KILN_ASSIGN_OR_RETURN(std::vector<Sample> samples, LoadSamples(o, sample_shape));
  KILN_ASSIGN_OR_RETURN(Payload payload, PackSamples(samples, sample_shape, o.model));

  inference::ModelInferRequest request;
  request.set_model_name(o.model);
  request.set_model_version(o.version);
  auto* tensor = request.add_inputs();
  tensor->set_name(input.name().empty() ? "input" : input.name());
  tensor->set_datatype(payload.rows ? "FP32" : "UINT8");
  tensor->add_shape(static_cast<int64_t>(samples.size()));
  for (int64_t d : sample_shape) tensor->add_shape(d);
  request.add_raw_input_contents(std::move(payload.bytes));
  request.add_outputs()->set_name("probabilities");
  inference::ModelInferResponse response;
  auto context = c->NewContext(absl::Minutes(1));
  status = stub->ModelInfer(context.get(), request, &response);
  if (!status.ok()) return ServerError(status);

  int probs = -1;
  for (int i = 0; i < response.outputs_size(); ++i) {
    if (response.outputs(i).name() == "probabilities") probs = i;
  }
  if (probs < 0) return absl::DataLossError("the server's answer has no \"probabilities\" output");
  const std::vector<float> values = OutputFloats(response, probs);
  const size_t classes = samples.empty() ? 0 : values.size() / samples.size();
  if (classes == 0 || classes * samples.size() != values.size()) {
    return absl::DataLossError(absl::StrCat("\"probabilities\" holds ", values.size(),
                                            " values for ", samples.size(), " samples"));
  }

  PrintPredictions(env, o, response.model_version(), samples, values, classes);
  return absl::OkStatus();
}

}  // namespace

void AddServingCommands(CLI::App& app, CommandEnv& env, Action* action) {
  auto d = std::make_shared<DeployOptions>();
  CLI::App* dep = app.add_subcommand("deploy", "Serve a job's checkpoint as a model");
  dep->add_option("checkpoint", d->ref, "JOB, JOB@ID, JOB@best or JOB@latest (the default)")
      ->required();
  dep->add_option("--name", d->name, "Model name (default: the job id)");
  dep->add_option("--version", d->version,
                  "Version number (default: the model's next: 1, 2, 3, ...)");
  dep->add_option("--version-policy", d->version_policy,
                  "Which versions stay loaded: latest:N (default latest:3), all, specific:1,3");
  dep->add_flag("--follow", d->follow,
                "Load a new version whenever the job writes a checkpoint that JOB@latest or "
                "JOB@best then names");
  dep->add_option("--max-batch", d->max_batch, "Largest batch the dynamic batcher forms")
      ->check(CLI::PositiveNumber);
  dep->add_option("--max-delay-us", d->max_delay_us,
                  "Longest a request waits for a batch to fill, in microseconds")
      ->check(CLI::NonNegativeNumber);
  dep->add_option("--device", d->device, "Device to serve on: cpu, cuda:N or auto");
  dep->add_option("--precision", d->precision,
                  "What the version's GEMMs compute in: fp32 (default), tf32 or bf16 (inputs "
                  "rounded to bfloat16, float32 sums; answers close to fp32's)");
  dep->footer(
      "Examples:\n"
      "  kiln deploy job-3f9c2a1b7d04 --name digits\n"
      "  kiln deploy job-3f9c2a1b7d04@best --name digits --max-batch 64 --max-delay-us 200\n"
      "  kiln deploy job-3f9c2a1b7d04@best --name live --follow --version-policy latest:2\n"
      "  kiln deploy job-3f9c2a1b7d04@best --name digits --precision bf16\n"
      "  kiln predict digits seven.png");
  dep->callback([&env, action, d] { *action = [&env, d] { return Deploy(env, *d); }; });

  auto un_name = std::make_shared<std::string>();
  auto un_version = std::make_shared<std::string>();
  CLI::App* un = app.add_subcommand("undeploy", "Stop serving a model");
  un->add_option("name", *un_name, "Model name")->required();
  un->add_option("--version", *un_version, "Only this version");
  un->footer("Example:\n  kiln undeploy digits");
  un->callback([&env, action, un_name, un_version] {
    *action = [&env, un_name, un_version] { return Undeploy(env, *un_name, *un_version); };
  });

  CLI::App* m = app.add_subcommand("models", "List the models the server knows");
  m->footer("Example:\n  kiln models --output json");
  m->callback([&env, action] { *action = [&env] { return Models(env); }; });

  auto p = std::make_shared<PredictOptions>();
  CLI::App* pr =
      app.add_subcommand("predict", "Classify images or table rows with a deployed model");
  pr->add_option("model", p->model, "Model name")->required();
  pr->add_option("files", p->files,
                 "PNG, JPEG or PGM images (grayscale, or colour for a [3,H,W] model), IDX or "
                 "CIFAR-10 .bin files with --index, or .csv tables for a model trained on one")
      ->required();
  pr->add_option("--index", p->indices,
                 "Image numbers (0-based) to take from IDX or CIFAR-10 .bin files")
      ->delimiter(',');
  pr->add_option("--label-column", p->label_column,
                 "CSV: the label column to drop from rows that carry one (default: the last)");
  pr->add_flag("--resize", p->resize,
               "Resize pictures to the model's height and width (area average to shrink, "
               "bilinear to grow), as kiln upload --format folder --resize does");
  pr->add_option("--top", p->top, "Classes to show per image (default 3)")
      ->check(CLI::Range(1, 1000));
  pr->add_option("--version", p->version, "Model version (default: the latest)");
  pr->footer(
      "Examples:\n"
      "  kiln predict digits seven.png two.pgm\n"
      "  kiln predict digits data/mnist/t10k-images-idx3-ubyte --index 0,1,2\n"
      "  kiln predict cifar cat.png dog.jpg\n"
      "  kiln predict pets photo.jpg --resize\n"
      "  kiln predict cifar cifar-10-batches-bin/test_batch.bin --index 0,1\n"
      "  kiln predict iris rows.csv\n"
      "  kiln predict digits seven.png --output json | jq '.predictions[0].class'");
  pr->callback([&env, action, p] { *action = [&env, p] { return Predict(env, *p); }; });
}

}  // namespace kiln::client
