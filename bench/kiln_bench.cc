// kiln-bench: trains the reference configurations on real MNIST and prints the same per-epoch
// numbers and SUMMARY JSON line as ../shared/peers/torch_peer.py, so the two compare directly;
// `--spec --cifar` trains a job spec (the ResNet example) on CIFAR-10 with the same output;
// `kiln-bench infer` times serving a job spec's model (the ResNet example) on the CIFAR-10 test
// batch, as `bench/torch_cifar_peer.py --infer-only` times the peer's.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/data/cifar10_reader.h"
#include "engine/data/dataset.h"
#include "engine/inference.h"
#include "engine/model/model.h"
#include "engine/reference_configs.h"
#include "engine/trainer.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/model_spec.pb.h"
#include "server/jobs/spec_translation.h"

namespace {

using Clock = std::chrono::steady_clock;

// The peer's inference benchmark, through a serving session loaded from the trained checkpoint:
// batch 1 over 2,000 test images (after 100 warm-up), then batch 256 over the test set, best of 5.
absl::StatusOr<nlohmann::json> BenchInference(kiln::Trainer& trainer, kiln::Backend* backend,
                                              const kiln::Dataset& test) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln-bench-" + std::to_string(getpid()) + ".safetensors"))
                               .string();
  if (auto s = trainer.SaveCheckpoint(path); !s.ok()) return s;
  auto session = kiln::InferenceSession::FromCheckpoint(path, backend, 256);
  std::filesystem::remove(path);
  if (!session.ok()) return session.status();
  const int64_t elems = test.sample_elems();
  std::vector<float> probs(256 * (*session)->num_classes());
  std::vector<int32_t> classes(256);
  auto predict = [&](int64_t first, int batch) {
    return (*session)->PredictU8(test.pixels.data() + first * elems, batch, probs.data(),
                                 classes.data());
  };
  for (int i = 0; i < 100; ++i) {
    if (auto s = predict(i, 1); !s.ok()) return s;
  }
  const int n_single = static_cast<int>(std::min<int64_t>(2000, test.size));
  std::vector<double> lat;
  const auto t0 = Clock::now();
  for (int i = 0; i < n_single; ++i) {
    const auto s0 = Clock::now();
    if (auto s = predict(i, 1); !s.ok()) return s;
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s0).count());
  }
  const double t_single = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> t256;
  for (int rep = 0; rep < 5; ++rep) {
    const auto r0 = Clock::now();
    for (int64_t i = 0; i < test.size; i += 256) {
      if (auto s = predict(i, static_cast<int>(std::min<int64_t>(256, test.size - i))); !s.ok()) {
        return s;
      }
    }
    t256.push_back(std::chrono::duration<double>(Clock::now() - r0).count());
  }
  std::vector<double> sorted = lat;
  std::sort(sorted.begin(), sorted.end());
  std::sort(t256.begin(), t256.end());
  return nlohmann::json{{"b1_img_per_s", n_single / t_single},
                        {"b1_median_us", sorted[sorted.size() / 2]},
                        {"b1_p90_us", sorted[sorted.size() * 9 / 10]},
                        {"b256_img_per_s_best", test.size / t256.front()},
                        {"b256_img_per_s_median", test.size / t256[t256.size() / 2]}};
}

// BenchInference's numbers as the peers print them.
void PrintInference(const nlohmann::json& inf) {
  std::printf(
      "inference: b1 %.0f img/s, b1 median %.1f us (p90 %.1f us), b256 %.0f img/s"
      " (best of 5; median %.0f)\n",
      inf["b1_img_per_s"].get<double>(), inf["b1_median_us"].get<double>(),
      inf["b1_p90_us"].get<double>(), inf["b256_img_per_s_best"].get<double>(),
      inf["b256_img_per_s_median"].get<double>());
}

