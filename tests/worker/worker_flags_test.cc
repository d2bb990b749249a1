// kiln-worker's flags and environment variables: the flag wins, the variables fill in, the token
// never comes from the command line, and every mistake is one line naming the flag.
#include "server/worker/worker_flags.h"

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::worker {
namespace {

using ::testing::HasSubstr;

EnvLookup EnvOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string WriteTempFile(const std::string& content) {
  std::string path = ::testing::TempDir() + "kiln_worker_token_XXXXXX";
  const int fd = mkstemp(path.data());
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << content;
  return path;
}

const std::vector<std::string> kMinimal = {"--coordinator", "kilnd:7070", "--job", "j1",
                                           "--rank",        "1"};

TEST(WorkerFlags, ReadsEveryFlag) {
  auto flags = ParseWorkerFlags({"--coordinator",
                                 "10.0.0.1:7070",
                                 "--job=job-7",
                                 "--rank",
                                 "3",
                                 "--data_dir",
                                 "/d",
                                 "--cache_dir",
                                 "/c",
                                 "--gloo_host",
                                 "10.0.0.5",
                                 "--gloo_interface",
                                 "eth1",
                                 "--tls_ca",
                                 "ca.pem",
                                 "--tls_cert",
                                 "c.pem",
                                 "--tls_key",
                                 "k.pem",
                                 "--tls_server_name",
                                 "kilnd.local"},
                                EnvOf({{"KILN_WORKER_TOKEN", "secret"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->coordinator, "10.0.0.1:7070");
  EXPECT_EQ(flags->job, "job-7");
  EXPECT_EQ(flags->rank, 3);
  EXPECT_EQ(flags->token, "secret");
  EXPECT_EQ(flags->data_dir, "/d");
  EXPECT_EQ(flags->cache_dir, "/c");
  EXPECT_EQ(flags->gloo_host, "10.0.0.5");
  EXPECT_EQ(flags->gloo_interface, "eth1");
  EXPECT_EQ(flags->tls_ca, "ca.pem");
  EXPECT_EQ(flags->tls_cert, "c.pem");
  EXPECT_EQ(flags->tls_key, "k.pem");
  EXPECT_EQ(flags->tls_server_name, "kilnd.local");
}

TEST(WorkerFlags, EnvironmentFillsInAndFlagsWin) {
  auto env = EnvOf({{"KILN_COORDINATOR", "env-host:1"},
                    {"KILN_JOB", "env-job"},
                    {"KILN_RANK", "2"},
                    {"KILN_GLOO_HOST", "10.1.1.1"},
                    {"KILN_WORKER_TOKEN", "t"},
                    {"TMPDIR", "/scratch"}});
  auto from_env = ParseWorkerFlags({}, env);
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->coordinator, "env-host:1");
  EXPECT_EQ(from_env->job, "env-job");
  EXPECT_EQ(from_env->rank, 2);
  EXPECT_EQ(from_env->gloo_host, "10.1.1.1");
  EXPECT_EQ(from_env->cache_dir, "/scratch/kiln-worker-cache");

  auto flags_win = ParseWorkerFlags({"--job", "flag-job", "--rank", "0"}, env);
  ASSERT_TRUE(flags_win.ok()) << flags_win.status();
  EXPECT_EQ(flags_win->job, "flag-job");
  EXPECT_EQ(flags_win->rank, 0);
  EXPECT_EQ(flags_win->coordinator, "env-host:1");
}

TEST(WorkerFlags, DefaultsListenOnLoopbackAndCacheUnderTmp) {
  auto flags = ParseWorkerFlags(kMinimal, EnvOf({{"KILN_WORKER_TOKEN", "t"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->gloo_host, "127.0.0.1");
  EXPECT_EQ(flags->gloo_interface, "");
  EXPECT_EQ(flags->data_dir, "");
  EXPECT_EQ(flags->cache_dir, "/tmp/kiln-worker-cache");
  EXPECT_EQ(flags->join_wait_seconds, 60);
}

TEST(WorkerFlags, ThreadsOverrideKilndsShare) {
  std::vector<std::string> args = kMinimal;
  args.insert(args.end(), {"--threads=2"});
  auto flags = ParseWorkerFlags(args, EnvOf({{"KILN_WORKER_TOKEN", "t"}, {"KILN_THREADS", "8"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->threads, 2);
  flags = ParseWorkerFlags(kMinimal, EnvOf({{"KILN_WORKER_TOKEN", "t"}, {"KILN_THREADS", "8"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->threads, 8);
  flags = ParseWorkerFlags(kMinimal, EnvOf({{"KILN_WORKER_TOKEN", "t"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->threads, 0);
  flags = ParseWorkerFlags(kMinimal, EnvOf({{"KILN_WORKER_TOKEN", "t"}, {"KILN_THREADS", "all"}}));
  EXPECT_THAT(flags.status().message(), HasSubstr("KILN_THREADS \"all\" is not a number"));
}

TEST(WorkerFlags, JoinWaitIsSecondsFromTheFlagOrTheEnvironment) {
  std::vector<std::string> args = kMinimal;
  args.insert(args.end(), {"--join_wait", "300"});
  auto flags = ParseWorkerFlags(args, EnvOf({{"KILN_WORKER_TOKEN", "t"}, {"KILN_JOIN_WAIT", "5"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->join_wait_seconds, 300);
  flags = ParseWorkerFlags(kMinimal, EnvOf({{"KILN_WORKER_TOKEN", "t"}, {"KILN_JOIN_WAIT", "5"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->join_wait_seconds, 5);
  flags = ParseWorkerFlags(kMinimal, EnvOf({{"KILN_WORKER_TOKEN", "t"}, {"KILN_JOIN_WAIT", "1m"}}));
  ASSERT_FALSE(flags.ok());
  EXPECT_THAT(flags.status().message(), HasSubstr("KILN_JOIN_WAIT \"1m\""));
}

TEST(WorkerFlags, RankFallsBackToTheIndexedJobsCompletionIndex) {
  auto flags = ParseWorkerFlags({"--coordinator", "k:1", "--job", "j"},
                                EnvOf({{"JOB_COMPLETION_INDEX", "4"}, {"KILN_WORKER_TOKEN", "t"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->rank, 4);
  // KILN_RANK comes first.
  flags = ParseWorkerFlags(
      {"--coordinator", "k:1", "--job", "j"},
      EnvOf({{"JOB_COMPLETION_INDEX", "4"}, {"KILN_RANK", "1"}, {"KILN_WORKER_TOKEN", "t"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->rank, 1);
}

TEST(WorkerFlags, TokenIsNeverAFlag) {
  std::vector<std::string> args = kMinimal;
  args.insert(args.end(), {"--token", "secret"});
  auto flags = ParseWorkerFlags(args, EnvOf({}));
  ASSERT_FALSE(flags.ok());
  EXPECT_THAT(flags.status().message(), HasSubstr("KILN_WORKER_TOKEN"));
  EXPECT_THAT(flags.status().message(), HasSubstr("--token_file"));
  EXPECT_THAT(flags.status().message(), ::testing::Not(HasSubstr("secret")));
}

TEST(WorkerFlags, TokenFileIsReadAndTrimmed) {
  const std::string path = WriteTempFile("file-token\n");
  std::vector<std::string> args = kMinimal;
  args.insert(args.end(), {"--token_file", path});
  // The file named by the flag wins over the token in the environment.
  auto flags = ParseWorkerFlags(args, EnvOf({{"KILN_WORKER_TOKEN", "env-token"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->token, "file-token");
  // A mounted secret named by the environment.
  flags = ParseWorkerFlags(kMinimal, EnvOf({{"KILN_WORKER_TOKEN_FILE", path}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->token, "file-token");
}

TEST(WorkerFlags, UnreadableOrEmptyTokenFileIsNamed) {
  std::vector<std::string> args = kMinimal;
  args.insert(args.end(), {"--token_file", "/nonexistent/token"});
  auto flags = ParseWorkerFlags(args, EnvOf({}));
  ASSERT_FALSE(flags.ok());
  EXPECT_THAT(flags.status().message(), HasSubstr("/nonexistent/token"));

  const std::string empty = WriteTempFile("\n");
  flags = ParseWorkerFlags(kMinimal, EnvOf({{"KILN_WORKER_TOKEN_FILE", empty}}));
  ASSERT_FALSE(flags.ok());
  EXPECT_THAT(flags.status().message(), HasSubstr("empty"));
}

TEST(WorkerFlags, MissingValuesAreNamed) {
  auto no_token = ParseWorkerFlags(kMinimal, EnvOf({}));
  ASSERT_FALSE(no_token.ok());
  EXPECT_THAT(no_token.status().message(), HasSubstr("KILN_WORKER_TOKEN"));

  auto token = EnvOf({{"KILN_WORKER_TOKEN", "t"}});
  auto no_coordinator = ParseWorkerFlags({"--job", "j", "--rank", "0"}, token);
  EXPECT_THAT(no_coordinator.status().message(), HasSubstr("--coordinator"));
  auto no_job = ParseWorkerFlags({"--coordinator", "k:1", "--rank", "0"}, token);
  EXPECT_THAT(no_job.status().message(), HasSubstr("--job"));
  auto no_rank = ParseWorkerFlags({"--coordinator", "k:1", "--job", "j"}, token);
  EXPECT_THAT(no_rank.status().message(), HasSubstr("--rank"));
  auto no_value = ParseWorkerFlags({"--coordinator", "k:1", "--job"}, token);
  EXPECT_THAT(no_value.status().message(), HasSubstr("--job needs a value"));
}

TEST(WorkerFlags, BadValuesAreNamed) {
  auto token = EnvOf({{"KILN_WORKER_TOKEN", "t"}});
  auto bad_rank = ParseWorkerFlags({"--coordinator", "k:1", "--job", "j", "--rank", "two"}, token);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_THAT(bad_rank.status().message(), HasSubstr("--rank \"two\""));
  auto bad_env_rank = ParseWorkerFlags({"--coordinator", "k:1", "--job", "j"},
                                       EnvOf({{"KILN_WORKER_TOKEN", "t"}, {"KILN_RANK", "-1"}}));
  EXPECT_THAT(bad_env_rank.status().message(), HasSubstr("KILN_RANK \"-1\""));
  auto no_port = ParseWorkerFlags({"--coordinator", "kilnd", "--job", "j", "--rank", "0"}, token);
  EXPECT_THAT(no_port.status().message(), HasSubstr("HOST:PORT"));
  std::vector<std::string> unknown = kMinimal;
  unknown.push_back("--epochs=3");
  EXPECT_THAT(ParseWorkerFlags(unknown, token).status().message(),
              HasSubstr("unknown flag --epochs"));
  std::vector<std::string> stray = kMinimal;
  stray.push_back("extra");
  EXPECT_THAT(ParseWorkerFlags(stray, token).status().message(), HasSubstr("\"extra\""));
  std::vector<std::string> half_tls = kMinimal;
  half_tls.insert(half_tls.end(), {"--tls_cert", "c.pem"});
  EXPECT_THAT(ParseWorkerFlags(half_tls, token).status().message(), HasSubstr("--tls_key"));
}

TEST(WorkerFlags, HelpNeedsNothingElse) {
  auto flags = ParseWorkerFlags({"--help"}, EnvOf({}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_TRUE(flags->help);
  EXPECT_THAT(WorkerUsage(), HasSubstr("KILN_WORKER_TOKEN"));
  EXPECT_THAT(WorkerUsage(), HasSubstr("JOB_COMPLETION_INDEX"));
}

}  // namespace
}  // namespace kiln::worker
