// The token file and the check of one call's authorization metadata, in-process.
#include "server/grpc/auth_tokens.h"

#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/grpc/auth_interceptor.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

using client::testing::MakeTempDir;
using client::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseAuthTokensTest, SkipsBlankLinesAndCommentsAndTrimsEachLine) {
  auto tokens = ParseAuthTokens("# ops team\n\nalpha-1\n   beta_2  \r\n\t# old: gamma\n\ndelta.3");
  ASSERT_OK(tokens) << tokens.status();
  EXPECT_THAT(*tokens, ElementsAre("alpha-1", "beta_2", "delta.3"));
}

TEST(ParseAuthTokensTest, AFileWithoutTokensIsAnError) {
  for (const char* text : {"", "\n\n", "# only a comment\n  # and another\n"}) {
    auto tokens = ParseAuthTokens(text);
    ASSERT_FALSE(tokens.ok()) << text;
    EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokens.status().message(), HasSubstr("holds no token"));
  }
}

TEST(ParseAuthTokensTest, ABadLineIsNamedByNumberWithoutItsContent) {
  auto tokens = ParseAuthTokens("good-token\n# comment\nsecret with-space\n");
  ASSERT_FALSE(tokens.ok());
  EXPECT_THAT(tokens.status().message(), HasSubstr("line 3"));
  EXPECT_THAT(tokens.status().message(), Not(HasSubstr("secret")));
  EXPECT_THAT(tokens.status().message(), Not(HasSubstr("good-token")));

  tokens =
      ParseAuthTokens(std::string("tok\x01"
                                  "en\n",
                                  7));
  ASSERT_FALSE(tokens.ok());
  EXPECT_THAT(tokens.status().message(), HasSubstr("line 1: a token must be printable ASCII"));
}

class AuthTokensFileTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = MakeTempDir("kiln-tokens") + "/tokens"; }
  void TearDown() override {
    std::filesystem::remove_all(std::filesystem::path(path_).parent_path());
  }

  std::string path_;
};

TEST_F(AuthTokensFileTest, AcceptsExactlyTheListedTokens) {
  WriteFile(path_, "first-token\nsecond-token\n");
  auto tokens = AuthTokens::Load(path_);
  ASSERT_OK(tokens) << tokens.status();
  EXPECT_EQ((*tokens)->size(), 2);
  EXPECT_TRUE((*tokens)->Accepts("first-token"));
  EXPECT_TRUE((*tokens)->Accepts("second-token"));
  for (const char* wrong : {"", "first", "first-token2", "First-token", " first-token"}) {
    EXPECT_FALSE((*tokens)->Accepts(wrong)) << wrong;
  }
}

TEST_F(AuthTokensFileTest, LoadNamesTheFileWhenItIsMissingOrEmpty) {
  auto missing = AuthTokens::Load(path_);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("--auth_tokens_file=" + path_ + ": cannot read"));

  WriteFile(path_, "# nothing yet\n");
  auto empty = AuthTokens::Load(path_);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr(path_ + ": holds no token"));
}

TEST_F(AuthTokensFileTest, ReloadSwapsTheSetAndABadFileKeepsTheOldOne) {
  WriteFile(path_, "old-token\n");
  auto tokens = AuthTokens::Load(path_);
  ASSERT_OK(tokens) << tokens.status();

  WriteFile(path_, "new-token\nother-token\n");
  absl::StatusOr<int> reloaded = (*tokens)->Reload();
  ASSERT_OK(reloaded) << reloaded.status();
  EXPECT_EQ(*reloaded, 2);
  EXPECT_TRUE((*tokens)->Accepts("new-token"));
  EXPECT_FALSE((*tokens)->Accepts("old-token"));

  WriteFile(path_, "\n# emptied by mistake\n");
  EXPECT_FALSE((*tokens)->Reload().ok());
  std::filesystem::remove(path_);
  EXPECT_FALSE((*tokens)->Reload().ok());
  EXPECT_TRUE((*tokens)->Accepts("new-token"));
  EXPECT_TRUE((*tokens)->Accepts("other-token"));
  EXPECT_EQ((*tokens)->size(), 2);
}

TEST_F(AuthTokensFileTest, CheckAuthorizationReadsBearerMetadata) {
  WriteFile(path_, "right\n");
  auto tokens = AuthTokens::Load(path_);
  ASSERT_OK(tokens) << tokens.status();
  const AuthTokens& t = **tokens;
  EXPECT_EQ(CheckAuthorization({}, t), AuthOutcome::kMissing);
  EXPECT_EQ(CheckAuthorization({"Bearer "}, t), AuthOutcome::kMissing);
  EXPECT_EQ(CheckAuthorization({"Bearer right"}, t), AuthOutcome::kAccepted);
  EXPECT_EQ(CheckAuthorization({"bearer right"}, t), AuthOutcome::kAccepted);  // scheme: any case
  EXPECT_EQ(CheckAuthorization({"BEARER  right "}, t), AuthOutcome::kAccepted);
  EXPECT_EQ(CheckAuthorization({"Bearer wrong"}, t), AuthOutcome::kInvalid);
  EXPECT_EQ(CheckAuthorization({"Bearer Right"}, t), AuthOutcome::kInvalid);  // tokens: exact
  EXPECT_EQ(CheckAuthorization({"right"}, t), AuthOutcome::kInvalid);
  EXPECT_EQ(CheckAuthorization({"Basic cmlnaHQ6"}, t), AuthOutcome::kInvalid);
  // One accepted value among several is enough.
  EXPECT_EQ(CheckAuthorization({"Bearer wrong", "Bearer right"}, t), AuthOutcome::kAccepted);
  EXPECT_EQ(AuthFailureReason(AuthOutcome::kMissing), "missing");
  EXPECT_EQ(AuthFailureReason(AuthOutcome::kInvalid), "invalid");
}

}  // namespace
}  // namespace kiln::server
