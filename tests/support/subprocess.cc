#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

extern char** environ;

namespace kiln::testing {

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
  const absl::Time end = absl::Now() + timeout;
  while (!Exited()) {
    if (absl::Now() > end) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
      exit_code_ = -1;
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return exit_code_;
}

bool Subprocess::Exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
  pid_ = -1;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // The readers end when the child's pipes close (grandchildren aside).
  if (out_reader_.joinable()) out_reader_.join();
  if (err_reader_.joinable()) err_reader_.join();
  return true;
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

}  // namespace kiln::testing
