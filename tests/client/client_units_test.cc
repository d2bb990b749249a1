// Unit tests of the client's pieces: tables, checkpoint references, spec files and overrides,
// image decoding, the plain progress view and exit codes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_split.h"
#include "cli_test_support.h"
#include "client/cli_status.h"
#include "client/image_file.h"
#include "client/job_ref.h"
#include "client/npy_writer.h"
#include "client/plain_enum_names.h"
#include "client/progress_view.h"
#include "client/spec_details.h"
#include "client/spec_file.h"
#include "client/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"

#ifdef KILN_CLIENT_HAVE_PNG
#include <png.h>
#include <zlib.h>
#endif

namespace kiln::client {
namespace {

using ::testing::HasSubstr;

TEST(TableTest, AlignsColumnsAndTrimsTrailingSpace) {
  Table t({"ID", "STATE"});
  t.AddRow({"job-1", "RUNNING"});
  t.AddRow({"j", ""});
  EXPECT_EQ(t.Render(), "ID     STATE\njob-1  RUNNING\nj\n");
}

TEST(KeyValueListTest, AlignsValues) {
  KeyValueList kv;
  kv.Add("job", "job-1");
  kv.Add("state", "RUNNING");
  EXPECT_EQ(kv.Render(), "job:    job-1\nstate:  RUNNING\n");
}

TEST(CheckpointRefTest, ParsesEveryForm) {
  EXPECT_EQ(ParseCheckpointRef("job-1")->which, CheckpointRef::Which::kLatest);
  EXPECT_EQ(ParseCheckpointRef("job-1@latest")->ToString(), "job-1@latest");
  EXPECT_EQ(ParseCheckpointRef("job-1@best")->which, CheckpointRef::Which::kBest);
  auto id = ParseCheckpointRef("job-1@7");
  ASSERT_OK(id);
  EXPECT_EQ(id->checkpoint_id, 7);
  EXPECT_EQ(id->job_id, "job-1");
  EXPECT_FALSE(ParseCheckpointRef("job-1@-3").ok());
  EXPECT_FALSE(ParseCheckpointRef("@best").ok());
  EXPECT_EQ(ReportStatus(ParseCheckpointRef("job@x").status(), stderr), 2);
}

TEST(SpecFileTest, ParsesJsonAndTextAndNamesTheFileOnErrors) {
  auto json = ParseSpecJson(R"({"preset": "mnist-cnn", "epochs": 3})", "a.json");
  ASSERT_OK(json) << json.status();
  EXPECT_EQ(json->epochs(), 3);
  auto text = ParseSpecText("preset: \"mnist-mlp\"\nbatch_size: 16\n", "a.textproto");
  ASSERT_OK(text) << text.status();
  EXPECT_EQ(text->batch_size(), 16);
  auto bad = ParseSpecText("epochs: \"x\"", "b.textproto");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("b.textproto"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 1"));
  EXPECT_FALSE(ParseSpecJson(R"({"no_such_field": 1})", "c.json").ok());
  // Nesting is refused before a tree is built (serialising one 80,000 deep overflows the stack).
  auto deep = ParseSpecJson("{\"a\": " + std::string(80'000, '[') + std::string(80'000, ']') + "}",
                            "d.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_THAT(deep.status().message(), ::testing::HasSubstr("d.json nests arrays and objects"));
}

// The README's augmentation snippet, as a spec file gives it, and its camelCase JSON name.
TEST(SpecFileTest, JsonSpecsTakeTheAugmentField) {
  for (
      const char* text :
      {R"({"preset": "mnist-cnn", "augment": {"random_crop_padding": 4, "horizontal_flip": true}})",
       R"({"preset": "mnist-cnn", "augment": {"randomCropPadding": 4, "horizontalFlip": true}})"}) {
    auto spec = ParseSpecJson(text, "a.json");
    ASSERT_OK(spec) << spec.status();
    EXPECT_EQ(spec->augment().random_crop_padding(), 4);
    EXPECT_TRUE(spec->augment().horizontal_flip());
  }
}

TEST(SpecFileTest, OverridesFillDefaultsAndSpellOutThePresetOptimizerForLr) {
  v1::JobSpec spec;
  SpecOverrides o;
  o.preset = "mnist-cnn";
  o.lr = 0.002;
  ASSERT_OK(ApplyOverrides(o, &spec));
  EXPECT_EQ(spec.dataset(), "mnist");
  EXPECT_EQ(spec.epochs(), 1);
  EXPECT_EQ(spec.optimizer().kind(), v1::OptimizerSpec::KIND_ADAM);
  EXPECT_FLOAT_EQ(spec.optimizer().lr(), 0.002f);

  v1::JobSpec custom;
  SpecOverrides lr_only;
  lr_only.lr = 0.1;
  EXPECT_EQ(ReportStatus(ApplyOverrides(lr_only, &custom), stderr), 2);
}

TEST(SpecFileTest, JsonTakesPlainEnumNamesInAnyCaseAndTheFullOnes) {
  auto spec = ParseSpecJson(R"({"optimizer": {"kind": "adamw", "lr": 0.001},
      "schedule": {"kind": "One_Cycle", "anneal": "linear"}, "loss": "cross_entropy",
      "checkpoint_policy": {"keep_best": true}})",
                            "a.json");
  ASSERT_OK(spec) << spec.status();
  EXPECT_EQ(spec->optimizer().kind(), v1::OptimizerSpec::KIND_ADAMW);
  EXPECT_EQ(spec->schedule().kind(), v1::ScheduleSpec::KIND_ONE_CYCLE);
  EXPECT_EQ(spec->schedule().anneal(), v1::ScheduleSpec::ANNEAL_LINEAR);
  EXPECT_EQ(spec->loss(), v1::LOSS_KIND_CROSS_ENTROPY);
  auto full = ParseSpecJson(R"({"optimizer": {"kind": "KIND_SGD"}, "loss": 1})", "b.json");
  ASSERT_OK(full) << full.status();
  EXPECT_EQ(full->optimizer().kind(), v1::OptimizerSpec::KIND_SGD);
  EXPECT_EQ(full->loss(), v1::LOSS_KIND_MEAN_SQUARED_ERROR);
}

TEST(SpecFileTest, AnUnknownEnumNameIsAUsageErrorListingTheAcceptedOnes) {
  auto bad = ParseSpecJson(R"({"optimizer": {"kind": "adamx"}})", "c.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(ReportStatus(bad.status(), stderr), 2);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("c.json: spec.optimizer.kind: unknown value \"adamx\"; expected sgd, "
                        "adam or adamw"));
  auto nested = ParseSpecJson(R"({"schedule": {"kind": "cos"}})", "d.json");
  ASSERT_FALSE(nested.ok());
  EXPECT_THAT(std::string(nested.status().message()),
              HasSubstr("expected constant, step, cosine, one_cycle or warmup_cosine"));
  // Not JSON at all: protobuf's parser still says what is wrong.
  EXPECT_FALSE(ParseSpecJson("{\"epochs\": ", "e.json").ok());
}

TEST(SpecFileTest, ScheduleFlagTakesAKindAndScheduleSpecsOwnFields) {
  auto cosine = ParseScheduleFlag("cosine:t_max=10,eta_min=1e-5");
  ASSERT_OK(cosine) << cosine.status();
  EXPECT_EQ(cosine->kind(), v1::ScheduleSpec::KIND_COSINE);
  EXPECT_EQ(cosine->t_max(), 10);
  EXPECT_FLOAT_EQ(cosine->eta_min(), 1e-5f);
  auto cycle = ParseScheduleFlag("ONE_CYCLE:pct_start=0.25,anneal=linear,cycle_momentum=false");
  ASSERT_OK(cycle) << cycle.status();
  EXPECT_EQ(cycle->kind(), v1::ScheduleSpec::KIND_ONE_CYCLE);
  EXPECT_FLOAT_EQ(cycle->pct_start(), 0.25f);
  EXPECT_EQ(cycle->anneal(), v1::ScheduleSpec::ANNEAL_LINEAR);
  ASSERT_TRUE(cycle->has_cycle_momentum());
  EXPECT_FALSE(cycle->cycle_momentum());
  auto warmup =
      ParseScheduleFlag("warmup_cosine:warmup_iters=100,lr_decay_iters=5000,eta_min=1e-4");
  ASSERT_OK(warmup) << warmup.status();
  EXPECT_EQ(warmup->kind(), v1::ScheduleSpec::KIND_WARMUP_COSINE);
  EXPECT_EQ(warmup->warmup_iters(), 100);
  EXPECT_EQ(warmup->lr_decay_iters(), 5000);
  EXPECT_FLOAT_EQ(warmup->eta_min(), 1e-4f);
  EXPECT_EQ(ReportStatus(ParseScheduleFlag("step:gamma").status(), stderr), 2);
  EXPECT_EQ(ReportStatus(ParseScheduleFlag("step:anneal=sideways").status(), stderr), 2);
}

TEST(SpecFileTest, AnotherOptimizerKindStartsAfreshKeepingTheRate) {
  v1::JobSpec spec;
  SpecOverrides o;
  o.preset = "mnist-mlp";
  o.optimizer = "Adam";
  o.weight_decay = 0.01;
  ASSERT_OK(ApplyOverrides(o, &spec));
  EXPECT_EQ(spec.optimizer().kind(), v1::OptimizerSpec::KIND_ADAM);
  EXPECT_FLOAT_EQ(spec.optimizer().lr(), 0.001f);
  EXPECT_FLOAT_EQ(spec.optimizer().momentum(), 0.0f) << "SGD's momentum stays with SGD";
  EXPECT_FLOAT_EQ(spec.optimizer().weight_decay(), 0.01f);

  SpecOverrides same;
  same.optimizer = "kind_adam";
  same.lr = 0.003;
  ASSERT_OK(ApplyOverrides(same, &spec));
  EXPECT_FLOAT_EQ(spec.optimizer().lr(), 0.003f);
  EXPECT_FLOAT_EQ(spec.optimizer().weight_decay(), 0.01f);

  SpecOverrides labels;
  labels.labels = {"team=vision", "note=a=b"};
  labels.name = "run 1";
  ASSERT_OK(ApplyOverrides(labels, &spec));
  EXPECT_EQ(spec.labels().at("team"), "vision");
  EXPECT_EQ(spec.labels().at("note"), "a=b");
  EXPECT_EQ(spec.name(), "run 1");
  labels.labels = {"=x"};
  EXPECT_EQ(ReportStatus(ApplyOverrides(labels, &spec), stderr), 2);
}

TEST(PlainEnumNameTest, IsTheLowerCaseNameWithoutTheSharedPrefix) {
  EXPECT_EQ(PlainEnumName(v1::OptimizerSpec::Kind_descriptor()->FindValueByNumber(3)), "adamw");
  EXPECT_EQ(PlainEnumName(v1::LossKind_descriptor()->FindValueByNumber(1)), "mean_squared_error");
  EXPECT_EQ(PlainEnumName(
                v1::CheckpointKind_descriptor()->FindValueByNumber(v1::CHECKPOINT_KIND_ON_DEMAND)),
            "on_demand");
  // Every plain name parses back to its value, even one that ends another's name
  // ("cosine" and "warmup_cosine").
  for (const auto* type :
       {v1::ScheduleSpec::Kind_descriptor(), v1::OptimizerSpec::Kind_descriptor(),
        v1::OptimizerSpec::WeightDecayRule_descriptor()}) {
    for (int i = 0; i < type->value_count(); ++i) {
      auto back = ParsePlainEnumName(type, PlainEnumName(type->value(i)), "x");
      ASSERT_OK(back) << type->value(i)->name();
      EXPECT_EQ(*back, type->value(i));
    }
  }
  auto kind = ParsePlainEnumName(v1::CheckpointKind_descriptor(), "Final", "--kind");
  ASSERT_OK(kind);
  EXPECT_EQ((*kind)->number(), v1::CHECKPOINT_KIND_FINAL);
}

TEST(SpecDetailsTest, ListsGraphNodesAndCustomHyperparametersByPlainName) {
  auto spec = ParseSpecText(R"(
    model {
      input_shape: [1, 8, 8]
      layers { name: "conv" conv2d { in_channels: 1 out_channels: 1 kernel_size: 3 padding: 1 } }
      layers { name: "sum" add {} inputs: ["conv", "input"] }
    }
    optimizer { kind: KIND_SGD lr: 0.1 nesterov: true momentum: 0.9 }
    schedule { kind: KIND_COSINE t_max: 4 }
    loss: LOSS_KIND_MEAN_SQUARED_ERROR
    normalization { scale: 1 channel_mean: [0.5] channel_std: [0.25] }
    checkpoint_policy { every_n_epochs: 2 keep_best: true }
  )",
                            "g.textproto");
  ASSERT_OK(spec) << spec.status();
  KeyValueList kv;
  AddSpecDetails(*spec, *spec, &kv);
  const std::string text = kv.Render();
  EXPECT_THAT(text, HasSubstr("input:          [1, 8, 8]\n"));
  EXPECT_THAT(text,
              HasSubstr("layer 1:        conv: conv2d(in_channels=1 out_channels=1 kernel_size=3 "
                        "padding=1)\n"));
  EXPECT_THAT(text, HasSubstr("layer 2:        sum: add <- conv, input\n"));
  EXPECT_THAT(text, HasSubstr("optimizer:      sgd lr=0.1 momentum=0.9 nesterov=true\n"));
  EXPECT_THAT(text, HasSubstr("schedule:       cosine t_max=4\n"));
  EXPECT_THAT(text, HasSubstr("loss:           mean_squared_error\n"));
  EXPECT_THAT(text, HasSubstr("normalisation:  scale=1 channel_mean=[0.5] channel_std=[0.25]\n"));
  EXPECT_THAT(text, HasSubstr("checkpointing:  every_n_epochs=2 keep_best=true\n"));
}

// nanoGPT's recipe in a JSON spec by plain names, shown back by plain names.
TEST(SpecDetailsTest, ShowsTheWeightDecayRuleAndTheWarmupCosineFields) {
  auto spec = ParseSpecJson(R"({"optimizer": {"kind": "adamw", "lr": 0.001, "weight_decay": 0.1,
      "weight_decay_rule": "matrices"},
      "schedule": {"kind": "warmup_cosine", "warmup_iters": 100, "eta_min": 0.0001}})",
                            "gpt.json");
  ASSERT_OK(spec) << spec.status();
  EXPECT_EQ(spec->optimizer().weight_decay_rule(), v1::OptimizerSpec::WEIGHT_DECAY_RULE_MATRICES);
  KeyValueList kv;
  AddSpecDetails(*spec, *spec, &kv);
  const std::string text = kv.Render();
  EXPECT_THAT(text, HasSubstr("optimizer:      adamw lr=0.001 weight_decay=0.1 "
                              "weight_decay_rule=matrices\n"));
  EXPECT_THAT(text, HasSubstr("schedule:       warmup_cosine eta_min=0.0001 warmup_iters=100\n"));
}

