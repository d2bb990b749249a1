#include "engine/model/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "kiln_safetensors_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Names in `dir` other than . and ..
  static std::vector<std::string> ListDir(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file from a literal header (padded here) and data section, for hand-made corruptions.
std::string MakeFile(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

HostTensor MakeTensor(std::string name, SafetensorDType dtype, Shape shape,
                      std::vector<uint8_t> bytes) {
  return HostTensor{std::move(name), dtype, std::move(shape), std::move(bytes)};
}

template <typename T>
HostTensor TensorOf(std::string name, SafetensorDType dtype, Shape shape,
                    const std::vector<T>& values) {
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  return MakeTensor(std::move(name), dtype, std::move(shape),
                    std::vector<uint8_t>(p, p + values.size() * sizeof(T)));
}

void ExpectSameTensors(const std::vector<HostTensor>& expected,
                       const std::vector<HostTensor>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(expected[i].name, actual[i].name);
    EXPECT_EQ(expected[i].dtype, actual[i].dtype);
    EXPECT_EQ(expected[i].shape, actual[i].shape);
    EXPECT_EQ(expected[i].bytes, actual[i].bytes);
  }
}

std::vector<HostTensor> SampleTensors() {
  const std::vector<float> w = {1.5f, -2.25f, 0.0f, 3.0e-8f, -1.0e30f, 7.0f};
  const float scalar = 42.5f;
  return {
      HostTensorFromF32("0.weight", w.data(), {2, 3}),
      HostTensorFromF32("0.bias", w.data(), {6}),
      HostTensorFromF32("scalar", &scalar, {}),
      HostTensorFromF32("empty", nullptr, {0}),
      HostTensorFromF32("empty.3d", nullptr, {3, 0, 2}),
      HostTensorFromI64("optimizer.step", {12345, -1}),
      HostTensorFromU64("rng.state", {0xFFFFFFFFFFFFFFFFull, 0x0123456789ABCDEFull, 0}),
      TensorOf<uint8_t>("mask", SafetensorDType::kU8, {2, 2}, {0, 1, 128, 255}),
      TensorOf<int32_t>("labels", SafetensorDType::kI32, {3}, {-5, 0, 2147483647}),
  };
}

const std::map<std::string, std::string> kSampleMetadata = {
    {"format", "pt"}, {"kiln.epoch", "3"}, {"quote\"and\\slash", "line\nbreak \xc3\xa9"}};

TEST_F(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  const std::string path = Path("model.safetensors");
  const std::vector<HostTensor> tensors = SampleTensors();
  ASSERT_OK(WriteSafetensors(path, tensors, kSampleMetadata));
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_OK(read) << read.status();
  ExpectSameTensors(tensors, read->tensors);
  EXPECT_EQ(read->metadata, kSampleMetadata);

  const HostTensor* step = read->Find("optimizer.step");
  ASSERT_NE(step, nullptr);
  absl::StatusOr<std::vector<int64_t>> steps = ToI64Values(*step);
  ASSERT_OK(steps);
  EXPECT_EQ(*steps, (std::vector<int64_t>{12345, -1}));
  absl::StatusOr<std::vector<uint64_t>> rng = ToU64Values(*read->Find("rng.state"));
  ASSERT_OK(rng);
  EXPECT_EQ(*rng, (std::vector<uint64_t>{0xFFFFFFFFFFFFFFFFull, 0x0123456789ABCDEFull, 0}));
  float w[6];
  ASSERT_OK(CopyF32(*read->Find("0.weight"), {2, 3}, w));
  EXPECT_EQ(w[1], -2.25f);
  EXPECT_EQ(w[4], -1.0e30f);
  EXPECT_EQ(read->Find("missing"), nullptr);
}

TEST_F(SafetensorsTest, RoundTripsNoTensorsAndNoMetadata) {
  const std::string path = Path("empty.safetensors");
  ASSERT_OK(WriteSafetensors(path, {}, {}));
  EXPECT_EQ(ReadBytes(path), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_OK(read) << read.status();
  EXPECT_TRUE(read->tensors.empty());
  EXPECT_TRUE(read->metadata.empty());
}

TEST_F(SafetensorsTest, WritesTheStandardLayoutByteForByte) {
  const std::string path = Path("tiny.safetensors");
  const std::vector<float> values = {1.0f, -2.0f};
  ASSERT_OK(WriteSafetensors(path, {HostTensorFromF32("a", values.data(), {2})}, {{"k", "v"}}));
  // 79 bytes of JSON and one space of padding make 80 (0x50); 1.0f is 0x3F800000, -2.0f 0xC0000000.
  const std::string expected =
      std::string("\x50\0\0\0\0\0\0\0", 8) +
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )" +
      std::string("\0\0\x80\x3f\0\0\0\xc0", 8);
  EXPECT_EQ(ReadBytes(path), expected);
}

TEST_F(SafetensorsTest, OutputIsDeterministicAndHeaderIsPaddedToEightBytes) {
  const std::vector<HostTensor> tensors = SampleTensors();
  ASSERT_OK(WriteSafetensors(Path("a"), tensors, kSampleMetadata));
  ASSERT_OK(WriteSafetensors(Path("b"), tensors, kSampleMetadata));
  const std::string a = ReadBytes(Path("a"));
  EXPECT_EQ(a, ReadBytes(Path("b")));
  for (size_t name_length = 1; name_length <= 9; ++name_length) {
    const float x = 1.0f;
    ASSERT_OK(WriteSafetensors(Path("c"),
                               {HostTensorFromF32(std::string(name_length, 'n'), &x, {})}, {}));
    const std::string c = ReadBytes(Path("c"));
    uint64_t n = 0;
    std::memcpy(&n, c.data(), 8);
    EXPECT_EQ(n % 8, 0u) << name_length;
    EXPECT_EQ(c.size(), 8 + n + 4);
  }
}

TEST_F(SafetensorsTest, ReadsTensorsInDataOrderWhateverTheHeaderOrder) {
  // Written the way another writer might: keys not in data order, metadata last.
  const std::string bytes =
      MakeFile(R"({"z":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
               R"("e":{"dtype":"F32","shape":[0],"data_offsets":[5,5]},)"
               R"("a":{"dtype":"F32","shape":[],"data_offsets":[1,5]},"__metadata__":{"m":"1"}})",
               std::string("\x07\0\0\x80\x3f", 5));
  absl::StatusOr<SafetensorsContents> read = ParseSafetensors(bytes, "mem");
  ASSERT_OK(read) << read.status();
  ASSERT_EQ(read->tensors.size(), 3u);
  EXPECT_EQ(read->tensors[0].name, "z");
  EXPECT_EQ(read->tensors[1].name, "a");
  EXPECT_EQ(read->tensors[2].name, "e");
  float a = 0;
  ASSERT_OK(CopyF32(read->tensors[1], {}, &a));
  EXPECT_EQ(a, 1.0f);
  EXPECT_EQ(read->metadata.at("m"), "1");
}

// Each corruption of a file on disk is refused with `code` and a message naming the file.
struct Corruption {
  const char* label;
  std::string bytes;
  absl::StatusCode code;
  const char* message_part;
};

const std::string kData8 = std::string(8, '\x11');
const std::string kGoodEntry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

std::vector<Corruption> Corruptions() {
  using C = absl::StatusCode;
  const std::string good = MakeFile("{" + kGoodEntry + "}", kData8);
  auto with_entry = [](const std::string& entry, const std::string& data = kData8) {
    return MakeFile(R"({"a":)" + entry + "}", data);
  };
  std::string long_length = good;
  long_length[8 - 1] = '\x01';  // Header length now about 2^56.
  const std::string bad_utf8 =
      MakeFile("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", kData8);
  return {
      {"empty file", "", C::kDataLoss, "shorter than the 8-byte header length"},
      {"five bytes", good.substr(0, 5), C::kDataLoss, "shorter than the 8-byte"},
      {"truncated in header", good.substr(0, 20), C::kDataLoss, "exceeds the 12 bytes"},
      {"header length huge", long_length, C::kDataLoss, "file truncated?"},
      {"truncated in data", good.substr(0, good.size() - 3), C::kDataLoss, "run past the data"},
      {"trailing data", good + "xyz", C::kDataLoss, "trailing bytes"},
      {"zero header", MakeFile("", ""), C::kInvalidArgument, "does not start with '{'"},
      {"array header", MakeFile("[1,2]", ""), C::kInvalidArgument, "does not start with '{'"},
      {"broken JSON", MakeFile(R"({"a":{"dtype":"F32",)", kData8), C::kInvalidArgument,
       "not valid JSON"},
      {"JSON with trailing garbage", MakeFile("{} x", ""), C::kInvalidArgument, "not valid JSON"},
      {"invalid UTF-8 name", bad_utf8, C::kInvalidArgument, "not valid JSON"},
      {"entry not an object", with_entry("[1]"), C::kInvalidArgument, "not a JSON object"},
      {"missing dtype", with_entry(R"({"shape":[2],"data_offsets":[0,8]})"), C::kInvalidArgument,
       "missing \"dtype\""},
      {"missing shape", with_entry(R"({"dtype":"F32","data_offsets":[0,8]})"), C::kInvalidArgument,
       "missing \"shape\""},
      {"missing data_offsets", with_entry(R"({"dtype":"F32","shape":[2]})"), C::kInvalidArgument,
       "missing \"data_offsets\""},
      {"dtype not a string", with_entry(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"),
       C::kInvalidArgument, "\"dtype\" is not a string"},
      {"unknown dtype", with_entry(R"({"dtype":"F16","shape":[4],"data_offsets":[0,8]})"),
       C::kInvalidArgument, "unsupported dtype \"F16\""},
      {"shape not an array", with_entry(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"),
       C::kInvalidArgument, "\"shape\" is not an array"},
      {"fractional dim", with_entry(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"),
       C::kInvalidArgument, "not an integer"},
      {"string dim", with_entry(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})"),
       C::kInvalidArgument, "not an integer"},
      {"negative dim", with_entry(R"({"dtype":"F32","shape":[-2,-1],"data_offsets":[0,8]})"),
       C::kInvalidArgument, "negative dim -2"},
      {"overflowing shape",
       with_entry(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
       C::kInvalidArgument, "overflows"},
      {"one offset", with_entry(R"({"dtype":"F32","shape":[2],"data_offsets":[8]})"),
       C::kInvalidArgument, "two non-negative integers"},
      {"negative offset", with_entry(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"),
       C::kInvalidArgument, "two non-negative integers"},
      {"offsets not an array", with_entry(R"({"dtype":"F32","shape":[2],"data_offsets":"0,8"})"),
       C::kInvalidArgument, "two non-negative integers"},
      {"end before begin", with_entry(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"),
       C::kInvalidArgument, "end before they begin"},
      {"size mismatch", with_entry(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
       C::kInvalidArgument, "needs 12 bytes but \"data_offsets\" [0,8] hold 8"},
      {"offsets out of range", with_entry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
       C::kDataLoss, "run past the data section of 8 bytes"},
      {"unknown field",
       with_entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"stride":[1]})"),
       C::kInvalidArgument, "unknown field \"stride\""},
      {"overlap",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                std::string(12, '\0')),
       C::kInvalidArgument, "tensor \"b\" at data_offsets [4,12] overlaps tensor \"a\""},
      {"zero-size tensor inside another",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                kData8),
       C::kInvalidArgument, "overlaps"},
      {"gap",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                std::string(20, '\0')),
       C::kInvalidArgument, "leaves a gap after tensor \"a\""},
      {"gap at start", with_entry(R"({"dtype":"U8","shape":[4],"data_offsets":[4,8]})"),
       C::kInvalidArgument, "leaves a gap after the start of the data section"},
      // The writer refuses an empty name, so the reader does too (found by the fuzzer: an
      // accepted file that could not be written back).
      {"empty name", MakeFile(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", kData8),
       C::kInvalidArgument, "a tensor has an empty name"},
      {"duplicate names", MakeFile("{" + kGoodEntry + "," + kGoodEntry + "}", kData8),
       C::kInvalidArgument, "duplicate key \"a\""},
      {"duplicate metadata keys", MakeFile(R"({"__metadata__":{"k":"1","k":"2"}})", ""),
       C::kInvalidArgument, "duplicate key \"k\""},
      {"metadata value not a string", MakeFile(R"({"__metadata__":{"k":1}})", ""),
       C::kInvalidArgument, "value for \"k\" is not a string"},
      {"metadata not an object", MakeFile(R"({"__metadata__":"k"})", ""), C::kInvalidArgument,
       "\"__metadata__\" is not a JSON object"},
  };
}

TEST_F(SafetensorsTest, RejectsEachCorruptionNamingTheFile) {
  for (const Corruption& c : Corruptions()) {
    SCOPED_TRACE(c.label);
    const std::string path = Path("bad.safetensors");
    WriteBytes(path, c.bytes);
    absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), c.code) << read.status();
    EXPECT_NE(read.status().message().find(path), absl::string_view::npos) << read.status();
    EXPECT_NE(read.status().message().find(c.message_part), absl::string_view::npos)
        << read.status();
  }
}

TEST_F(SafetensorsTest, CorruptionsOfAWrittenFileAreRejected) {
  const std::string path = Path("model.safetensors");
  ASSERT_OK(WriteSafetensors(path, SampleTensors(), kSampleMetadata));
  const std::string good = ReadBytes(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, good.data(), 8);

  // Every truncation fails.
  for (size_t length : {size_t{0}, size_t{7}, size_t{8}, size_t{9}, size_t{8 + header_size - 1},
                        size_t{8 + header_size}, good.size() - 1}) {
    WriteBytes(path, good.substr(0, length));
    absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
    ASSERT_FALSE(read.ok()) << length;
    EXPECT_NE(read.status().message().find(path), absl::string_view::npos) << read.status();
  }

  // Any single flipped byte in the length or header makes it non-ASCII or changes the length, so
  // every one must be refused, and none may crash.
  for (size_t i = 0; i < 8 + header_size; ++i) {
    std::string bytes = good;
    bytes[i] = static_cast<char>(bytes[i] ^ 0xFF);
    absl::StatusOr<SafetensorsContents> read = ParseSafetensors(bytes, "flipped.safetensors");
    ASSERT_FALSE(read.ok()) << "byte " << i;
    EXPECT_NE(read.status().message().find("flipped.safetensors"), absl::string_view::npos);
  }

  // Flipping single bits anywhere must never crash; data-section flips read back fine.
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bytes = good;
      bytes[i] = static_cast<char>(bytes[i] ^ (1 << bit));
      absl::StatusOr<SafetensorsContents> read = ParseSafetensors(bytes, "bits");
      if (i >= 8 + header_size) {
        EXPECT_OK(read) << read.status();
      }
    }
  }
}

