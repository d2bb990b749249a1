// TLS and mutual TLS: kilnd's credentials from its --tls_* flags (in-process), and kilnd as a
// subprocess reached by the kiln CLI as a subprocess, with certificates made at test time.
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <signal.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "cli_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "security_test_support.h"
#include "server/grpc/tls_credentials.h"
#include "tests/support/status_matchers.h"

namespace kiln::security::testing {
namespace {

using client::testing::MakeTempDir;
using client::testing::ReadFile;
using client::testing::RunCommand;
using client::testing::RunResult;
using client::testing::WriteFile;
using server::ReadTlsFiles;
using server::TlsFiles;
using ::testing::HasSubstr;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_dir_ = new std::string(MakeTempDir("kiln-pki"));
    auto pki = MakeTestPki(*pki_dir_);
    ASSERT_OK(pki) << pki.status();
    pki_ = new TestPki(*pki);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*pki_dir_);
    delete pki_;
    delete pki_dir_;
  }
  void SetUp() override {
    ASSERT_NE(pki_, nullptr);
    root_ = MakeTempDir("kiln-tls");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // kiln with `args` (global flags first) against `kilnd`.
  RunResult Kiln(const KilndUnderTest& kilnd, const std::vector<std::string>& args,
                 const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {KILN_PATH, "--server", kilnd.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, env, absl::Seconds(30));
  }
  std::vector<std::string> ServerTls() const {
    return {"--tls_cert=" + pki_->server_cert, "--tls_key=" + pki_->server_key};
  }
  // kilnd's exit code and stderr when it is started with `args` and ought to refuse them.
  RunResult StartupFailure(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {KILND_PATH, "--listen=127.0.0.1:0",
                                     "--metrics_listen=", "--state_dir=" + root_ + "/state",
                                     "--data_dir=" + root_ + "/data"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, {}, absl::Seconds(30));
  }

  static std::string* pki_dir_;
  static TestPki* pki_;
  std::string root_;
};
std::string* TlsTest::pki_dir_ = nullptr;
TestPki* TlsTest::pki_ = nullptr;

TEST_F(TlsTest, TheModeIsPlaintextTlsOrMutualByTheFilesGiven) {
  TlsFiles files;
  EXPECT_EQ(server::TlsModeOf(files), server::TlsMode::kOff);
  files.cert = pki_->server_cert;
  files.key = pki_->server_key;
  EXPECT_EQ(server::TlsModeOf(files), server::TlsMode::kTls);
  auto tls = ReadTlsFiles(files);
  ASSERT_OK(tls) << tls.status();
  EXPECT_EQ(tls->cert_chain, ReadFile(pki_->server_cert));
  EXPECT_EQ(tls->key, ReadFile(pki_->server_key));
  EXPECT_EQ(tls->client_ca, "");
  files.client_ca = pki_->ca_cert;
  EXPECT_EQ(server::TlsModeOf(files), server::TlsMode::kMutualTls);
  auto mutual = ReadTlsFiles(files);
  ASSERT_OK(mutual) << mutual.status();
  EXPECT_EQ(mutual->client_ca, ReadFile(pki_->ca_cert));
}

TEST_F(TlsTest, BadTlsFilesAreRefusedNamingTheFlag) {
  struct Case {
    TlsFiles files;
    std::string message;
  };
  const std::string missing = root_ + "/no-such.pem";
  const std::string not_pem = root_ + "/not.pem";
  WriteFile(not_pem, "this is not PEM\n");
  const std::vector<Case> cases = {
      {{pki_->server_cert, "", ""}, "--tls_cert and --tls_key go together"},
      {{"", pki_->server_key, ""}, "--tls_cert and --tls_key go together"},
      {{"", "", pki_->ca_cert}, "--tls_client_ca needs --tls_cert and --tls_key"},
      {{missing, pki_->server_key, ""}, "--tls_cert=" + missing + ": cannot read"},
      {{pki_->server_cert, missing, ""}, "--tls_key=" + missing + ": cannot read"},
      {{not_pem, pki_->server_key, ""}, "--tls_cert=" + not_pem + ": holds no PEM certificate"},
      {{pki_->server_cert, not_pem, ""}, "--tls_key=" + not_pem + ": holds no PEM private key"},
      {{pki_->server_cert, pki_->client_key, ""},
       "--tls_key=" + pki_->client_key +
           ": does not match the certificate in --tls_cert=" + pki_->server_cert},
      {{pki_->server_cert, pki_->server_key, missing}, "--tls_client_ca=" + missing},
      {{pki_->server_cert, pki_->server_key, not_pem},
       "--tls_client_ca=" + not_pem + ": holds no PEM certificate"},
  };
  for (const Case& c : cases) {
    auto credentials = ReadTlsFiles(c.files);
    ASSERT_FALSE(credentials.ok()) << c.message;
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(credentials.status().message(), HasSubstr(c.message));
  }
}