TEST(ImageFileTest, DecodesBinaryAndAsciiPgm) {
  const std::string p5 = testing::ToyPgm(3, 2);
  auto image = DecodePgm(p5, "x.pgm");
  ASSERT_OK(image) << image.status();
  EXPECT_EQ(image->width, 28);
  EXPECT_EQ(image->height, 28);
  EXPECT_EQ(std::string(image->pixels.begin(), image->pixels.end()), p5.substr(p5.size() - 784));

  auto ascii = DecodePgm("P2\n# comment\n2 1\n15\n0 15\n", "y.pgm");
  ASSERT_OK(ascii) << ascii.status();
  EXPECT_EQ(ascii->pixels, (std::vector<uint8_t>{0, 255}));
  EXPECT_FALSE(DecodePgm("P5\n28 28\n255\nshort", "z.pgm").ok());
  EXPECT_EQ(DetectImageFile(testing::ToyImagesIdx(1, 1)), ImageFileKind::kIdxImages);
}

#ifdef KILN_CLIENT_HAVE_PNG
TEST(ImageFileTest, DecodesPngToGray) {
  const std::string dir = testing::MakeTempDir("kiln-png");
  const std::string pgm = testing::ToyPgm(1, 2);
  const std::string gray = pgm.substr(pgm.size() - 784);
  // The same pixels as RGB, which the decoder must bring back to gray.
  std::string rgb;
  for (char c : gray) rgb.append(3, c);
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = 28;
  image.height = 28;
  image.format = PNG_FORMAT_RGB;
  const std::string path = dir + "/digit.png";
  ASSERT_TRUE(png_image_write_to_file(&image, path.c_str(), 0, rgb.data(), 0, nullptr));
  auto decoded = ReadImageFile(path);
  ASSERT_OK(decoded) << decoded.status();
  ASSERT_EQ(decoded->pixels.size(), 784u);
  int far = 0;
  for (size_t i = 0; i < 784; ++i)
    far += std::abs(decoded->pixels[i] - static_cast<uint8_t>(gray[i])) > 2;
  EXPECT_EQ(far, 0);
}