// Per-layer milliseconds per training step (forward and backward; evaluation excluded); what the
// layers leave of the step is batch loading, the loss, zeroing gradients and the optimizer.
nlohmann::json PrintProfile(const kiln::Model& model, const kiln::LayerTimes& t,
                            double train_seconds) {
  const double steps = static_cast<double>(std::max<int64_t>(t.backward_calls, 1));
  std::printf("profile (ms per training step over %lld steps):\n",
              static_cast<long long>(t.backward_calls));
  std::printf("  %-5s %-10s %9s %9s\n", "layer", "type", "forward", "backward");
  nlohmann::json layers = nlohmann::json::array();
  double in_layers = 0;
  for (size_t i = 0; i < model.num_layers(); ++i) {
    const double fwd = t.forward_s[i] * 1e3 / std::max<int64_t>(t.forward_calls, 1);
    const double bwd = t.backward_s[i] * 1e3 / steps;
    in_layers += fwd + bwd;
    const char* note = model.layer_fused(i) ? " (fused into the layer before it)" : "";
    // A graph's node is shown by name; a Sequential layer's name is its index.
    std::printf("  %-5s %-10s %9.3f %9.3f%s\n", model.node_name(i).c_str(), model.layer_type(i),
                fwd, bwd, note);
    layers.push_back({{"layer", i},
                      {"name", model.node_name(i)},
                      {"type", model.layer_type(i)},
                      {"forward_ms", fwd},
                      {"backward_ms", bwd},
                      {"fused", model.layer_fused(i)}});
  }
  const double step_ms = train_seconds * 1e3 / steps;
  std::printf(
      "  layers %.3f ms of a %.3f ms step; the rest (batch, loss, zero_grad, optimizer) "
      "%.3f ms\n",
      in_layers, step_ms, step_ms - in_layers);
  return {{"layers", layers}, {"step_ms", step_ms}, {"layers_ms", in_layers}};
}

// A job spec as kilnd takes it: its JSON form, translated by kilnd's own rules.
absl::StatusOr<kiln::TrainConfig> ConfigOfSpec(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  kiln::v1::JobSpec spec;
  if (auto s = google::protobuf::util::JsonStringToMessage(text.str(), &spec); !in || !s.ok()) {
    return absl::InvalidArgumentError(path + " is not a job spec: " + s.ToString());
  }
  auto translated = kiln::server::TranslateSpec(spec, kiln::server::SpecLimits{});
  if (!translated.ok()) {
    return absl::InvalidArgumentError(path + ": " + std::string(translated.status().message()));
  }
  return *translated;
}

// What `kiln-bench train` was asked for.
struct TrainArgs {
  std::string model = "mlp", data = "data/mnist", device = "cpu", json_path, precision = "fp32";
  // A job spec's model and recipe on CIFAR-10 instead of a reference model on MNIST.
  std::string spec, cifar;
  int cifar_batches = 1;
  int epochs = 1, threads = 2, batch = 0;
  float lr = 0;
  uint64_t seed = 0;
  bool infer = true, profile = false;
};

kiln::Precision PrecisionNamed(const std::string& name) {
  return name == "bf16"   ? kiln::Precision::kBf16
         : name == "tf32" ? kiln::Precision::kTf32
                          : kiln::Precision::kFp32;
}

// The reference model (or the spec's) with the arguments' epochs, seed, precision, batch and lr.
absl::StatusOr<kiln::TrainConfig> ConfigOf(const TrainArgs& args) {
  kiln::TrainConfig config =
      args.model == "mlp" ? kiln::MnistMlpReference() : kiln::MnistCnnReference();
  if (!args.spec.empty()) {
    auto translated = ConfigOfSpec(args.spec);
    if (!translated.ok()) return translated.status();
    config = *translated;
  }
  config.epochs = args.epochs;
  config.seed = args.seed;
  config.precision = PrecisionNamed(args.precision);
  if (args.batch > 0) config.batch_size = args.batch;
  if (args.lr > 0) config.optimizer.lr = args.lr;
  return config;
}

// The first `cifar_batches` training files of CIFAR-10 and its test batch.
absl::StatusOr<kiln::DatasetSplits> LoadCifar(const TrainArgs& args) {
  std::vector<std::string> files;
  for (int i = 1; i <= args.cifar_batches; ++i) {
    files.push_back(args.cifar + "/data_batch_" + std::to_string(i) + ".bin");
  }
  kiln::DatasetSplits splits;
  auto train = kiln::ReadCifar10Files(files);
  if (!train.ok()) return train.status();
  auto test = kiln::ReadCifar10File(args.cifar + "/test_batch.bin");
  if (!test.ok()) return test.status();
  splits.train = *std::move(train);
  splits.test = *std::move(test);
  return splits;
}

