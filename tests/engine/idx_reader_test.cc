#include "engine/data/idx_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// IDX bytes: magic 00 00 type rank, big-endian uint32 dims, then the payload as given.
std::string MakeIdx(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& payload,
                    uint8_t type = 0x08) {
  std::string s = {'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((d >> shift) & 0xff);
  }
  s.append(payload.begin(), payload.end());
  return s;
}

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

class IdxReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("kiln_idx_reader_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::string WriteRaw(const std::string& name, const std::string& bytes) const {
    std::string path = Path(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::string WriteGzip(const std::string& name, const std::string& bytes) const {
    std::string path = Path(name);
    gzFile gz = gzopen(path.c_str(), "wb");
    EXPECT_NE(gz, nullptr);
    EXPECT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    EXPECT_EQ(gzclose(gz), Z_OK);
    return path;
  }

  static std::string ReadBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
};

TEST_F(IdxReaderTest, ReadsRawFile) {
  std::string path = WriteRaw("a-idx2-ubyte", MakeIdx({2, 3}, {1, 2, 3, 4, 5, 6}));
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  ASSERT_OK(got) << got.status();
  EXPECT_THAT(got->dims, ElementsAre(2, 3));
  EXPECT_THAT(got->data, ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST_F(IdxReaderTest, ReadsGzipFileDetectedByMagicNotName) {
  for (const char* name : {"b-idx2-ubyte.gz", "b-idx2-ubyte-no-suffix"}) {
    std::string path = WriteGzip(name, MakeIdx({3, 2}, {9, 8, 7, 6, 5, 4}));
    absl::StatusOr<IdxArray> got = ReadIdxFile(path);
    ASSERT_OK(got) << got.status();
    EXPECT_THAT(got->dims, ElementsAre(3, 2));
    EXPECT_THAT(got->data, ElementsAre(9, 8, 7, 6, 5, 4));
  }
}

TEST_F(IdxReaderTest, RawFileNamedGzIsReadAsRaw) {
  std::string path = WriteRaw("c.gz", MakeIdx({2}, {42, 43}));
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  ASSERT_OK(got) << got.status();
  EXPECT_THAT(got->data, ElementsAre(42, 43));
}

TEST_F(IdxReaderTest, ReadsRank1AndRank4) {
  absl::StatusOr<IdxArray> r1 = ReadIdxFile(WriteRaw("r1", MakeIdx({4}, {0, 1, 2, 255})));
  ASSERT_OK(r1) << r1.status();
  EXPECT_THAT(r1->dims, ElementsAre(4));
  EXPECT_THAT(r1->data, ElementsAre(0, 1, 2, 255));

  absl::StatusOr<IdxArray> r4 = ReadIdxFile(WriteRaw("r4", MakeIdx({2, 1, 3, 2}, Iota(12))));
  ASSERT_OK(r4) << r4.status();
  EXPECT_THAT(r4->dims, ElementsAre(2, 1, 3, 2));
  EXPECT_EQ(r4->data, Iota(12));
}

// More than one read chunk (1 MiB), so the growing buffer is exercised, raw and gzipped.
TEST_F(IdxReaderTest, ReadsMultiMegabyteFileRawAndGzip) {
  const std::vector<uint8_t> payload = Iota(3 * 1024 * 1024 + 17);
  const std::string bytes = MakeIdx({3 * 1024 * 1024 + 17}, payload);
  for (const std::string& path : {WriteRaw("big", bytes), WriteGzip("big.gz", bytes)}) {
    absl::StatusOr<IdxArray> got = ReadIdxFile(path);
    ASSERT_OK(got) << got.status();
    EXPECT_THAT(got->dims, ElementsAre(3 * 1024 * 1024 + 17));
    EXPECT_TRUE(got->data == payload) << path;
  }
}

TEST_F(IdxReaderTest, MissingFileIsNotFound) {
  std::string path = Path("does-not-exist-idx1-ubyte");
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("no such file")));
}

TEST_F(IdxReaderTest, DirectoryIsRejected) {
  absl::StatusOr<IdxArray> got = ReadIdxFile(dir_.string());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(dir_.string()), HasSubstr("directory")));
}

TEST_F(IdxReaderTest, BadMagicIsRejected) {
  std::string bytes = MakeIdx({2}, {1, 2});
  bytes[0] = 'P';
  bytes[1] = 'K';
  std::string path = WriteRaw("bad-magic", bytes);
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("bad magic")));
}

TEST_F(IdxReaderTest, WrongTypeByteIsRejected) {
  for (uint8_t type : {0x0D, 0x09, 0x01}) {
    std::string path = WriteRaw("wrong-type", MakeIdx({1}, {0, 0, 0, 0}, type));
    absl::StatusOr<IdxArray> got = ReadIdxFile(path);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(),
                AllOf(HasSubstr(path), HasSubstr("unsupported element type")));
  }
}

