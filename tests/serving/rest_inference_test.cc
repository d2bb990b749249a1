// KServe v2 over HTTP/REST beside the same InferenceService over gRPC: every answer (health,
// metadata, readiness, inference with JSON tensors and with binary tensor data, the repository
// extension) and every error (status and message) the same on both paths; malformed and
// oversized bodies, bearer tokens; and the same comparison driven by curl where it is installed.
#include "server/serving/rest_inference.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/precision.h"
#include "gmock/gmock.h"
#include "nlohmann/json.hpp"
#include "server/http/http_server.h"
#include "server/http/route_label.h"
#include "server/http/status_mapping.h"
#include "tests/serving/serving_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::http {
namespace {

using nlohmann::json;
using serving::AddKServeRoutes;
using serving::testing::Answer;
using serving::testing::Form;
using serving::testing::kClasses;
using serving::testing::kPixels;
using serving::testing::MakeRequest;
using serving::testing::ReadAnswer;
using serving::testing::SampleImages;
using serving::testing::SharedCheckpoints;
using ::testing::HasSubstr;

// The JSON body of a typed ModelInferRequest (UINT8 or FP32 "data"), as a REST client sends it.
json InferJson(const inference::ModelInferRequest& r) {
  json inputs = json::array();
  for (const auto& in : r.inputs()) {
    json data = json::array();
    for (uint32_t v : in.contents().uint_contents()) data.push_back(v);
    for (float v : in.contents().fp32_contents()) data.push_back(v);
    inputs.push_back({{"name", in.name()},
                      {"datatype", in.datatype()},
                      {"shape", std::vector<int64_t>(in.shape().begin(), in.shape().end())},
                      {"data", data}});
  }
  json body = {{"inputs", inputs}};
  if (!r.id().empty()) body["id"] = r.id();
  if (r.outputs_size() > 0) {
    body["outputs"] = json::array();
    for (const auto& o : r.outputs()) body["outputs"].push_back({{"name", o.name()}});
  }
  return body;
}

std::string InferPath(const inference::ModelInferRequest& r) {
  return r.model_version().empty() ? absl::StrCat("/v2/models/", r.model_name(), "/infer")
                                   : absl::StrCat("/v2/models/", r.model_name(), "/versions/",
                                                  r.model_version(), "/infer");
}

// The outputs of a REST inference response, read back as the gRPC tests read theirs.
Answer JsonAnswer(const json& body) {
  Answer answer;
  for (const json& out : body.at("outputs")) {
    if (!out.contains("data")) continue;  // sent as binary data
    if (out.at("name") == "probabilities") {
      for (const json& v : out.at("data")) answer.probabilities.push_back(v.get<float>());
    } else if (out.at("name") == "class") {
      for (const json& v : out.at("data")) answer.classes.push_back(v.get<int64_t>());
    }
  }
  return answer;
}

class RestInferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Deploy("mlp", SharedCheckpoints().mlp_flat);
    Deploy("image", SharedCheckpoints().mlp_image);
    stub_ = server_.NewStub();
    StartHttp({});
  }

  void StartHttp(HttpServerOptions options) {
    http_.reset();
    options.listen = "127.0.0.1:0";
    http_ = std::make_unique<HttpServer>(std::move(options));
    AddKServeRoutes(&server_.service(), http_.get());
    absl::StatusOr<int> port = http_->Start();
    ASSERT_OK(port) << port.status();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    client_->set_read_timeout(20, 0);
  }

  void Deploy(const std::string& name, const std::string& path) {
    serving::LoadRequest load;
    load.model = name;
    load.source = path;
    load.options.device = "cpu";
    ASSERT_OK(server_.repository().Load(load));
  }

  grpc::Status GrpcInfer(const inference::ModelInferRequest& request,
                         inference::ModelInferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub_->ModelInfer(&context, request, response);
  }

  httplib::Result PostJson(const std::string& path, const std::string& body,
                           const httplib::Headers& headers = {}) {
    return client_->Post(path.c_str(), headers, body, "application/json");
  }

  serving::testing::ServingServer server_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(RestInferenceTest, HealthAndServerMetadataAnswerAsGrpc) {
  httplib::Result live = client_->Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  EXPECT_EQ(live->body, "");
  httplib::Result ready = client_->Get("/v2/health/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);

  grpc::ClientContext context;
  inference::ServerMetadataResponse grpc_meta;
  ASSERT_OK(stub_->ServerMetadata(&context, {}, &grpc_meta));
  httplib::Result meta = client_->Get("/v2");
  ASSERT_TRUE(meta);
  ASSERT_EQ(meta->status, 200) << meta->body;
  const json j = json::parse(meta->body);
  EXPECT_EQ(j.at("name"), grpc_meta.name());
  EXPECT_EQ(j.at("version"), grpc_meta.version());
  EXPECT_EQ(j.at("extensions"), json::array({"model_repository"}));

  server_.service().SetReady(false);
  ready = client_->Get("/v2/health/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 400);  // the protocol's "no": a 4xx, with an empty body
  EXPECT_EQ(ready->body, "");
}

TEST_F(RestInferenceTest, ModelMetadataAndReadinessAnswerAsGrpc) {
  for (const std::string model : {"mlp", "image"}) {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name(model);
    inference::ModelMetadataResponse grpc_meta;
    ASSERT_OK(stub_->ModelMetadata(&context, request, &grpc_meta));
    httplib::Result meta = client_->Get(absl::StrCat("/v2/models/", model).c_str());
    ASSERT_TRUE(meta);
    ASSERT_EQ(meta->status, 200) << meta->body;
    const json j = json::parse(meta->body);
    EXPECT_EQ(j.at("name"), grpc_meta.name());
    EXPECT_EQ(j.at("platform"), grpc_meta.platform());
    EXPECT_EQ(j.at("versions").size(), static_cast<size_t>(grpc_meta.versions_size()));
    ASSERT_EQ(j.at("inputs").size(), 1u);
    EXPECT_EQ(j.at("inputs")[0].at("name"), grpc_meta.inputs(0).name());
    EXPECT_EQ(j.at("inputs")[0].at("datatype"), grpc_meta.inputs(0).datatype());
    EXPECT_EQ(j.at("inputs")[0].at("shape").get<std::vector<int64_t>>(),
              std::vector<int64_t>(grpc_meta.inputs(0).shape().begin(),
                                   grpc_meta.inputs(0).shape().end()));
    ASSERT_EQ(j.at("outputs").size(), 2u);
    EXPECT_EQ(j.at("outputs")[0].at("name"), "probabilities");
    EXPECT_EQ(j.at("outputs")[0].at("shape"), json::array({-1, kClasses}));
    EXPECT_EQ(j.at("outputs")[1].at("datatype"), "INT64");
    EXPECT_EQ(j.at("parameters").at("precision"),
              grpc_meta.parameters().at("precision").string_param());
    EXPECT_EQ(j.at("parameters").at("precision"), "fp32");
    // The same through the versioned path.
    httplib::Result versioned = client_->Get(
        absl::StrCat("/v2/models/", model, "/versions/", grpc_meta.versions(0)).c_str());
    ASSERT_TRUE(versioned);
    EXPECT_EQ(versioned->body, meta->body);
  }
  struct Ready {
    std::string path;
    int status;
  } cases[] = {{"/v2/models/mlp/ready", 200},
               {"/v2/models/mlp/versions/1/ready", 200},
               {"/v2/models/nope/ready", 400},
               {"/v2/models/mlp/versions/99/ready", 400}};
  for (const Ready& c : cases) {
    httplib::Result r = client_->Get(c.path.c_str());
    ASSERT_TRUE(r) << c.path;
    EXPECT_EQ(r->status, c.status) << c.path;
  }
}

TEST_F(RestInferenceTest, InferWithJsonTensorsAnswersAsGrpc) {
  const std::vector<uint8_t> images = SampleImages(3, 5);
  for (const std::string model : {"mlp", "image"}) {
    for (const std::string datatype : {"UINT8", "FP32"}) {
      std::vector<int64_t> shape = {3, kPixels};
      if (model == "image") shape = {3, 1, 28, 28};
      inference::ModelInferRequest request =
          MakeRequest(model, images.data(), 3, datatype, Form::kTyped, shape);
      request.set_id("req-7");
      inference::ModelInferResponse grpc_response;
      ASSERT_OK(GrpcInfer(request, &grpc_response));
      const Answer expected = ReadAnswer(grpc_response);

      httplib::Result r = PostJson(InferPath(request), InferJson(request).dump());
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << model << " " << datatype << ": " << r->body;
      EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
      const json j = json::parse(r->body);
      EXPECT_EQ(j.at("model_name"), model);
      EXPECT_EQ(j.at("model_version"), grpc_response.model_version());
      EXPECT_EQ(j.at("id"), "req-7");
      EXPECT_EQ(j.at("outputs")[0].at("shape"), json::array({3, kClasses}));
      EXPECT_EQ(j.at("outputs")[0].at("datatype"), "FP32");
      EXPECT_EQ(j.at("outputs")[1].at("shape"), json::array({3}));
      const Answer got = JsonAnswer(j);
      // The same computation on the same inputs: the same floats, through JSON and back.
      EXPECT_EQ(got.probabilities, expected.probabilities) << model << " " << datatype;
      EXPECT_EQ(got.classes, expected.classes) << model << " " << datatype;
    }
  }
}

TEST_F(RestInferenceTest, NestedDataAndChosenOutputs) {
  const std::vector<uint8_t> images = SampleImages(2, 9);
  inference::ModelInferRequest request =
      MakeRequest("mlp", images.data(), 2, "UINT8", Form::kTyped);
  inference::ModelInferResponse grpc_response;
  ASSERT_OK(GrpcInfer(request, &grpc_response));
  json body = InferJson(request);
  // Row-major nested arrays are the same tensor as the flat list.
  json rows = json::array();
  for (int i = 0; i < 2; ++i) {
    rows.push_back(
        std::vector<uint32_t>(images.begin() + i * kPixels, images.begin() + (i + 1) * kPixels));
  }
  body["inputs"][0]["data"] = rows;
  body["outputs"] = json::array({{{"name", "class"}}});
  httplib::Result r = PostJson("/v2/models/mlp/infer", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j.at("outputs").size(), 1u);
  EXPECT_EQ(j.at("outputs")[0].at("name"), "class");
  EXPECT_EQ(JsonAnswer(j).classes, ReadAnswer(grpc_response).classes);
}

// The binary tensor data extension: pixels as raw bytes after the JSON header, and outputs
// asked as binary come back as the raw bytes gRPC's raw_output_contents hold.
TEST_F(RestInferenceTest, BinaryTensorDataAnswersAsRawGrpc) {
  const std::vector<uint8_t> images = SampleImages(4, 11);
  inference::ModelInferRequest request = MakeRequest("mlp", images.data(), 4, "UINT8", Form::kRaw);
  inference::ModelInferResponse grpc_response;
  ASSERT_OK(GrpcInfer(request, &grpc_response));
  ASSERT_EQ(grpc_response.raw_output_contents_size(), 2);

  const json header = {{"inputs",
                        {{{"name", "input"},
                          {"datatype", "UINT8"},
                          {"shape", {4, kPixels}},
                          {"parameters", {{"binary_data_size", images.size()}}}}}},
                       {"outputs",
                        {{{"name", "probabilities"}, {"parameters", {{"binary_data", true}}}},
                         {{"name", "class"}}}}};
  const std::string head = header.dump();
  std::string body = head;
  body.append(reinterpret_cast<const char*>(images.data()), images.size());
  httplib::Result r = client_->Post(
      "/v2/models/mlp/infer", {{"Inference-Header-Content-Length", std::to_string(head.size())}},
      body, "application/octet-stream");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const size_t json_size = std::stoul(r->get_header_value("Inference-Header-Content-Length"));
  ASSERT_LE(json_size, r->body.size());
  const json j = json::parse(r->body.substr(0, json_size));
  const std::string binary = r->body.substr(json_size);
  ASSERT_EQ(j.at("outputs")[0].at("parameters").at("binary_data_size"), binary.size());
  EXPECT_FALSE(j.at("outputs")[0].contains("data"));
  EXPECT_EQ(binary, grpc_response.raw_output_contents(0));
  // The output not asked as binary comes as JSON data, read from the raw answer.
  EXPECT_EQ(JsonAnswer(j).classes, ReadAnswer(grpc_response).classes);
}

// Every error the model's own checks make reaches a REST client with the gRPC path's message,
// and an HTTP status for its code.
TEST_F(RestInferenceTest, ErrorsAnswerAsGrpc) {
  const std::vector<uint8_t> images = SampleImages(2, 3);
  auto valid = [&] { return MakeRequest("mlp", images.data(), 2, "UINT8", Form::kTyped); };
  struct Case {
    std::string what;
    std::function<void(inference::ModelInferRequest&)> edit;
    int http_status;
  } cases[] = {
      {"unknown model", [](auto& r) { r.set_model_name("nope"); }, 404},
      {"unknown version", [](auto& r) { r.set_model_version("42"); }, 404},
      {"bad shape",
       [](auto& r) {
         r.mutable_inputs(0)->clear_shape();
         r.mutable_inputs(0)->add_shape(2);
         r.mutable_inputs(0)->add_shape(100);
       },
       400},
      {"wrong datatype", [](auto& r) { r.mutable_inputs(0)->set_datatype("BOOL"); }, 400},
      {"unknown input", [](auto& r) { r.mutable_inputs(0)->set_name("pixels"); }, 400},
      {"unknown output", [](auto& r) { r.add_outputs()->set_name("logits"); }, 400},
      {"element count",
       [](auto& r) { r.mutable_inputs(0)->mutable_contents()->add_uint_contents(1); }, 400},
      {"pixel out of range",
       [](auto& r) { r.mutable_inputs(0)->mutable_contents()->set_uint_contents(0, 300); }, 400},
  };
  for (const Case& c : cases) {
    inference::ModelInferRequest request = valid();
    c.edit(request);
    json body = InferJson(request);
    if (c.what == "wrong datatype") {  // BOOL data in JSON is true/false
      body["inputs"][0]["data"] = std::vector<bool>(2 * kPixels, true);
      request.mutable_inputs(0)->clear_contents();
      for (int i = 0; i < 2 * kPixels; ++i) {
        request.mutable_inputs(0)->mutable_contents()->add_bool_contents(true);
      }
    }
    inference::ModelInferResponse grpc_response;
    const grpc::Status grpc_status = GrpcInfer(request, &grpc_response);
    ASSERT_FALSE(grpc_status.ok()) << c.what;
    httplib::Result r = PostJson(InferPath(request), body.dump());
    ASSERT_TRUE(r) << c.what;
    EXPECT_EQ(r->status, c.http_status) << c.what << ": " << r->body;
    EXPECT_EQ(HttpStatusOf(static_cast<absl::StatusCode>(grpc_status.error_code())), c.http_status)
        << c.what;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json") << c.what;
    EXPECT_EQ(json::parse(r->body).at("error"), grpc_status.error_message()) << c.what;
  }
}

TEST_F(RestInferenceTest, MalformedBodiesAre400NamingTheProblem) {
  struct Case {
    std::string body;
    httplib::Headers headers;
    std::string fragment;
  } cases[] = {
      {"{\"inputs\": [", {}, "the request body is not valid JSON"},
      {"[1, 2]", {}, "the request body must be a JSON object"},
      {"{}", {}, "inputs: required, an array"},
      {R"({"inputs": [{"name": "input", "shape": [1, 784], "data": [1]}]})",
       {},
       "inputs[0].datatype: required"},
      {R"({"inputs": [{"name": "input", "datatype": "UINT8", "data": [1]}]})",
       {},
       "input \"input\": shape: required"},
      {R"({"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 784], "data": "abc"}]})",
       {},
       "input \"input\": data[0]: \"abc\" is not a UINT8 value"},
      {R"({"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 784], "data": [-1]}]})",
       {},
       "data[0]: -1 is not a UINT8 value"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784]}]})",
       {},
       "input \"input\": data: required"},
      {"{}", {{"Inference-Header-Content-Length", "abc"}}, "Inference-Header-Content-Length"},
      {"{}", {{"Inference-Header-Content-Length", "99"}}, "is larger than the body"},
      {R"({"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 784],
           "parameters": {"binary_data_size": 784}}]})",
       {},
       "binary_data_size needs the Inference-Header-Content-Length header"},
  };
  for (const Case& c : cases) {
    httplib::Result r = PostJson("/v2/models/mlp/infer", c.body, c.headers);
    ASSERT_TRUE(r) << c.body;
    EXPECT_EQ(r->status, 400) << c.body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    EXPECT_THAT(j.value("error", ""), HasSubstr(c.fragment)) << c.body;
  }
  // Unknown routes are JSON errors too.
  httplib::Result r = client_->Get("/v2/nothing/here");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_THAT(json::parse(r->body).at("error").get<std::string>(), HasSubstr("no route"));
}

