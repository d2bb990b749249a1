// The token file and the check of one call's authorization metadata, in-process.
#include "server/access/auth_tokens.h"

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
  std::vector<std::string> texts;
  for (const TokenIdentity& t : *tokens) texts.push_back(t.token);
  EXPECT_THAT(texts, ElementsAre("alpha-1", "beta_2", "delta.3"));
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
  Caller caller;
  EXPECT_EQ(CheckAuthorization({}, t, &caller), AuthOutcome::kMissing);
  EXPECT_EQ(CheckAuthorization({"Bearer "}, t, &caller), AuthOutcome::kMissing);
  EXPECT_EQ(CheckAuthorization({"Bearer right"}, t, &caller), AuthOutcome::kAccepted);
  EXPECT_EQ(CheckAuthorization({"bearer right"}, t, &caller), AuthOutcome::kAccepted);  // scheme: any case
  EXPECT_EQ(CheckAuthorization({"BEARER  right "}, t, &caller), AuthOutcome::kAccepted);
  EXPECT_EQ(CheckAuthorization({"Bearer wrong"}, t, &caller), AuthOutcome::kInvalid);
  EXPECT_EQ(CheckAuthorization({"Bearer Right"}, t, &caller), AuthOutcome::kInvalid);  // tokens: exact
  EXPECT_EQ(CheckAuthorization({"right"}, t, &caller), AuthOutcome::kInvalid);
  EXPECT_EQ(CheckAuthorization({"Basic cmlnaHQ6"}, t, &caller), AuthOutcome::kInvalid);
  // One accepted value among several is enough.
  EXPECT_EQ(CheckAuthorization({"Bearer wrong", "Bearer right"}, t, &caller), AuthOutcome::kAccepted);
  EXPECT_EQ(AuthFailureReason(AuthOutcome::kMissing), "missing");
  EXPECT_EQ(AuthFailureReason(AuthOutcome::kInvalid), "invalid");
}

TEST(ParseAuthTokensTest, FieldsNameTheUserTeamAndRoleAndABareTokenIsAnAdmin) {
  auto tokens = ParseAuthTokens(
      "tok-a user=alice team=vision role=member\n"
      "tok-b\trole=viewer   user=bob team=vision\n"
      "tok-c user=root role=admin\n"
      "tok-d\n");
  ASSERT_OK(tokens) << tokens.status();
  ASSERT_EQ(tokens->size(), 4u);
  const auto is = [](const TokenIdentity& t, const char* user, const char* team, Role role,
                     bool bare) {
    return t.caller.user == user && t.caller.team == team && t.caller.role == role &&
           t.bare == bare;
  };
  EXPECT_TRUE(is((*tokens)[0], "alice", "vision", Role::kMember, false));
  EXPECT_TRUE(is((*tokens)[1], "bob", "vision", Role::kViewer, false));
  EXPECT_TRUE(is((*tokens)[2], "root", "", Role::kAdmin, false));
  EXPECT_TRUE(is((*tokens)[3], "admin", "", Role::kAdmin, true));
}

TEST(ParseAuthTokensTest, ABadFieldIsNamedWithItsLineAndNeverTheToken) {
  const std::pair<const char*, const char*> cases[] = {
      {"secret-1 user=al team=t\n", "line 1: role= is required"},
      {"secret-1 user=al team=t role=boss\n", "role=boss: must be viewer, member or admin"},
      {"# c\nsecret-1 team=t role=member\n", "line 2: user= is required"},
      {"secret-1 user=al role=viewer\n", "team= is required"},
      {"secret-1 user=al team=t role=member colour=red\n", "field 4 is not user=, team= or role="},
      {"secret-1 user=al user=bo team=t role=member\n", "user= given twice"},
      {"secret-1 user=a/l team=t role=member\n", "user=a/l: 1 to 64 letters"},
      {"secret-1 user=al team=t role=member\nsecret-1 user=bo team=t role=viewer\n",
       "line 2: repeats the token of line 1"},
  };
  for (const auto& [text, expected] : cases) {
    auto tokens = ParseAuthTokens(text);
    ASSERT_FALSE(tokens.ok()) << text;
    EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokens.status().message(), HasSubstr(expected)) << text;
    EXPECT_THAT(tokens.status().message(), Not(HasSubstr("secret"))) << text;
  }
}

TEST_F(AuthTokensFileTest, FindSaysWhoATokenIsAndCountsTheBareOnes) {
  WriteFile(path_, "tok-a user=alice team=vision role=member\ntok-b\n");
  auto tokens = AuthTokens::Load(path_);
  ASSERT_OK(tokens) << tokens.status();
  std::optional<Caller> alice = (*tokens)->Find("tok-a");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->user, "alice");
  EXPECT_EQ(alice->team, "vision");
  EXPECT_EQ(alice->role, Role::kMember);
  std::optional<Caller> bare = (*tokens)->Find("tok-b");
  ASSERT_TRUE(bare.has_value());
  EXPECT_EQ(bare->role, Role::kAdmin);
  EXPECT_FALSE((*tokens)->Find("tok-c").has_value());
  EXPECT_EQ((*tokens)->bare_tokens(), 1);

  Caller caller;
  EXPECT_EQ(CheckAuthorization({"Bearer tok-a"}, **tokens, &caller), AuthOutcome::kAccepted);
  EXPECT_EQ(caller.user, "alice");

  // A reload changes who a token is, without a restart.
  WriteFile(path_, "tok-a user=alice team=vision role=viewer\n");
  ASSERT_OK((*tokens)->Reload());
  EXPECT_EQ((*tokens)->Find("tok-a")->role, Role::kViewer);
  EXPECT_EQ((*tokens)->bare_tokens(), 0);
}

}  // namespace
}  // namespace kiln::server