TEST_F(IdxReaderTest, RankZeroAndFiveAreRejected) {
  std::string rank0 = WriteRaw("rank0", MakeIdx({}, {1}));
  std::string rank5 = WriteRaw("rank5", MakeIdx({1, 1, 1, 1, 1}, {1}));
  for (const std::string& path : {rank0, rank5}) {
    absl::StatusOr<IdxArray> got = ReadIdxFile(path);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("rank")));
  }
}

TEST_F(IdxReaderTest, ZeroDimensionIsRejected) {
  std::string path = WriteRaw("zero-dim", MakeIdx({3, 0, 2}, {}));
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(),
              AllOf(HasSubstr(path), HasSubstr("zero dimension"), HasSubstr("3x0x2")));
}

TEST_F(IdxReaderTest, MoreThanTwoToThe31ElementsIsRejected) {
  // 2^16 * 2^15 + ... : 65536 x 32769 is just over 2^31.
  std::string path = WriteRaw("huge", MakeIdx({65536, 32769}, {}));
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("too large")));

  // Products that overflow int64 are caught too.
  path = WriteRaw("overflow", MakeIdx({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {}));
  got = ReadIdxFile(path);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("too large")));
}

TEST_F(IdxReaderTest, ExactlyTwoToThe31IsAcceptedByTheHeaderCheck) {
  // The size check passes; the missing data is then reported without allocating 2 GiB.
  std::string path = WriteRaw("limit", MakeIdx({65536, 32768}, {1, 2, 3}));
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("truncated")));
}

TEST_F(IdxReaderTest, TruncatedHeaderIsRejected) {
  const std::string full = MakeIdx({60000, 28, 28}, {});
  for (size_t len : {size_t{0}, size_t{2}, size_t{4}, size_t{10}, size_t{15}}) {
    std::string path = WriteRaw(absl::StrCat("short-header-", len), full.substr(0, len));
    absl::StatusOr<IdxArray> got = ReadIdxFile(path);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << len;
    EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("truncated header")));
  }
}

TEST_F(IdxReaderTest, TruncatedDataIsRejected) {
  std::string path = WriteRaw("train-images-idx3-ubyte", MakeIdx({60000, 28, 28}, Iota(1000)));
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(got.status().message(),
            absl::StrCat(path,
                         ": truncated: header says 60000x28x28 = 47040000 bytes of data but file "
                         "has 1000 after the 16-byte header"));
}

TEST_F(IdxReaderTest, TruncatedDataInGzipIsRejected) {
  std::string path = WriteGzip("short.gz", MakeIdx({10, 10}, Iota(99)));
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated"), HasSubstr("has 99")));
}

TEST_F(IdxReaderTest, TrailingBytesAreRejected) {
  std::vector<uint8_t> payload = Iota(6 + 5);
  std::string raw = WriteRaw("trailing", MakeIdx({2, 3}, payload));
  std::string gz = WriteGzip("trailing.gz", MakeIdx({2, 3}, payload));
  for (const std::string& path : {raw, gz}) {
    absl::StatusOr<IdxArray> got = ReadIdxFile(path);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("trailing bytes"),
                                              HasSubstr("2x3 = 6 bytes"), HasSubstr("has 11")));
  }
}

TEST_F(IdxReaderTest, CorruptGzipStreamIsRejected) {
  std::string path = WriteGzip("corrupt.gz", MakeIdx({64, 64}, Iota(size_t{64} * 64)));
  std::string bytes = ReadBytes(path);
  ASSERT_GT(bytes.size(), 40u);
  // Clobber the deflate data just past the 10-byte gzip header.
  for (size_t i = 12; i < 30; ++i) bytes[i] = static_cast<char>(0xff);
  WriteRaw("corrupt.gz", bytes);
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("gzip")));
}

TEST_F(IdxReaderTest, GzipChecksumMismatchIsRejected) {
  std::string path = WriteGzip("crc.gz", MakeIdx({8}, Iota(8)));
  std::string bytes = ReadBytes(path);
  bytes[bytes.size() - 8] ^= 0x55;  // the CRC-32 in the 8-byte trailer
  WriteRaw("crc.gz", bytes);
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("corrupt gzip")));
}

TEST_F(IdxReaderTest, CutOffGzipStreamIsRejected) {
  std::string path = WriteGzip("cut.gz", MakeIdx({256, 256}, Iota(size_t{256} * 256)));
  std::string bytes = ReadBytes(path);
  WriteRaw("cut.gz", bytes.substr(0, bytes.size() / 2));
  absl::StatusOr<IdxArray> got = ReadIdxFile(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(path), HasSubstr("truncated")));
}

TEST(ParseIdxTest, ParsesAndChecksBytesInMemory) {
  absl::StatusOr<IdxArray> got = ParseIdx(MakeIdx({2, 2}, {1, 2, 3, 4}), "upload");
  ASSERT_OK(got) << got.status();
  EXPECT_THAT(got->dims, ElementsAre(2, 2));
  EXPECT_THAT(got->data, ElementsAre(1, 2, 3, 4));

  got = ParseIdx(MakeIdx({2, 2}, {1, 2, 3}), "upload");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr("upload"), HasSubstr("truncated")));
}

}  // namespace
}  // namespace kiln
