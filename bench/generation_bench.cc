// kiln-bench-generate: tokens per second of one generation stream with and without the KV cache
// (engine/generation.h), for nanoGPT's small character config (4 layers, 4 heads, n_embd 128,
// block 64, vocab 113) with random weights. 200 tokens pass the 64-token context, so the crop
// applies: past it every token reruns the last 64 tokens either way (positions are absolute), and
// only the first 63 gain from the cache; a 63-token run shows that part alone. Usage:
// kiln-bench-generate [DEVICE] [THREADS] [TOKENS]  (defaults: cpu 1 200). Sampling at
// temperature 1 with a fixed seed; both paths must give the same tokens, which it checks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/generation.h"
#include "engine/model/model.h"
#include "tests/engine/gpt_config.h"  // nanoGPT's GPT as a ModelConfig, shared with the tests

namespace kiln {
namespace {

struct Run {
  double seconds = 0;
  std::vector<int32_t> tokens;
};

// The fastest of `reps` generations of `tokens` tokens from a one-token prompt.
Run Time(Model* model, int64_t tokens, bool cached, int reps) {
  GenerationParams p;
  p.max_tokens = tokens;
  p.temperature = 1.0;
  p.seed = 1234;
  p.use_kv_cache = cached;
  Run best;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    auto out = Generate(model, {0}, p);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!out.ok()) {
      fprintf(stderr, "generate: %s\n", std::string(out.status().message()).c_str());
      exit(1);
    }
    if (r == 0 || s < best.seconds) best = {s, *out};
  }
  return best;
}

int Main(int argc, char** argv) {
  const std::string device = argc > 1 ? argv[1] : "cpu";
  const int threads = argc > 2 ? atoi(argv[2]) : 1;
  const int64_t tokens = argc > 3 ? atoll(argv[3]) : 200;
  auto backend = CreateBackend(device, {threads});
  if (!backend.ok()) {
    fprintf(stderr, "backend %s: %s\n", device.c_str(),
            std::string(backend.status().message()).c_str());
    return 1;
  }
  const ModelConfig config = testing::GptConfig({113, 64, 4, 4, 128});
  auto model = Model::Build(config, backend->get(), /*seed=*/1);
  if (!model.ok()) {
    fprintf(stderr, "model: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  printf(
      "nanoGPT small (4 layers, 4 heads, n_embd 128, block 64, vocab 113, %lld parameters), "
      "random weights, %s, %d thread(s), one stream, best of 3\n",
      static_cast<long long>((*model)->parameter_count()), device.c_str(), threads);
  for (int64_t n : {tokens, int64_t{63}}) {
    const Run cached = Time(model->get(), n, true, 3);
    const Run whole = Time(model->get(), n, false, 3);
    printf("%4lld tokens: with KV cache %8.1f tokens/s, without %8.1f tokens/s (x%.2f)%s\n",
           static_cast<long long>(n), static_cast<double>(n) / cached.seconds,
           static_cast<double>(n) / whole.seconds, whole.seconds / cached.seconds,
           cached.tokens == whole.tokens ? "" : "  TOKENS DIFFER");
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
