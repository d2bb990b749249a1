// The pieces every part of kiln shares (common/): the atomic file writer, SHA-256 and the IDX
// header parser.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/idx_header.h"
#include "common/sha256.h"
#include "common/shown_paths.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = fs::temp_directory_path() / "kiln_common_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> List() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    return names;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string dir_;
};

TEST_F(AtomicFileTest, WritesAndReplacesLeavingNoTempFile) {
  const std::string path = dir_ + "/file";
  ASSERT_OK(WriteFileAtomically(path, "first"));
  ASSERT_OK(WriteFileAtomically(path, "second, longer"));
  EXPECT_EQ(Read(path), "second, longer");
  EXPECT_EQ(List(), std::vector<std::string>{"file"});
}

TEST_F(AtomicFileTest, StreamedPiecesAppearOnlyAtCommit) {
  const std::string path = dir_ + "/file";
  ASSERT_OK(WriteFileAtomically(path, "old"));
  auto writer = AtomicFileWriter::Open(path);
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->Append("new "));
  ASSERT_OK((*writer)->Append("content"));
  EXPECT_EQ(Read(path), "old");
  EXPECT_TRUE(fs::exists((*writer)->temp_path()));
  ASSERT_OK((*writer)->Commit());
  EXPECT_EQ(Read(path), "new content");
  EXPECT_EQ(List(), std::vector<std::string>{"file"});
}

TEST_F(AtomicFileTest, AWriterDroppedBeforeCommitLeavesTheOldFileAndNoTemp) {
  const std::string path = dir_ + "/file";
  ASSERT_OK(WriteFileAtomically(path, "old"));
  {
    auto writer = AtomicFileWriter::Open(path);
    ASSERT_OK(writer);
    ASSERT_OK((*writer)->Append("half"));
  }
  EXPECT_EQ(Read(path), "old");
  EXPECT_EQ(List(), std::vector<std::string>{"file"});
}

TEST_F(AtomicFileTest, AMissingDirectoryIsNotFoundNamingThePathAndStep) {
  const std::string path = dir_ + "/missing/file";
  absl::Status status = WriteFileAtomically(path, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find(path), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find(": open "), absl::string_view::npos) << status;
}

TEST_F(AtomicFileTest, TheModeIsTheOneAskedFor) {
  const std::string path = dir_ + "/secret";
  ASSERT_OK(WriteFileAtomically(path, "key", 0600));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(AtomicFileTest, TempFileNamesCarryTheWritersPid) {
  auto writer = AtomicFileWriter::Open(dir_ + "/file");
  ASSERT_OK(writer);
  EXPECT_EQ(AtomicFileTempWriterPid((*writer)->temp_path()), ::getpid());
  EXPECT_EQ(AtomicFileTempWriterPid("file"), -1);
  EXPECT_EQ(AtomicFileTempWriterPid("file.tmp.12.ab"), -1);
  EXPECT_EQ(AtomicFileTempWriterPid("file.tmp..00ff00ff00ff00ff"), -1);
  EXPECT_EQ(AtomicFileTempWriterPid("file.tmp.-3.00ff00ff00ff00ff"), -1);
}

TEST(Sha256, MatchesTheStandardsTestVectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 pieces;
  pieces.Update("a");
  pieces.Update("bc");
  EXPECT_EQ(pieces.HexDigest(), Sha256Hex("abc"));
  const std::array<uint8_t, 32> digest = Sha256Digest("abc");
  EXPECT_EQ(digest[0], 0xba);
  EXPECT_EQ(digest[31], 0xad);
}

TEST_F(AtomicFileTest, Sha256OfFileHashesTheContentsAndNamesAMissingFile) {
  const std::string path = dir_ + "/blob";
  const std::string big(3 << 20, 'x');  // more than one read
  ASSERT_OK(WriteFileAtomically(path, big));
  auto sha = Sha256OfFile(path);
  ASSERT_OK(sha);
  EXPECT_EQ(*sha, Sha256Hex(big));
  auto missing = Sha256OfFile(dir_ + "/none");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir_ + "/none"), absl::string_view::npos);
}

