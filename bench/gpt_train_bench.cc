// kiln-bench-gpt: milliseconds per training iteration of nanoGPT's small character model (4
// layers, 4 heads, n_embd 128, block 64, batch 12, vocab 113; AdamW, clipping at 1.0: the
// recipe of examples/char-gpt.json) through the engine's Trainer on a synthetic token dataset,
// without kilnd: what an iteration costs the engine, and with --profile where it goes (each layer
// type's forward and backward; the backend is synchronised after every layer then, so the
// profiled total runs a little slower). Usage:
//   kiln-bench-gpt [THREADS] [ITERS] [--profile] [--bf16]    (defaults: 2 threads, 200
//   iterations, fp32; --bf16: GEMMs in bfloat16, Precision::kBf16)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/data/token_data.h"
#include "engine/model/model.h"
#include "engine/trainer.h"
#include "tests/engine/gpt_config.h"  // nanoGPT's GPT as a ModelConfig, shared with the tests

namespace kiln {
namespace {

constexpr int kVocab = 113, kBlock = 64, kBatch = 12;

// A folder holding a 1M-token train shard and a 100K-token val shard of seeded ids.
std::string MakeShards() {
  const std::string dir = std::filesystem::temp_directory_path() / "kiln-bench-gpt-tokens";
  std::filesystem::create_directories(dir);
  uint64_t x = 88172645463325252ull;
  for (auto [name, n] : {std::pair{"train_000.bin", 1 << 20}, {"val_000.bin", 100000}}) {
    std::vector<uint16_t> tokens(n);
    for (uint16_t& t : tokens) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      t = static_cast<uint16_t>(x % kVocab);
    }
    if (!WriteTokenShard(dir + "/" + name, tokens).ok()) exit(1);
  }
  return dir;
}

int Main(int argc, char** argv) {
  int threads = 2, iters = 200;
  bool profile = false, bf16 = false;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--profile") {
      profile = true;
    } else if (std::string(argv[i]) == "--bf16") {
      bf16 = true;
    } else {
      positional.push_back(argv[i]);
    }
  }
  if (!positional.empty()) threads = atoi(positional[0].c_str());
  if (positional.size() > 1) iters = atoi(positional[1].c_str());
  BackendOptions options;
  options.threads = threads;
  options.precision = bf16 ? Precision::kBf16 : Precision::kFp32;
  auto backend = CreateBackend("cpu", options);
  const std::string dir = MakeShards();
  auto data = OpenTokenDataset(dir);
  if (!backend.ok() || !data.ok()) {
    fprintf(stderr, "setup failed\n");
    return 1;
  }
  TrainConfig c;
  c.precision = options.precision;
  c.model = testing::GptConfig({kVocab, kBlock, 4, 4, 128, /*tied=*/true});
  c.model.init = InitRule::kGpt2;
  c.optimizer.kind = OptimizerConfig::Kind::kAdamW;
  c.optimizer.lr = 1e-3f;
  c.optimizer.beta2 = 0.99f;
  c.optimizer.weight_decay = 0.1f;
  c.optimizer.decay_rule = OptimizerConfig::DecayRule::kMatrices;
  c.grad_clip = 1.0f;
  c.batch_size = kBatch;
  c.max_iters = iters;
  c.eval_interval = iters;
  c.eval_iters = 1;
  c.epochs = 1;
  auto trainer = Trainer::Create(c, backend->get(), &*data);
  if (!trainer.ok()) {
    fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
    return 1;
  }
  LayerTimes times;
  if (profile) (*trainer)->model().set_layer_times(&times);
  // The median step after 10 of warm-up, as the peer reports its own.
  std::vector<double> step_ms;
  auto last = std::chrono::steady_clock::now();
  Trainer::Callbacks cb;
  cb.on_step = [&](const StepEvent&) {
    const auto now = std::chrono::steady_clock::now();
    step_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  };
  if (absl::Status run = (*trainer)->Run(cb); !run.ok()) {
    fprintf(stderr, "%s\n", run.ToString().c_str());
    return 1;
  }
  std::vector<double> steady(step_ms.begin() + std::min<size_t>(10, step_ms.size() - 1),
                             step_ms.end());
  std::nth_element(steady.begin(), steady.begin() + steady.size() / 2, steady.end());
  const double median = steady[steady.size() / 2];
  // nanoGPT's count: 6 N per token for the weights, plus attention's 12 L T d per token.
  const double n = static_cast<double>((*trainer)->model().parameter_count() - kBlock * 128);
  const double flops = (6 * n + 12.0 * 4 * kBlock * 128) * kBatch * kBlock;
  printf("kiln-bench-gpt: %d threads, %d iterations, %s: median %.2f ms/iter, %.0f tokens/s, "
         "%.0f GFLOP/s\n",
         threads, iters, bf16 ? "bf16" : "fp32", median, kBatch * kBlock / (median / 1e3),
         flops / (median / 1e3) / 1e9);
  if (profile) {
    std::map<std::string, std::pair<double, double>> by_type;
    for (size_t i = 0; i < (*trainer)->model().num_layers(); ++i) {
      auto& t = by_type[(*trainer)->model().layer_type(i)];
      t.first += times.forward_s[i] * 1e3 / std::max<int64_t>(1, times.forward_calls);
      t.second += times.backward_s[i] * 1e3 / std::max<int64_t>(1, times.backward_calls);
    }
    double fwd = 0, bwd = 0;
    for (const auto& [type, t] : by_type) {
      printf("  %-24s forward %6.2f ms  backward %6.2f ms\n", type.c_str(), t.first, t.second);
      fwd += t.first, bwd += t.second;
    }
    printf("  %-24s forward %6.2f ms  backward %6.2f ms; the rest of the step %.2f ms\n",
           "layers", fwd, bwd, median - fwd - bwd);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