// A PNG whose header claims 100000 x 100000 pixels is refused from the header, before the
// decoder allocates 10 GB for it.
TEST(ImageFileTest, APngClaimingHugeDimensionsIsRefusedBeforeDecoding) {
  const std::string dir = testing::MakeTempDir("kiln-png");
  std::string gray(28 * 28, '\x7f');
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = 28;
  image.height = 28;
  image.format = PNG_FORMAT_GRAY;
  const std::string path = dir + "/huge.png";
  ASSERT_TRUE(png_image_write_to_file(&image, path.c_str(), 0, gray.data(), 0, nullptr));
  std::string bytes = testing::ReadFile(path);
  // IHDR: length at 8, "IHDR" at 12, width at 16, height at 20, CRC of type and data at 29.
  for (int at : {16, 20}) {
    const uint32_t side = 100000;
    for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>(side >> (24 - 8 * i));
  }
  const uint32_t crc = crc32(0, reinterpret_cast<const Bytef*>(bytes.data() + 12), 4 + 13);
  for (int i = 0; i < 4; ++i) bytes[29 + i] = static_cast<char>(crc >> (24 - 8 * i));
  testing::WriteFile(path, bytes);
  auto decoded = ReadImageFile(path);
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(std::string(decoded.status().message()),
              HasSubstr("100000x100000 pixels is larger than"));
}
#endif