TEST_F(SafetensorsTest, RejectsHeaderOverTheSizeLimit) {
  const uint64_t n = kMaxSafetensorsHeaderBytes + 8;
  std::string bytes(8 + n, ' ');
  std::memcpy(bytes.data(), &n, 8);
  bytes[8] = '{';
  absl::StatusOr<SafetensorsContents> read = ParseSafetensors(bytes, "upload.safetensors");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("upload.safetensors: header length 100000008 is over"),
            absl::string_view::npos)
      << read.status();
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const std::string path = Path("nope.safetensors");
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find(path), absl::string_view::npos);
}

TEST_F(SafetensorsTest, DirectoryIsNotAFile) {
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(dir_);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(read.status().message().find(dir_), absl::string_view::npos);
}

TEST_F(SafetensorsTest, WriteRejectsBadTensorsAndWritesNothing) {
  const float x[2] = {1, 2};
  const std::vector<std::vector<HostTensor>> bad = {
      {MakeTensor("short", SafetensorDType::kF32, {3}, std::vector<uint8_t>(8))},
      {MakeTensor("neg", SafetensorDType::kF32, {-1}, {})},
      {HostTensorFromF32("a", x, {2}), HostTensorFromF32("a", x, {2})},
      {HostTensorFromF32("__metadata__", x, {2})},
      {HostTensorFromF32("", x, {2})},
      {HostTensorFromF32("bad\xff", x, {2})},
  };
  const std::string path = Path("out.safetensors");
  for (const auto& tensors : bad) {
    absl::Status status = WriteSafetensors(path, tensors, {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(path), absl::string_view::npos) << status;
  }
  absl::Status status = WriteSafetensors(path, {}, {{"k", "\xc0\x80"}});  // Overlong NUL.
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(ListDir(dir_).empty());
}

TEST_F(SafetensorsTest, WriteIntoMissingDirectoryFailsCleanly) {
  const std::string path = Path("missing/model.safetensors");
  absl::Status status = WriteSafetensors(path, SampleTensors(), {});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find(path), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find(": open "), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find(std::strerror(ENOENT)), absl::string_view::npos) << status;
  EXPECT_TRUE(ListDir(dir_).empty());
}