// Tensor data that does not fit its input is a 400 naming the input: a wrong element from the
// parser, ragged rows and too many or too few elements from the model's count against the shape.
// Rows of any nesting, integers for FP32 and "datatype" after "data" are served.
TEST_F(RestInferenceTest, JsonDataIsCheckedNamingTheInput) {
  const std::vector<uint8_t> images = SampleImages(2, 5);
  auto row = [&](int i, int n) {
    return json(
        std::vector<uint32_t>(images.begin() + i * kPixels, images.begin() + i * kPixels + n));
  };
  json flat = json::array();
  for (uint8_t v : images) flat.push_back(v);
  // nlohmann prints an object's members in key order: "data" comes before "datatype".
  auto with_data = [](json data) {
    return json{{"inputs",
                 {{{"name", "input"},
                   {"datatype", "UINT8"},
                   {"shape", {2, kPixels}},
                   {"data", std::move(data)}}}}}
        .dump();
  };
  json too_many = flat, too_few = flat, wrong = flat;
  too_many.push_back(1);
  too_few.erase(too_few.end() - 1);
  wrong[5] = "a";
  struct Case {
    std::string what;
    std::string body;
    std::string fragment;
  } cases[] = {
      {"ragged rows", with_data(json::array({row(0, kPixels), row(1, kPixels - 1)})),
       "input \"input\": shape [2,784] needs 1568 elements; contents.uint_contents has 1567"},
      {"too many", with_data(too_many), "needs 1568 elements; contents.uint_contents has 1569"},
      {"too few", with_data(too_few), "needs 1568 elements; contents.uint_contents has 1567"},
      {"wrong type", with_data(wrong), "input \"input\": data[5]: \"a\" is not a UINT8 value"},
  };
  for (const Case& c : cases) {
    httplib::Result r = PostJson("/v2/models/mlp/infer", c.body);
    ASSERT_TRUE(r) << c.what;
    EXPECT_EQ(r->status, 400) << c.what << ": " << r->body;
    EXPECT_THAT(json::parse(r->body).at("error").get<std::string>(), HasSubstr(c.fragment))
        << c.what;
  }

  inference::ModelInferResponse grpc_response;
  ASSERT_OK(GrpcInfer(MakeRequest("mlp", images.data(), 2, "FP32", Form::kTyped), &grpc_response));
  // The same pixels as FP32: whole numbers (0 and 1) as integers, the rest as fractions.
  json rows = json::array();
  for (int i = 0; i < 2; ++i) {
    json values = json::array();
    for (int p = 0; p < kPixels; ++p) {
      const float v = static_cast<float>(images[i * kPixels + p]) / 255.f;
      if (v == 0.f || v == 1.f) {
        values.push_back(static_cast<int>(v));
      } else {
        values.push_back(v);
      }
    }
    rows.push_back(json::array({values}));  // [2][1][784]
  }
  const json input = {
      {"name", "input"}, {"datatype", "FP32"}, {"shape", {2, kPixels}}, {"data", rows}};
  httplib::Result r = PostJson("/v2/models/mlp/infer", json{{"inputs", {input}}}.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Answer got = JsonAnswer(json::parse(r->body));
  EXPECT_EQ(got.probabilities, ReadAnswer(grpc_response).probabilities);
  EXPECT_EQ(got.classes, ReadAnswer(grpc_response).classes);
}

// A body nested deeper than any tensor (as an element of shape, of data, or the whole body) is a
// 400 naming the depth, never a crash: the error never serialises the client's value whole.
TEST_F(RestInferenceTest, DeeplyNestedBodiesAre400AndTheDaemonLives) {
  const std::string deep = std::string(80'000, '[') + std::string(80'000, ']');
  const std::vector<std::string> bodies = {
      R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [)" + deep + "]}]}",
      R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": )" + deep +
          "}]}",
      deep,
  };
  for (const std::string& body : bodies) {
    httplib::Result r = PostJson("/v2/models/mlp/infer", body);
    ASSERT_TRUE(r) << "kilnd's HTTP port answered nothing";
    EXPECT_EQ(r->status, 400);
    EXPECT_THAT(r->body, HasSubstr("deeper than 64 levels"));
    EXPECT_LT(r->body.size(), 2000u);
  }
  // An element that is a (shallow) array is named by its kind, not dumped.
  httplib::Result r = PostJson(
      "/v2/models/mlp/infer",
      R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [[1, 2, 3]], "data": [1]}]})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("shape: an array of 3 elements is not an integer"));
  httplib::Result live = client_->Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
}

