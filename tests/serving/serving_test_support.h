// Shared pieces of the serving tests: small checkpoints trained for a moment on synthetic 28x28
// images, KServe v2 request builders, and an in-process server on a loopback port.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "inference/grpc_service.grpc.pb.h"
#include "server/serving/inference_service.h"
#include "server/serving/model_repository.h"

namespace kiln::serving::testing {

inline constexpr int kSide = 28;
inline constexpr int kPixels = kSide * kSide;
inline constexpr int kClasses = 10;

enum class TestModel {
  kMlpFlat,   // input {784}: linear 784-32, relu, linear 32-10; norm (x/255 - 0.5) / 0.25
  kMlpImage,  // input {1, 28, 28}: flatten, then as kMlpFlat; no normalisation beyond x/255
  kCnn,       // input {1, 28, 28}: conv 4x3x3, relu, pool 2, flatten, linear 676-10
};

// Trains `model` for one short epoch on band images and writes its checkpoint to `path`.
void WriteCheckpoint(const std::string& path, TestModel model, uint64_t seed = 1);

// Checkpoints of the test models, trained once per test process (in a folder removed at exit).
struct Checkpoints {
  std::string mlp_flat, mlp_flat_other /* another seed */, mlp_image, cnn;
};
const Checkpoints& SharedCheckpoints();

// `n` band images (n x 784 bytes), deterministic for a seed.
std::vector<uint8_t> SampleImages(int n, uint64_t seed);

// Where a request carries its pixels.
enum class Form { kTyped, kRaw };

// A ModelInfer request for `n` images with the given datatype ("UINT8" or "FP32", pixels / 255)
// and form; `shape` defaults to [n, 784].
inference::ModelInferRequest MakeRequest(const std::string& model, const uint8_t* pixels, int n,
                                         const std::string& datatype, Form form,
                                         std::vector<int64_t> shape = {});

// The "probabilities" and "class" outputs of a response, typed or raw (empty when absent).
struct Answer {
  std::vector<float> probabilities;
  std::vector<int64_t> classes;
};
Answer ReadAnswer(const inference::ModelInferResponse& response);

// A RepositoryModelLoad of `model` with string parameters (checkpoint, version, threads, ...).
inference::RepositoryModelLoadRequest LoadMessage(const std::string& model,
                                                  const std::map<std::string, std::string>& params);

// The repository's index as "model:version:state:reason", in its order.
std::vector<std::string> IndexOf(const ModelRepository& repo);

// A ModelRepository and an InferenceService behind a grpc::Server on 127.0.0.1, any free port.
class ServingServer {
 public:
  explicit ServingServer(ModelRepositoryOptions options = {});
  ~ServingServer();

  ModelRepository& repository() { return *repository_; }
  InferenceService& service() { return *service_; }
  int port() const { return port_; }
  // A stub on a channel of its own (its own TCP connection).
  std::unique_ptr<inference::GRPCInferenceService::Stub> NewStub() const;

 private:
  std::unique_ptr<ModelRepository> repository_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// A temporary folder removed at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace kiln::serving::testing
