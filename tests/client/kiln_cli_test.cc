// The kiln binary as a user runs it: a subprocess against a real kilnd subprocess on a loopback
// port, checked by exit code, stdout and stderr.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli_test_support.h"
#include "client/onnx/onnx_export.h"
#include "flaky_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_images.h"
#include "tests/support/loopback_port.h"
#include "tests/support/status_matchers.h"

namespace kiln::client::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSmallSpecJson[] = R"({
  "dataset": "toy",
  "epochs": 2,
  "batch_size": 32,
  "seed": 7,
  "device": "cpu",
  "model": {
    "input_shape": [784],
    "layers": [
      {"linear": {"in_features": 784, "out_features": 32}},
      {"relu": {}},
      {"linear": {"in_features": 32, "out_features": 10}}
    ]
  },
  "optimizer": {"kind": "KIND_SGD", "lr": 0.05, "momentum": 0.9}
})";

// kSmallSpecJson with plain enum names, as people write them.
constexpr char kPlainNamesSpecJson[] = R"({
  "dataset": "toy",
  "epochs": 1,
  "batch_size": 32,
  "seed": 7,
  "device": "cpu",
  "loss": "Cross_Entropy",
  "model": {
    "input_shape": [784],
    "layers": [
      {"linear": {"in_features": 784, "out_features": 32}},
      {"relu": {}},
      {"linear": {"in_features": 32, "out_features": 10}}
    ]
  },
  "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
  "schedule": {"kind": "cosine"}
})";

constexpr char kSmallSpecText[] = R"(
dataset: "toy"
epochs: 1
batch_size: 32
device: "cpu"
model {
  input_shape: 784
  layers { linear { in_features: 784 out_features: 10 } }
}
optimizer { kind: KIND_SGD lr: 0.05 }
)";

// One fast kilnd and one whose steps take 20 ms (for cancel and detach), shared by the tests.
class KilnCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(MakeTempDir("kiln-cli"));
    WriteToyDataset(*root_ + "/data/toy", 256, 64);
    fast_ = new Kilnd();
    ASSERT_TRUE(fast_->Start(*root_ + "/state-fast", *root_ + "/data")) << "kilnd did not start";
    slow_ = new Kilnd();
    ASSERT_TRUE(slow_->Start(*root_ + "/state-slow", *root_ + "/data", {"--step_delay=20ms"}));
    WriteFile(*root_ + "/small.json", kSmallSpecJson);
    WriteFile(*root_ + "/small.textproto", kSmallSpecText);
    WriteFile(*root_ + "/plain.json", kPlainNamesSpecJson);
    WriteFile(*root_ + "/unknown-enum.json", R"({"optimizer": {"kind": "rmsprop"}})");
  }
  static void TearDownTestSuite() {
    delete fast_;
    delete slow_;
    fs::remove_all(*root_);
    delete root_;
  }

  // Runs kiln with `args` against `server` (the fast kilnd by default).
  static RunResult Kiln(std::vector<std::string> args, Kilnd* server = nullptr,
                        absl::Duration timeout = absl::Seconds(60)) {
    args.insert(args.begin(), KILN_PATH);
    return RunCommand(args, {"KILN_SERVER=" + (server != nullptr ? server : fast_)->address()},
                      timeout);
  }

  // Submits a spec file and returns the job id (empty on failure).
  static std::string Submit(const std::string& spec_file, std::vector<std::string> extra = {},
                            Kilnd* server = nullptr) {
    std::vector<std::string> args = {"submit", spec_file, "--output", "json"};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = Kiln(args, server);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return "";
    return nlohmann::json::parse(r.out).at("id").get<std::string>();
  }

  // `kiln predict MODEL` on five toy images whose labels are known, as PGM files named
  // PREFIX0.pgm...: the answer as JSON, and how many of the five it classified right.
  static nlohmann::json PredictToyDigits(const std::string& model, const std::string& prefix,
                                         int* right) {
    std::vector<std::string> args = {"predict", model, "--output", "json"};
    std::vector<int> labels;
    for (int i = 0; i < 5; ++i) {
      const std::string file = absl::StrCat(*root_, "/", prefix, i, ".pgm");
      WriteFile(file, ToyPgm(i, 2));
      args.push_back(file);
      labels.push_back(ToyLabel(i, 2));
    }
    RunResult predict = Kiln(args);
    EXPECT_EQ(predict.exit_code, 0) << predict.err;
    *right = 0;
    if (predict.exit_code != 0) return nlohmann::json();
    const nlohmann::json out = nlohmann::json::parse(predict.out);
    EXPECT_EQ(out.at("predictions").size(), 5u) << predict.out;
    for (size_t i = 0; i < out.at("predictions").size() && i < 5; ++i) {
      *right += out.at("predictions")[i].at("class") == labels[i];
    }
    return out;
  }

  static std::string* root_;
  static Kilnd* fast_;
  static Kilnd* slow_;
};

std::string* KilnCliTest::root_ = nullptr;
Kilnd* KilnCliTest::fast_ = nullptr;
Kilnd* KilnCliTest::slow_ = nullptr;

