// ASSERT_OK / EXPECT_OK for absl::Status, absl::StatusOr and grpc::Status: a failure prints the
// status, where a bare ASSERT_TRUE(x.ok()) prints only "false". Debian's Abseil has no gtest
// status matchers. Further context streams as with any assertion: ASSERT_OK(s) << "while ...".
#pragma once

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::testing_internal {

inline std::string Describe(const absl::Status& s) { return s.ToString(); }
template <typename T>
std::string Describe(const absl::StatusOr<T>& s) {
  return s.status().ToString();
}
// grpc::Status (and anything else with error_code() and error_message()), without its headers.
template <typename S>
auto Describe(const S& s) -> decltype(s.error_message(), s.error_code(), std::string()) {
  std::ostringstream out;
  out << "gRPC code " << static_cast<int>(s.error_code()) << ": " << s.error_message();
  return out.str();
}

template <typename S>
::testing::AssertionResult IsOk(const char* expr, const S& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " is not OK: " << Describe(s);
}

}  // namespace kiln::testing_internal

#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::kiln::testing_internal::IsOk, expr)
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::kiln::testing_internal::IsOk, expr)
