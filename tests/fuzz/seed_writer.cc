// Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/) with kiln's own code:
// IDX files raw and gzipped, safetensors files by WriteSafetensors, JobSpecs and
// ModelInferRequests serialised by protobuf. Every seed is checked to be accepted by the code
// its target fuzzes, so the fuzzers start from real, valid inputs.
//
// Usage: fuzz_seed_writer OUT_DIR   (scripts/fuzz --write-seeds runs it on tests/fuzz/corpus)
#include <google/protobuf/text_format.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/data/idx_reader.h"
#include "engine/model/safetensors.h"
#include "inference/grpc_service.pb.h"
#include "kiln/v1/model_spec.pb.h"
#include "server/jobs/spec_translation.h"
#include "server/serving/tensor_codec.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

absl::Status WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat(path.string(), ": cannot write"));
  return absl::OkStatus();
}

// IDX bytes of unsigned bytes: magic 00 00 08 rank, big-endian dims, then a ramp of pixels.
std::string Idx(const std::vector<uint32_t>& dims) {
  std::string s = {'\0', '\0', '\x08', static_cast<char>(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((d >> shift) & 0xff);
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) s += static_cast<char>(i * 37 % 256);
  return s;
}

absl::Status WriteIdxSeeds(const fs::path& dir) {
  const std::map<std::string, std::string> files = {
      {"labels-5.idx", Idx({5})},
      {"images-3x4x4.idx", Idx({3, 4, 4})},
      {"rank4-2x1x2x3.idx", Idx({2, 1, 2, 3})},
  };
  for (const auto& [name, bytes] : files) {
    if (absl::Status s = WriteFile(dir / name, bytes); !s.ok()) return s;
  }
  // gzip by zlib's own file writer, as `gzip` would.
  const std::string gz_path = (dir / "images-2x3x3.idx.gz").string();
  const std::string raw = Idx({2, 3, 3});
  gzFile gz = gzopen(gz_path.c_str(), "wb9");
  if (gz == nullptr) return absl::UnavailableError(absl::StrCat(gz_path, ": cannot open"));
  const int wrote = gzwrite(gz, raw.data(), static_cast<unsigned>(raw.size()));
  if (gzclose(gz) != Z_OK || wrote != static_cast<int>(raw.size())) {
    return absl::UnavailableError(absl::StrCat(gz_path, ": cannot write"));
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    absl::StatusOr<IdxArray> read = ReadIdxFile(entry.path().string());
    if (!read.ok()) return read.status();
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensorsSeeds(const fs::path& dir) {
  // A checkpoint's shape: weights, optimizer state, counters and the metadata strings.
  std::vector<float> weight(12), bias(3);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.5f * static_cast<float>(i);
  HostTensor pixels{"pixels", SafetensorDType::kU8, {2, 2}, {0, 127, 128, 255}};
  HostTensor labels{"labels", SafetensorDType::kI32, {2}, {1, 0, 0, 0, 9, 0, 0, 0}};
  const std::vector<HostTensor> tensors = {
      HostTensorFromF32("0.weight", weight.data(), {3, 4}),
      HostTensorFromF32("0.bias", bias.data(), {3}),
      HostTensorFromF32("optimizer.0.weight.exp_avg", weight.data(), {3, 4}),
      HostTensorFromF32("empty", nullptr, {0, 4}),
      HostTensorFromF32("scalar", bias.data(), {}),
      HostTensorFromI64("steps", {7, -1}),
      HostTensorFromU64("rng", {1, 2, 3, 0xffffffffffffffffull}),
      pixels,
      labels,
  };
  const std::map<std::string, std::string> metadata = {
      {"format", "kiln-checkpoint-1"},
      {"kiln.model",
       R"({"input_shape":[4],"layers":[{"type":"linear","in_features":4,"out_features":3}]})"},
      {"epochs_done", "1"},
      {"epoch_rng", "1,2,3,4"},
      {"note", "caf\xc3\xa9 \xe2\x9c\x93"},  // UTF-8 beyond ASCII
  };
  const std::map<std::string, std::vector<HostTensor>> files = {
      {"checkpoint.safetensors", tensors},
      {"weights-only.safetensors", {tensors[0], tensors[1]}},
      {"empty.safetensors", {}},
  };
  for (const auto& [name, contents] : files) {
    const std::string path = (dir / name).string();
    const auto& meta =
        name == "checkpoint.safetensors" ? metadata : std::map<std::string, std::string>{};
    if (absl::Status s = WriteSafetensors(path, contents, meta); !s.ok()) return s;
    absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
    if (!read.ok()) return read.status();
  }
  return absl::OkStatus();
}

// Each preset, a preset with overrides, and custom models using every layer type.
constexpr const char* kJobSpecs[][2] = {
    {"preset-mnist-mlp", R"pb(preset: "mnist-mlp" dataset: "mnist" epochs: 1)pb"},
    {"preset-mnist-cnn", R"pb(preset: "mnist-cnn" dataset: "mnist" epochs: 2 seed: 7)pb"},
    {"preset-overridden", R"pb(
       preset: "mnist-cnn"
       dataset: "mnist"
       epochs: 3
       batch_size: 32
       device: "cpu"
       optimizer { kind: KIND_SGD lr: 0.05 momentum: 0.9 nesterov: true }
       schedule { kind: KIND_STEP step_size: 2 gamma: 0.5 }
       checkpoint_policy { every_n_epochs: 1 keep_last: 2 keep_best: true on_shutdown: false }
     )pb"},
    {"custom-cnn", R"pb(
       dataset: "mnist"
       epochs: 2
       batch_size: 64
       seed: 42
       model {
         input_shape: [ 1, 28, 28 ]
         layers { conv2d { in_channels: 1 out_channels: 8 kernel_size: 3 padding: 1 } }
         layers { relu {} }
         layers { maxpool2d { kernel_size: 2 } }
         layers { conv2d { in_channels: 8 out_channels: 16 kernel_size: 3 stride: 2 bias: false } }
         layers { relu {} }
         layers { flatten {} }
         layers { dropout { p: 0.25 } }
         layers { linear { in_features: 576 out_features: 32 } }
         layers { relu {} }
         layers { linear { in_features: 32 out_features: 10 } }
         layers { softmax {} }
       }
       optimizer { kind: KIND_ADAMW lr: 0.001 weight_decay: 0.01 beta1: 0.9 beta2: 0.999 eps: 1e-8 }
       schedule { kind: KIND_COSINE t_max: 5 eta_min: 0.0001 }
       normalization { scale: 0.00392157 mean: 0.1307 std: 0.3081 }
     )pb"},
    {"custom-colour-cnn", R"pb(
       dataset: "cifar10"
       epochs: 1
       batch_size: 32
       model {
         input_shape: [ 3, 32, 32 ]
         layers {
           conv2d {
             in_channels: 3 out_channels: 8 kernel_size: 3 kernel_w: 5 stride_h: 2
             padding: 1 padding_w: 2 bias: false
           }
         }
         layers { gelu {} }
         layers { maxpool2d { kernel_size: 3 stride: 2 padding: 1 } }
         layers { leaky_relu { negative_slope: 0.2 } }
         layers { avgpool2d { kernel_size: 3 stride: 1 padding: 1 } }
         layers { silu {} }
         layers { tanh {} }
         layers { sigmoid {} }
         layers { adaptive_avgpool2d {} }
         layers { flatten {} }
         layers { linear { in_features: 8 out_features: 10 } }
       }
       optimizer { kind: KIND_SGD lr: 0.1 momentum: 0.9 }
       augment { random_crop_padding: 4 horizontal_flip: true }
     )pb"},
    {"custom-mlp", R"pb(
       dataset: "fashion"
       epochs: 1
       batch_size: 100
       loss: LOSS_KIND_MEAN_SQUARED_ERROR
       model {
         input_shape: 784
         layers { linear { in_features: 784 out_features: 64 bias: false } }
         layers { relu {} }
         layers { dropout {} }
         layers { linear { in_features: 64 out_features: 10 } }
       }
       optimizer { kind: KIND_SGD lr: 0.1 momentum: 0.5 dampening: 0.1 weight_decay: 0.0005 }
     )pb"},
};

absl::Status WriteJobSpecSeeds(const fs::path& dir) {
  for (const auto& [name, text] : kJobSpecs) {
    v1::JobSpec spec;
    if (!google::protobuf::TextFormat::ParseFromString(text, &spec)) {
      return absl::InvalidArgumentError(absl::StrCat("seed ", name, ": not a JobSpec"));
    }
    absl::StatusOr<TrainConfig> config = server::TranslateSpec(spec, server::SpecLimits{});
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("seed ", name, ": ", config.status().ToString()));
    }
    if (absl::Status s = WriteFile(dir / absl::StrCat(name, ".pb"), spec.SerializeAsString());
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

inference::ModelInferRequest InferRequest(const std::string& datatype,
                                          const std::vector<int64_t>& shape,
                                          const std::vector<std::string>& outputs) {
  inference::ModelInferRequest request;
  request.set_model_name("mnist");
  request.set_id("seed");
  auto* input = request.add_inputs();
  input->set_name(serving::kInputName);
  input->set_datatype(datatype);
  for (int64_t d : shape) input->add_shape(d);
  for (const std::string& name : outputs) request.add_outputs()->set_name(name);
  return request;
}

int64_t Elements(const inference::ModelInferRequest& request) {
  int64_t n = 1;
  for (int64_t d : request.inputs(0).shape()) n *= d;
  return n;
}

uint8_t Pixel(int64_t i) { return static_cast<uint8_t>((i % 28) * (i / 28 % 28) % 256); }

absl::Status WriteInferRequestSeeds(const fs::path& dir) {
  std::map<std::string, inference::ModelInferRequest> requests;

  inference::ModelInferRequest typed_fp32 = InferRequest("FP32", {1, 784}, {});
  for (int64_t i = 0; i < Elements(typed_fp32); ++i) {
    typed_fp32.mutable_inputs(0)->mutable_contents()->add_fp32_contents(Pixel(i) / 255.0f);
  }
  requests["typed-fp32-1x784"] = typed_fp32;

  inference::ModelInferRequest typed_u8 =
      InferRequest("UINT8", {2, 1, 28, 28}, {serving::kClassOutput});
  for (int64_t i = 0; i < Elements(typed_u8); ++i) {
    typed_u8.mutable_inputs(0)->mutable_contents()->add_uint_contents(Pixel(i));
  }
  requests["typed-uint8-2x1x28x28"] = typed_u8;

  inference::ModelInferRequest raw_u8 =
      InferRequest("UINT8", {3, 784}, {serving::kProbabilitiesOutput, serving::kClassOutput});
  std::string* raw_u8_bytes = raw_u8.add_raw_input_contents();
  for (int64_t i = 0; i < Elements(raw_u8); ++i)
    raw_u8_bytes->push_back(static_cast<char>(Pixel(i)));
  requests["raw-uint8-3x784"] = raw_u8;

  inference::ModelInferRequest raw_fp32 =
      InferRequest("FP32", {1, 28, 28}, {serving::kClassOutput, serving::kProbabilitiesOutput});
  std::string* raw_fp32_bytes = raw_fp32.add_raw_input_contents();
  for (int64_t i = 0; i < Elements(raw_fp32); ++i) {
    const float x = Pixel(i) / 255.0f;
    raw_fp32_bytes->append(reinterpret_cast<const char*>(&x), sizeof(x));
  }
  requests["raw-fp32-1x28x28"] = raw_fp32;

  for (const auto& [name, request] : requests) {
    absl::StatusOr<serving::PixelInput> input = serving::DecodeInput(request, 784);
    if (!input.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("seed ", name, ": ", input.status().ToString()));
    }
    if (absl::Status s = WriteFile(dir / absl::StrCat(name, ".pb"), request.SerializeAsString());
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(const fs::path& out) {
  const std::pair<const char*, absl::Status (*)(const fs::path&)> targets[] = {
      {"idx_reader", WriteIdxSeeds},
      {"safetensors", WriteSafetensorsSeeds},
      {"spec_translation", WriteJobSpecSeeds},
      {"tensor_codec", WriteInferRequestSeeds},
  };
  for (const auto& [target, write] : targets) {
    const fs::path dir = out / target;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat(dir.string(), ": ", ec.message()));
    if (absl::Status s = write(dir); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const absl::Status status = kiln::WriteAll(argv[1]);
  if (!status.ok()) {
    std::fprintf(stderr, "fuzz_seed_writer: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
