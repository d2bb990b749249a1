// Token datasets: llm.c shards mapped and refused by name, the character vocabulary and its strict
// UTF-8, the seeded window draw (deterministic, sliceable, inside shards, uniform), and the text
// corpus encoder's split.
#include "engine/data/token_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/data/dataset.h"
#include "engine/data/utf8.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using ::kiln::testing::TempDir;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A shard's bytes with a header saying `count` and `magic`, and `tokens`.
std::string ShardBytes(const std::vector<uint16_t>& tokens, int32_t count, int32_t magic) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = 1;
  header[2] = count;
  std::string out(reinterpret_cast<const char*>(header), sizeof(header));
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return out;
}

std::vector<uint16_t> Iota(int n, int mod) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<uint16_t>(i % mod);
  return v;
}

TokenSplit OpenShards(const TempDir& dir, const std::vector<std::vector<uint16_t>>& shards) {
  TokenSplit split;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string path = dir.file(absl::StrCat("train_00", k, ".bin"));
    EXPECT_OK(WriteTokenShard(path, shards[k]));
    absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
    EXPECT_OK(shard);
    split.shards.push_back(*std::move(shard));
  }
  return split;
}

TEST(TokenShardTest, WrittenShardReadsBackThroughTheMap) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 65535, 300, 7};
  ASSERT_OK(WriteTokenShard(dir.file("train_000.bin"), tokens));
  std::ifstream in(dir.file("train_000.bin"), std::ios::binary | std::ios::ate);
  EXPECT_EQ(static_cast<int64_t>(in.tellg()), 1024 + 2 * 5);
  absl::StatusOr<TokenShard> shard = TokenShard::Open(dir.file("train_000.bin"));
  ASSERT_OK(shard);
  EXPECT_EQ(shard->size(), 5);
  EXPECT_THAT(shard->tokens(), ElementsAreArray(tokens));
  EXPECT_EQ(shard->MaxToken(), 65535);
  TokenShard moved = *std::move(shard);
  EXPECT_EQ(moved[3], 300);
  EXPECT_EQ(shard->size(), 0);  // a moved-from shard is empty
}

TEST(TokenShardTest, WrongMagicIsRefusedNamingFileAndBothValues) {
  TempDir dir;
  WriteBytes(dir.file("s.bin"), ShardBytes({1, 2}, 2, 20240519));
  absl::StatusOr<TokenShard> shard = TokenShard::Open(dir.file("s.bin"));
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(),
              AllOf(HasSubstr(dir.file("s.bin")), HasSubstr("20240519"), HasSubstr("20240520")));
}

TEST(TokenShardTest, TruncatedHeaderIsRefusedNamingTheFile) {
  TempDir dir;
  WriteBytes(dir.file("s.bin"), ShardBytes({}, 0, kTokenShardMagic).substr(0, 100));
  absl::StatusOr<TokenShard> shard = TokenShard::Open(dir.file("s.bin"));
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(),
              AllOf(HasSubstr(dir.file("s.bin")), HasSubstr("truncated")));
}

TEST(TokenShardTest, CountDisagreeingWithSizeIsRefusedSayingBoth) {
  TempDir dir;
  WriteBytes(dir.file("s.bin"), ShardBytes({1, 2, 3}, 5, kTokenShardMagic));
  absl::StatusOr<TokenShard> shard = TokenShard::Open(dir.file("s.bin"));
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(),
              AllOf(HasSubstr(dir.file("s.bin")), HasSubstr("5 tokens"), HasSubstr("1030 bytes")));
}

TEST(TokenShardTest, MissingFileIsNotFound) {
  TempDir dir;
  EXPECT_EQ(TokenShard::Open(dir.file("none.bin")).status().code(), absl::StatusCode::kNotFound);
}

TEST(CharVocabularyTest, IsTheSortedSetOfCodePoints) {
  absl::StatusOr<CharVocabulary> v = CharVocabulary::FromText("hé\nbaé€h😀", "t.txt");
  ASSERT_OK(v);
  EXPECT_THAT(v->characters(), ElementsAre(U'\n', U'a', U'b', U'h', U'é', U'€', U'😀'));
  EXPECT_EQ(v->IdOf(U'€'), 5);
  EXPECT_EQ(v->IdOf(U'z'), -1);
}

