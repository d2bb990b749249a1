// A tiny GPT served: KServe v2 infer with token ids (INT64, INT32) against the engine's own
// last-position logits, generation over REST (generate, generate_stream) and gRPC
// (kiln.v1.GenerationService) against the engine's Generate with the same seed, every bad
// input's error, and the bound on generations running at once.
#include "engine/generation.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/data/char_vocabulary.h"
#include "gmock/gmock.h"
#include "nlohmann/json.hpp"
#include "server/http/http_server.h"
#include "server/http/route_label.h"
#include "server/serving/generation_grpc_service.h"
#include "server/serving/generation_service.h"
#include "server/serving/rest_generation.h"
#include "server/serving/rest_inference.h"
#include "server/serving/token_codec.h"
#include "tests/engine/gpt_config.h"
#include "tests/serving/serving_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::serving {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kText[] = "hello world\n";
constexpr int64_t kBlock = 8;

ModelConfig TinyGpt(int64_t vocab) { return kiln::testing::GptConfig({vocab, kBlock, 1, 2, 16}); }

class GenerationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<CharVocabulary> v = CharVocabulary::FromText(kText, "test text");
    ASSERT_OK(v);
    vocabulary_ = std::make_unique<CharVocabulary>(*v);
    auto backend = CreateBackend("cpu", {1});
    ASSERT_OK(backend);
    backend_ = std::move(*backend);
    auto model = Model::Build(TinyGpt(vocabulary_->size()), backend_.get(), /*seed=*/3);
    ASSERT_OK(model);
    model_ = std::move(*model);
    ASSERT_OK(WriteCheckpoint(dir_.file("gpt.ckpt"), *model_, nullptr, TrainingPosition{},
                              PixelNorm{}, vocabulary_->ToJson()));
    ASSERT_OK(
        WriteCheckpoint(dir_.file("ids.ckpt"), *model_, nullptr, TrainingPosition{}, PixelNorm{}));
    Deploy("gpt", dir_.file("gpt.ckpt"));
    Deploy("ids", dir_.file("ids.ckpt"));
    Deploy("mlp", serving::testing::SharedCheckpoints().mlp_flat);
    StartServers(4);
  }

  void StartServers(int max_generations, absl::Duration max_duration = absl::Minutes(1)) {
    http_.reset();
    grpc_.reset();
    generation_ = std::make_unique<GenerationService>(
        &server_.repository(), GenerationOptions{max_generations, max_duration});
    http::HttpServerOptions options;
    options.listen = "127.0.0.1:0";
    http_ = std::make_unique<http::HttpServer>(std::move(options));
    AddGenerationRoutes(generation_.get(), http_.get());
    AddKServeRoutes(&server_.service(), http_.get());
    absl::StatusOr<int> port = http_->Start();
    ASSERT_OK(port);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    client_->set_read_timeout(20, 0);
    grpc_service_ = std::make_unique<GenerationGrpcService>(generation_.get());
    grpc::ServerBuilder builder;
    int grpc_port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &grpc_port);
    builder.RegisterService(grpc_service_.get());
    grpc_ = builder.BuildAndStart();
    ASSERT_NE(grpc_, nullptr);
    stub_ = kiln::v1::GenerationService::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", grpc_port), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    http_.reset();
    if (grpc_ != nullptr) grpc_->Shutdown();
  }

  void Deploy(const std::string& name, const std::string& path) {
    LoadRequest load;
    load.model = name;
    load.source = path;
    load.options.device = "cpu";
    load.options.batching.max_batch_size = 4;
    ASSERT_OK(server_.repository().Load(load));
  }

  // The engine's own answer: Generate on the model the checkpoint was written from.
  std::vector<int32_t> EngineGenerate(const std::string& prompt, const GenerationParams& params) {
    absl::StatusOr<std::vector<int32_t>> ids = vocabulary_->Encode(prompt);
    EXPECT_OK(ids);
    absl::StatusOr<std::vector<int32_t>> out = Generate(model_.get(), *ids, params);
    EXPECT_OK(out);
    return *out;
  }
  std::string EngineText(const std::string& prompt, const GenerationParams& params) {
    std::vector<int32_t> ids = EngineGenerate(prompt, params);
    return *vocabulary_->Decode(ids);
  }

  // The engine's logits at position length-1 of one prompt.
  std::vector<float> EngineLastLogits(const std::vector<int32_t>& prompt) {
    std::vector<int32_t> padded(kBlock, 0);
    std::copy(prompt.begin(), prompt.end(), padded.begin());
    auto x = backend_->Allocate(DType::kI32, {1, kBlock});
    EXPECT_OK(x);
    EXPECT_OK(backend_->CopyFromHost(padded.data(), padded.size() * 4, &*x));
    auto y = model_->Forward(*x, Mode::kEval);
    EXPECT_OK(y);
    const int64_t v = vocabulary_->size();
    std::vector<float> all(kBlock * v);
    EXPECT_OK(backend_->CopyToHost(**y, all.data(), all.size() * 4));
    const int64_t at = static_cast<int64_t>(prompt.size()) - 1;
    return std::vector<float>(all.begin() + at * v, all.begin() + (at + 1) * v);
  }

  httplib::Result Post(const std::string& path, const json& body) {
    return client_->Post(path.c_str(), body.dump(), "application/json");
  }

  serving::testing::TempDir dir_;
  std::unique_ptr<CharVocabulary> vocabulary_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  serving::testing::ServingServer server_;
  std::unique_ptr<GenerationService> generation_;
  std::unique_ptr<http::HttpServer> http_;
  std::unique_ptr<httplib::Client> client_;
  std::unique_ptr<GenerationGrpcService> grpc_service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<kiln::v1::GenerationService::Stub> stub_;
};