// What numpy.save writes for these arrays, byte for byte: kilnd's NPY reader takes both.
TEST(NpyWriterTest, HeadersAreNumpysOwn) {
  const std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string u8 = NpyHeader("|u1", {2, 3});
  EXPECT_EQ(u8, std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict + std::string(58, ' ') + "\n");
  const std::string labels = NpyHeader("<i4", {5});
  EXPECT_EQ(labels.size(), 128u);
  EXPECT_THAT(labels, HasSubstr("{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }"));
  EXPECT_EQ(labels.back(), '\n');
}

TEST(ImageFileTest, ReadsOneImageOutOfAnIdxFile) {
  const std::string dir = testing::MakeTempDir("kiln-idx");
  testing::WriteFile(dir + "/images", testing::ToyImagesIdx(4, 2));
  auto image = ReadIdxImage(dir + "/images", 3);
  ASSERT_OK(image) << image.status();
  const std::string pgm = testing::ToyPgm(3, 2);
  EXPECT_EQ(std::string(image->pixels.begin(), image->pixels.end()), pgm.substr(pgm.size() - 784));
  EXPECT_FALSE(ReadIdxImage(dir + "/images", 4).ok());
}

TEST(ProgressViewTest, PlainStylePrintsLinesWithoutControlCharacters) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  v1::Job job;
  job.set_id("job-1");
  job.set_epochs(1);
  {
    ProgressView view(out, ProgressView::Style::kPlain, job);
    for (int i = 1; i <= 20; ++i) {
      v1::JobEvent e;
      e.mutable_time()->set_seconds(1000 + i);
      v1::StepMetrics* s = e.mutable_step();
      s->set_epoch(1);
      s->set_step_in_epoch(i);
      s->set_steps_per_epoch(20);
      s->set_global_step(i);
      s->set_loss(1.0f / i);
      view.OnEvent(e);
    }
    v1::JobEvent epoch;
    epoch.mutable_epoch()->set_epoch(1);
    epoch.mutable_epoch()->set_test_samples(10);
    epoch.mutable_epoch()->set_test_accuracy(0.9);
    view.OnEvent(epoch);
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.set_epochs_done(1);
    job.set_global_step(20);
    view.PrintSummary(job);
  }
  std::fclose(out);
  const std::string text(buffer, size);
  free(buffer);
  EXPECT_FALSE(testing::HasControlCharacters(text)) << text;
  EXPECT_THAT(text, HasSubstr("epoch 1/1  step 2/20 (10%)"));
  EXPECT_THAT(text, HasSubstr("test acc 90.00%"));
  EXPECT_THAT(text, HasSubstr("job-1 SUCCEEDED: 1 epoch, 20 steps"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 9 + 1 + 2);
}

