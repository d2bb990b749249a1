// The fuzz targets' oracle: a broken promise of the code under test is a crash libFuzzer records.
#pragma once

#include <cstdio>
#include <cstdlib>

// Prints what was expected, where, and aborts, so libFuzzer saves the input as a crash.
#define KILN_FUZZ_CHECK(condition, ...)                                                            \
  do {                                                                                             \
    if (!(condition)) {                                                                            \
      std::fprintf(stderr, "%s:%d: KILN_FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #condition); \
      std::fprintf(stderr, __VA_ARGS__);                                                           \
      std::fprintf(stderr, "\n");                                                                  \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)
