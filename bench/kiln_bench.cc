// kiln-bench: trains the reference configurations on real MNIST and prints the same per-epoch
// numbers and SUMMARY JSON line as ../shared/peers/torch_peer.py, so the two compare directly.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "engine/backend_registry.h"
#include "engine/data/dataset.h"
#include "engine/model.h"
#include "engine/trainer.h"

namespace {

kiln::TrainConfig ReferenceConfig(const std::string& model) {
  kiln::TrainConfig c;
  if (model == "mlp") {
    c.model = kiln::MnistMlpConfig();
    c.optimizer.kind = kiln::OptimizerConfig::Kind::kSgd;
    c.optimizer.lr = 0.001f;
    c.optimizer.momentum = 0.9f;
    c.batch_size = 128;
    c.norm = {1.0f / 255.0f, 0.5f, 0.5f};  // ToTensor then Normalize((0.5,), (0.5,))
  } else {
    c.model = kiln::MnistCnnConfig();
    c.optimizer.kind = kiln::OptimizerConfig::Kind::kAdam;
    c.optimizer.lr = 0.001f;
    c.batch_size = 64;
    c.norm = {1.0f / 255.0f, 0.0f, 1.0f};  // ToTensor
  }
  return c;
}

int Train(const std::string& model, int epochs, int threads, uint64_t seed, int batch, float lr,
          const std::string& data, const std::string& device, const std::string& json_path) {
  kiln::TrainConfig config = ReferenceConfig(model);
  config.epochs = epochs;
  config.seed = seed;
  if (batch > 0) config.batch_size = batch;
  if (lr > 0) config.optimizer.lr = lr;

  auto backend = kiln::CreateBackend(device, {threads});
  if (!backend.ok()) {
    std::cerr << "kiln-bench: " << backend.status().message() << "\n";
    return 1;
  }
  auto splits = kiln::LoadImageFolder(data);
  if (!splits.ok()) {
    std::cerr << "kiln-bench: " << splits.status().message()
              << " (fetch MNIST with scripts/fetch-mnist)\n";
    return 1;
  }
  auto trainer = kiln::Trainer::Create(config, backend->get(), &splits->train, &splits->test);
  if (!trainer.ok()) {
    std::cerr << "kiln-bench: " << trainer.status().message() << "\n";
    return 1;
  }
  std::printf("# kiln-bench device=%s threads=%d model=%s epochs=%d batch=%d lr=%g seed=%llu\n",
              (*backend)->name().c_str(), threads, model.c_str(), epochs, config.batch_size,
              config.optimizer.lr, static_cast<unsigned long long>(seed));
  std::printf("# params=%lld train=%lld test=%lld\n",
              static_cast<long long>((*trainer)->model().parameter_count()),
              static_cast<long long>(splits->train.size),
              static_cast<long long>(splits->test.size));
  std::fflush(stdout);

  nlohmann::json epochs_json = nlohmann::json::array();
  kiln::Trainer::Callbacks cb;
  cb.on_epoch = [&](const kiln::EpochEvent& e) {
    const double acc = 100.0 * e.test.accuracy;
    std::printf("epoch %d: train_s=%.3f samples/s=%.0f loss=%.4f test_acc=%.2f%%\n", e.epoch,
                e.train_seconds, e.samples_per_sec, e.train_loss, acc);
    std::fflush(stdout);
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
  nlohmann::json summary = {{"model", model},
                            {"threads", threads},
                            {"batch", config.batch_size},
                            {"lr", config.optimizer.lr},
                            {"seed", seed},
                            {"params", (*trainer)->model().parameter_count()},
                            {"epochs", epochs_json},
                            {"device", (*backend)->name()},
                            {"kiln", "0.1.0"}};
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-bench: benchmarks of the kiln engine against the PyTorch peer"};
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand("train", "train a reference model on MNIST");
  std::string model = "mlp", data = "data/mnist", device = "cpu", json_path;
  int epochs = 1, threads = 2, batch = 0;
  float lr = 0;
  uint64_t seed = 0;
  train->add_option("--model", model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  train->add_option("--epochs", epochs, "epochs to train")->check(CLI::Range(1, 1000));
  train->add_option("--threads", threads, "CPU threads")->check(CLI::Range(1, 256));
  train->add_option("--seed", seed, "random seed");
  train->add_option("--batch", batch, "batch size (default: the reference's)");
  train->add_option("--lr", lr, "learning rate (default: the reference's)");
  train->add_option("--data", data, "folder with the MNIST IDX files");
  train->add_option("--device", device, "auto, cpu or cuda:N");
  train->add_option("--json", json_path, "also write the summary JSON to this file");
  CLI11_PARSE(app, argc, argv);
  return Train(model, epochs, threads, seed, batch, lr, data, device, json_path);
}
