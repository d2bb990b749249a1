// kiln-bench-dist: data-parallel training of a reference model over 1..N CPU ranks on loopback
// (Gloo), each rank a forked process with its own threads: steps/s and the time of each step's
// gradient allreduce. On a machine with fewer cores than ranks x threads this measures the
// overhead of the collective, not a speed-up.
#include <sys/wait.h>
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
#include "engine/data/dataset.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/file_key_value_store.h"
#include "engine/distributed/gloo_communicator.h"
#include "engine/reference_configs.h"
#include "engine/rng.h"
#include "engine/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

// Times every allreduce of the communicator it wraps (the trainer's one per step, and the few of
// the start and of evaluations).
class TimedCommunicator final : public kiln::Communicator {
 public:
  explicit TimedCommunicator(kiln::Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  kiln::DeviceKind device() const override { return inner_->device(); }
  absl::Status AllreduceSum(float* data, size_t count) override {
    const auto t0 = Clock::now();
    absl::Status s = inner_->AllreduceSum(data, count);
    calls.push_back({count, std::chrono::duration<double>(Clock::now() - t0).count()});
    return s;
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

  struct Call {
    size_t floats;
    double seconds;
  };
  std::vector<Call> calls;

 private:
  kiln::Communicator* inner_;
};

// Random pixels and labels shaped like MNIST: the speed of a step does not depend on them.
kiln::Dataset RandomImages(int64_t n, uint64_t seed) {
  kiln::Dataset d;
  d.sample_shape = {28, 28};
  d.size = n;
  d.num_classes = 10;
  d.pixels.resize(n * 28 * 28);
  d.labels.resize(n);
  kiln::Rng rng(seed);
  for (auto& p : d.pixels) p = static_cast<uint8_t>(rng.Below(256));
  for (auto& l : d.labels) l = static_cast<int32_t>(rng.Below(10));
  return d;
}

struct Options {
  std::string model = "mlp";
  int steps = 60, warmup = 5, threads = 1;
  double timeout_s = 60;
};

// One rank's run; writes its numbers as JSON to `out`. 0 on success.
int RunRank(const Options& o, int rank, int size, const std::string& dir, const std::string& out) {
  auto backend = kiln::CreateBackend("cpu", {o.threads});
  if (!backend.ok()) {
    std::cerr << backend.status() << "\n";
    return 1;
  }
  kiln::TrainConfig config =
      o.model == "mlp" ? kiln::MnistMlpReference() : kiln::MnistCnnReference();
  config.epochs = 1;
  const kiln::Dataset train = RandomImages(int64_t{config.batch_size} * o.steps, 1);
  std::unique_ptr<kiln::FileKeyValueStore> store;
  std::unique_ptr<kiln::Communicator> gloo;
  std::unique_ptr<TimedCommunicator> timed;
  if (size > 1) {
    auto opened = kiln::FileKeyValueStore::Open(dir + "/store");
    kiln::GlooOptions go;
    go.timeout = absl::Seconds(o.timeout_s);
    auto joined = opened.ok()
                      ? kiln::GlooCommunicator::Create(opened->get(), rank, size, go)
                      : absl::StatusOr<std::unique_ptr<kiln::GlooCommunicator>>(opened.status());
    if (!joined.ok()) {
      std::cerr << "rank " << rank << ": " << joined.status() << "\n";
      return 1;
    }
    store = std::move(*opened);
    gloo = std::move(*joined);
    timed = std::make_unique<TimedCommunicator>(gloo.get());
    config.communicator = timed.get();
  }
  auto trainer = kiln::Trainer::Create(config, backend->get(), &train, nullptr);
  if (!trainer.ok()) {
    std::cerr << trainer.status() << "\n";
    return 1;
  }
  std::vector<double> step_end;
  kiln::Trainer::Callbacks cb;
  cb.on_step = [&](const kiln::StepEvent&) {
    step_end.push_back(std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
  };
  if (absl::Status s = (*trainer)->Run(cb); !s.ok()) {
    std::cerr << "rank " << rank << ": " << s << "\n";
    return 1;
  }
  // Steps after the warm-up; the gradient allreduces are the largest calls, one per step.
  const int n = static_cast<int>(step_end.size());
  const double seconds = step_end[n - 1] - step_end[o.warmup - 1];
  const int timed_steps = n - o.warmup;
  double allreduce_s = 0;
  size_t floats = 0;
  int counted = 0;
  if (timed != nullptr) {
    for (const auto& c : timed->calls) floats = std::max(floats, c.floats);
    int step = 0;
    for (const auto& c : timed->calls) {
      if (c.floats != floats) continue;
      if (++step > o.warmup) {
        allreduce_s += c.seconds;
        ++counted;
      }
    }
  }
  // The same allreduce alone, after a barrier each time: its cost without the wait for a slower
  // rank that the step's allreduce also holds. The median of 50.
  double bare_ms = 0;
  if (gloo != nullptr && floats > 0) {
    std::vector<float> buffer(floats, 1.0f);
    std::vector<double> times;
    for (int i = 0; i < 50; ++i) {
      if (!gloo->Barrier().ok()) return 1;
      const auto t0 = Clock::now();
      if (!gloo->AllreduceSum(buffer.data(), floats).ok()) return 1;
      times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    bare_ms = times[times.size() / 2];
  }
  nlohmann::json j;
  j["rank"] = rank;
  j["bare_allreduce_ms"] = bare_ms;
  j["steps"] = timed_steps;
  j["steps_per_s"] = timed_steps / seconds;
  j["samples_per_s"] = timed_steps * config.batch_size / seconds;
  j["step_ms"] = 1000 * seconds / timed_steps;
  j["allreduce_ms"] = counted > 0 ? 1000 * allreduce_s / counted : 0.0;
  j["allreduce_bytes"] = floats * 4;
  std::ofstream(out) << j.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-bench-dist: data-parallel training over CPU ranks on loopback (Gloo)"};
  Options o;
  std::vector<int> ranks = {1, 2, 3};
  std::string json_path;
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--ranks", ranks, "world sizes to run, one after the other")->delimiter(',');
  app.add_option("--steps", o.steps, "steps per run (global batches of the reference's size)")
      ->check(CLI::Range(10, 100000));
  app.add_option("--warmup", o.warmup, "steps left out of the timing")->check(CLI::Range(1, 100));
  app.add_option("--threads", o.threads, "CPU threads per rank")->check(CLI::Range(1, 256));
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  if (o.warmup >= o.steps) {
    std::cerr << "--warmup must be below --steps\n";
    return 2;
  }

  nlohmann::json all = nlohmann::json::array();
  std::printf("model %s, global batch %d, %d steps (%d timed), %d thread(s) per rank, %ld cores\n",
              o.model.c_str(),
              (o.model == "mlp" ? kiln::MnistMlpReference() : kiln::MnistCnnReference()).batch_size,
              o.steps, o.steps - o.warmup, o.threads, sysconf(_SC_NPROCESSORS_ONLN));
  // allreduce ms: the step's, waits for slower ranks included; bare: alone after a barrier.
  std::printf("%5s %10s %12s %10s %14s %10s %14s\n", "ranks", "steps/s", "samples/s", "step ms",
              "allreduce ms", "bare ms", "allreduce KiB");
  for (int size : ranks) {
    const std::string dir =
        (std::filesystem::temp_directory_path() /
         ("kiln-bench-dist-" + std::to_string(getpid()) + "-" + std::to_string(size)))
            .string();
    std::filesystem::create_directories(dir);
    std::fflush(nullptr);
    std::vector<pid_t> pids;
    for (int r = 0; r < size; ++r) {
      const pid_t pid = fork();
      if (pid == 0) {
        _exit(RunRank(o, r, size, dir, dir + "/rank" + std::to_string(r) + ".json"));
      }
      pids.push_back(pid);
    }
    bool ok = true;
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    if (!ok) {
      std::cerr << "a rank of the run with " << size << " ranks failed\n";
      return 1;
    }
    // The ranks step in lockstep: rank 0's rate is the job's; the allreduce time is the mean.
    nlohmann::json run;
    double allreduce_ms = 0, bare_ms = 0;
    for (int r = 0; r < size; ++r) {
      std::ifstream in(dir + "/rank" + std::to_string(r) + ".json");
      nlohmann::json j = nlohmann::json::parse(in);
      if (r == 0) run = j;
      allreduce_ms += j["allreduce_ms"].get<double>() / size;
      bare_ms += j["bare_allreduce_ms"].get<double>() / size;
    }
    run.erase("rank");
    run["ranks"] = size;
    run["allreduce_ms"] = allreduce_ms;
    run["bare_allreduce_ms"] = bare_ms;
    run["model"] = o.model;
    run["threads_per_rank"] = o.threads;
    std::printf("%5d %10.1f %12.0f %10.2f %14.3f %10.3f %14.1f\n", size,
                run["steps_per_s"].get<double>(), run["samples_per_s"].get<double>(),
                run["step_ms"].get<double>(), allreduce_ms, bare_ms,
                run["allreduce_bytes"].get<double>() / 1024);
    all.push_back(run);
    std::filesystem::remove_all(dir);
  }
  std::printf("SUMMARY %s\n", all.dump().c_str());
  if (!json_path.empty()) std::ofstream(json_path) << all.dump(2) << "\n";
  return 0;
}