std::string Header(uint8_t type, std::vector<uint32_t> dims, int rank = -1) {
  std::string h = {0, 0, static_cast<char>(type),
                   static_cast<char>(rank < 0 ? static_cast<int>(dims.size()) : rank)};
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) h.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  return h;
}

absl::Status HeaderError(const std::string& bytes) {
  return ParseIdxHeader(bytes, "f", "file").status();
}

TEST(IdxHeader, ParsesDimsAndTheDataOffsetIgnoringWhatFollows) {
  auto h = ParseIdxHeader(Header(0x08, {60000, 28, 28}) + "data", "f", "file");
  ASSERT_OK(h);
  EXPECT_EQ(h->dims, (std::vector<int64_t>{60000, 28, 28}));
  EXPECT_EQ(h->elements, 60000 * 28 * 28);
  EXPECT_EQ(h->size_bytes, 16u);
  EXPECT_EQ(IdxHeaderBytes(Header(0x08, {60000, 28, 28})), 16u);
  EXPECT_EQ(IdxHeaderBytes(Header(0x0D, {1})), 0u);
}

TEST(IdxHeader, EveryMalformedHeaderIsRefusedWithItsReason) {
  auto has = [](const absl::Status& s, const std::string& text) {
    return s.message().find(text) != absl::string_view::npos;
  };
  EXPECT_TRUE(has(HeaderError(""), "truncated header: file is empty"));
  EXPECT_TRUE(has(HeaderError(std::string("\0\0", 2)), "has only 2 bytes"));
  EXPECT_TRUE(has(HeaderError("PK\3\4"), "bad magic"));
  EXPECT_TRUE(has(HeaderError(Header(0x0D, {3})), "unsupported element type 0x0d (float32)"));
  EXPECT_TRUE(has(HeaderError(Header(0x08, {1, 1, 1, 1, 1})), "unsupported rank 5"));
  EXPECT_TRUE(has(HeaderError(Header(0x08, {10, 28, 28}).substr(0, 12)),
                  "rank 3 needs a 16-byte header but file has only 12 bytes"));
  EXPECT_TRUE(has(HeaderError(Header(0x08, {10, 0, 28})), "dimension 1 of 10x0x28 is 0"));
  EXPECT_TRUE(has(HeaderError(Header(0x08, {65536, 65536})), "exceed the limit"));
  EXPECT_EQ(HeaderError(Header(0x08, {10, 0})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HeaderError("").code(), absl::StatusCode::kDataLoss);
}

TEST(ShownPathsTest, PathsUnderTheRootsAreShownByTheirNamesAndNothingElseChanges) {
  SetShownPathRoots({{"/srv/kiln/state/", "$state_dir"},
                     {"/srv/kiln/data", "$data_dir"},
                     {"/srv/kiln/data/mnist", "$mnist"},
                     {"/", "$root"}});
  EXPECT_EQ(WithShownPaths("writing /srv/kiln/state/checkpoints/job-1/final.safetensors: full"),
            "writing $state_dir/checkpoints/job-1/final.safetensors: full");
  EXPECT_EQ(WithShownPaths("open /srv/kiln/data/fashion/x and /srv/kiln/data"),
            "open $data_dir/fashion/x and $data_dir");
  // The longer root wins; a sibling whose name merely starts like a root is left alone.
  EXPECT_EQ(WithShownPaths("/srv/kiln/data/mnist/t10k"), "$mnist/t10k");
  EXPECT_EQ(WithShownPaths("/srv/kiln/data2/x"), "/srv/kiln/data2/x");
  EXPECT_EQ(WithShownPaths("no path here"), "no path here");
  SetShownPathRoots({});
  EXPECT_EQ(WithShownPaths("/srv/kiln/state/x"), "/srv/kiln/state/x");
}

}  // namespace
}  // namespace kiln
