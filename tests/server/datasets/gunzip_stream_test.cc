// GunzipStream: the same bytes whatever the pieces, gzip's own reading of concatenated members,
// and DataLoss for anything that is not a whole gzip stream.
#include "server/datasets/gunzip_stream.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
using ::testing::HasSubstr;

// Feeds `gz` in pieces of `piece` bytes; the inflated bytes, or the first error.
absl::StatusOr<std::string> Inflate(const std::string& gz, size_t piece) {
  GunzipStream stream("f.gz");
  std::string out;
  for (size_t at = 0; at < gz.size(); at += piece) {
    absl::Status s = stream.Feed(absl::string_view(gz).substr(at, piece), [&](absl::string_view p) {
      EXPECT_LE(p.size(), size_t{64} << 10) << "pieces stay small";
      out.append(p.data(), p.size());
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  if (absl::Status s = stream.Finish(); !s.ok()) return s;
  return out;
}

TEST(GunzipStreamTest, InflatesTheSameBytesWhateverThePieces) {
  std::string text;
  for (int i = 0; i < 100000; ++i) text += std::to_string(i * 7919 % 1000);
  const std::string gz = testing::Gzip(text);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}, gz.size()}) {
    absl::StatusOr<std::string> out = Inflate(gz, piece);
    ASSERT_OK(out) << out.status();
    EXPECT_EQ(*out, text) << "pieces of " << piece;
  }
}

TEST(GunzipStreamTest, ConcatenatedMembersAreOneStreamAsGzipReadsThem) {
  absl::StatusOr<std::string> out = Inflate(testing::Gzip("abc") + testing::Gzip("def"), 3);
  ASSERT_OK(out) << out.status();
  EXPECT_EQ(*out, "abcdef");
}

TEST(GunzipStreamTest, ATruncatedCorruptOrTrailedStreamIsDataLoss) {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += std::to_string(i * 7919 % 1000);
  const std::string gz = testing::Gzip(text);
  absl::StatusOr<std::string> cut = Inflate(gz.substr(0, gz.size() / 2), 100);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("f.gz: truncated gzip stream"));

  std::string corrupt = gz;
  corrupt[gz.size() / 2] ^= 0x55;
  EXPECT_EQ(Inflate(corrupt, 100).status().code(), absl::StatusCode::kDataLoss);

  absl::StatusOr<std::string> trailed = Inflate(gz + "junk", 100);
  EXPECT_EQ(trailed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(trailed.status().message()), HasSubstr("f.gz: corrupt gzip stream"));

  EXPECT_EQ(Inflate("", 1).status().code(), absl::StatusCode::kDataLoss);
}

TEST(GunzipStreamTest, ASinkErrorStopsTheInflatingAtOnce) {
  const std::string gz = testing::GzippedZeroIdx({16u << 20});  // 16 MB of zeros
  GunzipStream stream("bomb.gz");
  int64_t seen = 0;
  absl::Status s = stream.Feed(gz, [&](absl::string_view p) {
    seen += static_cast<int64_t>(p.size());
    return seen > (1 << 20) ? absl::ResourceExhaustedError("over") : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LT(seen, 2 << 20) << "inflating went on past the sink's error";
}

}  // namespace
}  // namespace kiln::server
