// Token datasets through the catalog: a text upload becomes shards and vocab.json and lists its
// tokens and vocabulary; llm.c shards are checked as they stream; bad text or shards are refused
// naming the file, leaving no folder; Load refuses a token dataset and OpenTokens maps it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/sha256.h"
#include "server/datasets/dataset_catalog.h"
#include "server/datasets/token_shard_stream_check.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string Shard(const std::vector<uint16_t>& tokens, int32_t count, int32_t magic = 20240520) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = 1;
  header[2] = count;
  std::string out(reinterpret_cast<const char*>(header), sizeof(header));
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return out;
}

class TokenDatasetUploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("kiln-token-upload");
    catalog_ = std::make_unique<DatasetCatalog>(root_, int64_t{64} << 20);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // Uploads `files` (name, bytes) in chunks of 1000 bytes; the first error, or the dataset.
  absl::StatusOr<v1::Dataset> Upload(const std::string& name, DatasetFormat format,
                                     const std::vector<std::pair<std::string, std::string>>& files,
                                     double val_fraction = kDefaultValFraction) {
    auto upload = catalog_->BeginUpload(name, {}, format, CsvOptions(), val_fraction);
    if (!upload.ok()) return upload.status();
    for (const auto& [file, bytes] : files) {
      size_t offset = 0;
      do {
        v1::DatasetFileChunk chunk;
        chunk.set_file_name(file);
        chunk.set_data(bytes.substr(offset, 1000));
        offset += 1000;
        if (offset >= bytes.size()) chunk.set_sha256(Sha256Hex(bytes));
        if (absl::Status s = (*upload)->Append(chunk); !s.ok()) return s;
      } while (offset < bytes.size());
    }
    return (*upload)->Commit();
  }

  // Only the datasets' folders: no upload folder was left behind.
  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string root_;
  std::unique_ptr<DatasetCatalog> catalog_;
};

TEST_F(TokenDatasetUploadTest, TextUploadBecomesShardsAndVocabularyAndListsItsTokens) {
  const std::string a(3000, 'a');           // spans several chunks
  const std::string b = "héllo wörld €\n";  // 14 characters, multi-byte
  absl::StatusOr<v1::Dataset> d =
      Upload("corpus", DatasetFormat::kText, {{"part1.txt", a}, {"part0.txt", b}}, 0.2);
  ASSERT_OK(d);
  EXPECT_EQ(d->format(), v1::DATASET_FORMAT_TEXT);
  const int64_t n = 3000 + 14;
  EXPECT_EQ(d->train_tokens(), static_cast<int64_t>(n * 0.8));
  EXPECT_EQ(d->val_tokens(), n - d->train_tokens());
  EXPECT_EQ(d->vocab_size(), 12);  // a h é l o w ö r d € space newline
  EXPECT_EQ(d->max_token(), 11);
  EXPECT_EQ(d->train_samples(), 0);
  // The text is not kept: only shards, the vocabulary and the (hidden) manifest.
  EXPECT_THAT(d->files(), ElementsAre("train_000.bin", "val_000.bin", "vocab.json"));
  EXPECT_FALSE(fs::exists(root_ + "/corpus/.corpus"));
  EXPECT_THAT(Entries(), ElementsAre("corpus"));

  // The files were concatenated in the order sent, not by name.
  absl::StatusOr<TokenDataset> ds = catalog_->OpenTokens("corpus");
  ASSERT_OK(ds);
  ASSERT_TRUE(ds->vocabulary.has_value());
  std::vector<int32_t> ids;
  for (const TokenSplit* split : {&ds->train, &ds->val}) {
    for (uint16_t t : split->shards[0].tokens()) ids.push_back(t);
  }
  EXPECT_EQ(*ds->vocabulary->Decode(ids), a + b);

  absl::StatusOr<std::vector<v1::Dataset>> listed = catalog_->List();
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].train_tokens(), d->train_tokens());
  EXPECT_EQ((*listed)[0].vocab_size(), 12);

  absl::StatusOr<DatasetSplits> load = catalog_->Load("corpus");
  EXPECT_EQ(load.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(load.status().message(), HasSubstr("dataset \"corpus\" holds tokens"));
}

TEST_F(TokenDatasetUploadTest, FactsAreReadAgainWhenTheManifestIsGone) {
  ASSERT_OK(Upload("c", DatasetFormat::kText, {{"t.txt", "abcabcabcabc\n"}}));
  fs::remove(root_ + "/c/" + kDatasetManifestName);
  absl::StatusOr<v1::Dataset> d = catalog_->Describe("c");
  ASSERT_OK(d);
  EXPECT_EQ(d->format(), v1::DATASET_FORMAT_TEXT);
  EXPECT_EQ(d->vocab_size(), 4);
  EXPECT_EQ(d->train_tokens() + d->val_tokens(), 13);
}

TEST_F(TokenDatasetUploadTest, BadTextIsRefusedNamingTheFileAndLeavesNothing) {
  absl::StatusOr<v1::Dataset> bad =
      Upload("c", DatasetFormat::kText, {{"good.txt", "fine text"}, {"bad.txt", "ok\xC0\xAF"}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("bad.txt"), HasSubstr("byte offset 2")));
  absl::StatusOr<v1::Dataset> empty = Upload("c", DatasetFormat::kText, {{"empty.txt", ""}});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), AllOf(HasSubstr("empty.txt"), HasSubstr("empty")));
  absl::StatusOr<v1::Dataset> fraction =
      Upload("c", DatasetFormat::kText, {{"t.txt", "text"}}, 0.7);
  EXPECT_THAT(fraction.status().message(), HasSubstr("header.val_fraction"));
  absl::StatusOr<v1::Dataset> name = Upload("c", DatasetFormat::kText, {{"../t.txt", "text"}});
  EXPECT_THAT(name.status().message(), HasSubstr("not a valid text file name"));
  EXPECT_THAT(Entries(), IsEmpty());
}