TEST(CharVocabularyTest, EncodeDecodeRoundTripsMultiByteCharacters) {
  const std::string text = "naïve € 😀 text\n";
  absl::StatusOr<CharVocabulary> v = CharVocabulary::FromText(text, "t.txt");
  ASSERT_OK(v);
  absl::StatusOr<std::vector<int32_t>> ids = v->Encode(text);
  ASSERT_OK(ids);
  EXPECT_EQ(ids->size(), 15u);  // characters, not bytes
  absl::StatusOr<std::string> back = v->Decode(*ids);
  ASSERT_OK(back);
  EXPECT_EQ(*back, text);
}

TEST(CharVocabularyTest, EncodeNamesTheFirstUnknownCharacterAndWhere) {
  absl::StatusOr<CharVocabulary> v = CharVocabulary::FromText("abc", "t.txt");
  ASSERT_OK(v);
  absl::StatusOr<std::vector<int32_t>> ids = v->Encode("abé!");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(),
              AllOf(HasSubstr("U+00E9"), HasSubstr("byte offset 2"), HasSubstr("character 2")));
  EXPECT_THAT(v->Decode(std::vector<int32_t>{0, 3}).status().message(), HasSubstr("id 3"));
}

TEST(CharVocabularyTest, JsonRoundTripsInIdOrder) {
  absl::StatusOr<CharVocabulary> v = CharVocabulary::FromText("b\"a\n\\é", "t.txt");
  ASSERT_OK(v);
  const std::string json = v->ToJson();
  EXPECT_EQ(json, "[\"\\n\",\"\\\"\",\"\\\\\",\"a\",\"b\",\"é\"]\n");
  absl::StatusOr<CharVocabulary> back = CharVocabulary::FromJson(json, "vocab.json");
  ASSERT_OK(back);
  EXPECT_EQ(back->characters(), v->characters());
}

TEST(CharVocabularyTest, JsonThatIsNotASortedListOfCharactersIsRefused) {
  for (const char* bad :
       {"{}", "[]", "[\"ab\"]", "[\"b\",\"a\"]", "[\"a\",\"a\"]", "[1]", "[\"a\""}) {
    absl::StatusOr<CharVocabulary> v = CharVocabulary::FromJson(bad, "vocab.json");
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(v.status().message(), HasSubstr("vocab.json")) << bad;
  }
}

TEST(CharVocabularyTest, InvalidUtf8IsRefusedWithTheByteOffset) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"ab\x80", 2},               // stray continuation byte
      {"a\xC0\xAF", 1},            // overlong '/'
      {"xy\xE0\x80\xAF", 2},       // overlong 3-byte
      {"\xED\xA0\x80", 0},         // UTF-16 surrogate U+D800
      {"abc\xF4\x90\x80\x80", 3},  // above U+10FFFF
      {"ok\xE2\x82", 2},           // truncated at the end
      {"\xC3(", 0},                // missing continuation
      {"z\xFF", 1},                // never valid
  };
  for (const auto& [text, offset] : cases) {
    absl::StatusOr<CharVocabulary> v = CharVocabulary::FromText(text, "bad.txt");
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(v.status().message(),
                AllOf(HasSubstr("bad.txt"), HasSubstr(absl::StrCat("byte offset ", offset))))
        << offset;
  }
  EXPECT_OK(CharVocabulary::FromText("\xF4\x8F\xBF\xBF \xEF\xBF\xBF", "edge.txt"));
}

TEST(Utf8StreamCheckTest, CharactersCutBetweenPiecesAreJoinedAndOffsetsCountFromTheStart) {
  const std::string text = "aé€😀b";  // 1 + 2 + 3 + 4 + 1 bytes
  for (size_t piece = 1; piece <= 4; ++piece) {
    Utf8StreamCheck check("s.txt");
    for (size_t i = 0; i < text.size(); i += piece) {
      ASSERT_OK(check.Consume(std::string_view(text).substr(i, piece))) << piece;
    }
    EXPECT_OK(check.Finish()) << piece;
  }
  const std::string bad = text + "xy\xE2\x82(";  // the cut euro sign starts at byte 13
  for (size_t piece = 1; piece <= 5; ++piece) {
    Utf8StreamCheck check("bad.txt");
    absl::Status s;
    for (size_t i = 0; i < bad.size() && s.ok(); i += piece) {
      s = check.Consume(std::string_view(bad).substr(i, piece));
    }
    EXPECT_THAT(s.message(), AllOf(HasSubstr("bad.txt"), HasSubstr("byte offset 13"))) << piece;
  }
  Utf8StreamCheck cut("cut.txt");
  ASSERT_OK(cut.Consume("ab\xF0\x9F"));
  EXPECT_THAT(cut.Finish().message(), AllOf(HasSubstr("cut.txt"), HasSubstr("byte offset 2")));
}