TEST_F(TlsTest, AnExpiredCertificateIsRefused) {
  const std::string cert = root_ + "/expired.pem", key = root_ + "/expired.key.pem";
  ASSERT_OK(WriteExpiredCertificate(cert, key));
  auto credentials = ReadTlsFiles({cert, key, ""});
  ASSERT_FALSE(credentials.ok());
  EXPECT_THAT(credentials.status().message(),
              HasSubstr("--tls_cert=" + cert + ": the certificate has expired"));
}

TEST_F(TlsTest, KilndExitsWithTheReasonWhenTheKeyDoesNotFit) {
  RunResult r =
      StartupFailure({"--tls_cert=" + pki_->server_cert, "--tls_key=" + pki_->client_key});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kilnd: --tls_key=" + pki_->client_key + ": does not match"));
}

TEST_F(TlsTest, TheCliTalksTlsWithTheCaThatSignedKilnd) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start(ServerTls()));
  EXPECT_TRUE(kilnd.WaitForStderr("security tls=tls auth=off", 1, absl::Seconds(5)))
      << kilnd.Stderr();
  RunResult r = Kiln(kilnd, {"--tls-ca", pki_->ca_cert, "jobs"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("no jobs"));
  r = Kiln(kilnd, {"health"}, {"KILN_TLS_CA=" + pki_->ca_cert});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SERVING"));
}

TEST_F(TlsTest, APlaintextClientIsToldTheServerWantsTls) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start(ServerTls()));
  RunResult r = Kiln(kilnd, {"jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach kilnd at " + kilnd.address() +
                               ": the port answers but not as a plaintext gRPC server (does "
                               "kilnd serve TLS? pass --tls-ca"));
  // Not the advice for a dead port.
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("is kilnd running?")));
}

TEST_F(TlsTest, ACaThatDidNotSignKilndIsAVerificationFailure) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start(ServerTls()));
  RunResult r = Kiln(kilnd, {"--tls-ca", pki_->other_ca_cert, "jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the TLS handshake failed: kilnd's certificate does not verify "
                               "against the CA in --tls-ca " +
                               pki_->other_ca_cert));
}

TEST_F(TlsTest, ATlsClientOfAPlaintextKilndIsToldItIsPlaintext) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start({}));
  RunResult r = Kiln(kilnd, {"--tls-ca", pki_->ca_cert, "jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the port answers but not with TLS"));
}

