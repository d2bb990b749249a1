// What a browser says about a request's origin, against where it went: other sites' pages and
// DNS rebinding refused, every non-browser client served.
#include "server/http/request_origin.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln::http {
namespace {

using ::testing::HasSubstr;

TEST(RequestOriginTest, NonBrowserClientsAndTheSameOriginPass) {
  const OriginPolicy policy;
  EXPECT_TRUE(CheckRequestOrigin("127.0.0.1:9464", "", "", policy, true).ok());
  EXPECT_TRUE(
      CheckRequestOrigin("localhost:9464", "http://localhost:9464", "same-origin", policy, true)
          .ok());
  EXPECT_TRUE(CheckRequestOrigin("[::1]:9464", "http://[::1]:9464", "", policy, true).ok());
  EXPECT_TRUE(CheckRequestOrigin("10.0.0.7", "http://10.0.0.7:80", "", policy, true).ok())
      << "a Host without a port is the scheme's default";
  EXPECT_TRUE(CheckRequestOrigin("", "", "", policy, true).ok()) << "HTTP/1.0 sends no Host";
}

TEST(RequestOriginTest, NamesAreServedOnlyWhenAllowedWithoutTokens) {
  OriginPolicy policy;
  absl::Status s = CheckRequestOrigin("evil.example:9464", "", "", policy, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("--http_allowed_hosts"));
  EXPECT_TRUE(CheckRequestOrigin("evil.example:9464", "", "", policy, false).ok())
      << "with tokens a rebinding page has none to send";
  policy.allowed_hosts = {"kilnd.example.com"};
  EXPECT_TRUE(CheckRequestOrigin("KILND.example.com:9464", "", "", policy, true).ok());
}

TEST(RequestOriginTest, OtherSitesPagesAreRefusedWithOrWithoutTokens) {
  const OriginPolicy policy;
  for (bool check_host : {true, false}) {
    EXPECT_EQ(
        CheckRequestOrigin("127.0.0.1:9464", "http://evil.example", "", policy, check_host).code(),
        absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(CheckRequestOrigin("127.0.0.1:9464", "http://127.0.0.1:8080", "", policy, check_host)
                  .code(),
              absl::StatusCode::kPermissionDenied)
        << "another port is another origin";
    EXPECT_EQ(CheckRequestOrigin("127.0.0.1:9464", "null", "", policy, check_host).code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(CheckRequestOrigin("127.0.0.1:9464", "", "cross-site", policy, check_host).code(),
              absl::StatusCode::kPermissionDenied);
  }
}

}  // namespace
}  // namespace kiln::http