TEST(ProgressViewTest, LiveStyleRedrawsOneBarInPlaceAndClearsItForLines) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  v1::Job job;
  job.set_id("job-2");
  job.set_epochs(2);
  {
    ProgressView view(out, ProgressView::Style::kLive, job, 80);
    for (int i = 1; i <= 4; ++i) {
      v1::JobEvent e;
      e.mutable_time()->set_seconds(1000 + i);
      v1::StepMetrics* s = e.mutable_step();
      s->set_epoch(1);
      s->set_step_in_epoch(i);
      s->set_steps_per_epoch(4);
      s->set_global_step(i);
      s->set_loss(0.5f);
      s->set_samples_per_sec(1234);
      view.OnEvent(e);
    }
    v1::JobEvent epoch;
    epoch.mutable_epoch()->set_epoch(1);
    view.OnEvent(epoch);
    job.set_state(v1::JOB_STATE_FAILED);
    job.set_reason("loss became NaN");
    view.PrintSummary(job);
  }
  std::fclose(out);
  const std::string text(buffer, size);
  free(buffer);
  EXPECT_THAT(text, HasSubstr("\r\033[Kepoch 1/2 [=====>"));
  EXPECT_THAT(text, HasSubstr("] 4/4  loss 0.5000  acc -  1234/s"));
  EXPECT_THAT(text, HasSubstr("\r\033[Kepoch 1/2  train loss"));
  EXPECT_THAT(text, HasSubstr("job-2 FAILED after 0 epochs, 0 steps: loss became NaN\n"));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // Every drawn bar fits the 80 columns it was given.
    const size_t last = line.rfind("\033[K");
    const absl::string_view shown = last == absl::string_view::npos ? line : line.substr(last + 3);
    EXPECT_LT(shown.size(), 80u) << shown;
  }
}

TEST(CliStatusTest, ExitCodesByKind) {
  EXPECT_EQ(ReportStatus(absl::OkStatus(), stderr), 0);
  EXPECT_EQ(ReportStatus(UsageError("bad"), stderr), 2);
  EXPECT_EQ(ReportStatus(ServerError(grpc::Status(grpc::StatusCode::NOT_FOUND, "x")), stderr), 1);
  EXPECT_EQ(ReportStatus(ReportedFailure(), stderr), 1);
  EXPECT_EQ(ReportStatus(absl::UnavailableError("down"), stderr), 1);
  EXPECT_EQ(ReportStatus(Interrupted(), stderr), 130);
}

}  // namespace
}  // namespace kiln::client
