// The KServe v2 service over real gRPC channels: predictions equal the engine's own, batched and
// one-by-one answers agree, metadata describes the model, bad requests get clear errors, and
// models load and unload under traffic.
#include "server/serving/inference_service.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "engine/backend_registry.h"
#include "engine/inference.h"
#include "engine/precision.h"
#include "tests/serving/serving_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::serving {
namespace {

using testing::Answer;
using testing::Form;
using testing::IndexOf;
using testing::kClasses;
using testing::kPixels;
using testing::LoadMessage;
using testing::MakeRequest;
using testing::ReadAnswer;
using testing::SharedCheckpoints;

// What the engine itself answers for `n` images, as PredictU8 or PredictF32 (pixels / 255).
Answer EngineAnswer(const std::string& checkpoint, const uint8_t* pixels, int n,
                    const std::string& datatype) {
  auto backend = CreateBackend("cpu", {2});
  EXPECT_OK(backend);
  auto session = InferenceSession::FromCheckpoint(checkpoint, backend->get(), n);
  EXPECT_OK(session) << session.status();
  std::vector<float> probs(n * kClasses);
  std::vector<int32_t> classes(n);
  if (datatype == "UINT8") {
    EXPECT_OK((*session)->PredictU8(pixels, n, probs.data(), classes.data()));
  } else {
    std::vector<float> scaled(n * kPixels);
    for (int i = 0; i < n * kPixels; ++i) scaled[i] = pixels[i] / 255.0f;
    EXPECT_OK((*session)->PredictF32(scaled.data(), n, probs.data(), classes.data()));
  }
  return Answer{probs, std::vector<int64_t>(classes.begin(), classes.end())};
}

// Equal to float rounding: rows computed in batches of different sizes may differ in the last bits.
bool Near(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) > 1e-6f) return false;
  }
  return true;
}

grpc::Status Infer(inference::GRPCInferenceService::Stub& stub,
                   const inference::ModelInferRequest& request,
                   inference::ModelInferResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return stub.ModelInfer(&context, request, response);
}

class InferenceServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Deploy("mlp", SharedCheckpoints().mlp_flat);
    Deploy("image", SharedCheckpoints().mlp_image);
    Deploy("cnn", SharedCheckpoints().cnn);
    stub_ = server_.NewStub();
  }

  void Deploy(const std::string& name, const std::string& path, BatchingOptions batching = {}) {
    LoadRequest load;
    load.model = name;
    load.source = path;
    load.options.device = "cpu";
    load.options.batching = batching;
    auto loaded = server_.repository().Load(load);
    ASSERT_OK(loaded) << loaded.status();
  }

  testing::ServingServer server_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(InferenceServiceTest, HealthAndServerMetadata) {
  grpc::ClientContext c1, c2, c3;
  inference::ServerLiveResponse live;
  ASSERT_OK(stub_->ServerLive(&c1, {}, &live));
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_OK(stub_->ServerReady(&c2, {}, &ready));
  EXPECT_TRUE(ready.ready());
  inference::ServerMetadataResponse meta;
  ASSERT_OK(stub_->ServerMetadata(&c3, {}, &meta));
  EXPECT_EQ(meta.name(), "kiln");
  EXPECT_FALSE(meta.version().empty());
  ASSERT_EQ(meta.extensions_size(), 1);
  EXPECT_EQ(meta.extensions(0), "model_repository");
  server_.service().SetReady(false);
  grpc::ClientContext c4;
  ASSERT_OK(stub_->ServerReady(&c4, {}, &ready));
  EXPECT_FALSE(ready.ready());
}

