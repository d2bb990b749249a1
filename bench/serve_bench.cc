// kiln-bench-serve: N concurrent KServe v2 gRPC clients on loopback against a deployed MNIST model,
// for a fixed time each, with dynamic batching off and on; prints throughput and p50/p99 latency.
// With --protocol rest the clients speak KServe v2 REST (JSON bodies, keep-alive) to kilnd's HTTP
// listener instead, so that the HTTP port's own cost shows.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/data/dataset.h"
#include "engine/inference.h"
#include "engine/model/model_config.h"
#include "engine/reference_configs.h"
#include "engine/rng.h"
#include "engine/trainer.h"
#include "inference/grpc_service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/http/http_server.h"
#include "server/serving/inference_service.h"
#include "server/serving/model_repository.h"
#include "server/serving/rest_inference.h"

namespace {

using Clock = std::chrono::steady_clock;

// MNIST-shaped stand-in when data/mnist is absent: class k is a bright block at spot k.
kiln::Dataset SyntheticDigits(int64_t n, uint64_t seed) {
  kiln::Dataset d;
  d.sample_shape = {28, 28};
  d.size = n;
  d.num_classes = 10;
  d.pixels.resize(n * 784);
  d.labels.resize(n);
  kiln::Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng.Below(10));
    d.labels[i] = label;
    const int y0 = 2 + (label / 5) * 13, x0 = 1 + (label % 5) * 5;
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) {
        const bool lit = y >= y0 && y < y0 + 7 && x >= x0 && x < x0 + 5;
        d.pixels[i * 784 + y * 28 + x] = static_cast<uint8_t>((lit ? 170 : 0) + rng.Uniform(0, 80));
      }
    }
  }
  return d;
}

struct Scenario {
  std::string name;  // also the deployed model's name
  kiln::serving::BatchingOptions batching;
  int clients;
};

struct Result {
  int64_t requests = 0, errors = 0;
  double seconds = 0, p50_us = 0, p99_us = 0, mean_batch = 0;
  double cpu_seconds = 0;  // the whole process's (clients and server), while measuring
};

enum class InputForm { kU8Raw, kF32Typed };

inference::ModelInferRequest MakeRequest(const std::string& model, const uint8_t* pixels,
                                         InputForm form) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* input = request.add_inputs();
  input->set_name("input");
  input->add_shape(1);
  input->add_shape(784);
  if (form == InputForm::kU8Raw) {
    input->set_datatype("UINT8");
    request.add_raw_input_contents(reinterpret_cast<const char*>(pixels), 784);
  } else {
    input->set_datatype("FP32");
    for (int i = 0; i < 784; ++i) input->mutable_contents()->add_fp32_contents(pixels[i] / 255.0f);
  }
  return request;
}

enum class ClientKind { kAsync, kSync, kRest };

// The REST body of the same request: typed JSON data, as a KServe v2 REST client sends it.
std::string RestBody(const uint8_t* pixels, InputForm form) {
  nlohmann::json data = nlohmann::json::array();
  for (int i = 0; i < 784; ++i) {
    if (form == InputForm::kU8Raw) {
      data.push_back(pixels[i]);
    } else {
      data.push_back(pixels[i] / 255.0f);
    }
  }
  nlohmann::json input = {{"name", "input"},
                          {"datatype", form == InputForm::kU8Raw ? "UINT8" : "FP32"},
                          {"shape", {1, 784}},
                          {"data", data}};
  return nlohmann::json{{"inputs", {input}}}.dump();
}

// One client of the callback (async) API: a request in flight at a time, the next one sent from
// the completion of the last, on gRPC's own threads.
class AsyncClient {
 public:
  AsyncClient(inference::GRPCInferenceService::Stub* stub,
              std::vector<inference::ModelInferRequest> requests,
              const std::atomic<bool>* measuring, const std::atomic<bool>* stop,
              std::function<void()> on_stopped)
      : stub_(stub),
        requests_(std::move(requests)),
        measuring_(measuring),
        stop_(stop),
        on_stopped_(std::move(on_stopped)) {
    latencies_.reserve(1 << 20);
  }
  void Send() {
    context_ = std::make_unique<grpc::ClientContext>();
    t0_ = Clock::now();
    stub_->async()->ModelInfer(context_.get(), &requests_[n_++ % requests_.size()], &response_,
                               [this](grpc::Status status) { Done(status); });
  }
  std::vector<float>& latencies() { return latencies_; }
  int64_t errors() const { return errors_; }