TEST(CharVocabularyTest, EmptyTextIsRefused) {
  EXPECT_THAT(CharVocabulary::FromText("", "empty.txt").status().message(),
              AllOf(HasSubstr("empty.txt"), HasSubstr("empty")));
}

TEST(CharVocabularyTest, MoreThan65535CharactersIsRefused) {
  std::vector<char32_t> chars(70000);
  std::iota(chars.begin(), chars.end(), char32_t{0x10000});
  absl::StatusOr<CharVocabulary> v = CharVocabulary::FromCharacters(chars, "big.txt");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), AllOf(HasSubstr("big.txt"), HasSubstr("65535")));
}

TEST(TokenWindowsTest, SameSeedDrawAndIndexGiveTheSameWindow) {
  TempDir dir;
  const TokenSplit split = OpenShards(dir, {Iota(1000, 50000), Iota(700, 50000)});
  std::vector<int32_t> x1(8 * 16), y1(8 * 16), x2(8 * 16), y2(8 * 16);
  ASSERT_OK(GatherWindows(split, 16, 42, 3, 0, 8, x1.data(), y1.data()));
  ASSERT_OK(GatherWindows(split, 16, 42, 3, 0, 8, x2.data(), y2.data()));
  EXPECT_EQ(x1, x2);
  EXPECT_EQ(y1, y2);
  ASSERT_OK(GatherWindows(split, 16, 42, 4, 0, 8, x2.data(), y2.data()));
  EXPECT_NE(x1, x2);  // another draw
  ASSERT_OK(GatherWindows(split, 16, 43, 3, 0, 8, x2.data(), y2.data()));
  EXPECT_NE(x1, x2);  // another seed
}

TEST(TokenWindowsTest, YIsXShiftedByOneToken) {
  TempDir dir;
  // Consecutive values within a shard make the shift visible.
  const TokenSplit split = OpenShards(dir, {Iota(500, 60000), Iota(300, 60000)});
  const int64_t T = 32;
  std::vector<int32_t> x(10 * T), y(10 * T);
  ASSERT_OK(GatherWindows(split, T, 7, 0, 0, 10, x.data(), y.data()));
  for (int64_t r = 0; r < 10; ++r) {
    for (int64_t t = 0; t < T; ++t) EXPECT_EQ(y[r * T + t], x[r * T + t] + 1);
  }
}

TEST(TokenWindowsTest, ASliceIsTheSameRowsOfTheWholeBatch) {
  TempDir dir;
  const TokenSplit split = OpenShards(dir, {Iota(2000, 777), Iota(90, 777), Iota(1500, 777)});
  const int64_t T = 8;
  const int batch = 12;
  std::vector<int32_t> x(batch * T), y(batch * T);
  ASSERT_OK(GatherWindows(split, T, 99, 17, 0, batch, x.data(), y.data()));
  // Three ranks of four rows each.
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<int32_t> xs(4 * T), ys(4 * T);
    ASSERT_OK(GatherWindows(split, T, 99, 17, rank * 4, 4, xs.data(), ys.data()));
    EXPECT_TRUE(std::equal(xs.begin(), xs.end(), x.begin() + rank * 4 * T)) << rank;
    EXPECT_TRUE(std::equal(ys.begin(), ys.end(), y.begin() + rank * 4 * T)) << rank;
  }
}

TEST(TokenWindowsTest, WindowsNeverCrossAShardEnd) {
  TempDir dir;
  // Shards of 10, 40 and 17 tokens with T = 16: the first has no valid start.
  const TokenSplit split = OpenShards(dir, {Iota(10, 9), Iota(40, 9), Iota(17, 9)});
  absl::StatusOr<std::vector<WindowPosition>> pos = DrawWindowPositions(split, 16, 5, 0, 0, 5000);
  ASSERT_OK(pos);
  int in_last = 0;
  for (const WindowPosition& p : *pos) {
    ASSERT_NE(p.shard, 0);
    ASSERT_GE(p.start, 0);
    ASSERT_LE(p.start + 16 + 1, split.shards[static_cast<size_t>(p.shard)].size());
    in_last += p.shard == 2;
  }
  // Shard 2 has 1 valid start of 25 in all: about 200 of 5000.
  EXPECT_GT(in_last, 100);
  EXPECT_LT(in_last, 320);
}