int Train(const TrainArgs& args) {
  const std::string& model = args.spec.empty() ? args.model : args.spec;
  const std::string& data = args.data;
  const std::string& device = args.device;
  const std::string& json_path = args.json_path;
  const int epochs = args.epochs, threads = args.threads;
  const uint64_t seed = args.seed;
  const bool infer = args.infer, profile = args.profile;
  auto made = ConfigOf(args);
  if (!made.ok()) {
    std::cerr << "kiln-bench: " << made.status().message() << "\n";
    return 1;
  }
  const kiln::TrainConfig config = *made;

  kiln::BackendOptions options;
  options.threads = threads;
  options.precision = config.precision;
  auto backend = kiln::CreateBackend(device, options);
  if (!backend.ok()) {
    std::cerr << "kiln-bench: " << backend.status().message() << "\n";
    return 1;
  }
  auto splits = args.cifar.empty() ? kiln::LoadImageFolder(data) : LoadCifar(args);
  if (!splits.ok()) {
    std::cerr << "kiln-bench: " << splits.status().message()
              << (args.cifar.empty() ? " (fetch MNIST with scripts/fetch-mnist)"
                                     : " (make CIFAR-10 files with bench/make-bench-data)")
              << "\n";
    return 1;
  }
  auto trainer = kiln::Trainer::Create(config, backend->get(), &splits->train, &splits->test);
  if (!trainer.ok()) {
    std::cerr << "kiln-bench: " << trainer.status().message() << "\n";
    return 1;
  }
  std::printf(
      "# kiln-bench device=%s threads=%d model=%s epochs=%d batch=%d lr=%g seed=%llu "
      "precision=%s\n",
      (*backend)->name().c_str(), threads, model.c_str(), epochs, config.batch_size,
      config.optimizer.lr, static_cast<unsigned long long>(seed), args.precision.c_str());
  std::printf("# params=%lld train=%lld test=%lld\n",
              static_cast<long long>((*trainer)->model().parameter_count()),
              static_cast<long long>(splits->train.size),
              static_cast<long long>(splits->test.size));
  std::fflush(stdout);

  kiln::LayerTimes layer_times;
  if (profile) (*trainer)->model().set_layer_times(&layer_times);
  double train_seconds = 0;
  nlohmann::json epochs_json = nlohmann::json::array();
  kiln::Trainer::Callbacks cb;
  cb.on_epoch = [&](const kiln::EpochEvent& e) {
    const double acc = 100.0 * e.test.accuracy;
    std::printf("epoch %d: train_s=%.3f samples/s=%.0f loss=%.4f test_acc=%.2f%%\n", e.epoch,
                e.train_seconds, e.samples_per_sec, e.train_loss, acc);
    std::fflush(stdout);
    train_seconds += e.train_seconds;
    epochs_json.push_back({{"epoch", e.epoch},
                           {"train_s", e.train_seconds},
                           {"samples_per_s", e.samples_per_sec},
                           {"train_loss", e.train_loss},
                           {"test_acc", acc}});
  };
  if (auto s = (*trainer)->Run(cb); !s.ok()) {
    std::cerr << "kiln-bench: " << s.message() << "\n";
    return 1;
  }
  (*trainer)->model().set_layer_times(nullptr);
  nlohmann::json profile_json;
  if (profile) profile_json = PrintProfile((*trainer)->model(), layer_times, train_seconds);
  nlohmann::json summary = {{"model", model},
                            {"threads", threads},
                            {"batch", config.batch_size},
                            {"lr", config.optimizer.lr},
                            {"seed", seed},
                            {"params", (*trainer)->model().parameter_count()},
                            {"epochs", epochs_json},
                            {"device", (*backend)->name()},
                            {"kiln", "0.1.0"}};
  if (profile) summary["profile"] = profile_json;
  if (infer) {
    auto inf = BenchInference(**trainer, backend->get(), splits->test);
    if (!inf.ok()) {
      std::cerr << "kiln-bench: inference: " << inf.status().message() << "\n";
      return 1;
    }
    summary["inference"] = *inf;
    PrintInference(*inf);
  }
  std::printf("SUMMARY %s\n", summary.dump().c_str());
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::cerr << "kiln-bench: cannot write " << json_path << "\n";
      return 1;
    }
    std::fputs(summary.dump(1).c_str(), f);
    std::fclose(f);
  }
  return 0;
}

