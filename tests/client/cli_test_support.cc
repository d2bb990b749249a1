#include "cli_test_support.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kiln::client::testing {
namespace fs = std::filesystem;
namespace {

void PutBigEndian32(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out->push_back(static_cast<char>((v >> shift) & 0xff));
}

std::string ToyImage(int label, std::mt19937& rng) {
  std::uniform_int_distribution<int> noise(0, 60);
  std::string out;
  const int row0 = (label / 4) * 7, col0 = (label % 4) * 7;
  for (int r = 0; r < 28; ++r) {
    for (int c = 0; c < 28; ++c) {
      const bool on = r >= row0 && r < row0 + 7 && c >= col0 && c < col0 + 7;
      out.push_back(static_cast<char>(on ? 255 - noise(rng) : noise(rng)));
    }
  }
  return out;
}

}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root = base != nullptr ? base : fs::temp_directory_path().string();
  std::string pattern = absl::StrCat(root, "/", prefix, "-XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  char* made = mkdtemp(buffer.data());
  return made != nullptr ? std::string(made) : pattern;
}

int ToyLabel(int i, uint32_t seed) { return static_cast<int>((i * 7 + seed) % 10); }

std::string ToyImagesIdx(int samples, uint32_t seed) {
  std::string out;
  PutBigEndian32(&out, 0x00000803);
  PutBigEndian32(&out, samples);
  PutBigEndian32(&out, 28);
  PutBigEndian32(&out, 28);
  std::mt19937 rng(seed);
  for (int i = 0; i < samples; ++i) out += ToyImage(ToyLabel(i, seed), rng);
  return out;
}

std::string ToyLabelsIdx(int samples, uint32_t seed) {
  std::string out;
  PutBigEndian32(&out, 0x00000801);
  PutBigEndian32(&out, samples);
  for (int i = 0; i < samples; ++i) out.push_back(static_cast<char>(ToyLabel(i, seed)));
  return out;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void WriteToyDataset(const std::string& dir, int train, int test, uint32_t seed) {
  fs::create_directories(dir);
  WriteFile(dir + "/train-images-idx3-ubyte", ToyImagesIdx(train, seed));
  WriteFile(dir + "/train-labels-idx1-ubyte", ToyLabelsIdx(train, seed));
  if (test > 0) {
    WriteFile(dir + "/t10k-images-idx3-ubyte", ToyImagesIdx(test, seed + 1));
    WriteFile(dir + "/t10k-labels-idx1-ubyte", ToyLabelsIdx(test, seed + 1));
  }
}

std::string ToyPgm(int i, uint32_t seed) {
  const std::string idx = ToyImagesIdx(i + 1, seed);
  return "P5\n28 28\n255\n" + idx.substr(16 + static_cast<size_t>(i) * 784, 784);
}

bool HasControlCharacters(const std::string& text) {
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
  }
  return false;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace kiln::client::testing
