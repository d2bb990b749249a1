// IdxStreamFacts: an IDX file checked in pieces, with ParseIdxHeader's errors and the reader's
// truncated and trailing-bytes errors, keeping the dims and the largest element.
#include "server/datasets/idx_stream_facts.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
using ::testing::HasSubstr;

absl::Status Check(IdxStreamFacts& facts, const std::string& bytes, size_t piece) {
  for (size_t at = 0; at < bytes.size(); at += piece) {
    if (absl::Status s = facts.Consume(absl::string_view(bytes).substr(at, piece)); !s.ok()) {
      return s;
    }
  }
  return facts.Finish();
}

TEST(IdxStreamFactsTest, KeepsTheDimsAndTheLargestElementWhateverThePieces) {
  const std::string labels = testing::ToyLabelsIdx(300, 3);
  for (size_t piece : {size_t{1}, size_t{3}, labels.size()}) {
    IdxStreamFacts facts("labels", "file");
    ASSERT_OK(Check(facts, labels, piece));
    EXPECT_EQ(facts.dims(), (std::vector<int64_t>{300}));
    EXPECT_EQ(facts.max_element(), 9);
  }
  IdxStreamFacts images("images", "file");
  ASSERT_OK(Check(images, testing::ToyImagesIdx(5, 1), 1000));
  EXPECT_EQ(images.dims(), (std::vector<int64_t>{5, 28, 28}));
}

TEST(IdxStreamFactsTest, ABadHeaderShortDataOrTrailingBytesAreRefusedNamingTheFile) {
  const std::string labels = testing::ToyLabelsIdx(10, 3);
  IdxStreamFacts bad_magic("f", "file");
  EXPECT_THAT(std::string(Check(bad_magic, "PK\x03\x04 a zip file", 2).message()),
              HasSubstr("f: bad magic"));
  IdxStreamFacts short_data("f", "decompressed file");
  absl::Status cut = Check(short_data, labels.substr(0, labels.size() - 1), 4);
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(cut.message()), HasSubstr("f: truncated: header says 10 = 10 bytes"));
  IdxStreamFacts trailing("f", "decompressed file");
  absl::Status more = Check(trailing, labels + "x", 4);
  EXPECT_EQ(more.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(more.message()), HasSubstr("f: trailing bytes"));
  IdxStreamFacts empty("f", "file");
  EXPECT_EQ(Check(empty, "", 1).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace kiln::server
