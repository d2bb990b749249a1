// TLS and mutual TLS: kilnd's credentials from its --tls_* flags (in-process), and kilnd as a
// subprocess reached by the kiln CLI as a subprocess, with certificates made at test time.
#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "security_test_support.h"
#include "server/tls_credentials.h"

namespace kiln::security::testing {
namespace {

using client::testing::MakeTempDir;
using client::testing::RunCommand;
using client::testing::RunResult;
using client::testing::WriteFile;
using server::MakeServerCredentials;
using server::TlsFiles;
using ::testing::HasSubstr;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_dir_ = new std::string(MakeTempDir("kiln-pki"));
    auto pki = MakeTestPki(*pki_dir_);
    ASSERT_TRUE(pki.ok()) << pki.status();
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

TEST_F(TlsTest, CredentialsArePlaintextTlsOrMutualByTheFilesGiven) {
  TlsFiles files;
  EXPECT_EQ(server::TlsModeOf(files), server::TlsMode::kOff);
  EXPECT_TRUE(MakeServerCredentials(files).ok());
  files.cert = pki_->server_cert;
  files.key = pki_->server_key;
  EXPECT_EQ(server::TlsModeOf(files), server::TlsMode::kTls);
  auto tls = MakeServerCredentials(files);
  EXPECT_TRUE(tls.ok()) << tls.status();
  files.client_ca = pki_->ca_cert;
  EXPECT_EQ(server::TlsModeOf(files), server::TlsMode::kMutualTls);
  auto mutual = MakeServerCredentials(files);
  EXPECT_TRUE(mutual.ok()) << mutual.status();
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
    auto credentials = MakeServerCredentials(c.files);
    ASSERT_FALSE(credentials.ok()) << c.message;
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(credentials.status().message(), HasSubstr(c.message));
  }
}

TEST_F(TlsTest, AnExpiredCertificateIsRefused) {
  const std::string cert = root_ + "/expired.pem", key = root_ + "/expired.key.pem";
  ASSERT_TRUE(WriteExpiredCertificate(cert, key).ok());
  auto credentials = MakeServerCredentials({cert, key, ""});
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
