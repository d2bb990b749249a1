// SubmitJob's checks of a language model against a token dataset: the vocabulary, the run's
// length, and image models or epochs on tokens, each refused naming the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/data/token_data.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_admission.h"
#include "server/jobs/worker_job_runner.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

using ::testing::HasSubstr;

class TokenJobAdmission : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("kiln-token-admission");
    std::filesystem::create_directories(root_ + "/chars");
    const std::string text = "the cat sat on the mat. a dog ran far! " + std::string(400, 'x');
    const TextSource source{"corpus.txt", text};
    auto facts = EncodeTextCorpus({&source, 1}, 0.1, root_ + "/chars");
    ASSERT_OK(facts) << facts.status();
    vocab_ = facts->vocabulary.size();
    testing::WriteToyDataset(root_ + "/digits", 64, 16);
    catalog_ = std::make_unique<DatasetCatalog>(root_, int64_t{64} << 20);
    admission_ = std::make_unique<JobAdmission>(catalog_.get(), SpecLimits(), "cpu", 1, &workers_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string Refusal(const v1::JobSpec& spec) {
    auto admitted = admission_->Admit(spec);
    return admitted.ok() ? "ok" : std::string(admitted.status().message());
  }

  std::string root_;
  int vocab_ = 0;
  WorkerRunnerOptions workers_;
  std::unique_ptr<DatasetCatalog> catalog_;
  std::unique_ptr<JobAdmission> admission_;
};

TEST_F(TokenJobAdmission, AGptWhoseVocabularyCoversTheDatasetsIsAdmitted) {
  EXPECT_EQ(Refusal(testing::GptSpec("chars", vocab_)), "ok");
  EXPECT_EQ(Refusal(testing::GptSpec("chars", vocab_ + 10)), "ok");  // more logits are allowed
}

TEST_F(TokenJobAdmission, MismatchesAreRefusedNamingTheField) {
  EXPECT_EQ(Refusal(testing::GptSpec("chars", vocab_ - 1)),
            "spec.model: the model has " + std::to_string(vocab_ - 1) +
                " logits per position but dataset \"chars\" has a vocabulary of " +
                std::to_string(vocab_) + " tokens");
  // A classifier on tokens, and a language model on images.
  EXPECT_THAT(Refusal(testing::SmallSpec("chars", 1)),
              HasSubstr("spec.max_iters: dataset \"chars\" holds tokens"));
  EXPECT_THAT(Refusal(testing::GptSpec("digits", vocab_)),
              HasSubstr("spec.max_iters: dataset \"digits\" holds samples, not tokens"));
}

}  // namespace
}  // namespace kiln::server