TEST_F(InferenceServiceTest, ModelMetadataAndReadinessDescribeTheModel) {
  struct Case {
    std::string model;
    std::vector<int64_t> input_shape;
  } cases[] = {{"mlp", {-1, 784}}, {"image", {-1, 1, 28, 28}}, {"cnn", {-1, 1, 28, 28}}};
  for (const Case& c : cases) {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name(c.model);
    inference::ModelMetadataResponse meta;
    ASSERT_OK(stub_->ModelMetadata(&context, request, &meta));
    EXPECT_EQ(meta.name(), c.model);
    EXPECT_EQ(meta.platform(), "kiln");
    ASSERT_EQ(meta.versions_size(), 1);
    EXPECT_EQ(meta.versions(0), "1");
    ASSERT_EQ(meta.inputs_size(), 1);
    EXPECT_EQ(meta.inputs(0).name(), "input");
    EXPECT_EQ(meta.inputs(0).datatype(), "FP32");
    EXPECT_EQ(std::vector<int64_t>(meta.inputs(0).shape().begin(), meta.inputs(0).shape().end()),
              c.input_shape);
    ASSERT_EQ(meta.outputs_size(), 2);
    EXPECT_EQ(meta.outputs(0).name(), "probabilities");
    EXPECT_EQ(meta.outputs(0).datatype(), "FP32");
    EXPECT_EQ(std::vector<int64_t>(meta.outputs(0).shape().begin(), meta.outputs(0).shape().end()),
              std::vector<int64_t>({-1, kClasses}));
    EXPECT_EQ(meta.outputs(1).name(), "class");
    EXPECT_EQ(meta.outputs(1).datatype(), "INT64");
    EXPECT_EQ(meta.outputs(1).shape_size(), 1);
  }
  auto ready = [&](const std::string& name, const std::string& version) {
    grpc::ClientContext context;
    inference::ModelReadyRequest request;
    request.set_name(name);
    request.set_version(version);
    inference::ModelReadyResponse response;
    EXPECT_OK(stub_->ModelReady(&context, request, &response));
    return response.ready();
  };
  EXPECT_TRUE(ready("mlp", ""));
  EXPECT_TRUE(ready("mlp", "1"));
  EXPECT_FALSE(ready("mlp", "2"));
  EXPECT_FALSE(ready("nope", ""));
  grpc::ClientContext context;
  inference::ModelMetadataRequest unknown;
  unknown.set_name("nope");
  inference::ModelMetadataResponse meta;
  grpc::Status status = stub_->ModelMetadata(&context, unknown, &meta);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "unknown model \"nope\"");
}

TEST_F(InferenceServiceTest, PredictionsEqualTheEnginesOwn) {
  const int n = 7;
  const std::vector<uint8_t> images = testing::SampleImages(n, 11);
  struct Model {
    std::string name, checkpoint;
  } models[] = {{"mlp", SharedCheckpoints().mlp_flat},
                {"image", SharedCheckpoints().mlp_image},
                {"cnn", SharedCheckpoints().cnn}};
  const std::vector<int64_t> shapes[] = {{n, 784}, {n, 1, 28, 28}, {n, 28, 28}};
  for (const Model& model : models) {
    for (const std::string datatype : {"UINT8", "FP32"}) {
      const Answer expected = EngineAnswer(model.checkpoint, images.data(), n, datatype);
      for (Form form : {Form::kTyped, Form::kRaw}) {
        for (const std::vector<int64_t>& shape : shapes) {
          SCOPED_TRACE(model.name + " " + datatype + (form == Form::kRaw ? " raw " : " typed ") +
                       std::to_string(shape.size()) + "-d");
          auto request = MakeRequest(model.name, images.data(), n, datatype, form, shape);
          request.set_id("req-42");
          inference::ModelInferResponse response;
          grpc::Status status = Infer(*stub_, request, &response);
          ASSERT_OK(status) << status.error_message();
          EXPECT_EQ(response.model_name(), model.name);
          EXPECT_EQ(response.model_version(), "1");
          EXPECT_EQ(response.id(), "req-42");
          EXPECT_EQ(response.raw_output_contents_size(), form == Form::kRaw ? 2 : 0);
          ASSERT_EQ(response.outputs_size(), 2);
          EXPECT_EQ(std::vector<int64_t>(response.outputs(0).shape().begin(),
                                         response.outputs(0).shape().end()),
                    std::vector<int64_t>({n, kClasses}));
          const Answer answer = ReadAnswer(response);
          // The request ran alone, as one batch of n: the same arithmetic, the same bits.
          EXPECT_EQ(answer.classes, expected.classes);
          EXPECT_EQ(answer.probabilities, expected.probabilities);
        }
      }
    }
  }
}

TEST_F(InferenceServiceTest, OnlyTheRequestedOutputsInTheirOrder) {
  const std::vector<uint8_t> images = testing::SampleImages(3, 5);
  auto request = MakeRequest("mlp", images.data(), 3, "UINT8", Form::kRaw);
  request.add_outputs()->set_name("class");
  inference::ModelInferResponse only_class;
  ASSERT_OK(Infer(*stub_, request, &only_class));
  ASSERT_EQ(only_class.outputs_size(), 1);
  EXPECT_EQ(only_class.outputs(0).name(), "class");
  ASSERT_EQ(only_class.raw_output_contents_size(), 1);
  EXPECT_EQ(only_class.raw_output_contents(0).size(), 3 * sizeof(int64_t));
  request.add_outputs()->set_name("probabilities");
  inference::ModelInferResponse both;
  ASSERT_OK(Infer(*stub_, request, &both));
  ASSERT_EQ(both.outputs_size(), 2);
  EXPECT_EQ(both.outputs(1).name(), "probabilities");
  EXPECT_EQ(ReadAnswer(both).classes, ReadAnswer(only_class).classes);
}

