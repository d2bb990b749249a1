// KServe v2 over HTTP/REST with kilnd's TLS and bearer tokens: kilnd as a subprocess, its HTTP
// port (the one /metrics is on) reached by httplib's client and by curl. /v2 needs the tokens
// gRPC needs (refusals counted as gRPC's are), health and /metrics stay open unless
// --metrics_require_token; with --tls_cert the port serves the gRPC port's certificate, mutual
// TLS asks for a client certificate, and a renewal reaches new connections without a restart.
// The web page and its /api share the port's TLS and tokens.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "security_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::security::testing {
namespace {

using client::testing::MakeTempDir;
using client::testing::ReadFile;
using client::testing::RunCommand;
using client::testing::RunResult;
using client::testing::WriteFile;
using ::testing::HasSubstr;

constexpr char kToken[] = "3f9c2a1b7d0458e6c1a2b3c4d5e6f708";

class RestSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // httplib's TLS client writes through OpenSSL, without MSG_NOSIGNAL: a handshake kilnd
    // refuses would end this process (kilnd itself ignores SIGPIPE).
    signal(SIGPIPE, SIG_IGN);
    pki_dir_ = new std::string(MakeTempDir("kiln-rest-pki"));
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
    root_ = MakeTempDir("kiln-rest");
    tokens_ = root_ + "/tokens";
    WriteFile(tokens_, absl::StrCat("# test\n", kToken, "\n"));
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // An HTTPS client of kilnd's HTTP port that verifies it with the test CA.
  std::unique_ptr<httplib::SSLClient> Https(int port, const std::string& cert = "",
                                            const std::string& key = "") {
    auto client = cert.empty() ? std::make_unique<httplib::SSLClient>("127.0.0.1", port)
                               : std::make_unique<httplib::SSLClient>("127.0.0.1", port, cert, key);
    client->set_ca_cert_path(pki_->ca_cert.c_str());
    client->enable_server_certificate_verification(true);
    client->set_read_timeout(10, 0);
    return client;
  }

  static std::string* pki_dir_;
  static TestPki* pki_;
  std::string root_, tokens_;
};
std::string* RestSecurityTest::pki_dir_ = nullptr;
TestPki* RestSecurityTest::pki_ = nullptr;