TEST(TokenWindowsTest, StartsAreRoughlyUniform) {
  TempDir dir;
  // Two shards of 60 and 41 tokens, T = 10: 50 + 31 = 81 valid starts.
  const TokenSplit split = OpenShards(dir, {Iota(60, 5), Iota(41, 5)});
  const int draws = 81 * 200;
  absl::StatusOr<std::vector<WindowPosition>> pos =
      DrawWindowPositions(split, 10, 2024, 1, 0, draws);
  ASSERT_OK(pos);
  std::vector<int> counts(81, 0);
  for (const WindowPosition& p : *pos) ++counts[static_cast<size_t>(p.shard * 50 + p.start)];
  double chi2 = 0;
  for (int c : counts) chi2 += (c - 200.0) * (c - 200.0) / 200.0;
  // 80 degrees of freedom: mean 80, sd about 12.6; 160 is far out in the tail.
  EXPECT_LT(chi2, 160.0);
}

TEST(TokenWindowsTest, NoShardLongEnoughIsRefusedNamingBlockSizeAndLongestShard) {
  TempDir dir;
  const TokenSplit split = OpenShards(dir, {Iota(10, 9), Iota(12, 9)});
  std::vector<int32_t> x(12), y(12);
  absl::Status s = GatherWindows(split, 12, 1, 0, 0, 1, x.data(), y.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("13 tokens"), HasSubstr("holds 12")));
}

TEST(TokenWindowsTest, TokenOutsideTheVocabularyIsReported) {
  TempDir dir;
  const TokenSplit split = OpenShards(dir, {std::vector<uint16_t>(40, 70)});
  std::vector<int32_t> x(8), y(8);
  absl::Status s = GatherWindows(split, 8, 1, 0, 0, 1, x.data(), y.data(), 65);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("token 70"), HasSubstr("65")));
  EXPECT_OK(GatherWindows(split, 8, 1, 0, 0, 1, x.data(), y.data(), 71));
}

TEST(TextCorpusTest, EncodesSplitsAndOpensAsADataset) {
  TempDir dir;
  const std::string a = "hello wörld\n";
  const std::string b = "second file €\n";
  const std::vector<TextSource> sources = {{"a.txt", a}, {"b.txt", b}};
  absl::StatusOr<TextCorpusFacts> facts = EncodeTextCorpus(sources, 0.1, dir.path());
  ASSERT_OK(facts);
  const int64_t n = 12 + 14;  // characters
  EXPECT_EQ(facts->train_tokens, static_cast<int64_t>(n * 0.9));
  EXPECT_EQ(facts->val_tokens, n - facts->train_tokens);

  absl::StatusOr<TokenDataset> ds = OpenTokenDataset(dir.path());
  ASSERT_OK(ds);
  ASSERT_TRUE(ds->vocabulary.has_value());
  EXPECT_EQ(ds->vocab_size, facts->vocabulary.size());
  EXPECT_EQ(ds->train.tokens(), facts->train_tokens);
  EXPECT_EQ(ds->val.tokens(), facts->val_tokens);
  EXPECT_EQ(ds->max_token, ds->vocab_size - 1);  // '€' is the largest character
  std::vector<int32_t> ids;
  for (const TokenSplit* split : {&ds->train, &ds->val}) {
    for (uint16_t t : split->shards[0].tokens()) ids.push_back(t);
  }
  absl::StatusOr<std::string> text = ds->vocabulary->Decode(ids);
  ASSERT_OK(text);
  EXPECT_EQ(*text, a + b);
}