inference::ModelInferRequest TokenRequest(const std::string& datatype,
                                          const std::vector<std::vector<int64_t>>& rows) {
  inference::ModelInferRequest r;
  r.set_model_name("gpt");
  auto* in = r.add_inputs();
  in->set_name("input");
  in->set_datatype(datatype);
  in->add_shape(static_cast<int64_t>(rows.size()));
  in->add_shape(static_cast<int64_t>(rows[0].size()));
  for (const auto& row : rows) {
    for (int64_t id : row) {
      if (datatype == "INT64") in->mutable_contents()->add_int64_contents(id);
      if (datatype == "INT32") in->mutable_contents()->add_int_contents(static_cast<int32_t>(id));
      if (datatype == "FP32") in->mutable_contents()->add_fp32_contents(static_cast<float>(id));
    }
  }
  return r;
}

TEST_F(GenerationTest, InferTakesInt64AndInt32IdsAndAnswersLastPositionLogits) {
  const std::vector<std::vector<int64_t>> rows = {{1, 2, 3}, {4, 0, 5}};
  for (const std::string datatype : {"INT64", "INT32"}) {
    SCOPED_TRACE(datatype);
    inference::ModelInferResponse response;
    ASSERT_OK(server_.service().Infer(server::Caller::Unchecked(), TokenRequest(datatype, rows),
                                      &response));
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).name(), "logits");
    EXPECT_EQ(response.outputs(0).datatype(), "FP32");
    const int64_t v = vocabulary_->size();
    EXPECT_THAT(std::vector<int64_t>(response.outputs(0).shape().begin(),
                                     response.outputs(0).shape().end()),
                ::testing::ElementsAre(2, v));
    const auto& got = response.outputs(0).contents().fp32_contents();
    for (size_t b = 0; b < rows.size(); ++b) {
      std::vector<int32_t> prompt(rows[b].begin(), rows[b].end());
      std::vector<float> want = EngineLastLogits(prompt);
      for (int64_t i = 0; i < v; ++i) EXPECT_NEAR(got[b * v + i], want[i], 1e-5) << b << "," << i;
    }
  }
  // A full-length prompt, one row.
  inference::ModelInferResponse full;
  ASSERT_OK(server_.service().Infer(server::Caller::Unchecked(),
                                    TokenRequest("INT64", {{1, 2, 3, 4, 5, 6, 7, 8}}), &full));
  std::vector<float> want = EngineLastLogits({1, 2, 3, 4, 5, 6, 7, 8});
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(full.outputs(0).contents().fp32_contents(i), want[i], 1e-5);
  }
}