TEST_F(RestSecurityTest, V2NeedsTheGrpcTokensWhileHealthAndMetricsStayOpen) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start({"--auth_tokens_file=" + tokens_}));
  httplib::Client http("127.0.0.1", kilnd.metrics_port());
  struct Call {
    std::string method, path;
  } const guarded[] = {{"GET", "/v2"},
                       {"GET", "/v2/models/digits"},
                       {"GET", "/v2/models/digits/ready"},
                       {"POST", "/v2/models/digits/infer"},
                       {"POST", "/v2/repository/index"},
                       {"POST", "/v2/repository/models/digits/load"},
                       {"POST", "/v2/repository/models/digits/unload"}};
  auto call = [&](const Call& c, const httplib::Headers& headers) {
    return c.method == "GET" ? http.Get(c.path.c_str(), headers)
                             : http.Post(c.path.c_str(), headers, "{}", "application/json");
  };
  for (const Call& c : guarded) {
    httplib::Result none = call(c, {});
    ASSERT_TRUE(none) << c.path;
    EXPECT_EQ(none->status, 401) << c.path;
    EXPECT_EQ(none->body, R"({"error":"missing bearer token"})") << c.path;
    httplib::Result wrong = call(c, {{"Authorization", "Bearer not-the-token"}});
    ASSERT_TRUE(wrong) << c.path;
    EXPECT_EQ(wrong->status, 401) << c.path;
    EXPECT_EQ(wrong->body, R"({"error":"invalid bearer token"})") << c.path;
  }
  httplib::Result ok = http.Get("/v2", {{"Authorization", absl::StrCat("Bearer ", kToken)}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_THAT(ok->body, HasSubstr("\"name\":\"kiln\""));
  // The token's scheme is matched in any case, as on the gRPC port.
  ok = http.Get("/v2/models/digits/ready", {{"Authorization", absl::StrCat("bearer ", kToken)}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 400);  // authorised; no such model, so not ready
  for (const char* open : {"/v2/health/live", "/v2/health/ready"}) {
    httplib::Result r = http.Get(open);
    ASSERT_TRUE(r) << open;
    EXPECT_EQ(r->status, 200) << open;
  }
  absl::StatusOr<std::string> scrape = ScrapeMetrics(kilnd.metrics_port());
  ASSERT_OK(scrape) << scrape.status();
  // Refusals count where gRPC's do; the token never reaches the log.
  EXPECT_EQ(SampleValue(*scrape, "kiln_auth_failures_total{reason=\"missing\"}"), 7);
  EXPECT_EQ(SampleValue(*scrape, "kiln_auth_failures_total{reason=\"invalid\"}"), 7);
  // And in the HTTP port's own series, by route (names folded) and status.
  EXPECT_EQ(
      SampleValue(*scrape,
                  "kiln_http_requests_total{code=\"401\",route=\"/v2/models/{model}/infer\"}"),
      2);
  EXPECT_EQ(SampleValue(*scrape, "kiln_http_requests_total{code=\"200\",route=\"/v2\"}"), 1);
  EXPECT_EQ(SampleValue(*scrape,
                        "kiln_http_requests_total{code=\"400\","
                        "route=\"/v2/models/{model}/ready\"}"),
            1);
  EXPECT_EQ(kilnd.Stderr().find(kToken), std::string::npos);
  EXPECT_EQ(kilnd.Stop(), 0);
}

TEST_F(RestSecurityTest, MetricsCanRequireTheTokenToo) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start({"--auth_tokens_file=" + tokens_, "--metrics_require_token"}));
  httplib::Client http("127.0.0.1", kilnd.metrics_port());
  httplib::Result r = http.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = http.Get("/metrics", {{"Authorization", absl::StrCat("Bearer ", kToken)}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("kiln_build_info{"));
}

TEST_F(RestSecurityTest, TheHttpPortServesTheGrpcCertificate) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start({"--tls_cert=" + pki_->server_cert, "--tls_key=" + pki_->server_key}));
  httplib::Result r = Https(kilnd.metrics_port())->Get("/v2/health/live");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  // A plaintext client gets no answer from the TLS port.
  httplib::Client plain("127.0.0.1", kilnd.metrics_port());
  plain.set_read_timeout(5, 0);
  EXPECT_FALSE(plain.Get("/v2/health/live"));
  // Nor does a client that trusts another CA.
  auto stranger = Https(kilnd.metrics_port());
  stranger->set_ca_cert_path(pki_->other_ca_cert.c_str());
  EXPECT_FALSE(stranger->Get("/v2/health/live"));
}

TEST_F(RestSecurityTest, TheWebPageAndItsApiAreBehindTheSameTlsAndTokens) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start({"--tls_cert=" + pki_->server_cert, "--tls_key=" + pki_->server_key,
                           "--auth_tokens_file=" + tokens_}));
  auto https = Https(kilnd.metrics_port());
  httplib::Result page = https->Get("/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr("/web/app.js"));
  httplib::Result refused = https->Get("/api/jobs");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  httplib::Result jobs =
      https->Get("/api/jobs", {{"Authorization", absl::StrCat("Bearer ", kToken)}});
  ASSERT_TRUE(jobs);
  EXPECT_EQ(jobs->status, 200);
  EXPECT_THAT(jobs->body, HasSubstr("\"jobs\":[]"));
  // The event stream too: it opens over TLS with the token (and ends when kilnd stops).
  std::string feed;
  https->Get("/api/events", {{"Authorization", absl::StrCat("Bearer ", kToken)}},
             [&](const char* data, size_t n) {
               feed.append(data, n);
               return feed.find("event: open") == std::string::npos;  // enough: stop reading
             });
  EXPECT_THAT(feed, HasSubstr("event: open"));
}

TEST_F(RestSecurityTest, MutualTlsWantsAClientCertificateOfTheCa) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start({"--tls_cert=" + pki_->server_cert, "--tls_key=" + pki_->server_key,
                           "--tls_client_ca=" + pki_->ca_cert}));
  EXPECT_FALSE(Https(kilnd.metrics_port())->Get("/v2/health/live"));
  EXPECT_FALSE(
      Https(kilnd.metrics_port(), pki_->stranger_cert, pki_->stranger_key)->Get("/v2/health/live"));
  httplib::Result r =
      Https(kilnd.metrics_port(), pki_->client_cert, pki_->client_key)->Get("/v2/health/live");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
}