TEST(TextCorpusTest, BadCorporaAreRefusedNamingTheFile) {
  TempDir dir;
  const std::vector<TextSource> bad_utf8 = {{"good.txt", "fine"}, {"bad.txt", "x\xC3"}};
  EXPECT_THAT(EncodeTextCorpus(bad_utf8, 0.1, dir.path()).status().message(),
              AllOf(HasSubstr("bad.txt"), HasSubstr("byte offset 1")));
  const std::vector<TextSource> empty = {{"empty.txt", ""}};
  EXPECT_THAT(EncodeTextCorpus(empty, 0.1, dir.path()).status().message(),
              AllOf(HasSubstr("empty.txt"), HasSubstr("empty")));
  const std::vector<TextSource> one = {{"one.txt", "a"}};
  EXPECT_THAT(EncodeTextCorpus(one, 0.1, dir.path()).status().message(), HasSubstr("too few"));
  const std::vector<TextSource> ok = {{"ok.txt", "abcdefghij"}};
  EXPECT_THAT(EncodeTextCorpus(ok, 0.6, dir.path()).status().message(), HasSubstr("val_fraction"));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));  // nothing written by a refused corpus
}

TEST(TokenDatasetTest, FolderWithoutTrainShardsOrWithABadOneIsRefused) {
  TempDir dir;
  EXPECT_THAT(OpenTokenDataset(dir.path()).status().message(), HasSubstr("train_NNN.bin"));
  ASSERT_OK(WriteTokenShard(dir.file("train_000.bin"), Iota(50, 10)));
  WriteBytes(dir.file("train_001.bin"), ShardBytes({1}, 1, 7));
  EXPECT_THAT(OpenTokenDataset(dir.path()).status().message(),
              AllOf(HasSubstr("train_001.bin"), HasSubstr("wrong magic 7")));
}

TEST(TokenDatasetTest, TokenShardsWithoutVocabularyLeaveTheSizeToTheJob) {
  TempDir dir;
  ASSERT_OK(WriteTokenShard(dir.file("train_001.bin"), Iota(50, 10)));
  ASSERT_OK(WriteTokenShard(dir.file("train_000.bin"), Iota(30, 300)));
  ASSERT_OK(WriteTokenShard(dir.file("val_000.bin"), Iota(20, 5)));
  absl::StatusOr<TokenDataset> ds = OpenTokenDataset(dir.path());
  ASSERT_OK(ds);
  EXPECT_EQ(ds->vocab_size, 0);
  EXPECT_FALSE(ds->vocabulary.has_value());
  EXPECT_EQ(ds->max_token, 29);
  ASSERT_EQ(ds->train.shards.size(), 2u);
  EXPECT_EQ(ds->train.shards[0].size(), 30);  // in order of their numbers
  EXPECT_EQ(ds->train.tokens(), 80);
  EXPECT_EQ(ds->val.tokens(), 20);
  EXPECT_EQ(TokenShardNumber("train_012.bin", "train_"), 12);
  EXPECT_EQ(TokenShardNumber("train_12.bin", "train_"), -1);
  EXPECT_EQ(TokenShardNumber("val_000.bin", "train_"), -1);
}

TEST(TokenDatasetTest, FoldersOfShardsAreDetectedNamedAndNotLoadedAsSamples) {
  TempDir dir;
  ASSERT_OK(WriteTokenShard(dir.file("train_000.bin"), Iota(50, 10)));
  EXPECT_EQ(DetectDatasetFormat(dir.path()), DatasetFormat::kTokens);
  const std::vector<TextSource> text = {{"t.txt", "some text to encode"}};
  TempDir text_dir;
  ASSERT_OK(EncodeTextCorpus(text, 0.1, text_dir.path()));
  EXPECT_EQ(DetectDatasetFormat(text_dir.path()), DatasetFormat::kText);
  for (DatasetFormat f : {DatasetFormat::kText, DatasetFormat::kTokens}) {
    EXPECT_TRUE(IsTokenFormat(f));
    EXPECT_EQ(DatasetFormatFromName(DatasetFormatName(f)), f);
    absl::StatusOr<DatasetSplits> splits = LoadDatasetFolder(dir.path(), f);
    EXPECT_EQ(splits.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(splits.status().message(), HasSubstr("OpenTokenDataset"));
  }
  EXPECT_EQ(DatasetFormatName(DatasetFormat::kText), "text");
  EXPECT_EQ(DatasetFormatName(DatasetFormat::kTokens), "tokens");
  EXPECT_FALSE(IsTokenFormat(DatasetFormat::kIdx));
}

}  // namespace
}  // namespace kiln