// Without tokens, a page of another site cannot act through a browser (a text/plain form POST
// that unloads a model) and a DNS name that is not kilnd's (rebinding) reads nothing.
TEST_F(RestInferenceTest, OtherSitesAndRebindingNamesAreRefusedWithoutTokens) {
  httplib::Result unload = client_->Post("/v2/repository/models/mlp/unload",
                                         {{"Origin", "http://evil.example"}}, "{}", "text/plain");
  ASSERT_TRUE(unload);
  EXPECT_EQ(unload->status, 403);
  EXPECT_THAT(unload->body, HasSubstr("another site"));
  httplib::Result ready = client_->Get("/v2/models/mlp/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << "the model is still loaded";

  httplib::Result rebound = client_->Get("/v2/models/mlp", {{"Host", "evil.example"}});
  ASSERT_TRUE(rebound);
  EXPECT_EQ(rebound->status, 403);
  httplib::Result local = client_->Get("/v2/models/mlp", {{"Host", "localhost"}});
  ASSERT_TRUE(local);
  EXPECT_EQ(local->status, 200);
}

TEST_F(RestInferenceTest, ABodyOverTheMessageLimitIs413) {
  HttpServerOptions options;
  options.max_body_bytes = 4096;
  StartHttp(options);
  const std::vector<uint8_t> images = SampleImages(2, 3);
  const std::string body =
      InferJson(MakeRequest("mlp", images.data(), 2, "UINT8", Form::kTyped)).dump();
  ASSERT_GT(body.size(), 4096u);
  httplib::Result r = PostJson("/v2/models/mlp/infer", body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(json::parse(r->body).at("error").get<std::string>(),
              HasSubstr("over the limit of 4096 bytes (--max_message_bytes)"));
  // A chunked body (no Content-Length to check up front) is held to the same limit.
  httplib::Result chunked = client_->Post(
      "/v2/models/mlp/infer",
      [&body](size_t offset, httplib::DataSink& sink) {
        const size_t n = std::min<size_t>(1000, body.size() - offset);
        sink.write(body.data() + offset, n);
        if (offset + n == body.size()) sink.done();
        return true;
      },
      "application/json");
  ASSERT_TRUE(chunked);
  EXPECT_EQ(chunked->status, 413) << chunked->body;
  // Within the limit, the same listener still answers.
  httplib::Result live = client_->Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
}

TEST_F(RestInferenceTest, RepositoryExtensionOverRest) {
  // No body at all, as `curl -X POST` sends: the request's defaults.
  httplib::Result index = client_->Post("/v2/repository/index");
  ASSERT_TRUE(index);
  ASSERT_EQ(index->status, 200) << index->body;
  json models = json::parse(index->body);
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].at("state"), "READY");

  const json load = {
      {"parameters", {{"checkpoint", SharedCheckpoints().mlp_flat}, {"max_batch_size", 8}}}};
  httplib::Result loaded = PostJson("/v2/repository/models/extra/load", load.dump());
  ASSERT_TRUE(loaded);
  ASSERT_EQ(loaded->status, 200) << loaded->body;
  httplib::Result ready = client_->Get("/v2/models/extra/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  // Seen by gRPC too: one repository behind both.
  grpc::ClientContext context;
  inference::ModelReadyRequest ready_request;
  ready_request.set_name("extra");
  inference::ModelReadyResponse ready_response;
  ASSERT_OK(stub_->ModelReady(&context, ready_request, &ready_response));
  EXPECT_TRUE(ready_response.ready());

  httplib::Result unloaded = PostJson("/v2/repository/models/extra/unload", "{}");
  ASSERT_TRUE(unloaded);
  EXPECT_EQ(unloaded->status, 200) << unloaded->body;
  ready = client_->Get("/v2/models/extra/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 400);
  index = PostJson("/v2/repository/index", R"({"ready": true})");
  ASSERT_TRUE(index);
  EXPECT_EQ(json::parse(index->body).size(), 2u);

  // A precision load parameter over REST: the version's metadata says it, on both paths.
  const json bf16_load = {
      {"parameters", {{"checkpoint", SharedCheckpoints().mlp_flat}, {"precision", "bf16"}}}};
  httplib::Result bf16_loaded = PostJson("/v2/repository/models/half/load", bf16_load.dump());
  ASSERT_TRUE(bf16_loaded);
  ASSERT_EQ(bf16_loaded->status, 200) << bf16_loaded->body;
  httplib::Result half_meta = client_->Get("/v2/models/half/versions/1");
  ASSERT_TRUE(half_meta);
  ASSERT_EQ(half_meta->status, 200) << half_meta->body;
  EXPECT_EQ(json::parse(half_meta->body).at("parameters"), json({{"precision", "bf16"}}));
  EXPECT_EQ((*server_.repository().Find("half", "1"))->options().precision, Precision::kBf16);

  // A precision that is not one, or not a string: 400 naming the parameter and the words.
  for (const char* body :
       {R"({"parameters": {"precision": "half"}})", R"({"parameters": {"precision": 16}})"}) {
    httplib::Result bad_precision = PostJson("/v2/repository/models/half/load", body);
    ASSERT_TRUE(bad_precision);
    EXPECT_EQ(bad_precision->status, 400) << body;
    EXPECT_THAT(json::parse(bad_precision->body).at("error").get<std::string>(),
                HasSubstr("parameter \"precision\": "))
        << body;
  }
  httplib::Result bad_word =
      PostJson("/v2/repository/models/half/load", R"({"parameters": {"precision": "half"}})");
  ASSERT_TRUE(bad_word);
  EXPECT_EQ(json::parse(bad_word->body).at("error"),
            "parameter \"precision\": \"half\" is not a precision; expected fp32, tf32 or bf16");

  // A parameter kilnd does not read: the gRPC path's error.
  inference::RepositoryModelLoadRequest bad;
  bad.set_model_name("extra");
  (*bad.mutable_parameters())["colour"].set_string_param("red");
  grpc::ClientContext bad_context;
  inference::RepositoryModelLoadResponse bad_response;
  const grpc::Status grpc_status = stub_->RepositoryModelLoad(&bad_context, bad, &bad_response);
  ASSERT_FALSE(grpc_status.ok());
  httplib::Result refused =
      PostJson("/v2/repository/models/extra/load", R"({"parameters": {"colour": "red"}})");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(json::parse(refused->body).at("error"), grpc_status.error_message());
}

TEST_F(RestInferenceTest, BearerTokensGuardV2ButNotHealth) {
  HttpServerOptions options;
  options.authorize =
      [](const std::vector<std::string_view>& values) -> absl::StatusOr<server::Caller> {
    if (values.empty()) return absl::UnauthenticatedError("missing bearer token");
    for (std::string_view v : values) {
      if (v == "Bearer s3cret") return server::Caller{"tester", "ops", server::Role::kAdmin};
    }
    return absl::UnauthenticatedError("invalid bearer token");
  };
  StartHttp(options);
  httplib::Result r = client_->Get("/v2/models/mlp");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(json::parse(r->body).at("error"), "missing bearer token");
  r = client_->Get("/v2/models/mlp", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body).at("error"), "invalid bearer token");
  r = client_->Post("/v2/repository/models/mlp/unload", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_TRUE(server_.repository().Find("mlp", "").ok()) << "a refused unload changed nothing";
  r = client_->Get("/v2/models/mlp", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  for (const char* path : {"/v2/health/live", "/v2/health/ready"}) {
    r = client_->Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << path;
  }
}

// Metrics labels come from a fixed set, whatever names a client puts in the path.
TEST(RestRouteLabelTest, NamesInPathsFoldIntoAFixedSet) {
  const std::pair<std::string, std::string> cases[] = {
      {"/metrics", "/metrics"},
      {"/v2", "/v2"},
      {"/v2/", "/v2"},
      {"/v2/health/live", "/v2/health/live"},
      {"/v2/models/digits", "/v2/models/{model}"},
      {"/v2/models/digits/versions/3", "/v2/models/{model}"},
      {"/v2/models/x/versions/7/ready", "/v2/models/{model}/ready"},
      {"/v2/models/random-123/infer", "/v2/models/{model}/infer"},
      {"/v2/repository/index", "/v2/repository/index"},
      {"/v2/repository/models/a/load", "/v2/repository/models/{model}/load"},
      {"/v2/repository/models/a/unload", "/v2/repository/models/{model}/unload"},
      {"/v2/models/a/b/c", "other"},
      {"/favicon.ico", "other"},
      {"/", "/"},
      {"/web/app.js", "/web/{file}"},
      {"/web/anything-else", "/web/{file}"},
      {"/api/jobs", "/api/jobs"},
      {"/api/events", "/api/events"},
      {"/api/models", "/api/models"},
      {"/api/jobs/job-1", "/api/jobs/{job}"},
      {"/api/jobs/job-1/events", "/api/jobs/{job}/events"},
      {"/api/jobs/job-1/checkpoints", "/api/jobs/{job}/checkpoints"},
      {"/api/jobs/job-1/checkpoints/12/file", "/api/jobs/{job}/checkpoints/{checkpoint}/file"},
      {"/api/jobs/job-1/resume", "/api/jobs/{job}/resume"},
      {"/api/jobs/job-1/whatever", "other"},
      {"/api/other", "other"},
  };
  for (const auto& [path, label] : cases) EXPECT_EQ(RouteLabel(path), label) << path;
}

// What a user types: curl against the REST port, side by side with gRPC.
TEST_F(RestInferenceTest, CurlGetsTheGrpcAnswers) {
  if (access("/usr/bin/curl", X_OK) != 0) {
    GTEST_SKIP() << "/usr/bin/curl is not installed (apt-get install curl); the REST path is "
                    "still covered by the httplib client tests above";
  }
  const std::string base = absl::StrCat("http://127.0.0.1:", http_->port());
  serving::testing::TempDir dir;
  const std::vector<uint8_t> images = SampleImages(2, 21);
  const inference::ModelInferRequest request =
      MakeRequest("mlp", images.data(), 2, "FP32", Form::kTyped);
  { std::ofstream(dir.file("request.json")) << InferJson(request).dump(); }
  // The arguments are ours (no spaces, no quotes), so a plain shell line is safe.
  auto curl = [&](const std::vector<std::string>& args) {
    std::string command = "/usr/bin/curl -sS -w '\n%{http_code}'";
    for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
    std::string out;
    if (FILE* pipe = popen(command.c_str(), "r"); pipe != nullptr) {
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
      EXPECT_EQ(pclose(pipe), 0) << command;
    }
    return out;
  };
  // The last line is the HTTP status (-w), the rest the body.
  auto split = [](const std::string& out) {
    const size_t nl = out.rfind('\n');
    return std::make_pair(out.substr(0, nl), out.substr(nl + 1));
  };
  auto [live_body, live_status] = split(curl({base + "/v2/health/live"}));
  EXPECT_EQ(live_status, "200");
  // A POST with no body at all (no Content-Length), as `curl -X POST` sends it.
  auto [index_body, index_status] = split(curl({"-X", "POST", base + "/v2/repository/index"}));
  EXPECT_EQ(index_status, "200") << index_body;
  EXPECT_EQ(json::parse(index_body).size(), 2u);
  auto [infer_body, infer_status] =
      split(curl({"-H", "Content-Type: application/json", "--data-binary",
                  "@" + dir.file("request.json"), base + "/v2/models/mlp/infer"}));
  ASSERT_EQ(infer_status, "200") << infer_body;
  inference::ModelInferResponse grpc_response;
  ASSERT_OK(GrpcInfer(request, &grpc_response));
  const Answer expected = ReadAnswer(grpc_response);
  const Answer got = JsonAnswer(json::parse(infer_body));
  EXPECT_EQ(got.probabilities, expected.probabilities);
  EXPECT_EQ(got.classes, expected.classes);
  auto [missing_body, missing_status] = split(
      curl({"--data-binary", "@" + dir.file("request.json"), base + "/v2/models/nope/infer"}));
  EXPECT_EQ(missing_status, "404");
  EXPECT_EQ(json::parse(missing_body).at("error"), "unknown model \"nope\"");
}

}  // namespace
}  // namespace kiln::http