TEST_F(InferenceServiceTest, BatchedAndOneByOneAnswersAreIdentical) {
  // A long delay, so concurrent requests surely meet however slow the machine.
  Deploy("batched", SharedCheckpoints().mlp_flat, {64, 20000});
  Deploy("single", SharedCheckpoints().mlp_flat, {1, 0});
  constexpr int kClients = 24, kRounds = 8;
  const std::vector<uint8_t> images = testing::SampleImages(kClients * kRounds, 13);
  std::vector<Answer> batched(kClients * kRounds), single(kClients * kRounds);
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  std::mutex error_mu;
  std::string first_error;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto stub = server_.NewStub();
      for (int r = 0; r < kRounds; ++r) {
        const int i = c * kRounds + r;
        const Form form = (i % 2) ? Form::kRaw : Form::kTyped;
        auto request = MakeRequest("batched", images.data() + i * kPixels, 1, "UINT8", form);
        inference::ModelInferResponse response;
        const grpc::Status status = Infer(*stub, request, &response);
        if (!status.ok()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.empty()) first_error = status.error_message();
          ++failures;
        }
        batched[i] = ReadAnswer(response);
      }
    });
  }
  for (auto& t : clients) t.join();
  ASSERT_EQ(failures.load(), 0) << "first: " << first_error;
  for (int i = 0; i < kClients * kRounds; ++i) {
    auto request = MakeRequest("single", images.data() + i * kPixels, 1, "UINT8", Form::kRaw);
    inference::ModelInferResponse response;
    ASSERT_OK(Infer(*stub_, request, &response));
    single[i] = ReadAnswer(response);
  }
  for (int i = 0; i < kClients * kRounds; ++i) {
    EXPECT_EQ(batched[i].classes, single[i].classes) << "image " << i;
    ASSERT_EQ(batched[i].probabilities.size(), single[i].probabilities.size());
    EXPECT_TRUE(Near(batched[i].probabilities, single[i].probabilities)) << "image " << i;
  }
  // The concurrent requests really were batched.
  const DynamicBatcher::Stats stats =
      (*server_.repository().Find("batched", ""))->batcher().stats();
  EXPECT_EQ(stats.requests, kClients * kRounds);
  EXPECT_LT(stats.batches, stats.requests);
}