 private:
  void Done(const grpc::Status& status) {
    const auto t1 = Clock::now();
    if (measuring_->load(std::memory_order_relaxed)) {
      if (status.ok()) {
        latencies_.push_back(std::chrono::duration<float, std::micro>(t1 - t0_).count());
      } else if (errors_++ == 0) {
        std::fprintf(stderr, "kiln-bench-serve: %s\n", status.error_message().c_str());
      }
    }
    if (stop_->load(std::memory_order_relaxed)) {
      on_stopped_();
    } else {
      Send();
    }
  }

  inference::GRPCInferenceService::Stub* stub_;
  std::vector<inference::ModelInferRequest> requests_;
  const std::atomic<bool>* measuring_;
  const std::atomic<bool>* stop_;
  std::function<void()> on_stopped_;
  std::unique_ptr<grpc::ClientContext> context_;
  inference::ModelInferResponse response_;
  Clock::time_point t0_;
  int64_t n_ = 0, errors_ = 0;
  std::vector<float> latencies_;
};

double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

Result RunScenario(const Scenario& s, int port, int rest_port, const kiln::Dataset& images,
                   double seconds, InputForm form, ClientKind kind,
                   kiln::serving::ModelRepository& repo) {
  std::atomic<bool> measuring{false}, stop{false};
  std::vector<std::vector<float>> latencies(s.clients);
  std::vector<int64_t> errors(s.clients, 0);
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs;
  std::vector<std::vector<inference::ModelInferRequest>> requests(s.clients);
  std::vector<std::vector<std::string>> rest_bodies(s.clients);
  for (int c = 0; c < s.clients; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per client
    stubs.push_back(inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args)));
    // A few distinct images per client, requests built once: the client side stays cheap.
    for (int k = 0; k < 8; ++k) {
      const int64_t i = (int64_t{c} * 8 + k) % images.size;
      requests[c].push_back(MakeRequest(s.name, images.pixels.data() + i * 784, form));
      if (kind == ClientKind::kRest)
        rest_bodies[c].push_back(RestBody(images.pixels.data() + i * 784, form));
    }
  }
  std::mutex mu;
  std::condition_variable all_stopped;
  int stopped = 0;
  std::vector<std::unique_ptr<AsyncClient>> async_clients;
  if (kind == ClientKind::kAsync) {
    for (int c = 0; c < s.clients; ++c) {
      async_clients.push_back(
          std::make_unique<AsyncClient>(stubs[c].get(), requests[c], &measuring, &stop, [&] {
            std::lock_guard<std::mutex> lock(mu);
            ++stopped;
            all_stopped.notify_one();
          }));
    }
    for (auto& client : async_clients) client->Send();
  } else if (kind == ClientKind::kRest) {
    const std::string path = "/v2/models/" + s.name + "/infer";
    for (int c = 0; c < s.clients; ++c) {
      threads.emplace_back([&, c, path] {
        latencies[c].reserve(1 << 20);
        httplib::Client http("127.0.0.1", rest_port);
        http.set_keep_alive(true);
        // httplib's client writes a request's head and body apart: without this, Nagle holds the
        // body for the server's delayed ACK (40 ms).
        http.set_tcp_nodelay(true);
        http.set_read_timeout(20, 0);
        for (int64_t n = 0; !stop.load(std::memory_order_relaxed); ++n) {
          const auto t0 = Clock::now();
          httplib::Result r = http.Post(path.c_str(), rest_bodies[c][n % rest_bodies[c].size()],
                                        "application/json");
          const auto t1 = Clock::now();
          if (!measuring.load(std::memory_order_relaxed)) continue;
          if (!r || r->status != 200) {
            if (errors[c]++ == 0) {
              std::fprintf(stderr, "kiln-bench-serve: REST %s\n",
                           r ? r->body.c_str() : httplib::to_string(r.error()).c_str());
            }
            continue;
          }
          latencies[c].push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
        }
      });
    }
  } else {
    for (int c = 0; c < s.clients; ++c) {
      threads.emplace_back([&, c] {
        latencies[c].reserve(1 << 20);
        inference::ModelInferResponse response;
        for (int64_t n = 0; !stop.load(std::memory_order_relaxed); ++n) {
          grpc::ClientContext context;
          const auto t0 = Clock::now();
          grpc::Status status =
              stubs[c]->ModelInfer(&context, requests[c][n % requests[c].size()], &response);
          const auto t1 = Clock::now();
          if (!measuring.load(std::memory_order_relaxed)) continue;
          if (!status.ok()) {
            if (errors[c]++ == 0) {
              std::fprintf(stderr, "kiln-bench-serve: %s\n", status.error_message().c_str());
            }
            continue;
          }
          latencies[c].push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
        }
      });
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // connect and warm up
  const auto before = (*repo.Find(s.name, ""))->batcher().stats();
  const double cpu0 = ProcessCpuSeconds();
  measuring = true;
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  measuring = false;
  const auto t1 = Clock::now();
  const double cpu1 = ProcessCpuSeconds();
  const auto after = (*repo.Find(s.name, ""))->batcher().stats();
  stop = true;
  for (auto& t : threads) t.join();
  if (kind == ClientKind::kAsync) {
    std::unique_lock<std::mutex> lock(mu);
    all_stopped.wait(lock, [&] { return stopped == s.clients; });
    for (int c = 0; c < s.clients; ++c) {
      latencies[c] = std::move(async_clients[c]->latencies());
      errors[c] = async_clients[c]->errors();
    }
  }

  Result r;
  r.cpu_seconds = cpu1 - cpu0;
  std::vector<float> all;
  for (int c = 0; c < s.clients; ++c) {
    all.insert(all.end(), latencies[c].begin(), latencies[c].end());
    r.errors += errors[c];
  }
  std::sort(all.begin(), all.end());
  r.requests = static_cast<int64_t>(all.size());
  r.seconds = std::chrono::duration<double>(t1 - t0).count();
  if (!all.empty()) {
    r.p50_us = all[all.size() / 2];
    r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  const int64_t batches = after.batches - before.batches;
  r.mean_batch = batches > 0 ? double(after.samples - before.samples) / batches : 0;
  return r;
}

// Median microseconds of `fn` over `n` calls.
template <typename Fn>
double MedianMicros(int n, Fn fn) {
  std::vector<double> t(n);
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    fn();
    t[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  std::sort(t.begin(), t.end());
  return t[n / 2];
}

// Where the batch-1 time goes: the engine's forward pass alone, the batcher's hand-off to its
// worker on top of it, and an empty gRPC round trip (ServerLive) on this loopback.
void PrintBaselines(const std::string& checkpoint, kiln::Backend* backend,
                    const kiln::Dataset& images, kiln::serving::ModelRepository& repo, int port,
                    int rest_port) {
  auto session = kiln::InferenceSession::FromCheckpoint(checkpoint, backend, 1);
  if (!session.ok()) return;
  float probs[16];
  int32_t cls[16];
  const double forward = MedianMicros(
      2000, [&] { (*session)->PredictU8(images.pixels.data(), 1, probs, cls).IgnoreError(); });
  auto version = *repo.Find("off", "");
  int64_t out_class;
  const double batcher = MedianMicros(2000, [&] {
    kiln::serving::PixelInput in{kiln::serving::PixelEncoding::kU8, images.pixels.data(), 1};
    version->batcher()
        .Run(in, {reinterpret_cast<char*>(probs), reinterpret_cast<char*>(&out_class)})
        .IgnoreError();
  });
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  const double rpc = MedianMicros(2000, [&] {
    grpc::ClientContext context;
    inference::ServerLiveResponse live;
    stub->ServerLive(&context, {}, &live).IgnoreError();
  });
  std::printf(
      "# batch-1 medians: engine forward %.1f us, through the batcher %.1f us, "
      "empty gRPC call %.1f us\n",
      forward, batcher, rpc);
  if (rest_port > 0) {
    httplib::Client http("127.0.0.1", rest_port);
    http.set_keep_alive(true);
    http.set_tcp_nodelay(true);
    const double live = MedianMicros(2000, [&] { http.Get("/v2/health/live"); });
    std::printf("# empty REST call (GET /v2/health/live, kept alive) %.1f us\n", live);
  }
}

// Trains `model` on `train` for `epochs` and writes it to `*checkpoint` (a temporary folder,
// returned in `*dir`, when none is named): the served model when no checkpoint file exists.
absl::Status TrainCheckpoint(const std::string& model, int epochs, bool real,
                             const kiln::Dataset& train, const kiln::Dataset& test,
                             std::string* checkpoint, std::string* dir) {
  kiln::TrainConfig config = model == "mlp" ? kiln::MnistMlpReference() : kiln::MnistCnnReference();
  // A served MLP worth querying after one epoch: 10x the reference SGD rate.
  if (model == "mlp") config.optimizer.lr = 0.01f;
  config.epochs = epochs;
  auto backend = kiln::CreateBackend("cpu");
  if (!backend.ok()) return backend.status();
  auto trainer = kiln::Trainer::Create(config, backend->get(), &train, &test);
  if (!trainer.ok() || !(*trainer)->Run({}).ok()) return absl::InternalError("training failed");
  auto eval = (*trainer)->Evaluate(test);
  if (checkpoint->empty()) {
    *dir = (std::filesystem::temp_directory_path() /
            ("kiln_bench_serve_" + std::to_string(::getpid())))
               .string();
    std::filesystem::create_directories(*dir);
    *checkpoint = *dir + "/model.safetensors";
  }
  if (!(*trainer)->SaveCheckpoint(*checkpoint).ok()) {
    return absl::InternalError("cannot write " + *checkpoint);
  }
  std::printf("# trained %s for %d epoch(s) on %s MNIST: test accuracy %.2f%%\n", model.c_str(),
              epochs, real ? "real" : "synthetic", eval.ok() ? 100.0 * eval->accuracy : 0.0);
  return absl::OkStatus();
}

// Loads the checkpoint as the models "off" (no batching) and "on" (batching as `on`).
absl::Status LoadModels(kiln::serving::ModelRepository& repo, const std::string& checkpoint,
                        const std::string& device, int threads,
                        const kiln::serving::BatchingOptions& off,
                        const kiln::serving::BatchingOptions& on) {
  for (const std::string name : {"off", "on"}) {
    kiln::serving::LoadRequest load;
    load.model = name;
    load.source = checkpoint;
    load.options.device = device;
    load.options.threads = threads;
    load.options.batching = name == "off" ? off : on;
    if (auto loaded = repo.Load(load); !loaded.ok()) return loaded.status();
  }
  return absl::OkStatus();
}

// KServe v2 REST onto `service` on a loopback port of kilnd's HTTP listener.
absl::StatusOr<std::unique_ptr<kiln::http::HttpServer>> StartRest(
    kiln::serving::InferenceService* service, int* port) {
  kiln::http::HttpServerOptions options;
  options.listen = "127.0.0.1:0";
  auto http = std::make_unique<kiln::http::HttpServer>(std::move(options));
  kiln::serving::AddKServeRoutes(service, http.get());
  absl::StatusOr<int> bound = http->Start();
  if (!bound.ok()) return bound.status();
  *port = *bound;
  return http;
}

// Prints one run's row of the results table.
void PrintRow(const Scenario& s, const Result& r) {
  const std::string opts =
      "max_batch=" + std::to_string(s.batching.max_batch_size) +
      (s.batching.max_batch_size > 1 ? " delay=" + std::to_string(s.batching.max_queue_delay_us)
                                     : "");
  std::printf("%-9s %-22s %8d %10lld %12.0f %10.1f %10.1f %10.2f %12.1f%s\n", s.name.c_str(),
              opts.c_str(), s.clients, static_cast<long long>(r.requests), r.requests / r.seconds,
              r.p50_us, r.p99_us, r.mean_batch,
              r.requests > 0 ? 1e6 * r.cpu_seconds / r.requests : 0.0,
              r.errors ? (" errors=" + std::to_string(r.errors)).c_str() : "");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-bench-serve: KServe v2 gRPC serving throughput and latency on loopback"};
  std::string model = "mlp", data = "data/mnist", checkpoint, device = "cpu", input = "u8raw";
  std::string runs = "off1,offN,on1,onN", client = "async", protocol = "grpc";
  int clients = 64, epochs = 1, max_batch = 64, threads = 1;
  int64_t delay_us = kiln::serving::BatchingOptions{}.max_queue_delay_us;
  double seconds = 3;
  app.add_option("--model", model, "mlp (784-512-256-10) or cnn")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--data", data, "MNIST folder; synthetic digits when it is absent");
  app.add_option("--checkpoint", checkpoint,
                 "serve this checkpoint; when the file is missing, train one and write it there");
  app.add_option("--epochs", epochs, "epochs to train the served model")->check(CLI::Range(1, 50));
  app.add_option("--device", device, "device the served model runs on");
  app.add_option("--threads", threads, "CPU threads of each served model (0: all cores)")
      ->check(CLI::Range(0, 256));
  app.add_option("--clients", clients, "concurrent clients of the many-client runs")
      ->check(CLI::Range(1, 1024));
  app.add_option("--seconds", seconds, "measured time per run")->check(CLI::Range(0.1, 600.0));
  app.add_option("--max_batch_size", max_batch, "max_batch_size with batching on")
      ->check(CLI::Range(2, 1024));
  app.add_option("--max_queue_delay_us", delay_us, "max_queue_delay_us with batching on")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--input", input, "u8raw (UINT8 raw_input_contents) or f32typed")
      ->check(CLI::IsMember({"u8raw", "f32typed"}));
  app.add_option("--client", client,
                 "async: clients on gRPC's callback API (few threads); sync: a thread each")
      ->check(CLI::IsMember({"async", "sync"}));
  app.add_option("--protocol", protocol,
                 "grpc, or rest: KServe v2 REST over kilnd's HTTP listener (a thread per client)")
      ->check(CLI::IsMember({"grpc", "rest"}));
  app.add_option("--runs", runs, "which runs, of off1,offN,on1,onN (N: --clients)");
  CLI11_PARSE(app, argc, argv);

  auto splits = kiln::LoadImageFolder(data);
  const bool real = splits.ok();
  kiln::Dataset train = real ? splits->train : SyntheticDigits(6000, 1);
  kiln::Dataset test = real ? splits->test : SyntheticDigits(1000, 2);
  std::string dir;
  if (checkpoint.empty() || !std::filesystem::exists(checkpoint)) {
    if (absl::Status trained = TrainCheckpoint(model, epochs, real, train, test, &checkpoint, &dir);
        !trained.ok()) {
      std::fprintf(stderr, "kiln-bench-serve: %s\n", std::string(trained.message()).c_str());
      return 1;
    }
  }

  const std::vector<Scenario> scenarios = {
      {"off", {1, 0}, 1},
      {"off", {1, 0}, clients},
      {"on", {max_batch, delay_us}, 1},
      {"on", {max_batch, delay_us}, clients},
  };
  kiln::serving::ModelRepository repo;
  if (absl::Status loaded = LoadModels(repo, checkpoint, device, threads, scenarios[0].batching,
                                       scenarios[2].batching);
      !loaded.ok()) {
    std::fprintf(stderr, "kiln-bench-serve: %s\n", std::string(loaded.message()).c_str());
    return 1;
  }
  kiln::serving::InferenceService service(&repo);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "kiln-bench-serve: cannot listen on 127.0.0.1\n");
    return 1;
  }

  const InputForm form = input == "u8raw" ? InputForm::kU8Raw : InputForm::kF32Typed;
  ClientKind client_kind = client == "async" ? ClientKind::kAsync : ClientKind::kSync;
  std::unique_ptr<kiln::http::HttpServer> http;
  int rest_port = 0;
  if (protocol == "rest") {
    client_kind = ClientKind::kRest;
    client = "rest";
    auto started = StartRest(&service, &rest_port);
    if (!started.ok()) {
      std::fprintf(stderr, "kiln-bench-serve: %s\n",
                   std::string(started.status().message()).c_str());
      return 1;
    }
    http = *std::move(started);
  }
  std::printf(
      "# kiln-bench-serve model=%s device=%s threads=%d input=%s client=%s seconds=%.1f cores=%u\n",
      model.c_str(), device.c_str(), threads, input.c_str(), client.c_str(), seconds,
      std::thread::hardware_concurrency());
  {
    auto backend = kiln::CreateBackend(device, {threads});
    if (backend.ok()) PrintBaselines(checkpoint, backend->get(), test, repo, port, rest_port);
  }
  std::printf("%-9s %-22s %8s %10s %12s %10s %10s %10s %12s\n", "batching", "options", "clients",
              "requests", "req/s", "p50_us", "p99_us", "mean_batch", "cpu_us/req");
  const char* run_names[] = {"off1", "offN", "on1", "onN"};
  std::vector<Result> results(scenarios.size());
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& s = scenarios[i];
    if (runs.find(run_names[i]) == std::string::npos) continue;
    results[i] = RunScenario(s, port, rest_port, test, seconds, form, client_kind, repo);
    PrintRow(s, results[i]);
  }
  auto rate = [](const Result& r) { return r.seconds > 0 ? r.requests / r.seconds : 0.0; };
  const double speedup = rate(results[1]) > 0 ? rate(results[3]) / rate(results[1]) : 0.0;
  std::printf(
      "SUMMARY {\"model\":\"%s\",\"input\":\"%s\",\"b1_p50_us\":%.1f,\"b1_p99_us\":%.1f,"
      "\"off_%d_req_s\":%.0f,\"on_%d_req_s\":%.0f,\"on_%d_p50_us\":%.1f,"
      "\"batching_speedup\":%.2f}\n",
      model.c_str(), input.c_str(), results[0].p50_us, results[0].p99_us, clients, rate(results[1]),
      clients, rate(results[3]), clients, results[3].p50_us, speedup);
  if (http != nullptr) http->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  if (!dir.empty()) std::filesystem::remove_all(dir);
  return 0;
}