TEST_F(KilnCliTest, SubmitWatchRunsToSuccessInPlainLinesWithoutControlCharacters) {
  RunResult r = Kiln({"submit", *root_ + "/small.json", "--watch"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("submitted job-"));
  EXPECT_THAT(r.out, HasSubstr("step "));
  EXPECT_THAT(r.out, HasSubstr("epoch 1/2  train loss"));
  EXPECT_THAT(r.out, HasSubstr("epoch 2/2  train loss"));
  EXPECT_THAT(r.out, HasSubstr("checkpoint "));
  EXPECT_THAT(r.out, HasSubstr("(final): epoch 2"));
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED: 2 epochs, 16 steps"));
  EXPECT_FALSE(HasControlCharacters(r.out)) << r.out;
  EXPECT_FALSE(HasControlCharacters(r.err)) << r.err;
}

TEST_F(KilnCliTest, WatchInJsonPrintsOneParsableEventPerLine) {
  const std::string id = Submit(*root_ + "/small.json", {"--epochs", "1"});
  ASSERT_FALSE(id.empty());
  RunResult r = Kiln({"watch", id, "--output", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int epochs = 0, steps = 0;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    const nlohmann::json event = nlohmann::json::parse(line);
    epochs += event.contains("epoch");
    steps += event.contains("step");
  }
  EXPECT_EQ(epochs, 1);
  EXPECT_EQ(steps, 8);
}

TEST_F(KilnCliTest, JobsAndGetPrintTablesAndJson) {
  const std::string id = Submit(*root_ + "/small.textproto");
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Kiln({"watch", id}).exit_code, 0);

  RunResult table = Kiln({"jobs"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("JOB"));
  EXPECT_THAT(table.out, HasSubstr("STATE"));
  EXPECT_THAT(table.out, HasSubstr("NAME"));
  // NAME and OWNER are "-": no name, and no owner without a token file.
  EXPECT_THAT(table.out, ::testing::ContainsRegex(id + " +- +- +SUCCEEDED"));

  RunResult json = Kiln({"jobs", "--output", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json jobs = nlohmann::json::parse(json.out);
  bool found = false;
  for (const auto& job : jobs.at("jobs")) found |= job.at("id") == id;
  EXPECT_TRUE(found) << json.out;

  RunResult only_running = Kiln({"jobs", "--state", "running", "--output", "json"});
  ASSERT_EQ(only_running.exit_code, 0) << only_running.err;
  const nlohmann::json running = nlohmann::json::parse(only_running.out);
  for (const auto& job : running.at("jobs")) {
    EXPECT_EQ(job.at("state"), "JOB_STATE_RUNNING");
  }

  RunResult get = Kiln({"get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("state:"));
  EXPECT_THAT(get.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(get.out, HasSubstr("epochs:         1 of 1 done"));
  EXPECT_THAT(get.out, HasSubstr("precision:      fp32\n"));

  RunResult get_json = Kiln({"--output", "json", "get", id});
  ASSERT_EQ(get_json.exit_code, 0) << get_json.err;
  const nlohmann::json job = nlohmann::json::parse(get_json.out);
  EXPECT_EQ(job.at("id"), id);
  EXPECT_EQ(job.at("state"), "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(job.at("epochs_done"), 1);
}

TEST_F(KilnCliTest, PresetFlagsOverrideThePresetsOptimizerRate) {
  RunResult r = Kiln({"submit", "--preset", "mnist-mlp", "--dataset", "toy", "--epochs", "1",
                      "--lr", "0.01", "--batch-size", "64", "--output", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json job = nlohmann::json::parse(r.out);
  EXPECT_EQ(job.at("spec").at("preset"), "mnist-mlp");
  EXPECT_EQ(job.at("spec").at("optimizer").at("kind"), "KIND_SGD");
  EXPECT_NEAR(job.at("spec").at("optimizer").at("lr").get<double>(), 0.01, 1e-6);
  EXPECT_EQ(job.at("spec").at("batch_size"), 64);
  EXPECT_EQ(Kiln({"watch", job.at("id")}).exit_code, 0);
}

TEST_F(KilnCliTest, PlainEnumNamesAndSubmitOverridesReachTheJobAndGetShowsThem) {
  RunResult r =
      Kiln({"submit", *root_ + "/plain.json", "--optimizer", "adamw", "--lr", "0.002",
            "--weight-decay", "0.01", "--schedule", "step:step_size=1,gamma=0.5", "--name",
            "plain names", "--label", "team=vision", "--label", "run=1", "--output", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json job = nlohmann::json::parse(r.out);
  const nlohmann::json& spec = job.at("spec");
  EXPECT_EQ(spec.at("optimizer").at("kind"), "KIND_ADAMW");
  EXPECT_NEAR(spec.at("optimizer").at("lr").get<double>(), 0.002, 1e-7);
  EXPECT_NEAR(spec.at("optimizer").at("weight_decay").get<double>(), 0.01, 1e-7);
  EXPECT_EQ(spec.at("optimizer").at("momentum"), 0) << "SGD's momentum is not AdamW's";
  EXPECT_EQ(spec.at("schedule").at("kind"), "KIND_STEP");
  EXPECT_EQ(spec.at("schedule").at("step_size"), "1");
  EXPECT_NEAR(spec.at("schedule").at("gamma").get<double>(), 0.5, 1e-7);
  EXPECT_EQ(spec.at("name"), "plain names");
  EXPECT_EQ(spec.at("labels"), (nlohmann::json{{"team", "vision"}, {"run", "1"}}));
  const std::string id = job.at("id");
  ASSERT_EQ(Kiln({"watch", id}).exit_code, 0);

  RunResult get = Kiln({"get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("name:           plain names\n"));
  EXPECT_THAT(get.out, HasSubstr("labels:         run=1, team=vision\n"));
  EXPECT_THAT(get.out, HasSubstr("input:          [784]\n"));
  EXPECT_THAT(get.out, HasSubstr("layer 1:        linear(in_features=784 out_features=32)\n"));
  EXPECT_THAT(get.out, HasSubstr("layer 2:        relu\n"));
  EXPECT_THAT(get.out, HasSubstr("optimizer:      adamw lr=0.002 weight_decay=0.01\n"));
  EXPECT_THAT(get.out, HasSubstr("schedule:       step step_size=1 gamma=0.5\n"));
  EXPECT_THAT(get.out, HasSubstr("loss:           cross_entropy\n"));
  EXPECT_THAT(get.out, HasSubstr("batch size:     32\n"));
  EXPECT_THAT(get.out, HasSubstr("seed:           7\n"));
  EXPECT_THAT(get.out, HasSubstr("normalisation:  scale=0.00392157"));
  EXPECT_THAT(get.out, HasSubstr("checkpointing:  at the end, on demand and at shutdown\n"));

  RunResult table = Kiln({"jobs"});
  EXPECT_THAT(table.out, HasSubstr("NAME"));
  EXPECT_THAT(table.out, HasSubstr(id + "  plain names"));
  RunResult vision = Kiln({"jobs", "--label", "team=vision", "--label", "run", "--output", "json"});
  ASSERT_EQ(vision.exit_code, 0) << vision.err;
  const nlohmann::json listed = nlohmann::json::parse(vision.out).at("jobs");
  ASSERT_EQ(listed.size(), 1u) << vision.out;
  EXPECT_EQ(listed[0].at("id"), id);
  RunResult nobody = Kiln({"jobs", "--label", "team=audio"});
  EXPECT_EQ(nobody.exit_code, 0);
  EXPECT_THAT(nobody.out, HasSubstr("no jobs with those labels"));
}

// The CPU has no TF32 units: a tf32 job there trains as fp32, and `kiln get` says so.
TEST_F(KilnCliTest, PrecisionFlagReachesTheJobAndGetSaysWhatTheCpuComputes) {
  RunResult r = Kiln({"submit", *root_ + "/small.json", "--precision", "tf32", "--output", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json job = nlohmann::json::parse(r.out);
  EXPECT_EQ(job.at("spec").at("precision"), "PRECISION_TF32");
  EXPECT_EQ(job.at("device"), "cpu");
  ASSERT_EQ(Kiln({"watch", job.at("id")}).exit_code, 0);
  RunResult get = Kiln({"get", job.at("id")});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("precision:      tf32 (on cpu: fp32, no TF32 units)\n"));
}

// bf16 rounds the inputs of GEMMs (and, on the CPU, convolutions); `kiln get` says which part
// is bfloat16. The job's checkpoint (float32 weights) then serves in bf16 and predicts.
TEST_F(KilnCliTest, Bf16PrecisionReachesTheJobAndGetSaysTheGemmsAreBfloat16) {
  RunResult r = Kiln({"submit", *root_ + "/small.json", "--precision", "bf16", "--output", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json job = nlohmann::json::parse(r.out);
  EXPECT_EQ(job.at("spec").at("precision"), "PRECISION_BF16");
  ASSERT_EQ(Kiln({"watch", job.at("id")}).exit_code, 0);
  RunResult get = Kiln({"get", job.at("id")});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(get.out, HasSubstr("precision:      bf16 (GEMMs and convolutions in bfloat16, "
                                 "the rest fp32)\n"));

  RunResult deploy = Kiln({"deploy", std::string(job.at("id")) + "@latest", "--name",
                           "toy-bf16-trained", "--precision", "bf16"});
  if (deploy.exit_code != 0 && absl::StrContains(deploy.err, "UNIMPLEMENTED")) {
    GTEST_SKIP() << "serving (KServe v2) is not wired into kilnd: " << deploy.err;
  }
  ASSERT_EQ(deploy.exit_code, 0) << deploy.err;
  EXPECT_THAT(deploy.out, HasSubstr("precision bf16")) << deploy.out;
  int right = 0;
  const nlohmann::json out = PredictToyDigits("toy-bf16-trained", "bf16-digit", &right);
  ASSERT_FALSE(out.is_null());
  EXPECT_GE(right, 4) << out.dump();
}

TEST_F(KilnCliTest, GetFillsInWhatThePresetSets) {
  RunResult r = Kiln({"submit", "--preset", "mnist-mlp", "--dataset", "toy", "--momentum", "0.5",
                      "--schedule", "one_cycle:anneal=linear", "--output", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json job = nlohmann::json::parse(r.out);
  EXPECT_EQ(job.at("spec").at("optimizer").at("kind"), "KIND_SGD");
  EXPECT_NEAR(job.at("spec").at("optimizer").at("lr").get<double>(), 0.001, 1e-7);
  EXPECT_EQ(job.at("spec").at("schedule").at("anneal"), "ANNEAL_LINEAR");
  RunResult get = Kiln({"get", job.at("id")});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("optimizer:      sgd lr=0.001 momentum=0.5\n"));
  EXPECT_THAT(get.out, HasSubstr("schedule:       one_cycle anneal=linear\n"));
  EXPECT_THAT(get.out, HasSubstr("batch size:     128 (mnist-mlp's)\n"));
  EXPECT_THAT(get.out,
              HasSubstr("normalisation:  scale=0.00392157 mean=0.5 std=0.5 (mnist-mlp's)"));
  EXPECT_EQ(Kiln({"watch", job.at("id")}).exit_code, 0);
}

// A plain preset job: `kiln get` shows the recipe kilnd resolved (Job.resolved_spec), the same
// the web page shows, marked as the preset's.
TEST_F(KilnCliTest, GetShowsThePresetsRecipeAsKilndResolvesIt) {
  RunResult r = Kiln(
      {"submit", "--preset", "mnist-cnn", "--dataset", "toy", "--epochs", "1", "--output", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json job = nlohmann::json::parse(r.out);
  EXPECT_EQ(job.at("resolved_spec").at("batch_size"), 64);
  EXPECT_EQ(job.at("resolved_spec").at("optimizer").at("kind"), "KIND_ADAM");
  RunResult get = Kiln({"get", job.at("id")});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("optimizer:      adam lr=0.001 (mnist-cnn's)\n"));
  EXPECT_THAT(get.out, HasSubstr("batch size:     64 (mnist-cnn's)\n"));
  EXPECT_THAT(get.out, HasSubstr("normalisation:  scale=0.00392157 std=1 (mnist-cnn's)\n"));
  EXPECT_EQ(Kiln({"watch", job.at("id")}).exit_code, 0);
}

// The optimizer flags start from the client's copy of each preset's optimizer: it must be the
// one kilnd trains with.
TEST_F(KilnCliTest, TheClientsPresetOptimizersAreKilndsOwn) {
  for (const std::string preset : {"mnist-mlp", "mnist-cnn"}) {
    RunResult plain = Kiln({"submit", "--preset", preset, "--dataset", "toy", "--output", "json"});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const nlohmann::json kilnds = nlohmann::json::parse(plain.out).at("resolved_spec");
    // --weight-decay 0 changes nothing but makes the client spell the preset's optimizer out.
    RunResult spelled = Kiln({"submit", "--preset", preset, "--dataset", "toy", "--weight-decay",
                              "0", "--output", "json"});
    ASSERT_EQ(spelled.exit_code, 0) << spelled.err;
    const nlohmann::json clients = nlohmann::json::parse(spelled.out).at("spec");
    EXPECT_EQ(clients.at("optimizer"), kilnds.at("optimizer")) << preset;
    for (const std::string& id : {nlohmann::json::parse(plain.out).at("id").get<std::string>(),
                                  nlohmann::json::parse(spelled.out).at("id").get<std::string>()}) {
      EXPECT_EQ(Kiln({"watch", id}).exit_code, 0);
    }
  }
}

TEST_F(KilnCliTest, BadNamesAndOverridesAreRefusedSayingWhatIsAccepted) {
  RunResult unknown = Kiln({"submit", *root_ + "/unknown-enum.json"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("unknown-enum.json: spec.optimizer.kind: unknown value "
                                     "\"rmsprop\"; expected sgd, adam or adamw"));
  RunResult optimizer = Kiln({"submit", *root_ + "/small.json", "--optimizer", "rmsprop"});
  EXPECT_EQ(optimizer.exit_code, 2);
  EXPECT_THAT(optimizer.err, HasSubstr("--optimizer: unknown value \"rmsprop\"; expected sgd, "
                                       "adam or adamw"));
  RunResult precision = Kiln({"submit", *root_ + "/small.json", "--precision", "fp16"});
  EXPECT_EQ(precision.exit_code, 2);
  EXPECT_THAT(precision.err,
              HasSubstr("--precision: unknown value \"fp16\"; expected fp32, tf32 or bf16"));
  RunResult schedule = Kiln({"submit", *root_ + "/small.json", "--schedule", "linear"});
  EXPECT_EQ(schedule.exit_code, 2);
  EXPECT_THAT(schedule.err,
              HasSubstr("expected constant, step, cosine, one_cycle or warmup_cosine"));
  RunResult field = Kiln({"submit", *root_ + "/small.json", "--schedule", "step:size=2"});
  EXPECT_EQ(field.exit_code, 2);
  EXPECT_THAT(field.err, HasSubstr("--schedule \"step:size=2\""));
  RunResult label = Kiln({"submit", *root_ + "/small.json", "--label", "team"});
  EXPECT_EQ(label.exit_code, 2);
  EXPECT_THAT(label.err, HasSubstr("--label \"team\": expected KEY=VALUE"));
  RunResult name = Kiln({"submit", *root_ + "/small.json", "--name", "a;rm -rf"});
  EXPECT_EQ(name.exit_code, 1);
  EXPECT_THAT(name.err, HasSubstr("INVALID_ARGUMENT: spec.name: only letters, digits"));
  RunResult value = Kiln({"submit", *root_ + "/small.json", "--label", "team=a b"});
  EXPECT_EQ(value.exit_code, 1);
  EXPECT_THAT(value.err, HasSubstr("INVALID_ARGUMENT: spec.labels[\"team\"]: a value is"));
}

TEST_F(KilnCliTest, ACheckpointKindIsSpelledTheSameInTheTableThePathTheWatchAndKind) {
  const std::string id = Submit(*root_ + "/small.json", {"--epochs", "50"}, slow_);
  ASSERT_FALSE(id.empty());
  Subprocess watch;
  ASSERT_TRUE(watch.Start({KILN_PATH, "watch", id}, {"KILN_SERVER=" + slow_->address()}));
  ASSERT_TRUE(watch.WaitForStdout("step ", absl::Seconds(30))) << watch.Stdout();
  ASSERT_EQ(Kiln({"checkpoint", id}, slow_).exit_code, 0);
  ASSERT_EQ(Kiln({"cancel", id}, slow_).exit_code, 0);
  EXPECT_EQ(watch.Wait(absl::Seconds(30)), 1);
  EXPECT_THAT(watch.Stdout(), HasSubstr("(on_demand): epoch"));

  RunResult table = Kiln({"checkpoints", id}, slow_);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("  on_demand  "));
  EXPECT_THAT(table.out, HasSubstr("/on_demand-step"));
  for (const std::string kind : {"on_demand", "ON_DEMAND", "CHECKPOINT_KIND_ON_DEMAND"}) {
    RunResult only = Kiln({"checkpoints", id, "--kind", kind, "--output", "json"}, slow_);
    ASSERT_EQ(only.exit_code, 0) << only.err;
    const nlohmann::json listed = nlohmann::json::parse(only.out).at("checkpoints");
    ASSERT_EQ(listed.size(), 1u) << kind << ": " << only.out;
    EXPECT_EQ(listed[0].at("kind"), "CHECKPOINT_KIND_ON_DEMAND");
  }
  RunResult none = Kiln({"checkpoints", id, "--kind", "best,final"}, slow_);
  EXPECT_EQ(none.exit_code, 0);
  EXPECT_THAT(none.out, HasSubstr("no checkpoints of those kinds"));
  RunResult hyphen = Kiln({"checkpoints", id, "--kind", "on-demand"}, slow_);
  EXPECT_EQ(hyphen.exit_code, 2);
  EXPECT_THAT(
      hyphen.err,
      HasSubstr("expected periodic, best, on_demand, shutdown, final, cancel or preempted"));
}

TEST_F(KilnCliTest, CancelStopsARunningJobAndWatchThenExitsOne) {
  const std::string id = Submit(*root_ + "/small.json", {"--epochs", "50"}, slow_);
  ASSERT_FALSE(id.empty());
  RunResult cancel = Kiln({"cancel", id}, slow_);
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_THAT(cancel.out, HasSubstr("cancelling " + id));
  RunResult watch = Kiln({"watch", id}, slow_);
  EXPECT_EQ(watch.exit_code, 1) << watch.out << watch.err;
  EXPECT_THAT(watch.out, HasSubstr(id + " CANCELLED"));

  RunResult again = Kiln({"cancel", id}, slow_);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("FAILED_PRECONDITION: "));
}

TEST_F(KilnCliTest, CtrlCDuringWatchDetachesAndTheJobKeepsRunning) {
  const std::string id = Submit(*root_ + "/small.json", {"--epochs", "50"}, slow_);
  ASSERT_FALSE(id.empty());
  Subprocess watch;
  ASSERT_TRUE(watch.Start({KILN_PATH, "watch", id}, {"KILN_SERVER=" + slow_->address()}));
  ASSERT_TRUE(watch.WaitForStdout("step ", absl::Seconds(30))) << watch.Stdout();
  watch.Signal(SIGINT);
  EXPECT_EQ(watch.Wait(absl::Seconds(10)), 130);
  EXPECT_THAT(watch.Stderr(),
              HasSubstr("detached; job " + id + " keeps running — kiln watch " + id));
  RunResult get = Kiln({"get", id, "--output", "json"}, slow_);
  ASSERT_EQ(get.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(get.out).at("state"), "JOB_STATE_RUNNING");
  EXPECT_EQ(Kiln({"cancel", id}, slow_).exit_code, 0);
}

TEST_F(KilnCliTest, CheckpointsAndExportCheckTheServersSha256) {
  const std::string id = Submit(*root_ + "/small.json", {"--epochs", "1"});
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Kiln({"watch", id}).exit_code, 0);

  RunResult list = Kiln({"checkpoints", id, "--output", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  const nlohmann::json checkpoints = nlohmann::json::parse(list.out).at("checkpoints");
  ASSERT_FALSE(checkpoints.empty());
  EXPECT_EQ(checkpoints.back().at("kind"), "CHECKPOINT_KIND_FINAL");
  RunResult table = Kiln({"checkpoints", id});
  EXPECT_THAT(table.out, HasSubstr("final"));

  const std::string file = *root_ + "/" + id + ".safetensors";
  RunResult exported = Kiln({"export", id, "-o", file, "--output", "json"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const nlohmann::json out = nlohmann::json::parse(exported.out);
  const std::string bytes = ReadFile(file);
  EXPECT_EQ(out.at("sha256"), Sha256Hex(bytes));
  EXPECT_EQ(out.at("bytes"), bytes.size());
  EXPECT_FALSE(fs::exists(file + ".part"));

  RunResult best = Kiln({"export", id + "@best", "-o", file});
  EXPECT_EQ(best.exit_code, 2) << "refuses to overwrite without --force";
  EXPECT_THAT(best.err, HasSubstr("--force"));
  best = Kiln({"export", id + "@best", "-o", file, "--force"});
  EXPECT_EQ(best.exit_code, 0) << best.err;
  EXPECT_THAT(best.out, HasSubstr("sha256 " + Sha256Hex(ReadFile(file))));

  RunResult missing = Kiln({"export", id + "@999", "-o", *root_ + "/none.safetensors"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("NOT_FOUND: "));
  EXPECT_FALSE(fs::exists(*root_ + "/none.safetensors"));
}

TEST_F(KilnCliTest, ExportAsOnnxConvertsTheVerifiedCheckpointAndLeavesNothingElse) {
  const std::string id = Submit(*root_ + "/small.json", {"--epochs", "1"});
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Kiln({"watch", id}).exit_code, 0);
  const std::string dir = *root_ + "/onnx-" + id;
  fs::create_directories(dir);
  const std::string checkpoint = dir + "/model.safetensors", onnx = dir + "/model.onnx";
  ASSERT_EQ(Kiln({"export", id, "-o", checkpoint}).exit_code, 0);
  RunResult exported = Kiln({"export", id, "--format", "onnx", "-o", onnx, "--output", "json"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const nlohmann::json out = nlohmann::json::parse(exported.out);
  EXPECT_EQ(out.at("format"), "onnx");
  EXPECT_EQ(out.at("sha256"), Sha256Hex(ReadFile(checkpoint))) << "the checkpoint's digest";
  EXPECT_EQ(out.at("bytes"), ReadFile(onnx).size());
  // The same bytes as converting the downloaded checkpoint here.
  const std::string local = *root_ + "/local-" + id + ".onnx";
  ASSERT_OK(ExportOnnx(checkpoint, local));
  EXPECT_EQ(ReadFile(onnx), ReadFile(local));
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir)) left.push_back(entry.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"model.onnx", "model.safetensors"}))
      << "the downloaded checkpoint's temp file is gone";

  RunResult plain = Kiln({"export", id, "--format", "onnx", "-o", onnx, "--force"});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_THAT(plain.out, HasSubstr("ONNX (opset 13)"));
  RunResult bad = Kiln({"export", id, "--format", "pickle"});
  EXPECT_EQ(bad.exit_code, 2);
}

TEST_F(KilnCliTest, ResumeFromANamedCheckpointAndDeleteCheckpoint) {
  const std::string id = Submit(*root_ + "/small.json", {"--epochs", "1"});
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Kiln({"watch", id}).exit_code, 0);
  RunResult list = Kiln({"checkpoints", id, "--output", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  const std::string first =
      nlohmann::json::parse(list.out).at("checkpoints").front().at("id").get<std::string>();

  RunResult resumed = Kiln({"resume", id, "--checkpoint", first, "--epochs", "2", "--watch"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  RunResult get = Kiln({"get", id, "--output", "json"});
  EXPECT_EQ(nlohmann::json::parse(get.out).at("epochs_done"), 2);

  RunResult unnamed = Kiln({"delete-checkpoint", id});
  EXPECT_EQ(unnamed.exit_code, 2) << "a checkpoint must be named by id";
  EXPECT_THAT(unnamed.err, HasSubstr("JOB@ID"));
  RunResult deleted = Kiln({"delete-checkpoint", id + "@" + first});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_THAT(deleted.out, HasSubstr("deleted checkpoint " + first + " of " + id));
  list = Kiln({"checkpoints", id, "--output", "json"});
  for (const auto& c : nlohmann::json::parse(list.out).at("checkpoints")) {
    EXPECT_NE(c.at("id").get<std::string>(), first);
  }
  RunResult again = Kiln({"delete-checkpoint", id + "@" + first});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("NOT_FOUND: "));
}

TEST_F(KilnCliTest, AFailedJobMakesWatchExitOneWithTheReason) {
  // Pixels scaled to ~1e30 overflow the loss at once.
  nlohmann::json spec = nlohmann::json::parse(kSmallSpecJson);
  spec["normalization"] = {{"scale", 1e30}, {"mean", 0}, {"std", 1}};
  WriteFile(*root_ + "/diverges.json", spec.dump());
  RunResult r = Kiln({"submit", *root_ + "/diverges.json", "--watch"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(" FAILED after "));
  EXPECT_THAT(r.out, HasSubstr("loss became"));
}

TEST_F(KilnCliTest, BadUsageExitsTwoWithAMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  WriteFile(*root_ + "/broken.json", "{\"epochs\": \"many\"");
  const std::vector<Case> cases = {
      {{}, "A subcommand is required"},
      {{"frobnicate"}, "unknown command \"frobnicate\""},
      {{"get"}, "job is required"},
      {{"submit"}, "give a spec file"},
      {{"submit", "--preset", "resnet"}, "--preset"},
      {{"submit", *root_ + "/missing.json"}, "cannot read spec file"},
      {{"submit", *root_ + "/broken.json"}, "not a valid JobSpec in JSON"},
      {{"submit", "--preset", "mnist-mlp", "--epochs", "0"}, "--epochs"},
      {{"--output", "yaml", "jobs"}, "--output"},
      {{"export", "job-1@newest"}, "the part after @ must be a checkpoint id"},
      {{"predict", "digits"}, "files is required"},
  };
  for (const Case& c : cases) {
    RunResult r = Kiln(c.args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(c.args, " ") << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << absl::StrJoin(c.args, " ");
  }
  RunResult help = Kiln({"submit", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("Examples:"));
}

TEST_F(KilnCliTest, ServerRefusalsExitOneWithTheCodeNameAndTheServersMessage) {
  RunResult r = Kiln({"get", "job-nope"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND: "));
  EXPECT_THAT(r.err, HasSubstr("job-nope"));

  r = Kiln({"submit", *root_ + "/small.json", "--dataset", "no-such-data"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no-such-data"));
}

TEST_F(KilnCliTest, AnUnreachableServerSaysHowToStartKilnd) {
  const std::string address = absl::StrCat("127.0.0.1:", kiln::testing::UnusedLoopbackPort());
  const absl::Time start = absl::Now();
  RunResult r = RunCommand({KILN_PATH, "--server", address, "jobs"});
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach kilnd at " + address + ": connection refused"));
  EXPECT_THAT(r.err, HasSubstr("(is kilnd running? start it with: kilnd --listen " + address +
                               " --state_dir DIR --data_dir DIR)"));
  // The environment variable names the server too.
  r = RunCommand({KILN_PATH, "health"}, {"KILN_SERVER=" + address});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach kilnd at " + address));
}

TEST_F(KilnCliTest, AConnectionAttemptThatFailsOnceIsRetriedBeforeAnyDiagnosis) {
  // kilnd behind a port that closes the first connection unanswered: what the CLI sees when its
  // gRPC (Debian 12's 1.51) takes an in-progress connect for a failed one.
  FlakyPort flaky(fast_->port());
  RunResult r = RunCommand({KILN_PATH, "--server", flaky.address(), "health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SERVING"));
  EXPECT_GE(flaky.accepted(), 2);
}

TEST_F(KilnCliTest, UploadAddsADatasetThatDatasetsLists) {
  const std::string dir = *root_ + "/upload";
  WriteToyDataset(dir, 64, 16, 5);
  RunResult up =
      Kiln({"upload", "uploaded", "--train-images", dir + "/train-images-idx3-ubyte",
            "--train-labels", dir + "/train-labels-idx1-ubyte", "--test-images",
            dir + "/t10k-images-idx3-ubyte", "--test-labels", dir + "/t10k-labels-idx1-ubyte"});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_THAT(up.out, HasSubstr("64 training and 16 test samples"));

  RunResult list = Kiln({"datasets", "--output", "json"});
  ASSERT_EQ(list.exit_code, 0);
  std::vector<std::string> names;
  const nlohmann::json datasets = nlohmann::json::parse(list.out);
  for (const auto& d : datasets.at("datasets")) names.push_back(d.at("name"));
  EXPECT_THAT(names, ::testing::IsSupersetOf({"toy", "uploaded"}));
  EXPECT_THAT(Kiln({"datasets"}).out, HasSubstr("uploaded"));

  RunResult again = Kiln({"upload", "uploaded", "--train-images", dir + "/train-images-idx3-ubyte",
                          "--train-labels", dir + "/train-labels-idx1-ubyte"});
  EXPECT_EQ(again.exit_code, 1) << "the name is taken";

  RunResult table = Kiln({"datasets"});
  EXPECT_THAT(table.out, HasSubstr("CLASSES"));
  RunResult deleted = Kiln({"datasets", "delete", "uploaded"});
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_THAT(deleted.out, HasSubstr("dataset uploaded deleted"));
  EXPECT_THAT(Kiln({"datasets"}).out, ::testing::Not(HasSubstr("uploaded")));
  RunResult gone = Kiln({"datasets", "delete", "uploaded"});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_THAT(gone.err, HasSubstr("not found"));
  RunResult reuse = Kiln({"upload", "uploaded", "--train-images", dir + "/train-images-idx3-ubyte",
                          "--train-labels", dir + "/train-labels-idx1-ubyte"});
  EXPECT_EQ(reuse.exit_code, 0) << reuse.err;
}

// A CIFAR-10 batch file of `labels.size()` records with constant images.
std::string WriteCifarBatch(const std::string& path, const std::vector<int>& labels) {
  std::string bytes;
  for (int label : labels) {
    bytes += static_cast<char>(label);
    bytes.append(3072, static_cast<char>(label * 20));
  }
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST_F(KilnCliTest, UploadCifar10SendsTheBatchesInOrderAndDatasetsShowsTheFormat) {
  const std::string dir = *root_ + "/cifar";
  std::filesystem::create_directories(dir);
  const std::string a = WriteCifarBatch(dir + "/a.bin", {0, 1, 2});
  const std::string b = WriteCifarBatch(dir + "/b.bin", {3, 9});
  const std::string t = WriteCifarBatch(dir + "/t.bin", {4});
  RunResult up = Kiln({"upload", "colour", "--format", "cifar10", "--train", a, b, "--test", t});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_THAT(up.out, HasSubstr("5 training and 1 test samples of 3x32x32"));
  EXPECT_THAT(up.err, HasSubstr("as data_batch_2.bin"));

  RunResult table = Kiln({"datasets"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("FORMAT"));
  for (absl::string_view line : absl::StrSplit(table.out, '\n')) {
    if (absl::StartsWith(line, "colour ")) {
      EXPECT_THAT(std::string(line), HasSubstr("cifar10"));
    }
    if (absl::StartsWith(line, "toy ")) {
      EXPECT_THAT(std::string(line), HasSubstr("idx"));
    }
  }
  const nlohmann::json list = nlohmann::json::parse(Kiln({"datasets", "--output", "json"}).out);
  bool seen = false;
  for (const auto& d : list.at("datasets")) {
    if (d.at("name") == "colour") {
      seen = true;
      EXPECT_EQ(d.at("format"), "DATASET_FORMAT_CIFAR10");
    }
  }
  EXPECT_TRUE(seen);

  RunResult no_train = Kiln({"upload", "x", "--format", "cifar10", "--test", t});
  EXPECT_EQ(no_train.exit_code, 2) << no_train.err;
  EXPECT_THAT(no_train.err, HasSubstr("--train"));
  RunResult mixed = Kiln({"upload", "x", "--format", "cifar10", "--train", a, "--train-images", a});
  EXPECT_EQ(mixed.exit_code, 2);
  RunResult idx_with_train = Kiln({"upload", "x", "--train", a});
  EXPECT_EQ(idx_with_train.exit_code, 2);
  EXPECT_THAT(idx_with_train.err, HasSubstr("--format cifar10"));
  RunResult unknown = Kiln({"upload", "x", "--format", "tiff", "--train", a});
  EXPECT_NE(unknown.exit_code, 0);

  std::string cut = std::string(3073 + 10, '\1');
  std::ofstream(dir + "/cut.bin", std::ios::binary) << cut;
  RunResult truncated = Kiln({"upload", "cut", "--format", "cifar10", "--train", dir + "/cut.bin"});
  EXPECT_EQ(truncated.exit_code, 1);
  EXPECT_THAT(truncated.err,
              AllOf(HasSubstr("data_batch_1.bin: truncated"), HasSubstr("byte offset 3073")));
}

TEST_F(KilnCliTest, UploadCsvSendsTheTableWithItsOptionsAndNamesABadCell) {
  const std::string dir = *root_ + "/csv";
  std::filesystem::create_directories(dir);
  std::string table = "label,a,b\n";
  for (int i = 0; i < 20; ++i) table += absl::StrCat(i % 3, ",", i, ",", i * 0.5, "\n");
  std::ofstream(dir + "/t.csv") << table;
  RunResult up = Kiln({"upload", "tab", "--format", "csv", "--train", dir + "/t.csv",
                       "--label-column", "label", "--test-fraction", "0.25"});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_THAT(up.out, HasSubstr("15 training and 5 test samples of 2"));
  bool seen = false;
  for (absl::string_view line : absl::StrSplit(Kiln({"datasets"}).out, '\n')) {
    if (absl::StartsWith(line, "tab ")) {
      seen = true;
      EXPECT_THAT(std::string(line), HasSubstr("csv"));
    }
  }
  EXPECT_TRUE(seen);

  std::ofstream(dir + "/bad.csv") << "a,label\n1,0\nx,1\n";
  RunResult bad = Kiln({"upload", "bad", "--format", "csv", "--train", dir + "/bad.csv"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("train.csv: line 3, column 1 (a): \"x\" is not a finite number"));
  RunResult misplaced = Kiln(
      {"upload", "x", "--format", "cifar10", "--train", dir + "/t.csv", "--label-column", "label"});
  EXPECT_EQ(misplaced.exit_code, 2);
  EXPECT_THAT(misplaced.err, HasSubstr("are for --format csv"));
  RunResult both = Kiln({"upload", "x", "--format", "csv", "--train", dir + "/t.csv", "--test",
                         dir + "/t.csv", "--test-fraction", "0.1"});
  EXPECT_EQ(both.exit_code, 2);
}

TEST_F(KilnCliTest, UploadTextSendsTheCorpusInOrderAndDatasetsShowsTokensAndVocabulary) {
  const std::string dir = *root_ + "/text";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/b.txt") << "to be or not to be\n";
  std::ofstream(dir + "/a.txt") << "that is the question\n";
  RunResult up = Kiln({"upload", "bard", "--format", "text", dir + "/b.txt", dir + "/a.txt",
                       "--val-fraction", "0.25"});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  // 40 characters: int(40 * 0.75) = 30 train, 10 validation; 14 distinct characters.
  EXPECT_THAT(up.out, HasSubstr("30 training and 10 validation tokens, a vocabulary of 14"));
  EXPECT_THAT(up.err, HasSubstr("as b.txt"));
  bool seen = false;
  for (absl::string_view line : absl::StrSplit(Kiln({"datasets"}).out, '\n')) {
    if (absl::StartsWith(line, "bard ")) {
      seen = true;
      EXPECT_THAT(std::string(line),
                  AllOf(HasSubstr("text"), HasSubstr("30 tokens"), HasSubstr("vocab 14")));
    }
  }
  EXPECT_TRUE(seen);
  // Without --val-fraction, nanoGPT's split: int(40 * 0.9) = 36.
  RunResult default_split =
      Kiln({"upload", "bard2", "--format", "text", dir + "/b.txt", dir + "/a.txt"});
  ASSERT_EQ(default_split.exit_code, 0) << default_split.err;
  EXPECT_THAT(default_split.out, HasSubstr("36 training and 4 validation tokens"));

  std::ofstream(dir + "/bad.txt", std::ios::binary) << "ok\xff";
  RunResult bad = Kiln({"upload", "bad", "--format", "text", dir + "/bad.txt"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, AllOf(HasSubstr("bad.txt"), HasSubstr("byte offset 2")));
  RunResult none = Kiln({"upload", "x", "--format", "text"});
  EXPECT_EQ(none.exit_code, 2);
  RunResult misplaced = Kiln({"upload", "x", dir + "/a.txt"});
  EXPECT_EQ(misplaced.exit_code, 2);
  EXPECT_THAT(misplaced.err, HasSubstr("for --format text"));
}

TEST_F(KilnCliTest, UploadTokensSendsShardsAsTrainAndValAndNamesABadOne) {
  const std::string dir = *root_ + "/tokens";
  std::filesystem::create_directories(dir);
  const auto shard = [&](const std::string& name, int count, int32_t magic) {
    int32_t header[256] = {};
    header[0] = magic;
    header[1] = 1;
    header[2] = count;
    std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
    for (int i = 0; i < count; ++i) {
      const uint16_t t = static_cast<uint16_t>(i * 7 % 1000);
      bytes.append(reinterpret_cast<const char*>(&t), 2);
    }
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return dir + "/" + name;
  };
  const std::string t0 = shard("fw_train_000001.bin", 400, 20240520);
  const std::string t1 = shard("fw_train_000002.bin", 300, 20240520);
  const std::string v0 = shard("fw_val_000000.bin", 100, 20240520);
  RunResult up = Kiln({"upload", "fw", "--format", "tokens", "--train", t0, t1, "--val", v0});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_THAT(up.out, HasSubstr("700 training and 100 validation tokens, token ids up to 995"));
  EXPECT_THAT(up.err, AllOf(HasSubstr("as train_001.bin"), HasSubstr("as val_000.bin")));
  const nlohmann::json list = nlohmann::json::parse(Kiln({"datasets", "--output", "json"}).out);
  bool seen = false;
  for (const auto& d : list.at("datasets")) {
    if (d.at("name") == "fw") {
      seen = true;
      EXPECT_EQ(d.at("format"), "DATASET_FORMAT_TOKENS");
      EXPECT_EQ(d.at("train_tokens"), "700");  // int64 as JSON strings
    }
  }
  EXPECT_TRUE(seen);

  const std::string wrong = shard("wrong.bin", 10, 1234);
  RunResult bad = Kiln({"upload", "bad", "--format", "tokens", "--train", wrong});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, AllOf(HasSubstr("train_000.bin"), HasSubstr("wrong magic 1234")));
  RunResult no_train = Kiln({"upload", "x", "--format", "tokens", "--val", v0});
  EXPECT_EQ(no_train.exit_code, 2);
  EXPECT_THAT(no_train.err, HasSubstr("--train"));
}

#if defined(KILN_CLIENT_HAVE_PNG) && defined(KILN_CLIENT_HAVE_JPEG)
// dir/cls/name as a PNG, or a JPEG when the name ends in .jpg, of one value everywhere.
std::string PutImage(const std::string& dir, const std::string& cls, const std::string& name,
                     int width, int height, int channels, uint8_t value) {
  std::filesystem::create_directories(dir + "/" + cls);
  const std::string path = dir + "/" + cls + "/" + name;
  const std::string pixels = Flat(width, height, channels, value);
  EXPECT_TRUE(absl::EndsWith(name, ".png") ? WritePng(path, width, height, channels, pixels)
                                           : WriteJpeg(path, width, height, channels, pixels));
  return path;
}

TEST_F(KilnCliTest, UploadFolderDecodesClassFoldersIntoADatasetThatDatasetsLists) {
  const std::string dir = *root_ + "/folder";
  for (int i = 0; i < 3; ++i) {
    PutImage(dir + "/train", "bird", absl::StrCat(i, ".png"), 8, 6, 3, 40);
    PutImage(dir + "/train", "ant", absl::StrCat(i, ".jpg"), 8, 6, 1, 200);
  }
  PutImage(dir + "/test", "ant", "t.jpg", 8, 6, 3, 10);
  PutImage(dir + "/test", "bird", "t.png", 8, 6, 1, 10);
  WriteFile(dir + "/train/bird/Thumbs.db", "not an image");
  RunResult up = Kiln(
      {"upload", "pics", "--format", "folder", "--train", dir + "/train", "--test", dir + "/test"});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_THAT(up.out, HasSubstr("6 training and 2 test samples of 3x6x8"));
  EXPECT_THAT(up.out, HasSubstr("classes: 0 ant, 1 bird"));
  EXPECT_THAT(up.err, AllOf(HasSubstr("as train_x.npy"), HasSubstr("1 file")));

  bool seen = false;
  const nlohmann::json list = nlohmann::json::parse(Kiln({"datasets", "--output", "json"}).out);
  for (const auto& d : list.at("datasets")) {
    if (d.at("name") != "pics") continue;
    seen = true;
    EXPECT_EQ(d.at("train_samples"), "6");
    EXPECT_EQ(d.at("test_samples"), "2");
    EXPECT_EQ(d.at("sample_shape"), nlohmann::json({"3", "6", "8"}));
    EXPECT_EQ(d.at("num_classes"), 2);
  }
  EXPECT_TRUE(seen) << list.dump();

  // kilnd trains on what the CLI decoded.
  WriteFile(dir + "/pics.json", R"({
  "dataset": "pics", "epochs": 1, "batch_size": 2, "device": "cpu",
  "model": {"input_shape": [3, 6, 8],
            "layers": [{"flatten": {}}, {"linear": {"in_features": 144, "out_features": 2}}]},
  "optimizer": {"kind": "KIND_SGD", "lr": 0.01}
})");
  const std::string job = Submit(dir + "/pics.json");
  ASSERT_FALSE(job.empty());
  RunResult trained = Kiln({"watch", job});
  EXPECT_EQ(trained.exit_code, 0) << trained.out << trained.err;

  // --grayscale and --resize, and the class names in JSON.
  RunResult gray = Kiln({"upload", "pics-gray", "--format", "folder", "--train", dir + "/train",
                         "--grayscale", "--resize", "3x4", "--output", "json"});
  ASSERT_EQ(gray.exit_code, 0) << gray.err;
  const nlohmann::json dataset = nlohmann::json::parse(gray.out);
  EXPECT_EQ(dataset.at("sample_shape"), nlohmann::json({"3", "4"}));
  EXPECT_EQ(dataset.at("class_names"), nlohmann::json({"ant", "bird"}));
}

TEST_F(KilnCliTest, UploadFolderNamesTheFileAndTheProblem) {
  const std::string dir = *root_ + "/folder-bad";
  const auto upload = [&](const std::string& train, std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"upload", "bad", "--format", "folder", "--train", train};
    args.insert(args.end(), more.begin(), more.end());
    return Kiln(args);
  };
  // A truncated PNG.
  PutImage(dir + "/cut", "a", "1.png", 8, 8, 3, 1);
  const std::string png = PutImage(dir + "/cut", "b", "1.png", 8, 8, 3, 1);
  WriteFile(png, ReadFile(png).substr(0, 40));
  RunResult cut = upload(dir + "/cut");
  EXPECT_EQ(cut.exit_code, 2);
  EXPECT_THAT(cut.err, HasSubstr(png + ": "));
  // A corrupt JPEG: the error comes back as a message; libjpeg does not end the process.
  PutImage(dir + "/jpeg", "a", "1.png", 8, 8, 3, 1);
  const std::string jpeg = PutImage(dir + "/jpeg", "b", "1.jpg", 8, 8, 3, 1);
  std::string bytes = ReadFile(jpeg);
  for (size_t i = 20; i < bytes.size(); i += 3) bytes[i] = '\xff';
  WriteFile(jpeg, bytes);
  RunResult corrupt = upload(dir + "/jpeg");
  EXPECT_EQ(corrupt.exit_code, 2);
  EXPECT_THAT(corrupt.err, HasSubstr(jpeg + ": "));
  // Sizes that differ, refused without --resize.
  const std::string first = PutImage(dir + "/sizes", "a", "1.png", 8, 8, 3, 1);
  const std::string odd = PutImage(dir + "/sizes", "b", "1.png", 10, 8, 3, 1);
  RunResult sizes = upload(dir + "/sizes");
  EXPECT_EQ(sizes.exit_code, 2);
  EXPECT_THAT(sizes.err, AllOf(HasSubstr(odd), HasSubstr("8x10"), HasSubstr(first),
                               HasSubstr("8x8"), HasSubstr("--resize")));
  RunResult resized = Kiln(
      {"upload", "resized", "--format", "folder", "--train", dir + "/sizes", "--resize", "8x8"});
  EXPECT_EQ(resized.exit_code, 0) << resized.err;
  EXPECT_THAT(resized.out, HasSubstr("2 training and 0 test samples of 3x8x8"));
  // An empty class folder.
  PutImage(dir + "/empty", "a", "1.png", 8, 8, 3, 1);
  std::filesystem::create_directories(dir + "/empty/b");
  RunResult empty = upload(dir + "/empty");
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.err, HasSubstr(dir + "/empty/b"));
  // A test folder whose classes are not the train folder's.
  PutImage(dir + "/other", "a", "1.png", 8, 8, 3, 1);
  PutImage(dir + "/other", "c", "1.png", 8, 8, 3, 1);
  RunResult other = upload(dir + "/sizes", {"--resize", "8x8", "--test", dir + "/other"});
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_THAT(other.err, AllOf(HasSubstr(dir + "/sizes"), HasSubstr(dir + "/other")));
  // Options of other formats, and folder options elsewhere.
  EXPECT_EQ(upload(dir + "/sizes", {"--train-images", png}).exit_code, 2);
  RunResult misplaced = Kiln({"upload", "x", "--format", "csv", "--train", png, "--grayscale"});
  EXPECT_EQ(misplaced.exit_code, 2);
  EXPECT_THAT(misplaced.err, HasSubstr("--format folder"));
  RunResult bad_size = upload(dir + "/sizes", {"--resize", "8by8"});
  EXPECT_EQ(bad_size.exit_code, 2);
  EXPECT_THAT(bad_size.err, HasSubstr("HxW"));
  EXPECT_THAT(Kiln({"datasets"}).out, Not(HasSubstr("bad ")));

  // More than kilnd's --max_upload_bytes: its refusal, naming the limit, and no dataset.
  Kilnd small;
  ASSERT_TRUE(small.Start(dir + "/state-small", dir + "/data-small", {"--max_upload_bytes=4096"}));
  for (int i = 0; i < 4; ++i) PutImage(dir + "/many", "a", absl::StrCat(i, ".png"), 32, 32, 3, 9);
  RunResult over = Kiln({"upload", "many", "--format", "folder", "--train", dir + "/many"}, &small);
  EXPECT_EQ(over.exit_code, 1);
  EXPECT_THAT(over.err, AllOf(HasSubstr("RESOURCE_EXHAUSTED"), HasSubstr("--max_upload_bytes")));
  EXPECT_THAT(Kiln({"datasets"}, &small).out, Not(HasSubstr("many")));
}
#endif

TEST_F(KilnCliTest, HealthSaysTheTrainingServiceIsServing) {
  RunResult r = Kiln({"health", "--output", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json health = nlohmann::json::parse(r.out);
  EXPECT_EQ(health.at("status"), "SERVING");
  EXPECT_EQ(health.at("services").at("kiln.v1.Training"), "SERVING");
}

TEST_F(KilnCliTest, DeployAndPredictClassifyImagesWithKnownLabels) {
  RunResult models = Kiln({"models"});
  if (models.exit_code != 0 && absl::StrContains(models.err, "UNIMPLEMENTED")) {
    GTEST_SKIP() << "serving (KServe v2) is not wired into kilnd yet: " << models.err;
  }
  ASSERT_EQ(models.exit_code, 0) << models.err;
  const std::string id = Submit(*root_ + "/small.json");
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Kiln({"watch", id}).exit_code, 0);

  RunResult deploy = Kiln({"deploy", id + "@latest", "--name", "toy-digits", "--max-batch", "8",
                           "--max-delay-us", "100"});
  ASSERT_EQ(deploy.exit_code, 0) << deploy.err;
  EXPECT_THAT(deploy.out, HasSubstr("(versions 1), precision fp32\n")) << deploy.out;
  EXPECT_THAT(Kiln({"models"}).out, HasSubstr("toy-digits"));

  // Test images of the toy set, whose labels are known, as PGM files.
  int right = 0;
  const nlohmann::json out = PredictToyDigits("toy-digits", "digit", &right);
  ASSERT_FALSE(out.is_null());
  EXPECT_GE(right, 4) << out.dump();

  // Every answer names the version that gave it; versions are numbered per model.
  EXPECT_EQ(out.at("version"), "1") << out.dump();
  // A second deployment under latest:1 replaces the first as version 2; following is accepted.
  RunResult again = Kiln({"deploy", id + "@best", "--name", "toy-digits", "--version-policy",
                          "latest:1", "--follow", "--output", "json"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out).at("versions"), nlohmann::json({"2"})) << again.out;
  // --precision bf16 loads a version whose GEMMs run in bfloat16; deploy and models say so.
  RunResult bf16 = Kiln(
      {"deploy", id + "@best", "--name", "toy-bf16", "--precision", "BF16", "--output", "json"});
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_EQ(nlohmann::json::parse(bf16.out).at("precision"), "bf16") << bf16.out;
  RunResult listed = Kiln({"models"});
  EXPECT_THAT(listed.out, ::testing::ContainsRegex("toy-bf16 +1 +READY +bf16")) << listed.out;
  EXPECT_THAT(listed.out, ::testing::ContainsRegex("toy-digits +2 +READY +fp32")) << listed.out;
  RunResult listed_json = Kiln({"models", "--output", "json"});
  EXPECT_THAT(listed_json.out, HasSubstr("\"precision\": \"bf16\"")) << listed_json.out;
  EXPECT_EQ(Kiln({"undeploy", "toy-bf16"}).exit_code, 0);
  // A word that is no precision is a usage error before anything is sent.
  RunResult bad_precision = Kiln({"deploy", id, "--name", "toy-bf16", "--precision", "fp16"});
  EXPECT_EQ(bad_precision.exit_code, 2);
  EXPECT_THAT(bad_precision.err,
              HasSubstr("--precision: unknown value \"fp16\"; expected fp32, tf32 or bf16"));
  RunResult bad_policy = Kiln({"deploy", id, "--name", "toy-digits", "--version-policy", "newest"});
  EXPECT_EQ(bad_policy.exit_code, 1);
  EXPECT_THAT(bad_policy.err, HasSubstr("version_policy \"newest\" must be latest:N"));

  RunResult idx = Kiln(
      {"predict", "toy-digits", *root_ + "/data/toy/t10k-images-idx3-ubyte", "--index", "0,1"});
  EXPECT_EQ(idx.exit_code, 0) << idx.err;
  EXPECT_THAT(idx.out, HasSubstr("t10k-images-idx3-ubyte#1"));

  EXPECT_EQ(Kiln({"undeploy", "toy-digits"}).exit_code, 0);
  RunResult gone = Kiln({"predict", "toy-digits", *root_ + "/digit0.pgm"});
  EXPECT_EQ(gone.exit_code, 1);
}

// A tiny character GPT (14-character vocabulary, context 8) for a few steps on a text dataset.
std::string TinyGptSpec(const std::string& dataset) {
  std::string layers =
      R"({"name": "wte", "embedding": {"num_embeddings": 14, "embedding_dim": 16}},
          {"name": "wpe", "position_embedding": {"block_size": 8, "embedding_dim": 16}},
          {"name": "h.0.ln_1", "layernorm": {"normalized_shape": 16}},
          {"name": "h.0.attn", "causal_self_attention": {"n_head": 2, "n_embd": 16}},
          {"name": "h.0.res_1", "add": {}, "inputs": ["wpe", "h.0.attn"]},
          {"name": "ln_f", "layernorm": {"normalized_shape": 16}},
          {"name": "lm_head", "linear": {"in_features": 16, "out_features": 14, "bias": false}})";
  return absl::StrCat(R"({"model": {"input_shape": [8], "layers": [)", layers,
                      R"(]}, "optimizer": {"kind": "KIND_ADAMW", "lr": 0.001},
                      "dataset": ")",
                      dataset, R"(", "batch_size": 4, "max_iters": 4})");
}

TEST_F(KilnCliTest, GenerateStreamsTextFromADeployedGpt) {
  const std::string dir = *root_ + "/gpt-text";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/a.txt") << "to be or not to be\nthat is the question\n";
  RunResult up =
      Kiln({"upload", "gpt-bard", "--format", "text", dir + "/a.txt", "--val-fraction", "0.5"});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  WriteFile(dir + "/gpt.json", TinyGptSpec("gpt-bard"));
  const std::string id = Submit(dir + "/gpt.json");
  ASSERT_FALSE(id.empty());
  RunResult watch = Kiln({"watch", id});
  ASSERT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  RunResult deploy = Kiln({"deploy", id + "@latest", "--name", "bard"});
  ASSERT_EQ(deploy.exit_code, 0) << deploy.err;
  EXPECT_THAT(deploy.out, HasSubstr("generate with: kiln generate bard PROMPT"));

  RunResult json = Kiln({"generate", "bard", "to be", "--max-tokens", "12", "--temperature", "0.9",
                         "--seed", "3", "--output", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json out = nlohmann::json::parse(json.out);
  const std::string text = out.at("text_output");
  EXPECT_EQ(text.size(), 12u) << json.out;  // one ASCII character per token
  EXPECT_EQ(out.at("finish_reason"), "length");
  EXPECT_EQ(out.at("model_version"), "1");
  // Plain output: the prompt, then the same tokens (the same seed) as they came.
  RunResult plain = Kiln(
      {"generate", "bard", "to be", "--max-tokens", "12", "--temperature", "0.9", "--seed", "3"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out, "to be" + text + "\n");

  RunResult unknown = Kiln({"generate", "bard", "to bZ"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, AllOf(HasSubstr("INVALID_ARGUMENT"), HasSubstr("text_input")));
  EXPECT_EQ(unknown.out, "");  // the prompt is printed only once kilnd accepts it
  RunResult not_gpt = Kiln({"generate", "nope-model", "x"});
  EXPECT_EQ(not_gpt.exit_code, 1);
  EXPECT_THAT(not_gpt.err, HasSubstr("NOT_FOUND"));
  EXPECT_EQ(Kiln({"undeploy", "bard"}).exit_code, 0);
}

TEST_F(KilnCliTest, ColourAndTableModelsServeWhatTheyWereTrainedOn) {
  RunResult models = Kiln({"models"});
  if (models.exit_code != 0 && absl::StrContains(models.err, "UNIMPLEMENTED")) {
    GTEST_SKIP() << "serving is not wired into kilnd: " << models.err;
  }
  // Colour: label k (0..2) lights channel k. Per-channel normalisation travels with the job.
  const std::string dir = *root_ + "/serve-colour";
  std::filesystem::create_directories(dir);
  std::string batch;
  for (int i = 0; i < 90; ++i) {
    const int label = i % 3;
    batch += static_cast<char>(label);
    for (int c = 0; c < 3; ++c) batch.append(1024, static_cast<char>(c == label ? 200 : i % 50));
  }
  WriteFile(dir + "/b.bin", batch);
  ASSERT_EQ(Kiln({"upload", "rgb", "--format", "cifar10", "--train", dir + "/b.bin"}).exit_code, 0);
  WriteFile(dir + "/rgb.json", R"({
  "dataset": "rgb", "epochs": 3, "batch_size": 16, "seed": 3, "device": "cpu",
  "model": {"input_shape": [3, 32, 32],
            "layers": [{"flatten": {}}, {"linear": {"in_features": 3072, "out_features": 3}}]},
  "optimizer": {"kind": "KIND_ADAM", "lr": 0.001},
  "normalization": {"scale": 0.00392157, "channel_mean": [0.3, 0.3, 0.3],
                    "channel_std": [0.3, 0.3, 0.3]}
})");
  const std::string rgb = Submit(dir + "/rgb.json");
  ASSERT_FALSE(rgb.empty());
  ASSERT_EQ(Kiln({"watch", rgb}).exit_code, 0);
  ASSERT_EQ(Kiln({"deploy", rgb + "@latest", "--name", "rgb"}).exit_code, 0);
  RunResult colour =
      Kiln({"predict", "rgb", dir + "/b.bin", "--index", "0,1,2", "--output", "json"});
  ASSERT_EQ(colour.exit_code, 0) << colour.err;
  const nlohmann::json by_colour = nlohmann::json::parse(colour.out);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(by_colour.at("predictions")[i].at("class"), i);
#if defined(KILN_CLIENT_HAVE_PNG) && defined(KILN_CLIENT_HAVE_JPEG)
  // Colour pictures: channel k bright is class k, as PNG and as JPEG; another size is refused
  // naming both shapes, or resized to the model's with --resize.
  const auto picture = [](int side, int lit) {
    std::string rgb;
    for (int i = 0; i < side * side; ++i) {
      for (int c = 0; c < 3; ++c) rgb += static_cast<char>(c == lit ? 200 : 20);
    }
    return rgb;
  };
  ASSERT_TRUE(WritePng(dir + "/one.png", 32, 32, 3, picture(32, 1)));
  ASSERT_TRUE(WriteJpeg(dir + "/two.jpg", 32, 32, 3, picture(32, 2)));
  RunResult pictures =
      Kiln({"predict", "rgb", dir + "/one.png", dir + "/two.jpg", "--output", "json"});
  ASSERT_EQ(pictures.exit_code, 0) << pictures.err;
  const nlohmann::json by_picture = nlohmann::json::parse(pictures.out);
  EXPECT_EQ(by_picture.at("predictions")[0].at("class"), 1) << pictures.out;
  EXPECT_EQ(by_picture.at("predictions")[1].at("class"), 2) << pictures.out;
  ASSERT_TRUE(WriteJpeg(dir + "/small.jpg", 16, 16, 3, picture(16, 1)));
  RunResult small = Kiln({"predict", "rgb", dir + "/small.jpg"});
  EXPECT_EQ(small.exit_code, 2);
  EXPECT_THAT(small.err, AllOf(HasSubstr("small.jpg is 3x16x16"), HasSubstr("3x32x32"),
                               HasSubstr("--resize")));
  RunResult resized = Kiln({"predict", "rgb", dir + "/small.jpg", "--resize", "--output", "json"});
  ASSERT_EQ(resized.exit_code, 0) << resized.err;
  EXPECT_EQ(nlohmann::json::parse(resized.out).at("predictions")[0].at("class"), 1);
#endif

  // A table: the label is whether x (in the thousands) + 100 y passes 1500.
  std::string table = "x,y,label\n";
  for (int i = 0; i < 200; ++i) {
    const int x = 1000 + (i * 37) % 1000, y = (i * 11) % 7;
    table += absl::StrCat(x, ",", y, ",", x + 100 * y > 1800 ? 1 : 0, "\n");
  }
  WriteFile(dir + "/t.csv", table);
  // Not "tab": UploadCsvSendsTheTableWithItsOptionsAndNamesABadCell takes that name on the same
  // kilnd when the tests run in one process.
  ASSERT_EQ(Kiln({"upload", "rows", "--format", "csv", "--train", dir + "/t.csv"}).exit_code, 0);
  WriteFile(dir + "/tab.json", R"({
  "dataset": "rows", "epochs": 30, "batch_size": 16, "seed": 3, "device": "cpu",
  "model": {"input_shape": [2],
            "layers": [{"linear": {"in_features": 2, "out_features": 16}}, {"relu": {}},
                       {"linear": {"in_features": 16, "out_features": 2}}]},
  "optimizer": {"kind": "KIND_ADAM", "lr": 0.02}
})");
  const std::string tab = Submit(dir + "/tab.json");
  ASSERT_FALSE(tab.empty());
  ASSERT_EQ(Kiln({"watch", tab}).exit_code, 0);
  ASSERT_EQ(Kiln({"deploy", tab + "@latest", "--name", "tab"}).exit_code, 0);
  WriteFile(dir + "/rows.csv", "x,y,label\n1900,6,1\n1050,0,0\n");
  RunResult rows = Kiln({"predict", "tab", dir + "/rows.csv", "--output", "json"});
  ASSERT_EQ(rows.exit_code, 0) << rows.err;
  const nlohmann::json by_row = nlohmann::json::parse(rows.out);
  ASSERT_EQ(by_row.at("predictions").size(), 2u);
  EXPECT_EQ(by_row.at("predictions")[0].at("class"), 1) << rows.out;
  EXPECT_EQ(by_row.at("predictions")[1].at("class"), 0) << rows.out;
  EXPECT_THAT(by_row.at("predictions")[0].at("file").get<std::string>(), HasSubstr("rows.csv#2"));
  WriteFile(dir + "/short.csv", "1900\n");
  RunResult short_row = Kiln({"predict", "tab", dir + "/short.csv"});
  EXPECT_EQ(short_row.exit_code, 2);
  EXPECT_THAT(short_row.err, HasSubstr("line 1 has 1 cells but the model takes 2 features"));
}

}  // namespace
}  // namespace kiln::client::testing
