/* scalemm C ABI: a stable, C99-compatible surface for frameworks that cannot consume C++.
 *
 * Rules of this header: no C++ types cross it; every function returns a scalemm_status_t (or a
 * pointer that is never NULL); enum values are fixed forever; new functions are only appended. */
#ifndef SCALEMM_SCALEMM_H
#define SCALEMM_SCALEMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes, identical to scalemm::StatusCode. */
typedef enum scalemm_status_t {
  SCALEMM_STATUS_OK = 0,
  SCALEMM_STATUS_INVALID_ARGUMENT = 1,
  SCALEMM_STATUS_INVALID_LAYOUT = 2,
  SCALEMM_STATUS_UNSUPPORTED = 3,
  SCALEMM_STATUS_CUDA_ERROR = 4,
  SCALEMM_STATUS_CUBLAS_ERROR = 5,
  SCALEMM_STATUS_OUT_OF_MEMORY = 6,
  SCALEMM_STATUS_VERIFICATION_FAILED = 7,
  SCALEMM_STATUS_IO_ERROR = 8,
  SCALEMM_STATUS_INTERNAL = 9
} scalemm_status_t;

/* Element types, identical to scalemm::DType. */
typedef enum scalemm_dtype_t {
  SCALEMM_DTYPE_F32 = 0,
  SCALEMM_DTYPE_F16 = 1,
  SCALEMM_DTYPE_BF16 = 2,
  SCALEMM_DTYPE_E4M3 = 3,
  SCALEMM_DTYPE_E5M2 = 4,
  SCALEMM_DTYPE_E2M1 = 5,
  SCALEMM_DTYPE_E8M0 = 6,
  SCALEMM_DTYPE_UE4M3 = 7,
  SCALEMM_DTYPE_U8 = 8
} scalemm_dtype_t;

/* Scaling recipes, identical to scalemm::Recipe. */
typedef enum scalemm_recipe_t {
  SCALEMM_RECIPE_TENSORWISE = 1,
  SCALEMM_RECIPE_ROWWISE = 2,
  SCALEMM_RECIPE_BLOCK1X128 = 3,
  SCALEMM_RECIPE_BLOCK128X128 = 4,
  SCALEMM_RECIPE_MXFP8 = 5,
  SCALEMM_RECIPE_MXFP8_32X32 = 6,
  SCALEMM_RECIPE_NVFP4 = 7
} scalemm_recipe_t;

/* Scale formats, identical to scalemm::ScaleFormat. */
typedef enum scalemm_scale_format_t {
  SCALEMM_SCALE_FORMAT_COMPACT = 0,
  SCALEMM_SCALE_FORMAT_CUBLASLT = 1
} scalemm_scale_format_t;

/* "0.1.0": the library's version (static storage). */
const char* scalemm_version(void);

/* "SCALEMM_STATUS_INVALID_LAYOUT" for 2; "SCALEMM_STATUS_UNKNOWN" for values outside the enum. */
const char* scalemm_status_string(int status);

/* Canonical names ("e4m3", "block128x128", "cublaslt"); "unknown" outside the enum. */
const char* scalemm_dtype_name(int dtype);
const char* scalemm_recipe_name(int recipe);
const char* scalemm_scale_format_name(int format);

/* Message of the last failing call on this thread ("" if none). Valid until the next call. */
const char* scalemm_last_error_message(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SCALEMM_SCALEMM_H */