TEST_F(GenerationTest, RestInferTakesJsonIdsAndAnswersLogits) {
  const json request = {
      {"inputs",
       {{{"name", "input"}, {"datatype", "INT32"}, {"shape", {1, 3}}, {"data", {1, 2, 3}}}}}};
  httplib::Result res = Post("/v2/models/gpt/infer", request);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  ASSERT_EQ(body.at("outputs").size(), 1u);
  EXPECT_EQ(body.at("outputs")[0].at("name"), "logits");
  std::vector<float> want = EngineLastLogits({1, 2, 3});
  std::vector<float> got = body.at("outputs")[0].at("data").get<std::vector<float>>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5);
  httplib::Result meta = client_->Get("/v2/models/gpt");
  ASSERT_TRUE(meta);
  EXPECT_EQ(json::parse(meta->body).at("inputs")[0].at("datatype"), "INT64");
}

TEST_F(GenerationTest, MetadataShowsTokenIdsAndLogits) {
  inference::ModelMetadataRequest request;
  request.set_name("gpt");
  inference::ModelMetadataResponse metadata;
  ASSERT_OK(server_.service().Metadata(server::Caller::Unchecked(), request, &metadata));
  ASSERT_EQ(metadata.inputs_size(), 1);
  EXPECT_EQ(metadata.inputs(0).datatype(), "INT64");
  EXPECT_THAT(
      std::vector<int64_t>(metadata.inputs(0).shape().begin(), metadata.inputs(0).shape().end()),
      ::testing::ElementsAre(-1, -1));
  ASSERT_EQ(metadata.outputs_size(), 1);
  EXPECT_EQ(metadata.outputs(0).name(), "logits");
}

TEST_F(GenerationTest, InferRefusesBadTokenInputsNamingTheInput) {
  inference::ModelInferResponse response;
  absl::Status out_of_vocab = server_.service().Infer(server::Caller::Unchecked(),
                                                      TokenRequest("INT64", {{1, 99}}), &response);
  EXPECT_EQ(out_of_vocab.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out_of_vocab.message(), HasSubstr("input \"input\": token id 99 at [0,1]"));
  absl::Status too_long = server_.service().Infer(
      server::Caller::Unchecked(), TokenRequest("INT64", {{1, 2, 3, 4, 5, 6, 7, 8, 0}}), &response);
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.message(), HasSubstr("more than the model's context of 8"));
  absl::Status floats = server_.service().Infer(server::Caller::Unchecked(),
                                                TokenRequest("FP32", {{1, 2}}), &response);
  EXPECT_EQ(floats.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(floats.message(), HasSubstr("input \"input\": datatype \"FP32\""));
  absl::Status negative = server_.service().Infer(server::Caller::Unchecked(),
                                                  TokenRequest("INT32", {{-1}}), &response);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
}

json GenerateBody(const std::string& prompt, int64_t max_tokens, double temperature, int64_t top_k,
                  uint64_t seed) {
  return {{"text_input", prompt},
          {"parameters",
           {{"max_tokens", max_tokens},
            {"temperature", temperature},
            {"top_k", top_k},
            {"seed", seed}}}};
}

TEST_F(GenerationTest, RestGenerateGivesTheEngineText) {
  httplib::Result res = Post("/v2/models/gpt/generate", GenerateBody("hello", 20, 0.8, 4, 7));
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body.at("model_name"), "gpt");
  EXPECT_EQ(body.at("model_version"), "1");
  EXPECT_EQ(body.at("text_output"), EngineText("hello", {20, 0.8, 4, 7, true}));
  // Versions by number in the path, and another seed another draw (almost surely).
  httplib::Result v1 =
      Post("/v2/models/gpt/versions/1/generate", GenerateBody("hello", 20, 0.8, 4, 7));
  ASSERT_TRUE(v1);
  EXPECT_EQ(json::parse(v1->body).at("text_output"), body.at("text_output"));
}

// The data lines of an SSE body, each parsed.
std::vector<json> Events(const std::string& body) {
  std::vector<json> events;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (absl::ConsumePrefix(&line, "data: ")) events.push_back(json::parse(line));
  }
  return events;
}

