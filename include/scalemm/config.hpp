// Compiler portability shims shared by every scalemm header.
#pragma once

#if defined(__CUDACC__) || defined(__CUDA_ARCH__)
#define SCALEMM_HD __host__ __device__
#define SCALEMM_DEVICE_COMPILE 1
#else
#define SCALEMM_HD
#define SCALEMM_DEVICE_COMPILE 0
#endif

// True while compiling device code (the second nvcc pass).
#if defined(__CUDA_ARCH__)
#define SCALEMM_IN_DEVICE_PASS 1
#else
#define SCALEMM_IN_DEVICE_PASS 0
#endif

// A precondition the optimiser may rely on (undefined behaviour when false): lets it treat the
// signed 64-bit index arithmetic of offset formulas as unsigned, which drops the sign fix-ups of
// every division by a power of two.
#if defined(__GNUC__) || defined(__clang__) || defined(__CUDACC__)
#define SCALEMM_ASSUME(cond) \
  do {                       \
    if (!(cond)) __builtin_unreachable(); \
  } while (0)
#else
#define SCALEMM_ASSUME(cond) ((void)0)
#endif
