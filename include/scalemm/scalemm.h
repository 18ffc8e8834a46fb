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

/* ---- scaled GEMM --------------------------------------------------------------------------------
 * D (M,N) = alpha * A (M,K) * B (N,K)^T (+ bias[N]): A and B row-major with K contiguous, as in a
 * linear layer Y = X W^T. Each operand carries its recipe, data dtype and scale format. */

typedef struct scalemm_handle* scalemm_handle_t;

/* Backends, identical to scalemm::Backend. */
typedef enum scalemm_backend_t {
  SCALEMM_BACKEND_NATIVE = 0,
  SCALEMM_BACKEND_CONVERT_NATIVE = 1,
  SCALEMM_BACKEND_EMULATED = 2,
  SCALEMM_BACKEND_REFERENCE = 3,
  SCALEMM_BACKEND_CONTIGUOUS = 4 /* added in 0.7: scalemm's blockwise kernel (sm_90, scales read in place, bf16 out), tried first */
} scalemm_backend_t;

typedef enum scalemm_memory_space_t {
  SCALEMM_MEMORY_HOST = 0,
  SCALEMM_MEMORY_DEVICE = 1
} scalemm_memory_space_t;

/* One input operand. `data`: (rows, K) e4m3/e5m2 bytes, or e2m1 packed two per byte (element 2i in
 * the low nibble). `scale`: the recipe's scale buffer in `scale_format`. `global_scale`: NVFP4's
 * per-tensor decode scale (1.0f otherwise). */
typedef struct scalemm_operand_t {
  const void* data;
  int32_t dtype;        /* scalemm_dtype_t */
  int32_t recipe;       /* scalemm_recipe_t */
  const void* scale;
  int32_t scale_format; /* scalemm_scale_format_t */
  float global_scale;
} scalemm_operand_t;

/* A GEMM call. Set struct_size = sizeof(scalemm_gemm_t): fields appended in later versions are then
 * read only when the caller's struct has them. */
typedef struct scalemm_gemm_t {
  size_t struct_size;
  int64_t m, n, k;
  scalemm_operand_t a, b;
  void* d;
  int32_t d_dtype;      /* SCALEMM_DTYPE_BF16, _F16, _F32, or _E4M3/_E5M2 with d_scale */
  const void* bias;     /* optional bf16 [N] */
  float alpha;
  int32_t memory_space; /* scalemm_memory_space_t: all pointers live there */
  /* Added in 0.2 (read when struct_size covers them). FP8 output: D = fp8(*d_scale * result),
   * saturating; *d_amax (optional) receives max |result| before d_scale. Both null otherwise.
   * *d_scale is positive and finite: in host memory 0, negative, NaN and inf are refused. */
  const float* d_scale;
  float* d_amax;
  /* Added in 0.6: 1 lets cuBLASLt's FP8 kernels skip the periodic fp32 promotion of their partial sums
   * (tensorwise and rowwise operands only; torch's use_fast_accum); 0 (default) accumulates exactly. */
  int32_t fast_accum;
} scalemm_gemm_t;

/* Handle options. strict != 0 refuses anything but the native backend (cuBLASLt; the contiguous backend
 * steps aside for it); force_backend >= 0 runs exactly that backend (an error when it cannot); -1 lets
 * the planner choose. autotune: 0 from SCALEMM_AUTOTUNE (default off), 1 off (cuBLASLt's first heuristic
 * choice), 2 on (time the candidates once per problem and keep the fastest); read only when struct_size
 * covers it. */
typedef struct scalemm_handle_options_t {
  size_t struct_size;
  int32_t strict;
  int32_t force_backend;
  int32_t autotune;
} scalemm_handle_options_t;

/* Creates a handle (options may be NULL for the defaults). One handle may serve many threads and every
 * device of the process: each call runs on its stream's device (the current device for the default
 * stream), with a plan and per-stream resources of that device. */
scalemm_status_t scalemm_handle_create(scalemm_handle_t* handle, const scalemm_handle_options_t* options);
scalemm_status_t scalemm_handle_destroy(scalemm_handle_t handle);

/* Validates, plans (cached per problem and device) and runs the GEMM on `stream` (a cudaStream_t; NULL
 * for the default stream of the current device), on the stream's device. Host memory runs the host
 * reference synchronously. On an error nothing is written to d and scalemm_last_error_message() names
 * the argument and the rule: device memory of another device than the stream's is
 * SCALEMM_STATUS_INVALID_ARGUMENT, rule pointer-device, naming both devices. */
scalemm_status_t scalemm_gemm(scalemm_handle_t handle, const scalemm_gemm_t* gemm, void* stream);

