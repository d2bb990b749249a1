// Pieces of the kiln CLI tests: the shared child-process and kilnd launchers (tests/support) under
// the names these tests use, and tiny generated IDX datasets with known labels.
#pragma once

#include <cstdint>
#include <string>

#include "common/sha256.h"
#include "tests/support/kilnd_child.h"
#include "tests/support/subprocess.h"

namespace kiln::client::testing {

// The shared launchers, under the names these tests use.
using kiln::testing::RunCommand;
using kiln::testing::RunResult;
using kiln::testing::Subprocess;
using Kilnd = kiln::testing::KilndChild;

// A fresh folder under the test's temporary directory.
std::string MakeTempDir(const std::string& prefix);

// Label of sample i of a toy dataset; images put a bright 7x7 block in cell (label / 4, label % 4)
// of a 4x4 grid of 7x7 cells, over noise.
int ToyLabel(int i, uint32_t seed);
std::string ToyImagesIdx(int samples, uint32_t seed);
std::string ToyLabelsIdx(int samples, uint32_t seed);
// Writes the four MNIST-named IDX files into dir/name.
void WriteToyDataset(const std::string& dir, int train, int test, uint32_t seed = 1);
// Sample i of ToyImagesIdx(.., seed) as a binary PGM file.
std::string ToyPgm(int i, uint32_t seed);
void WriteFile(const std::string& path, const std::string& bytes);

// True when `text` holds a byte below 0x20 other than '\n', or DEL.
bool HasControlCharacters(const std::string& text);
std::string ReadFile(const std::string& path);

}  // namespace kiln::client::testing