TEST_F(TokenDatasetUploadTest, TextIsCheckedAsItStreamsSoABadByteStopsTheUploadAtItsChunk) {
  auto upload = catalog_->BeginUpload("c", {}, DatasetFormat::kText);
  ASSERT_OK(upload);
  v1::DatasetFileChunk first;
  first.set_file_name("big.txt");
  first.set_data(std::string(1000, 'a') + "\xC3");  // a character cut by the chunk's end
  ASSERT_OK((*upload)->Append(first));
  v1::DatasetFileChunk second;
  second.set_file_name("big.txt");
  second.set_data("\xA9 ok \xED\xA0\x80 more");  // é completed, then a surrogate at 1006
  absl::Status s = (*upload)->Append(second);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("big.txt"), HasSubstr("byte offset 1006")));
  upload->reset();
  EXPECT_THAT(Entries(), IsEmpty());
}

TEST_F(TokenDatasetUploadTest, TokenShardsUploadCheckedAndListed) {
  std::vector<uint16_t> train(5000);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint16_t>(i % 50257);
  const std::vector<uint16_t> val = {1, 2, 3, 40000};
  absl::StatusOr<v1::Dataset> d =
      Upload("gpt", DatasetFormat::kTokens,
             {{"train_000.bin", Shard(train, 5000)}, {"val_000.bin", Shard(val, 4)}});
  ASSERT_OK(d);
  EXPECT_EQ(d->format(), v1::DATASET_FORMAT_TOKENS);
  EXPECT_EQ(d->train_tokens(), 5000);
  EXPECT_EQ(d->val_tokens(), 4);
  EXPECT_EQ(d->vocab_size(), 0);  // the job's model says
  EXPECT_EQ(d->max_token(), 40000);
  absl::StatusOr<TokenDataset> ds = catalog_->OpenTokens("gpt");
  ASSERT_OK(ds);
  EXPECT_EQ(ds->train.tokens(), 5000);
  EXPECT_EQ(ds->max_token, 40000);
  EXPECT_THAT(catalog_->Load("gpt").status().message(), HasSubstr("holds tokens"));
}

TEST_F(TokenDatasetUploadTest, BadShardsAreRefusedAtUploadNamingTheFileAndLeaveNothing) {
  const std::vector<uint16_t> tokens(600, 7);
  absl::StatusOr<v1::Dataset> magic =
      Upload("gpt", DatasetFormat::kTokens, {{"train_000.bin", Shard(tokens, 600, 12345)}});
  EXPECT_EQ(magic.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      magic.status().message(),
      AllOf(HasSubstr("train_000.bin"), HasSubstr("wrong magic 12345"), HasSubstr("20240520")));
  absl::StatusOr<v1::Dataset> longer =
      Upload("gpt", DatasetFormat::kTokens,
             {{"train_000.bin", Shard(tokens, 600)}, {"val_001.bin", Shard(tokens, 500)}});
  EXPECT_THAT(longer.status().message(), AllOf(HasSubstr("val_001.bin"), HasSubstr("500 tokens")));
  absl::StatusOr<v1::Dataset> shorter =
      Upload("gpt", DatasetFormat::kTokens, {{"train_000.bin", Shard(tokens, 700)}});
  EXPECT_THAT(shorter.status().message(),
              AllOf(HasSubstr("train_000.bin"), HasSubstr("700 tokens"), HasSubstr("2224 bytes")));
  absl::StatusOr<v1::Dataset> no_train =
      Upload("gpt", DatasetFormat::kTokens, {{"val_000.bin", Shard(tokens, 600)}});
  EXPECT_THAT(no_train.status().message(), HasSubstr("missing train_<N>.bin"));
  absl::StatusOr<v1::Dataset> name =
      Upload("gpt", DatasetFormat::kTokens, {{"shard.bin", Shard(tokens, 600)}});
  EXPECT_THAT(name.status().message(), HasSubstr("not a token shard name"));
  EXPECT_THAT(Entries(), IsEmpty());
}

TEST(TokenShardStreamCheckTest, TokensSplitAcrossChunksAreCountedAndTheLargestKept) {
  std::vector<uint16_t> tokens = {5, 0x1234, 300, 65535, 9};
  const std::string bytes = Shard(tokens, 5);
  TokenShardStreamCheck check("s.bin");
  // Odd chunk sizes split the header and tokens between chunks.
  for (size_t i = 0; i < bytes.size(); i += 7) {
    ASSERT_OK(check.Consume(absl::string_view(bytes).substr(i, 7)));
  }
  ASSERT_OK(check.Finish());
  EXPECT_EQ(check.tokens(), 5);
  EXPECT_EQ(check.max_token(), 65535);
  TokenShardStreamCheck truncated("t.bin");
  ASSERT_OK(truncated.Consume(absl::string_view(bytes).substr(0, 500)));
  EXPECT_THAT(truncated.Finish().message(), AllOf(HasSubstr("t.bin"), HasSubstr("truncated")));
}

}  // namespace
}  // namespace kiln::server