TEST_F(TlsTest, TlsServerNameVerifiesACertificateForAnotherName) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start(
      {"--tls_cert=" + pki_->named_server_cert, "--tls_key=" + pki_->named_server_key}));
  // The certificate names kilnd.test only, not the address dialled.
  RunResult r = Kiln(kilnd, {"--tls-ca", pki_->ca_cert, "jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kilnd's certificate is not for \"127.0.0.1\" (pass "
                               "--tls-server-name"));
  r = Kiln(kilnd, {"--tls-ca", pki_->ca_cert, "--tls-server-name", "kilnd.test", "jobs"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Kiln(kilnd, {"jobs"}, {"KILN_TLS_CA=" + pki_->ca_cert, "KILN_TLS_SERVER_NAME=kilnd.test"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(TlsTest, MutualTlsRefusesClientsWithoutACertificateOfItsCa) {
  KilndUnderTest kilnd(root_);
  std::vector<std::string> args = ServerTls();
  args.push_back("--tls_client_ca=" + pki_->ca_cert);
  ASSERT_TRUE(kilnd.Start(args));
  EXPECT_TRUE(kilnd.WaitForStderr("security tls=mutual", 1, absl::Seconds(5))) << kilnd.Stderr();

  RunResult r = Kiln(kilnd, {"--tls-ca", pki_->ca_cert, "jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kilnd closed the connection during the TLS handshake (does it "
                               "require a client certificate? pass --tls-cert and --tls-key)"));
  // Health is no exception to mutual TLS: the handshake comes before any call.
  EXPECT_EQ(Kiln(kilnd, {"--tls-ca", pki_->ca_cert, "health"}).exit_code, 1);

  r = Kiln(kilnd, {"--tls-ca", pki_->ca_cert, "--tls-cert", pki_->stranger_cert, "--tls-key",
                   pki_->stranger_key, "jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("did it refuse the client certificate?"));

  r = Kiln(kilnd, {"--tls-ca", pki_->ca_cert, "--tls-cert", pki_->client_cert, "--tls-key",
                   pki_->client_key, "jobs"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Kiln(kilnd, {"health"},
           {"KILN_TLS_CA=" + pki_->ca_cert, "KILN_TLS_CERT=" + pki_->client_cert,
            "KILN_TLS_KEY=" + pki_->client_key});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// The workers kilnd starts for a job of several connect to it with TLS too: with the CA given by
// --worker_tls_ca (and under mutual TLS the certificate of --worker_tls_cert); without it such
// jobs are refused at once, naming the flag, rather than failing in their workers.
TEST_F(TlsTest, WorkersKilndStartsConnectWithTheWorkerTlsFlags) {
  client::testing::WriteToyDataset(root_ + "/data/toy", 256, 64);
  const std::vector<std::string> submit = {
      "--tls-ca", pki_->ca_cert, "--tls-cert", pki_->client_cert, "--tls-key", pki_->client_key,
      "submit",   "--preset",    "mnist-mlp",  "--dataset",       "toy",       "--workers",
      "2",        "--device",    "cpu"};
  std::vector<std::string> args = ServerTls();
  args.push_back("--tls_client_ca=" + pki_->ca_cert);
  {
    KilndUnderTest kilnd(root_);
    ASSERT_TRUE(kilnd.Start(args));
    RunResult r = Kiln(kilnd, submit);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.err, HasSubstr("start kilnd with --worker_tls_ca"));
    ASSERT_EQ(kilnd.Stop(), 0);
  }
  {
    KilndUnderTest kilnd(root_);
    std::vector<std::string> with_ca = args;
    with_ca.push_back("--worker_tls_ca=" + pki_->ca_cert);
    ASSERT_TRUE(kilnd.Start(with_ca));
    RunResult r = Kiln(kilnd, submit);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.err, HasSubstr("--worker_tls_cert and --worker_tls_key"));
    ASSERT_EQ(kilnd.Stop(), 0);
  }
  KilndUnderTest kilnd(root_);
  args.push_back("--worker_tls_ca=" + pki_->ca_cert);
  args.push_back("--worker_tls_cert=" + pki_->client_cert);
  args.push_back("--worker_tls_key=" + pki_->client_key);
  ASSERT_TRUE(kilnd.Start(args));
  std::vector<std::string> watched = submit;
  watched.push_back("--watch");
  RunResult r = Kiln(kilnd, watched);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
}

// Replaces `path` as renewal tools do: the new content in a file beside it, then a rename.
void Renew(const std::string& path, const std::string& content) {
  WriteFile(path + ".new", content);
  std::filesystem::rename(path + ".new", path);
}

// Runs `attempt` (a kiln command's exit code) every 200 ms until it is 0; false after `timeout`.
bool EventuallySucceeds(const std::function<int()>& attempt, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (attempt() == 0) return true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return false;
}

// When the certificate in the PEM file `path` expires, in Unix seconds.
double NotAfterUnix(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return -1;
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  std::tm tm{};
  const bool ok = cert != nullptr && ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) == 1;
  X509_free(cert);
  return ok ? static_cast<double>(timegm(&tm)) : -1;
}

// A sample of kilnd's /metrics, -1 when absent or unreachable.
double Sample(const KilndUnderTest& kilnd, const std::string& series) {
  absl::StatusOr<std::string> scrape = ScrapeMetrics(kilnd.metrics_port());
  return scrape.ok() ? SampleValue(*scrape, series) : -1;
}

constexpr char kExpiry[] = "kiln_tls_certificate_expiry_timestamp_seconds";
constexpr char kReloadsOk[] = "kiln_tls_reloads_total{result=\"ok\"}";
constexpr char kReloadsFailed[] = "kiln_tls_reloads_total{result=\"failed\"}";

// kilnd's own copies of the PKI's server files, so that a test can renew them.
struct RenewableFiles {
  std::string cert, key;
  std::vector<std::string> Flags() const { return {"--tls_cert=" + cert, "--tls_key=" + key}; }
};

class TlsRenewalTest : public TlsTest {
 protected:
  RenewableFiles Files() {
    RenewableFiles files{root_ + "/kilnd.pem", root_ + "/kilnd.key.pem"};
    WriteFile(files.cert, ReadFile(pki_->server_cert));
    WriteFile(files.key, ReadFile(pki_->server_key));
    return files;
  }
  // The renewed certificate names kilnd.test only: once it is served, only that name verifies.
  void RenewForTheName(const RenewableFiles& files) {
    Renew(files.key, ReadFile(pki_->named_server_key));
    Renew(files.cert, ReadFile(pki_->named_server_cert));
  }
  std::vector<std::string> ForTheAddress() const { return {"--tls-ca", pki_->ca_cert, "health"}; }
  std::vector<std::string> ForTheName() const {
    return {"--tls-ca", pki_->ca_cert, "--tls-server-name", "kilnd.test", "health"};
  }
};

TEST_F(TlsRenewalTest, RenewedFilesAreServedWithoutARestart) {
  const RenewableFiles files = Files();
  KilndUnderTest kilnd(root_);
  std::vector<std::string> args = files.Flags();
  args.push_back("--tls_reload_interval=1s");
  ASSERT_TRUE(kilnd.Start(args));
  RunResult r = Kiln(kilnd, ForTheAddress());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Sample(kilnd, kExpiry), NotAfterUnix(pki_->server_cert));
  EXPECT_EQ(Sample(kilnd, kReloadsOk), 0);

  RenewForTheName(files);
  EXPECT_TRUE(
      EventuallySucceeds([&] { return Kiln(kilnd, ForTheName()).exit_code; }, absl::Seconds(30)))
      << "kilnd never served the renewed certificate; its log:\n"
      << kilnd.Stderr();
  EXPECT_THAT(kilnd.Stderr(), HasSubstr("tls_reloaded cert=" + files.cert));
  r = Kiln(kilnd, ForTheAddress());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kilnd's certificate is not for \"127.0.0.1\""));
  EXPECT_EQ(Sample(kilnd, kExpiry), NotAfterUnix(pki_->named_server_cert));
  EXPECT_GE(Sample(kilnd, kReloadsOk), 1);
}

TEST_F(TlsRenewalTest, ABadRenewalIsLoggedAndTheFilesInForceStay) {
  const RenewableFiles files = Files();
  KilndUnderTest kilnd(root_);
  std::vector<std::string> args = files.Flags();
  args.push_back("--tls_reload_interval=0");  // only SIGHUP reads them
  ASSERT_TRUE(kilnd.Start(args));
  struct Case {
    std::function<void()> renew;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {[&] { Renew(files.key, ReadFile(pki_->client_key)); }, "does not match the certificate"},
      {[&] { Renew(files.key, "not a key\n"); }, "holds no PEM private key"},
      {[&] { Renew(files.cert, ""); }, "holds no PEM certificate"},
      {[&] { std::filesystem::remove(files.cert); }, "cannot read"},
  };
  int failures = 0;
  for (const Case& c : cases) {
    c.renew();
    kilnd.Signal(SIGHUP);
    ASSERT_TRUE(kilnd.WaitForStderr("tls_reload_failed", ++failures, absl::Seconds(10)))
        << kilnd.Stderr();
    EXPECT_THAT(kilnd.Stderr(), HasSubstr(c.reason));
    // Well past gRPC's one-second look at kilnd's copies: still the certificate in force.
    absl::SleepFor(absl::Milliseconds(1500));
    const RunResult r = Kiln(kilnd, ForTheAddress());
    EXPECT_EQ(r.exit_code, 0) << c.reason << ": " << r.err;
  }
  EXPECT_EQ(Sample(kilnd, kReloadsFailed), 4);
  EXPECT_EQ(Sample(kilnd, kExpiry), NotAfterUnix(pki_->server_cert));
  // A sound renewal after all that is served.
  RenewForTheName(files);
  kilnd.Signal(SIGHUP);
  ASSERT_TRUE(kilnd.WaitForStderr("tls_reloaded", 1, absl::Seconds(10))) << kilnd.Stderr();
  EXPECT_TRUE(
      EventuallySucceeds([&] { return Kiln(kilnd, ForTheName()).exit_code; }, absl::Seconds(10)));
  EXPECT_EQ(Sample(kilnd, kReloadsOk), 1);
}

TEST_F(TlsTest, ANegativeReloadIntervalIsRefused) {
  std::vector<std::string> args = ServerTls();
  args.push_back("--tls_reload_interval=-1s");
  RunResult r = StartupFailure(args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--tls_reload_interval: must not be negative"));
}

TEST_F(TlsTest, AClientCertificateWithoutItsKeyIsBadUsage) {
  RunResult r = RunCommand({KILN_PATH, "--tls-cert", pki_->client_cert, "jobs"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--tls-cert requires --tls-key"));
  r = RunCommand({KILN_PATH, "jobs"}, {"KILN_TLS_KEY=" + pki_->client_key});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--tls-key requires --tls-cert"));
}

}  // namespace
}  // namespace kiln::security::testing
