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