// curl, as a user would: the renewed certificate (for the name kilnd.test only) is served on
// the HTTP port after SIGHUP, without a restart.
TEST_F(RestSecurityTest, ARenewedCertificateReachesNewHttpsConnections) {
  if (access("/usr/bin/curl", X_OK) != 0) {
    GTEST_SKIP() << "/usr/bin/curl is not installed (apt-get install curl)";
  }
  const std::string cert = root_ + "/kilnd.pem", key = root_ + "/kilnd.key.pem";
  WriteFile(cert, ReadFile(pki_->server_cert));
  WriteFile(key, ReadFile(pki_->server_key));
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start({"--tls_cert=" + cert, "--tls_key=" + key, "--tls_reload_interval=0",
                           "--auth_tokens_file=" + tokens_}));
  const std::string port = std::to_string(kilnd.metrics_port());
  auto curl = [&](const std::string& host) {
    return RunCommand(
        {"/usr/bin/curl", "-sS", "--cacert", pki_->ca_cert, "--resolve",
         "kilnd.test:" + port + ":127.0.0.1", "-H", absl::StrCat("Authorization: Bearer ", kToken),
         absl::StrCat("https://", host, ":", port, "/v2")},
        {}, absl::Seconds(30));
  };
  RunResult before = curl("127.0.0.1");
  ASSERT_EQ(before.exit_code, 0) << before.err;
  EXPECT_THAT(before.out, HasSubstr("\"extensions\":[\"model_repository\"]"));
  EXPECT_NE(curl("kilnd.test").exit_code, 0);  // not yet a name the certificate has

  WriteFile(key, ReadFile(pki_->named_server_key));
  WriteFile(cert, ReadFile(pki_->named_server_cert));
  kilnd.Signal(SIGHUP);
  ASSERT_TRUE(kilnd.WaitForStderr("tls_reloaded", 1, absl::Seconds(10))) << kilnd.Stderr();
  RunResult after = curl("kilnd.test");
  EXPECT_EQ(after.exit_code, 0) << after.err;
  EXPECT_THAT(after.out, HasSubstr("\"name\":\"kiln\""));
  EXPECT_NE(curl("127.0.0.1").exit_code, 0);  // the renewed certificate does not name it
}

// The HTTP port's TLS handshakes are waited for off its request threads: clients that connect
// and never finish a handshake (silent, or a few bytes of one) hold no thread, so HTTPS probes
// and token-guarded REST answer at once while they are open, and each is closed once its
// handshake has not finished within --http_header_timeout (10 s) of connecting.
TEST_F(RestSecurityTest, StalledTlsHandshakesHoldNoThread) {
  KilndUnderTest kilnd(root_);
  ASSERT_TRUE(kilnd.Start({"--tls_cert=" + pki_->server_cert, "--tls_key=" + pki_->server_key,
                           "--auth_tokens_file=" + tokens_}));
  std::vector<int> stalled;
  for (int i = 0; i < 64; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(kilnd.metrics_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    // Half of them send the start of a ClientHello (a TLS record header) and stop.
    if (i % 2 == 1) send(fd, "\x16\x03\x01\x02\x00", 5, MSG_NOSIGNAL);
    stalled.push_back(fd);
  }
  const absl::Time asked = absl::Now();
  auto https = Https(kilnd.metrics_port());
  httplib::Result ready = https->Get("/v2/health/ready");
  httplib::Result v2 = https->Get("/v2", {{"Authorization", absl::StrCat("Bearer ", kToken)}});
  httplib::Result refused = https->Get("/v2");
  const absl::Duration took = absl::Now() - asked;
  ASSERT_TRUE(ready) << httplib::to_string(ready.error());
  ASSERT_TRUE(v2) << httplib::to_string(v2.error());
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(v2->status, 200);
  EXPECT_EQ(refused->status, 401);  // tokens hold as before
  EXPECT_LT(took, absl::Seconds(3)) << "three HTTPS calls past 64 stalled handshakes";
  // kilnd closes them at the handshake deadline: each reads the end of the stream.
  int closed = 0;
  for (int fd : stalled) {
    timeval wait{20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    char byte;
    if (recv(fd, &byte, 1, 0) <= 0) ++closed;
    close(fd);
  }
  EXPECT_EQ(closed, 64);
  EXPECT_EQ(kilnd.Stop(), 0);
}

}  // namespace
}  // namespace kiln::security::testing
