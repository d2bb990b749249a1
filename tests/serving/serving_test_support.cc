#include "tests/serving/serving_test_support.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "engine/backend_registry.h"
#include "engine/trainer.h"
#include "tests/engine/synthetic_data.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"

namespace kiln::serving::testing {

void WriteCheckpoint(const std::string& path, TestModel model, uint64_t seed) {
  TrainConfig c;
  switch (model) {
    case TestModel::kMlpFlat:
      c.model.input_shape = {kPixels};
      c.model.layers = {LinearConfig{kPixels, 32}, ReluConfig{}, LinearConfig{32, kClasses}};
      c.norm = {1.0f / 255, 0.5f, 0.25f};
      break;
    case TestModel::kMlpImage:
      c.model.input_shape = {1, kSide, kSide};
      c.model.layers = {FlattenConfig{}, LinearConfig{kPixels, 32}, ReluConfig{},
                        LinearConfig{32, kClasses}};
      break;
    case TestModel::kCnn:
      c.model.input_shape = {1, kSide, kSide};
      c.model.layers = {Conv2dConfig{1, 4, 3}, ReluConfig{}, MaxPool2dConfig{2}, FlattenConfig{},
                        LinearConfig{4 * 13 * 13, kClasses}};
      break;
  }
  c.optimizer.kind = OptimizerConfig::Kind::kAdam;
  c.optimizer.lr = 0.01f;
  c.batch_size = 32;
  c.seed = seed;
  auto backend = CreateBackend("cpu", {2});
  ASSERT_OK(backend) << backend.status();
  Dataset train = kiln::testing::BandsDataset(256, kClasses, kSide, seed);
  auto trainer = Trainer::Create(c, backend->get(), &train, nullptr);
  ASSERT_OK(trainer) << trainer.status();
  ASSERT_OK((*trainer)->Run({}));
  ASSERT_OK((*trainer)->SaveCheckpoint(path));
}

const Checkpoints& SharedCheckpoints() {
  static TempDir* dir = new TempDir();  // outlives every test; removed by the atexit below
  static const Checkpoints* checkpoints = [] {
    auto* c =
        new Checkpoints{dir->file("mlp_flat.safetensors"), dir->file("mlp_flat_other.safetensors"),
                        dir->file("mlp_image.safetensors"), dir->file("cnn.safetensors")};
    WriteCheckpoint(c->mlp_flat, TestModel::kMlpFlat, 1);
    WriteCheckpoint(c->mlp_flat_other, TestModel::kMlpFlat, 2);
    WriteCheckpoint(c->mlp_image, TestModel::kMlpImage, 3);
    WriteCheckpoint(c->cnn, TestModel::kCnn, 4);
    std::atexit([] { delete dir; });
    return c;
  }();
  return *checkpoints;
}

std::vector<uint8_t> SampleImages(int n, uint64_t seed) {
  return kiln::testing::BandsDataset(n, kClasses, kSide, seed).pixels;
}

inference::ModelInferRequest MakeRequest(const std::string& model, const uint8_t* pixels, int n,
                                         const std::string& datatype, Form form,
                                         std::vector<int64_t> shape) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* input = request.add_inputs();
  input->set_name("input");
  input->set_datatype(datatype);
  if (shape.empty()) shape = {n, kPixels};
  for (int64_t d : shape) input->add_shape(d);
  const int64_t count = int64_t{n} * kPixels;
  if (datatype == "UINT8") {
    if (form == Form::kRaw) {
      request.add_raw_input_contents(reinterpret_cast<const char*>(pixels), count);
    } else {
      for (int64_t i = 0; i < count; ++i) input->mutable_contents()->add_uint_contents(pixels[i]);
    }
  } else {
    std::vector<float> scaled(count);
    for (int64_t i = 0; i < count; ++i) scaled[i] = pixels[i] / 255.0f;
    if (form == Form::kRaw) {
      request.add_raw_input_contents(reinterpret_cast<const char*>(scaled.data()),
                                     scaled.size() * sizeof(float));
    } else {
      for (float x : scaled) input->mutable_contents()->add_fp32_contents(x);
    }
  }
  return request;
}

Answer ReadAnswer(const inference::ModelInferResponse& response) {
  Answer answer;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& out = response.outputs(i);
    const bool raw = response.raw_output_contents_size() > 0;
    if (out.name() == "probabilities") {
      if (raw) {
        const std::string& bytes = response.raw_output_contents(i);
        answer.probabilities.resize(bytes.size() / sizeof(float));
        std::memcpy(answer.probabilities.data(), bytes.data(), bytes.size());
      } else {
        answer.probabilities.assign(out.contents().fp32_contents().begin(),
                                    out.contents().fp32_contents().end());
      }
    } else if (out.name() == "class") {
      if (raw) {
        const std::string& bytes = response.raw_output_contents(i);
        answer.classes.resize(bytes.size() / sizeof(int64_t));
        std::memcpy(answer.classes.data(), bytes.data(), bytes.size());
      } else {
        answer.classes.assign(out.contents().int64_contents().begin(),
                              out.contents().int64_contents().end());
      }
    }
  }
  return answer;
}

inference::RepositoryModelLoadRequest LoadMessage(
    const std::string& model, const std::map<std::string, std::string>& params) {
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(model);
  for (const auto& [key, value] : params) {
    (*request.mutable_parameters())[key].set_string_param(value);
  }
  return request;
}

std::vector<std::string> IndexOf(const ModelRepository& repo) {
  std::vector<std::string> out;
  for (const ModelIndexEntry& e : repo.Index()) {
    out.push_back(e.name + ":" + e.version + ":" + e.state + ":" + e.reason);
  }
  return out;
}

ServingServer::ServingServer(ModelRepositoryOptions options)
    : repository_(std::make_unique<ModelRepository>(std::move(options))),
      service_(std::make_unique<InferenceService>(repository_.get(), [] {
        InferenceServiceOptions options;
        options.default_deployment.device = "cpu";
        return options;
      }())) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  EXPECT_NE(server_, nullptr);
  EXPECT_NE(port_, 0);
}

ServingServer::~ServingServer() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }
}

std::unique_ptr<inference::GRPCInferenceService::Stub> ServingServer::NewStub() const {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  return inference::GRPCInferenceService::NewStub(
      kiln::testing::ConnectedChannel("127.0.0.1:" + std::to_string(port_), args));
}

TempDir::TempDir() {
  std::random_device rd;
  path_ = (std::filesystem::temp_directory_path() /
           ("kiln_serving_test_" + std::to_string(rd()) + std::to_string(rd())))
              .string();
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace kiln::serving::testing