TEST_F(GenerationTest, GenerateStreamSendsOneEventPerToken) {
  const json request = GenerateBody("wor", 25, 1.0, 0, 11);
  httplib::Result whole = Post("/v2/models/gpt/generate", request);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200);
  httplib::Result stream = Post("/v2/models/gpt/generate_stream", request);
  ASSERT_TRUE(stream);
  ASSERT_EQ(stream->status, 200) << stream->body;
  EXPECT_EQ(stream->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> events = Events(stream->body);
  ASSERT_EQ(events.size(), 25u) << stream->body;
  std::string text;
  for (const json& e : events) {
    EXPECT_EQ(e.at("model_name"), "gpt");
    EXPECT_EQ(e.at("model_version"), "1");
    EXPECT_EQ(e.at("text_output").get<std::string>().size(), 1u);  // one ASCII character
    text += e.at("text_output").get<std::string>();
  }
  EXPECT_EQ(text, json::parse(whole->body).at("text_output").get<std::string>());
}

TEST_F(GenerationTest, GrpcGenerateStreamsTheEngineTokens) {
  kiln::v1::GenerateRequest request;
  request.set_model_name("gpt");
  request.set_text_input("he");
  request.mutable_parameters()->set_max_tokens(12);
  request.mutable_parameters()->set_temperature(0.9);
  request.mutable_parameters()->set_seed(5);
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, request);
  kiln::v1::GenerateResponse response;
  std::vector<int32_t> ids;
  std::string text, finish;
  while (reader->Read(&response)) {
    ids.push_back(static_cast<int32_t>(response.token_id()));
    text += response.text_output();
    EXPECT_TRUE(finish.empty()) << "finish_reason before the last response";
    finish = response.finish_reason();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(ids, EngineGenerate("he", {12, 0.9, 0, 5, true}));
  EXPECT_EQ(text, EngineText("he", {12, 0.9, 0, 5, true}));
  EXPECT_EQ(finish, "length");
}

TEST_F(GenerationTest, AGenerationPastItsLongestTimeEndsWithFinishReasonStop) {
  StartServers(4, absl::ZeroDuration());  // every generation is past it after its first token
  kiln::v1::GenerateRequest request;
  request.set_model_name("gpt");
  request.set_text_input("he");
  request.mutable_parameters()->set_max_tokens(50);
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, request);
  kiln::v1::GenerateResponse response;
  int count = 0;
  std::string finish;
  while (reader->Read(&response)) {
    ++count;
    finish = response.finish_reason();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(count, 1);
  EXPECT_EQ(finish, "stop");
}

TEST_F(GenerationTest, GrpcGenerateRefusesANonLanguageModel) {
  kiln::v1::GenerateRequest request;
  request.set_model_name("mlp");
  request.set_text_input("he");
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, request);
  kiln::v1::GenerateResponse response;
  EXPECT_FALSE(reader->Read(&response));
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("model \"mlp\" is not a language model"));
}

TEST_F(GenerationTest, BadGenerationRequestsAreRefusedNamingWhatIsWrong) {
  struct Case {
    std::string path;
    json body;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"/v2/models/gpt/generate", GenerateBody("hellX", 5, 1, 0, 1), 400, "text_input: "},
      {"/v2/models/gpt/generate", GenerateBody("hello world", 5, 1, 0, 1), 400, "prompt"},
      {"/v2/models/gpt/generate", GenerateBody("he", 64 * kBlock + 1, 1, 0, 1), 400, "max_tokens"},
      {"/v2/models/gpt/generate", GenerateBody("he", 5, -0.5, 0, 1), 400, "temperature"},
      {"/v2/models/gpt/generate", GenerateBody("he", 5, 1, 1000, 1), 400, "top_k"},
      {"/v2/models/mlp/generate", GenerateBody("he", 5, 1, 0, 1), 400,
       "model \"mlp\" is not a language model"},
      {"/v2/models/nope/generate", GenerateBody("he", 5, 1, 0, 1), 404, "unknown model \"nope\""},
      {"/v2/models/gpt/generate", json{{"text_input", "he"}, {"parameters", {{"beam", 2}}}}, 400,
       "parameters.beam: unknown"},
      {"/v2/models/gpt/generate", json{{"prompt", "he"}}, 400, "prompt: unknown field"},
      {"/v2/models/gpt/generate_stream", GenerateBody("hellX", 5, 1, 0, 1), 400, "text_input: "},
      {"/v2/models/ids/generate", GenerateBody("he", 5, 1, 0, 1), 400, "send input_ids instead"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.dump());
    httplib::Result res = Post(c.path, c.body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, c.status) << res->body;
    json body = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(body.contains("error")) << res->body;
    EXPECT_THAT(body.at("error").get<std::string>(), HasSubstr(c.message));
  }
  // The unknown character is named, with where it is.
  httplib::Result unknown = Post("/v2/models/gpt/generate", GenerateBody("hellX", 5, 1, 0, 1));
  ASSERT_TRUE(unknown);
  EXPECT_THAT(json::parse(unknown->body).at("error").get<std::string>(), HasSubstr("X"));
  EXPECT_THAT(json::parse(unknown->body).at("error").get<std::string>(), HasSubstr("4"));
}

