// The property check of the libFuzzer targets in this folder: a failed check prints the target's file,
// the condition and the line, then aborts (libFuzzer saves the input that did it).
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s: check failed: %s (line %d)\n", __FILE__, #cond, __LINE__);     \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
