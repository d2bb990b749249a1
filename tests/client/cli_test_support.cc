#include "cli_test_support.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

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

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10));
  }
  if (out_reader_.joinable()) out_reader_.join();
  if (err_reader_.joinable()) err_reader_.join();
}

bool Subprocess::Start(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    // The tests say where kiln connects; a developer's own settings must not leak in.
    if (absl::StartsWith(*e, "KILN_")) continue;
    environment.emplace_back(*e);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<std::string> args = argv;
  std::vector<char*> cargs, cenv;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  for (std::string& e : environment) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return false;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  const int rc = posix_spawn(&pid_, cargs[0], &actions, nullptr, cargs.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]);
    close(err[0]);
    pid_ = -1;
    return false;
  }
  auto reader = [this](int fd, std::string* sink) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mu_);
      sink->append(buffer, static_cast<size_t>(n));
    }
    close(fd);
  };
  out_reader_ = std::thread(reader, out[0], &out_);
  err_reader_ = std::thread(reader, err[0], &err_);
  return true;
}

int Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return exit_code_;
  const absl::Time end = absl::Now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (absl::Now() > end) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      pid_ = -1;
      exit_code_ = -1;
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  pid_ = -1;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // The readers end when the child's pipes close (grandchildren aside).
  if (out_reader_.joinable()) out_reader_.join();
  if (err_reader_.joinable()) err_reader_.join();
  return exit_code_;
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

std::string Subprocess::Stdout() {
  std::lock_guard<std::mutex> lock(mu_);
  return out_;
}

std::string Subprocess::Stderr() {
  std::lock_guard<std::mutex> lock(mu_);
  return err_;
}

bool Subprocess::WaitForStdout(const std::string& text, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (absl::StrContains(Stdout(), text)) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::StrContains(Stdout(), text);
}

RunResult RunCommand(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                     absl::Duration timeout) {
  Subprocess p;
  RunResult result;
  if (!p.Start(argv, env)) {
    result.err = "could not start " + argv[0];
    return result;
  }
  result.exit_code = p.Wait(timeout);
  result.out = p.Stdout();
  result.err = p.Stderr();
  return result;
}

bool Kilnd::Start(const std::string& state_dir, const std::string& data_dir,
                  const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {KILND_PATH, "--listen=127.0.0.1:0", "--state_dir=" + state_dir,
                                   "--data_dir=" + data_dir, "--device=cpu"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  if (!process_.Start(args)) return false;
  if (!process_.WaitForStdout("\n", absl::Seconds(30))) return false;
  return std::sscanf(process_.Stdout().c_str(), "kilnd: listening on port %d", &port_) == 1;
}

std::string Kilnd::address() const { return absl::StrCat("127.0.0.1:", port_); }

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root = base != nullptr ? base : fs::temp_directory_path().string();
  std::string pattern = absl::StrCat(root, "/", prefix, "-XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  char* made = mkdtemp(buffer.data());
  return made != nullptr ? std::string(made) : pattern;
}

int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
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

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(digest), length));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace kiln::client::testing