// What `kiln-bench infer` was asked for.
struct InferArgs {
  std::string spec = "examples/resnet-cifar.json", cifar, device = "cpu", precision = "fp32";
  int threads = 2;
};

// The spec's model (untrained: speed does not depend on the weights) served from a checkpoint
// with the spec's normalisation, through BenchInference on the CIFAR-10 test batch.
int Infer(const InferArgs& args) {
  auto translated = ConfigOfSpec(args.spec);
  if (!translated.ok()) {
    std::cerr << "kiln-bench: " << translated.status().message() << "\n";
    return 1;
  }
  kiln::TrainConfig config = *translated;
  config.precision = PrecisionNamed(args.precision);
  kiln::BackendOptions options;
  options.threads = args.threads;
  options.precision = config.precision;
  auto backend = kiln::CreateBackend(args.device, options);
  auto test = kiln::ReadCifar10File(args.cifar + "/test_batch.bin");
  if (!backend.ok() || !test.ok()) {
    std::cerr << "kiln-bench: "
              << (backend.ok() ? test.status().message() : backend.status().message()) << "\n";
    return 1;
  }
  auto trainer = kiln::Trainer::Create(config, backend->get(), &*test, &*test);
  if (!trainer.ok()) {
    std::cerr << "kiln-bench: " << trainer.status().message() << "\n";
    return 1;
  }
  auto inf = BenchInference(**trainer, backend->get(), *test);
  if (!inf.ok()) {
    std::cerr << "kiln-bench: inference: " << inf.status().message() << "\n";
    return 1;
  }
  std::printf("# kiln-bench infer device=%s threads=%d spec=%s precision=%s test=%lld\n",
              (*backend)->name().c_str(), args.threads, args.spec.c_str(), args.precision.c_str(),
              static_cast<long long>(test->size));
  PrintInference(*inf);
  std::printf("SUMMARY %s\n", nlohmann::json{{"inference", *inf}}.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-bench: benchmarks of the kiln engine against the PyTorch peer"};
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand("train", "train a reference model on MNIST");
  TrainArgs args;
  train->add_option("--model", args.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  train->add_option("--epochs", args.epochs, "epochs to train")->check(CLI::Range(1, 1000));
  train->add_option("--threads", args.threads, "CPU threads")->check(CLI::Range(1, 256));
  train->add_option("--seed", args.seed, "random seed");
  train->add_option("--batch", args.batch, "batch size (default: the reference's)");
  train->add_option("--lr", args.lr, "learning rate (default: the reference's)");
  train->add_option("--data", args.data, "folder with the MNIST IDX files");
  train->add_option("--spec", args.spec, "train this job spec's model and recipe instead")
      ->check(CLI::ExistingFile);
  train->add_option("--cifar", args.cifar, "train on CIFAR-10 from this folder instead of MNIST");
  train
      ->add_option("--cifar-batches", args.cifar_batches,
                   "how many of CIFAR-10's training files (10,000 images each)")
      ->check(CLI::Range(1, 5));
  train->add_option("--device", args.device, "auto, cpu or cuda:N");
  train->add_option("--precision", args.precision, "fp32 (default), tf32 or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  train->add_option("--json", args.json_path, "also write the summary JSON to this file");
  bool no_infer = false;
  train->add_flag("--no-infer", no_infer, "skip the inference benchmark after training");
  train->add_flag("--profile", args.profile,
                  "time every layer's forward and backward (synchronising after each; slower)");
  CLI::App* infer = app.add_subcommand("infer", "time serving a job spec's model on CIFAR-10");
  InferArgs infer_args;
  infer->add_option("--spec", infer_args.spec, "job spec JSON whose model is served")
      ->check(CLI::ExistingFile);
  infer->add_option("--cifar", infer_args.cifar, "folder with CIFAR-10's test_batch.bin")
      ->required();
  infer->add_option("--threads", infer_args.threads, "CPU threads")->check(CLI::Range(1, 256));
  infer->add_option("--device", infer_args.device, "auto, cpu or cuda:N");
  infer->add_option("--precision", infer_args.precision, "fp32 (default), tf32 or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  if (infer->parsed()) return Infer(infer_args);
  args.infer = !no_infer;
  return Train(args);
}