TEST_F(GenerationTest, ModelWithoutVocabularyTakesAndAnswersIds) {
  const json request = {{"input_ids", {3, 1, 4}},
                        {"parameters", {{"max_tokens", 6}, {"temperature", 0}}}};
  httplib::Result res = Post("/v2/models/ids/generate", request);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_FALSE(body.contains("text_output"));
  absl::StatusOr<std::vector<int32_t>> want = Generate(model_.get(), {3, 1, 4}, {6, 0, 0, 0, true});
  ASSERT_OK(want);
  EXPECT_EQ(body.at("output_ids").get<std::vector<int32_t>>(), *want);
  httplib::Result bad = Post("/v2/models/ids/generate", {{"input_ids", {3, 100}}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("input_ids[1]: token id 100"));
}

TEST_F(GenerationTest, GenerationsPastTheLimitAreRefusedUntilOneEnds) {
  StartServers(1);
  GenerationCall call;
  call.model = "gpt";
  call.text_input = "he";
  absl::StatusOr<std::unique_ptr<Generation>> held =
      generation_->Start(server::Caller::Unchecked(), call);
  ASSERT_OK(held);
  absl::StatusOr<std::unique_ptr<Generation>> second =
      generation_->Start(server::Caller::Unchecked(), call);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("--max_generations 1"));
  httplib::Result res = Post("/v2/models/gpt/generate", GenerateBody("he", 3, 1, 0, 1));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  held->reset();
  EXPECT_EQ(generation_->running(), 0);
  httplib::Result after = Post("/v2/models/gpt/generate", GenerateBody("he", 3, 1, 0, 1));
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
}

// Generations and infers of one version at once take turns on its one model: each answer is the
// one it gets alone.
TEST_F(GenerationTest, ConcurrentGenerationsAndInfersOfOneVersionEachGetTheirOwnAnswer) {
  const std::string want = EngineText("hello", {30, 0.8, 0, 9, true});
  const std::vector<float> logits = EngineLastLogits({1, 2, 3});
  std::vector<std::string> texts(4);
  std::vector<std::vector<float>> inferred(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", http_->port());
      client.set_read_timeout(20, 0);
      httplib::Result res =
          client.Post("/v2/models/gpt/generate_stream", GenerateBody("hello", 30, 0.8, 0, 9).dump(),
                      "application/json");
      if (res && res->status == 200) {
        for (const json& e : Events(res->body)) texts[i] += e.at("text_output").get<std::string>();
      }
    });
    threads.emplace_back([&, i] {
      inference::ModelInferResponse response;
      if (server_.service()
              .Infer(server::Caller::Unchecked(), TokenRequest("INT64", {{1, 2, 3}}), &response)
              .ok()) {
        const auto& c = response.outputs(0).contents().fp32_contents();
        inferred[i].assign(c.begin(), c.end());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(texts[i], want) << i;
    ASSERT_EQ(inferred[i].size(), logits.size()) << i;
    for (size_t j = 0; j < logits.size(); ++j) EXPECT_NEAR(inferred[i][j], logits[j], 1e-5);
  }
}

TEST(GenerationRouteLabelTest, GenerateRoutesFoldTheModelName) {
  EXPECT_EQ(http::RouteLabel("/v2/models/gpt/generate"), "/v2/models/{model}/generate");
  EXPECT_EQ(http::RouteLabel("/v2/models/gpt/versions/2/generate_stream"),
            "/v2/models/{model}/generate_stream");
}

}  // namespace
}  // namespace kiln::serving