TEST_F(SafetensorsTest, WriteUnderARegularFileFailsAndLeavesItIntact) {
  const std::string parent = Path("plain_file");
  WriteBytes(parent, "not a directory");
  const std::string path = parent + "/model.safetensors";
  absl::Status status = WriteSafetensors(path, SampleTensors(), {});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(path), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find(std::strerror(ENOTDIR)), absl::string_view::npos) << status;
  EXPECT_EQ(ReadBytes(parent), "not a directory");
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"plain_file"});
}

TEST_F(SafetensorsTest, OverwriteReplacesTheFileAndLeavesNoTempFiles) {
  const std::string path = Path("model.safetensors");
  ASSERT_OK(WriteSafetensors(path, SampleTensors(), kSampleMetadata));
  const float y = -1.0f;
  const std::vector<HostTensor> second = {HostTensorFromF32("only", &y, {1, 1})};
  ASSERT_OK(WriteSafetensors(path, second, {{"v", "2"}}));
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_OK(read) << read.status();
  ExpectSameTensors(second, read->tensors);
  EXPECT_EQ(read->metadata, (std::map<std::string, std::string>{{"v", "2"}}));
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, FailedWriteLeavesOldFileIntactAndNoTempFile) {
  const std::string path = Path("model.safetensors");
  ASSERT_OK(WriteSafetensors(path, SampleTensors(), kSampleMetadata));
  const std::string old_bytes = ReadBytes(path);

  // A file-size limit makes write() fail with EFBIG part way, even for root.
  std::vector<float> big(1 << 18, 0.5f);  // 1 MiB.
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit limited = saved;
  limited.rlim_cur = rlim_t{64} * 1024;
  void (*saved_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  absl::Status status = WriteSafetensors(
      path, {HostTensorFromF32("big", big.data(), {static_cast<int64_t>(big.size())})}, {});
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  ::signal(SIGXFSZ, saved_handler);

  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(path), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find(": write "), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find(std::strerror(EFBIG)), absl::string_view::npos) << status;
  EXPECT_EQ(ReadBytes(path), old_bytes);
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, FailedRenameRemovesTheTempFile) {
  // A non-empty directory at PATH cannot be renamed over.
  const std::string path = Path("model.safetensors");
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  WriteBytes(path + "/keep", "x");
  absl::Status status = WriteSafetensors(path, SampleTensors(), {});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(": rename "), absl::string_view::npos) << status;
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(ReadBytes(path + "/keep"), "x");
}