/* The plan for `gemm` on the current device without running it: the backend, and its explanation
 * (which backend, why the earlier ones were passed over, conversions, workspace, the device planned
 * for) copied into buf (NUL-terminated, truncated to buf_size). *needed (optional) receives the full
 * length + 1. */
scalemm_status_t scalemm_plan_explain(scalemm_handle_t handle, const scalemm_gemm_t* gemm, int32_t* backend,
                                      char* buf, size_t buf_size, size_t* needed);

/* ---- grouped (MoE) GEMM (added in 0.3; scalemm/grouped.hpp has the full contract) -------------------
 * m-grouped: A (sum M_g, K) rows grouped, B (G, N, K), D (sum M_g, N).
 * k-grouped: A (M, sum K_g), B (N, sum K_g), D (G, M, N); every K_g on both recipes' K-block bounds.
 * Scales: m-grouped A = each group's buffer in order (for per-row compact recipes, the whole tensor's
 * scales), B stacked per expert; k-grouped A and B = the whole tensors' scales. cuBLASLt-format group
 * buffers start 16-byte aligned. Output bf16, f16 or f32. */
typedef enum scalemm_group_dim_t {
  SCALEMM_GROUP_DIM_M = 0,
  SCALEMM_GROUP_DIM_K = 1
} scalemm_group_dim_t;

/* Which grouped backend runs a call (0.4): AUTO takes the contiguous kernel where it can run the call,
   else a CUTLASS kernel (except large groups with host sizes, measured faster per group), else the
   per-group backend. */
typedef enum scalemm_grouped_backend_t {
  SCALEMM_GROUPED_BACKEND_AUTO = 0,
  SCALEMM_GROUPED_BACKEND_CUTLASS = 1,   /* one launch for all groups (blockwise or rowwise FP8, sm_90, bf16 out) */
  SCALEMM_GROUPED_BACKEND_PER_GROUP = 2,  /* one dense call per non-empty group */
  SCALEMM_GROUPED_BACKEND_CONTIGUOUS = 3  /* one launch of scalemm's own kernel (m-grouped blockwise, sm_90, bf16 out) */
} scalemm_grouped_backend_t;

typedef struct scalemm_grouped_gemm_t {
  size_t struct_size;           /* sizeof(scalemm_grouped_gemm_t) */
  int32_t group_dim;            /* scalemm_group_dim_t */
  int64_t groups;               /* G >= 1 */
  const int64_t* group_sizes;   /* G sizes (M_g or K_g) in host memory, or NULL with group_sizes_device */
  int64_t m, n, k;              /* m-grouped: m = sum M_g; k-grouped: k = sum K_g */
  scalemm_operand_t a, b;
  void* d;
  int32_t d_dtype;
  float alpha;
  int32_t memory_space;         /* scalemm_memory_space_t: all pointers but group_sizes live there */
  /* Added in 0.4 (a struct_size that ends before them leaves them unset): */
  const void* group_sizes_device;  /* G sizes in device memory (the router's counts), or NULL: read on the
                                      device by the one-launch kernels, no host synchronisation */
  int32_t group_sizes_int64;       /* element type of group_sizes_device: 1 = int64, 0 = int32 */
  int32_t* device_status;          /* optional device word: 0, or 1 + the first bad group (G + 1: bad sum) */
  int32_t backend;                 /* scalemm_grouped_backend_t */
  /* Added in 0.5: */
  int32_t graph_replay;            /* 1: the per-group backend captures the whole call as a CUDA graph on its
                                      first run and replays it while the call repeats exactly (fixed sizes and
                                      buffers); scalemm_grouped_graph_counts reports captures and replays */
  /* Added in 0.6: */
  int32_t fast_accum;              /* as scalemm_gemm_t.fast_accum, for every group's cuBLASLt call */
} scalemm_grouped_gemm_t;

/* Validates every group, then runs each non-empty group on `stream` (one cached plan per distinct
 * group shape). On an error nothing is written to d. */
scalemm_status_t scalemm_grouped_gemm(scalemm_handle_t handle, const scalemm_grouped_gemm_t* gemm, void* stream);

/* The plan of each distinct group shape, copied into buf as scalemm_plan_explain does. */
scalemm_status_t scalemm_grouped_plan_explain(scalemm_handle_t handle, const scalemm_grouped_gemm_t* gemm, char* buf,
                                              size_t buf_size, size_t* needed);

/* Whole-call graphs of grouped calls made with graph_replay on this handle (0.5): how many were captured
 * and how many calls replayed one. Either pointer may be NULL. */
scalemm_status_t scalemm_grouped_graph_counts(scalemm_handle_t handle, uint64_t* captures, uint64_t* replays);

/* "native", "convert-native", "emulated", "reference", "contiguous"; "unknown" outside the enum. */
const char* scalemm_backend_name(int backend);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SCALEMM_SCALEMM_H */
