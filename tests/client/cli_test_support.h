// Pieces of the kiln CLI tests: child processes with captured output, a kilnd child on a free
// loopback port, and tiny generated IDX datasets with known labels.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace kiln::client::testing {

// A child process whose stdout and stderr are read into strings as it runs.
class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess();  // SIGKILL if still running
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Starts argv[0] (a path) with the environment plus `env` ("NAME=value"), stdin /dev/null.
  bool Start(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
  // Waits up to `timeout` for the exit; returns the exit code, 128+signal when killed by one,
  // or -1 on timeout (the child is then killed).
  int Wait(absl::Duration timeout);
  void Signal(int signal);
  // What it has written so far.
  std::string Stdout();
  std::string Stderr();
  // Polls until stdout contains `text`; false after `timeout`.
  bool WaitForStdout(const std::string& text, absl::Duration timeout);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::mutex mu_;
  std::string out_, err_;
  std::thread out_reader_, err_reader_;
};

// The outcome of one finished command.
struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `argv` to its end (at most `timeout`).
RunResult RunCommand(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
                     absl::Duration timeout = absl::Seconds(60));

// kilnd as a child on 127.0.0.1 with a port of its choosing.
class Kilnd {
 public:
  // Starts kilnd (path KILND_PATH) with the given dirs and extra flags; false on failure.
  bool Start(const std::string& state_dir, const std::string& data_dir,
             const std::vector<std::string>& extra_args = {});
  int port() const { return port_; }
  std::string address() const;

 private:
  Subprocess process_;
  int port_ = 0;
};

// A fresh folder under the test's temporary directory.
std::string MakeTempDir(const std::string& prefix);
// A port on 127.0.0.1 that nothing listens on (bound, then released).
int ClosedPort();

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
std::string Sha256Hex(const std::string& bytes);
std::string ReadFile(const std::string& path);

}  // namespace kiln::client::testing