TEST(SafetensorsHelpersTest, RejectWrongDtypeOrShape) {
  const float x[2] = {1, 2};
  const HostTensor f = HostTensorFromF32("f", x, {2});
  float out[2];
  EXPECT_FALSE(CopyF32(f, {1, 2}, out).ok());
  EXPECT_FALSE(CopyF32(HostTensorFromU64("u", {1, 2}), {2}, out).ok());
  EXPECT_FALSE(ToU64Values(f).ok());
  EXPECT_FALSE(ToI64Values(HostTensorFromU64("u", {1})).ok());
  EXPECT_EQ(SafetensorDTypeSize(SafetensorDType::kI64), 8u);
  EXPECT_STREQ(SafetensorDTypeName(ToSafetensorDType(DType::kU8)), "U8");
}

// The fixed set tests/engine/safetensors_torch_check.py also knows.
std::vector<HostTensor> InteropTensors() {
  std::vector<float> w(6);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f - 1.0f;
  const float scalar = 3.25f;
  return {
      HostTensorFromF32("layer.0.weight", w.data(), {2, 3}),
      HostTensorFromF32("scalar", &scalar, {}),
      HostTensorFromF32("empty", nullptr, {0}),
      HostTensorFromI64("step", {42, -1}),
      HostTensorFromU64("rng", {0xFFFFFFFFFFFFFFFFull, 12345678901234567890ull}),
      TensorOf<uint8_t>("mask", SafetensorDType::kU8, {4}, {0, 1, 127, 255}),
      TensorOf<int32_t>("labels", SafetensorDType::kI32, {3}, {-2, 0, 2147483647}),
  };
}

// With KILN_SAFETENSORS_INTEROP_DIR set: writes from_cpp.safetensors there for the Python reader,
// and checks from_python.safetensors (written by the Python script) when it exists.
TEST(SafetensorsInteropTest, ExchangesFilesWithIndependentPythonCode) {
  const char* dir = std::getenv("KILN_SAFETENSORS_INTEROP_DIR");
  if (dir == nullptr) GTEST_SKIP() << "KILN_SAFETENSORS_INTEROP_DIR not set";
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"kiln", "interop"}};
  const std::vector<HostTensor> expected = InteropTensors();
  ASSERT_OK(WriteSafetensors(std::string(dir) + "/from_cpp.safetensors", expected, metadata));
  const std::string python_file = std::string(dir) + "/from_python.safetensors";
  if (!std::filesystem::exists(python_file)) return;
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(python_file);
  ASSERT_OK(read) << read.status();
  EXPECT_EQ(read->metadata, metadata);
  ASSERT_EQ(read->tensors.size(), expected.size());
  for (const HostTensor& want : expected) {
    SCOPED_TRACE(want.name);
    const HostTensor* got = read->Find(want.name);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_EQ(got->bytes, want.bytes);
  }
}

}  // namespace
}  // namespace kiln