TEST_F(InferenceServiceTest, BadRequestsGetClearErrors) {
  const std::vector<uint8_t> images = testing::SampleImages(2, 17);
  const auto valid = [&] { return MakeRequest("mlp", images.data(), 2, "UINT8", Form::kTyped); };
  const auto raw = [&] { return MakeRequest("mlp", images.data(), 2, "UINT8", Form::kRaw); };
  using Edit = std::function<void(inference::ModelInferRequest&)>;
  struct Case {
    std::string what;
    std::function<inference::ModelInferRequest()> make;
    Edit edit;
    grpc::StatusCode code;
    std::string fragment;
  };
  const std::string at = "model \"mlp\" version \"1\": ";
  auto shape = [](std::vector<int64_t> dims) {
    return [dims](inference::ModelInferRequest& r) {
      r.mutable_inputs(0)->clear_shape();
      for (int64_t d : dims) r.mutable_inputs(0)->add_shape(d);
    };
  };
  const grpc::StatusCode kBad = grpc::StatusCode::INVALID_ARGUMENT;
  const Case cases[] = {
      {"no model name", valid, [](auto& r) { r.clear_model_name(); }, kBad, "model_name: required"},
      {"unknown model", valid, [](auto& r) { r.set_model_name("nope"); },
       grpc::StatusCode::NOT_FOUND, "unknown model \"nope\""},
      {"unknown version", valid, [](auto& r) { r.set_model_version("3"); },
       grpc::StatusCode::NOT_FOUND, "model \"mlp\" has no version \"3\" (versions: 1)"},
      {"no input", valid, [](auto& r) { r.clear_inputs(); }, kBad,
       at + "the model takes one input, \"input\"; the request has 0"},
      {"two inputs", valid, [](auto& r) { *r.add_inputs() = r.inputs(0); }, kBad,
       "the request has 2"},
      {"unknown input name", valid, [](auto& r) { r.mutable_inputs(0)->set_name("x"); }, kBad,
       at + "unknown input \"x\"; the model's input is \"input\""},
      {"wrong datatype", valid, [](auto& r) { r.mutable_inputs(0)->set_datatype("INT32"); }, kBad,
       at + "input \"input\": datatype \"INT32\" is not accepted"},
      {"no batch dimension", valid, shape({1568}), kBad,
       "input \"input\": shape [1568] has no batch dimension"},
      {"wrong per-sample count", valid, shape({2, 100}), kBad,
       "shape [2,100] holds 100 elements per sample; the model takes 784"},
      {"negative dimension", valid, shape({2, -1}), kBad, "has a negative dimension"},
      {"empty batch", valid, shape({0, 784}), kBad, "has batch dimension 0"},
      {"absurd shape", valid, shape({int64_t{1} << 40, 784}), kBad, "is too large"},
      {"element count", valid, shape({3, 784}), kBad,
       "shape [3,784] needs 2352 elements; contents.uint_contents has 1568"},
      {"raw byte size", raw, [](auto& r) { r.mutable_raw_input_contents(0)->resize(1000); }, kBad,
       "input \"input\": raw_input_contents holds 1000 bytes; shape [2,784] of UINT8 "
       "needs 1568"},
      {"raw FP32 byte size", raw, [](auto& r) { r.mutable_inputs(0)->set_datatype("FP32"); }, kBad,
       "holds 1568 bytes; shape [2,784] of FP32 needs 6272"},
      {"typed and raw", raw,
       [](auto& r) { r.mutable_inputs(0)->mutable_contents()->add_uint_contents(1); }, kBad,
       "data given both in contents and in raw_input_contents"},
      {"two raw entries", raw, [](auto& r) { r.add_raw_input_contents()->push_back(0); }, kBad,
       "raw_input_contents has 2 entries"},
      {"no data", valid, [](auto& r) { r.mutable_inputs(0)->clear_contents(); }, kBad,
       "input \"input\": no data"},
      {"wrong typed field", valid, [](auto& r) { r.mutable_inputs(0)->set_datatype("FP32"); }, kBad,
       "FP32 elements go in contents.fp32_contents"},
      {"UINT8 out of range", valid,
       [](auto& r) { r.mutable_inputs(0)->mutable_contents()->set_uint_contents(5, 300); }, kBad,
       "input \"input\": element 5 is 300, outside 0..255 for UINT8"},
      {"FP32 not finite",
       [&] { return MakeRequest("mlp", images.data(), 2, "FP32", Form::kTyped); },
       [](auto& r) {
         r.mutable_inputs(0)->mutable_contents()->set_fp32_contents(9, std::nanf(""));
       },
       kBad, "input \"input\": element 9 is not a finite number"},
      {"raw FP32 not finite",
       [&] { return MakeRequest("mlp", images.data(), 2, "FP32", Form::kRaw); },
       [](auto& r) {
         const float inf = std::numeric_limits<float>::infinity();
         std::memcpy(r.mutable_raw_input_contents(0)->data() + 4 * 100, &inf, 4);
       },
       kBad, "element 100 is not a finite number"},
      {"unknown output", valid, [](auto& r) { r.add_outputs()->set_name("logits"); }, kBad,
       at + "unknown output \"logits\"; the model's outputs are \"probabilities\" and \"class\""},
      {"repeated output", valid,
       [](auto& r) {
         r.add_outputs()->set_name("class");
         r.add_outputs()->set_name("class");
       },
       kBad, "output \"class\" is asked for twice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    inference::ModelInferRequest request = c.make();
    c.edit(request);
    inference::ModelInferResponse response;
    grpc::Status status = Infer(*stub_, request, &response);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_NE(status.error_message().find(c.fragment), std::string::npos) << status.error_message();
  }
  // The service is unharmed.
  inference::ModelInferResponse response;
  EXPECT_OK(Infer(*stub_, valid(), &response));
}

inference::ModelRepositoryParameter StringParam(const std::string& value) {
  inference::ModelRepositoryParameter p;
  p.set_string_param(value);
  return p;
}

grpc::Status LoadRpc(inference::GRPCInferenceService::Stub& stub, const std::string& model,
                     std::map<std::string, inference::ModelRepositoryParameter> params) {
  grpc::ClientContext context;
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(model);
  for (auto& [k, v] : params) (*request.mutable_parameters())[k] = v;
  inference::RepositoryModelLoadResponse response;
  return stub.RepositoryModelLoad(&context, request, &response);
}

grpc::Status UnloadRpc(inference::GRPCInferenceService::Stub& stub, const std::string& model) {
  grpc::ClientContext context;
  inference::RepositoryModelUnloadRequest request;
  request.set_model_name(model);
  inference::RepositoryModelUnloadResponse response;
  return stub.RepositoryModelUnload(&context, request, &response);
}

std::vector<std::string> IndexRpc(inference::GRPCInferenceService::Stub& stub, bool ready) {
  grpc::ClientContext context;
  inference::RepositoryIndexRequest request;
  request.set_ready(ready);
  inference::RepositoryIndexResponse response;
  EXPECT_OK(stub.RepositoryIndex(&context, request, &response));
  std::vector<std::string> rows;
  for (const auto& m : response.models()) {
    rows.push_back(m.name() + ":" + m.version() + ":" + m.state() + ":" + m.reason());
  }
  return rows;
}

TEST_F(InferenceServiceTest, RepositoryExtensionLoadsIndexesAndUnloads) {
  inference::ModelRepositoryParameter batch;
  batch.set_int64_param(8);
  ASSERT_OK(LoadRpc(*stub_, "fresh",
                    {{"checkpoint", StringParam(SharedCheckpoints().mlp_flat)},
                     {"max_batch_size", batch},
                     {"max_queue_delay_us", StringParam("100")},
                     {"device", StringParam("cpu")},
                     {"threads", StringParam("2")},
                     {"version", StringParam("7")}}));
  auto fresh = server_.repository().Find("fresh", "7");
  ASSERT_OK(fresh);
  EXPECT_EQ((*fresh)->options().batching.max_batch_size, 8);
  EXPECT_EQ((*fresh)->options().batching.max_queue_delay_us, 100);
  EXPECT_EQ((*fresh)->options().threads, 2);
  EXPECT_EQ(IndexRpc(*stub_, true), std::vector<std::string>({"cnn:1:READY:", "fresh:7:READY:",
                                                              "image:1:READY:", "mlp:1:READY:"}));
  ASSERT_OK(UnloadRpc(*stub_, "fresh"));
  EXPECT_EQ(IndexRpc(*stub_, false).size(), 4u);
  EXPECT_EQ(IndexRpc(*stub_, false)[1], "fresh::UNAVAILABLE:unloaded");
  EXPECT_EQ(IndexRpc(*stub_, true).size(), 3u);

  const std::vector<uint8_t> images = testing::SampleImages(1, 1);
  inference::ModelInferResponse response;
  grpc::Status gone =
      Infer(*stub_, MakeRequest("fresh", images.data(), 1, "UINT8", Form::kRaw), &response);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(gone.error_message(), "model \"fresh\" is unloaded");

  struct Case {
    std::string model;
    std::map<std::string, inference::ModelRepositoryParameter> params;
    grpc::StatusCode code;
    std::string fragment;
  };
  const Case cases[] = {
      {"", {}, grpc::StatusCode::INVALID_ARGUMENT, "model_name: required"},
      {"ghost", {}, grpc::StatusCode::NOT_FOUND, "model \"ghost\": checkpoint \"ghost\": no such"},
      {"m",
       {{"config", StringParam("{}")}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "parameter \"config\" is not supported"},
      {"m",
       {{"checkpoint", batch}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "parameter \"checkpoint\": must be a string_param"},
      {"m",
       {{"checkpoint", StringParam(SharedCheckpoints().mlp_flat)},
        {"max_batch_size", StringParam("many")}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "parameter \"max_batch_size\": must be an int64"},
      {"m",
       {{"checkpoint", StringParam(SharedCheckpoints().mlp_flat)},
        {"max_batch_size", StringParam("5000")}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "max_batch_size must be in 1..1024, got 5000"},
      {"m",
       {{"checkpoint", StringParam(SharedCheckpoints().mlp_flat)},
        {"precision", StringParam("fp16")}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "parameter \"precision\": \"fp16\" is not a precision; expected fp32, tf32 or bf16"},
      {"m",
       {{"checkpoint", StringParam(SharedCheckpoints().mlp_flat)}, {"precision", batch}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "parameter \"precision\": must be a string_param"},
  };
  for (const Case& c : cases) {
    grpc::Status status = LoadRpc(*stub_, c.model, c.params);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_NE(status.error_message().find(c.fragment), std::string::npos) << status.error_message();
  }
  grpc::Status unknown = UnloadRpc(*stub_, "ghost");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unknown.error_message(), "unknown model \"ghost\"");
}

// The load parameter's words are PrecisionName's, read back exactly (the one parser of them).
static_assert(PrecisionNamed(PrecisionName(Precision::kBf16)) == Precision::kBf16 &&
                  PrecisionNamed("tf32") == Precision::kTf32 &&
                  PrecisionNamed("fp32") == Precision::kFp32 && !PrecisionNamed("fp16") &&
                  !PrecisionNamed("BF16") && !PrecisionNamed(""),
              "PrecisionNamed reads back exactly what PrecisionName writes");

// The "precision" a version was loaded with, as ModelMetadata says it.
std::string MetadataPrecision(inference::GRPCInferenceService::Stub& stub, const std::string& model,
                              const std::string& version) {
  grpc::ClientContext context;
  inference::ModelMetadataRequest request;
  request.set_name(model);
  request.set_version(version);
  inference::ModelMetadataResponse meta;
  EXPECT_OK(stub.ModelMetadata(&context, request, &meta));
  auto it = meta.parameters().find("precision");
  return it == meta.parameters().end() ? "(none)" : it->second.string_param();
}

// How far a bf16 version's probabilities may be from its fp32 twin's, absolute. bfloat16 keeps 8
// significant bits, so each rounded GEMM input is off by at most u = 2^-9 relative, each product
// by about 2u. The test MLP's first layer sums 784 products of inputs in [-2, 2] with weights of
// about 1/sqrt(784): the worst case bound 2u * sum |x w| is ~0.1 on a hidden unit, but the
// roundings are independent, so the error grows as sqrt(784) terms, ~5e-3; the 32-wide second
// layer adds less. A logit change of d moves a softmax probability p by at most ~2 p d <= 2d.
// Measured over these 64 images with oneDNN's AVX512_BF16 kernels: max |dp| = 2.4e-3, inside
// that estimate. 2e-2 leaves an eightfold margin (other CPUs sum in other orders) yet is far
// below the probabilities' own spread, so a wrong model or unnormalised output would still fail.
// (A CPU without AVX512_BF16 keeps such GEMMs float32, see DnnlMatmulCache, and the not-equal
// check below would fail there, as the engine's own bf16 GEMM tests would.)
constexpr float kBf16ProbabilityTolerance = 2e-2f;

// A version loaded with precision bf16 says so in its metadata and predicts close to, but not
// bit-equal to, the same checkpoint loaded in fp32: bf16 GEMMs really ran. Loading the same
// version number again with another precision replaces it, as any other load of that label does.
TEST_F(InferenceServiceTest, ABf16LoadPredictsCloseToFp32AndSaysSoInMetadata) {
  ASSERT_OK(LoadRpc(*stub_, "mlp",
                    {{"checkpoint", StringParam(SharedCheckpoints().mlp_flat)},
                     {"device", StringParam("cpu")},
                     {"precision", StringParam("bf16")},
                     {"version", StringParam("2")}}));
  EXPECT_EQ(MetadataPrecision(*stub_, "mlp", "1"), "fp32");
  EXPECT_EQ(MetadataPrecision(*stub_, "mlp", "2"), "bf16");
  EXPECT_EQ((*server_.repository().Find("mlp", "2"))->options().precision, Precision::kBf16);

  const int n = 64;
  const std::vector<uint8_t> images = testing::SampleImages(n, 23);
  auto answer_of = [&](const std::string& version) {
    auto request = MakeRequest("mlp", images.data(), n, "UINT8", Form::kRaw);
    request.set_model_version(version);
    inference::ModelInferResponse response;
    grpc::Status status = Infer(*stub_, request, &response);
    EXPECT_OK(status) << status.error_message();
    return ReadAnswer(response);
  };
  const Answer fp32 = answer_of("1"), bf16 = answer_of("2");
  ASSERT_EQ(fp32.probabilities.size(), size_t{n * kClasses});
  ASSERT_EQ(bf16.probabilities.size(), fp32.probabilities.size());
  float max_diff = 0;
  for (size_t i = 0; i < fp32.probabilities.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(fp32.probabilities[i] - bf16.probabilities[i]));
  }
  RecordProperty("bf16_max_probability_difference", std::to_string(max_diff));
  EXPECT_LE(max_diff, kBf16ProbabilityTolerance);
  EXPECT_GT(max_diff, 0.0f) << "bf16 answered bit for bit as fp32: its GEMMs did not run in bf16";
  // A class may only flip where fp32's top two probabilities were within the tolerance's reach.
  for (int s = 0; s < n; ++s) {
    if (fp32.classes[s] == bf16.classes[s]) continue;
    const float* p = &fp32.probabilities[s * kClasses];
    EXPECT_LE(std::abs(p[fp32.classes[s]] - p[bf16.classes[s]]), 2 * kBf16ProbabilityTolerance)
        << "sample " << s;
  }

  // Version 2 loaded again in fp32 replaces the bf16 one: the same bits as version 1 now.
  ASSERT_OK(LoadRpc(*stub_, "mlp",
                    {{"checkpoint", StringParam(SharedCheckpoints().mlp_flat)},
                     {"device", StringParam("cpu")},
                     {"precision", StringParam("fp32")},
                     {"version", StringParam("2")}}));
  EXPECT_EQ(MetadataPrecision(*stub_, "mlp", "2"), "fp32");
  EXPECT_EQ(answer_of("2").probabilities, fp32.probabilities);
  EXPECT_EQ(
      IndexRpc(*stub_, true),
      std::vector<std::string>({"cnn:1:READY:", "image:1:READY:", "mlp:1:READY:", "mlp:2:READY:"}));
}

// Every load and unload hands the model's loaded versions to record_deployments, as load
// requests that bring back the same versions with the same settings; a second service restores
// them from those records, and a record that no longer loads is UNAVAILABLE with its reason.
TEST(InferenceServiceRecordsTest, LoadsAndUnloadsAreRecordedAndRestoredElsewhere) {
  std::map<std::string, std::vector<DeploymentRecord>> recorded;
  InferenceServiceOptions options;
  options.default_deployment.device = "cpu";
  options.record_deployments = [&](const std::string& model,
                                   const std::vector<DeploymentRecord>& versions) {
    recorded[model] = versions;
    return absl::OkStatus();
  };
  ModelRepository repo;
  InferenceService service(&repo, options);
  const std::string flat = SharedCheckpoints().mlp_flat, other = SharedCheckpoints().mlp_flat_other;
  ASSERT_OK(service.LoadModel(LoadMessage("a", {{"checkpoint", flat}, {"max_batch_size", "8"}})));
  ASSERT_OK(service.LoadModel(LoadMessage("a", {{"checkpoint", other}, {"threads", "2"}})));
  ASSERT_OK(service.LoadModel(
      LoadMessage("b", {{"checkpoint", flat}, {"version", "9"}, {"precision", "bf16"}})));
  ASSERT_OK(service.LoadModel(LoadMessage("c", {{"checkpoint", flat}})));
  inference::RepositoryModelUnloadRequest unload;
  unload.set_model_name("c");
  ASSERT_OK(service.UnloadModel(unload));
  ASSERT_EQ(recorded["a"].size(), 2u);
  ASSERT_EQ(recorded["b"].size(), 1u);
  EXPECT_TRUE(recorded["c"].empty());

  std::vector<DeploymentRecord> all;
  for (const char* model : {"a", "b"}) {
    for (const DeploymentRecord& r : recorded[model]) all.push_back(r);
  }
  ModelRepository restored_repo;
  InferenceService restored(&restored_repo, options);
  EXPECT_TRUE(restored.Restore(all).empty());
  // The loaded versions come back; that "c" was unloaded is not remembered across a restart.
  EXPECT_EQ(IndexOf(restored_repo),
            std::vector<std::string>({"a:1:READY:", "a:2:READY:", "b:9:READY:"}));
  EXPECT_EQ(IndexOf(repo), std::vector<std::string>({"a:1:READY:", "a:2:READY:", "b:9:READY:",
                                                     "c::UNAVAILABLE:unloaded"}));
  auto a1 = restored_repo.Find("a", "1"), a2 = restored_repo.Find("a", "2");
  ASSERT_OK(a1);
  ASSERT_OK(a2);
  EXPECT_EQ((*a1)->checkpoint_path(), flat);
  EXPECT_EQ((*a1)->options().batching.max_batch_size, 8);
  EXPECT_EQ((*a2)->checkpoint_path(), other);
  EXPECT_EQ((*a2)->options().threads, 2);
  EXPECT_EQ((*restored_repo.Find("a", ""))->version(), "2");  // the default stays the newest
  ASSERT_OK(restored_repo.Find("b", "9"));
  EXPECT_EQ((*restored_repo.Find("b", "9"))->options().precision, Precision::kBf16);
  EXPECT_EQ((*a1)->options().precision, Precision::kFp32);

  // A record whose checkpoint is gone fails alone, with its reason in the index.
  std::vector<DeploymentRecord> broken = all;
  (*broken[0].request.mutable_parameters())["checkpoint"] = StringParam("/no/such.safetensors");
  ModelRepository third_repo;
  InferenceService third(&third_repo, options);
  const std::vector<std::string> failures = third.Restore(broken);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_NE(failures[0].find("a 1: NOT_FOUND"), std::string::npos) << failures[0];
  EXPECT_OK(third_repo.Find("a", "2"));
  EXPECT_OK(third_repo.Find("b", "9"));
  bool marked = false;
  for (const ModelIndexEntry& e : third_repo.Index()) {
    if (e.name == "a" && e.version == "1") {
      marked = e.state == "UNAVAILABLE" && e.reason.find("/no/such") != std::string::npos;
    }
  }
  EXPECT_TRUE(marked) << ::testing::PrintToString(IndexOf(third_repo));
}

// A load that cannot be recorded would not survive a restart: it is undone, and says so.
TEST(InferenceServiceRecordsTest, ALoadThatCannotBeRecordedIsUndone) {
  InferenceServiceOptions options;
  options.default_deployment.device = "cpu";
  options.record_deployments = [](const std::string&, const std::vector<DeploymentRecord>&) {
    return absl::ResourceExhaustedError("job store: database or disk is full");
  };
  ModelRepository repo;
  InferenceService service(&repo, options);
  absl::Status status =
      service.LoadModel(LoadMessage("a", {{"checkpoint", SharedCheckpoints().mlp_flat}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("loaded but not recorded, so unloaded again: job store: "),
            std::string::npos)
      << status;
  EXPECT_FALSE(repo.Find("a", "").ok());
}

TEST_F(InferenceServiceTest, LoadAndUnloadWhileClientsSend) {
  const std::string a = SharedCheckpoints().mlp_flat, b = SharedCheckpoints().mlp_flat_other;
  const std::vector<uint8_t> images = testing::SampleImages(4, 19);
  const Answer from_a = EngineAnswer(a, images.data(), 4, "UINT8");
  const Answer from_b = EngineAnswer(b, images.data(), 4, "UINT8");
  ASSERT_FALSE(Near(from_a.probabilities, from_b.probabilities));
  ASSERT_OK(LoadRpc(*stub_, "hot", {{"checkpoint", StringParam(a)}}));

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, unavailable{0}, wrong{0};
  std::mutex mu;
  std::string first_wrong;
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&] {
      auto stub = server_.NewStub();
      auto request = MakeRequest("hot", images.data(), 4, "UINT8", Form::kRaw);
      while (!stop.load()) {
        inference::ModelInferResponse response;
        grpc::Status status = Infer(*stub, request, &response);
        if (status.ok()) {
          const Answer answer = ReadAnswer(response);
          // Every answer is wholly one checkpoint's (batched with others' requests or not).
          if ((Near(answer.probabilities, from_a.probabilities) &&
               answer.classes == from_a.classes) ||
              (Near(answer.probabilities, from_b.probabilities) &&
               answer.classes == from_b.classes)) {
            ++ok;
            continue;
          }
        } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                   status.error_message() == "model \"hot\" is unloaded") {
          ++unavailable;
          continue;
        }
        ++wrong;
        std::lock_guard<std::mutex> lock(mu);
        first_wrong = std::to_string(status.error_code()) + " " + status.error_message();
      }
    });
  }
  // Reloads (a version replaced under traffic), new versions, and whole unloads.
  auto admin = server_.NewStub();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  int cycles = 0;
  // At least 1.5 s and four cycles, however slow the machine.
  while (std::chrono::steady_clock::now() < until || cycles < 4) {
    const std::string path = cycles % 2 ? b : a;
    EXPECT_OK(LoadRpc(*admin, "hot",
                      {{"checkpoint", StringParam(path)}, {"version_policy", StringParam("all")}}));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_OK(
        LoadRpc(*admin, "hot", {{"checkpoint", StringParam(path)}, {"version", StringParam("1")}}));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (cycles % 3 == 2) {
      EXPECT_OK(UnloadRpc(*admin, "hot"));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ++cycles;
  }
  stop = true;
  for (auto& t : clients) t.join();
  RecordProperty("ok", ok.load());
  RecordProperty("unavailable", unavailable.load());
  RecordProperty("cycles", cycles);
  EXPECT_EQ(wrong.load(), 0) << first_wrong;
  EXPECT_GT(ok.load(), 0);
  // Afterwards the model loads and answers as ever.
  ASSERT_OK(LoadRpc(*admin, "hot", {{"checkpoint", StringParam(a)}}));
  inference::ModelInferResponse response;
  ASSERT_OK(Infer(*stub_, MakeRequest("hot", images.data(), 4, "UINT8", Form::kRaw), &response));
  EXPECT_EQ(ReadAnswer(response).probabilities, from_a.probabilities);
}

}  // namespace
}  // namespace kiln::serving
