// A fresh folder under gtest's TempDir for one test's files (rendezvous store, outputs).
#pragma once

#include <stdlib.h>

#include <string>

#include "gtest/gtest.h"

namespace kiln::testing {

inline std::string MakeTempFolder() {
  std::string pattern = ::testing::TempDir() + "kiln_dist_XXXXXX";
  char* made = mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr) << "mkdtemp " << pattern;
  return pattern;
}

}  // namespace kiln::testing
