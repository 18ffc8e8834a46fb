/* Compiled as strict C99: proves scalemm.h is a C header and the ABI answers from C. */
#include <scalemm/scalemm.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
#define EXPECT_STR(got, want)                                                          \
  do {                                                                                 \
    const char* g_ = (got);                                                            \
    if (g_ == NULL || strcmp(g_, (want)) != 0) {                                       \
      fprintf(stderr, "%s:%d: %s = \"%s\", want \"%s\"\n", __FILE__, __LINE__, #got,   \
              g_ ? g_ : "(null)", (want));                                             \
      ++failures;                                                                      \
    }                                                                                  \
  } while (0)

int main(void) {
  const char* v = scalemm_version();
  if (v == NULL || strlen(v) < 5) {
    fprintf(stderr, "scalemm_version() returned an implausible string\n");
    ++failures;
  }
  EXPECT_STR(scalemm_status_string(SCALEMM_STATUS_OK), "SCALEMM_STATUS_OK");
  EXPECT_STR(scalemm_status_string(SCALEMM_STATUS_INVALID_LAYOUT), "SCALEMM_STATUS_INVALID_LAYOUT");
  EXPECT_STR(scalemm_status_string(SCALEMM_STATUS_INTERNAL), "SCALEMM_STATUS_INTERNAL");
  EXPECT_STR(scalemm_status_string(-1), "SCALEMM_STATUS_UNKNOWN");
  EXPECT_STR(scalemm_status_string(4242), "SCALEMM_STATUS_UNKNOWN");
  EXPECT_STR(scalemm_dtype_name(SCALEMM_DTYPE_E4M3), "e4m3");
  EXPECT_STR(scalemm_dtype_name(99), "unknown");
  EXPECT_STR(scalemm_recipe_name(SCALEMM_RECIPE_MXFP8_32X32), "mxfp8-32x32");
  EXPECT_STR(scalemm_recipe_name(0), "unknown");
  EXPECT_STR(scalemm_scale_format_name(SCALEMM_SCALE_FORMAT_CUBLASLT), "cublaslt");
  EXPECT_STR(scalemm_last_error_message(), "");
  EXPECT_STR(scalemm_backend_name(SCALEMM_BACKEND_EMULATED), "emulated");
  EXPECT_STR(scalemm_backend_name(SCALEMM_BACKEND_CONTIGUOUS), "contiguous");
  EXPECT_STR(scalemm_backend_name(SCALEMM_BACKEND_CONTIGUOUS + 1), "unknown");

  /* A host GEMM through the C ABI: A = 1.0 (e4m3 0x38), B = 2.0 (0x40), tensorwise scales 0.5 and 2,
   * K = 32: every D element is 32 * 1 * 2 * 0.5 * 2 = 64. */
  {
    enum { M = 4, N = 8, K = 32 };
    unsigned char a[M * K], b[N * K];
    float sa = 0.5f, sb = 2.0f, d[M * N];
    scalemm_handle_t h = NULL;
    scalemm_gemm_t g;
    char text[512];
    size_t needed = 0;
    int32_t backend = -1;
    int i, wrong = 0;
    memset(a, 0x38, sizeof a);
    memset(b, 0x40, sizeof b);
    for (i = 0; i < M * N; ++i) d[i] = -1.0f;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.m = M, g.n = N, g.k = K;
    g.a.data = a, g.a.dtype = SCALEMM_DTYPE_E4M3, g.a.recipe = SCALEMM_RECIPE_TENSORWISE, g.a.scale = &sa;
    g.a.scale_format = SCALEMM_SCALE_FORMAT_COMPACT, g.a.global_scale = 1.0f;
    g.b = g.a;
    g.b.data = b, g.b.scale = &sb;
    g.d = d, g.d_dtype = SCALEMM_DTYPE_F32, g.alpha = 1.0f, g.memory_space = SCALEMM_MEMORY_HOST;

    if (scalemm_handle_create(&h, NULL) != SCALEMM_STATUS_OK || h == NULL) {
      fprintf(stderr, "scalemm_handle_create failed: %s\n", scalemm_last_error_message());
      ++failures;
    } else {
      if (scalemm_plan_explain(h, &g, &backend, text, sizeof text, &needed) != SCALEMM_STATUS_OK ||
          backend != SCALEMM_BACKEND_REFERENCE || needed < 10 || strstr(text, "host") == NULL) {
        fprintf(stderr, "scalemm_plan_explain: backend %d, text \"%s\" (%s)\n", (int)backend, text,
                scalemm_last_error_message());
        ++failures;
      }
      g.k = 0; /* invalid: named error, output untouched */
      if (scalemm_gemm(h, &g, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT || d[0] != -1.0f ||
          strstr(scalemm_last_error_message(), "positive-extent") == NULL) {
        fprintf(stderr, "K=0 was not rejected with a named error: %s\n", scalemm_last_error_message());
        ++failures;
      }
      g.k = K;
      g.struct_size = 8; /* a struct from no version of the header */
      if (scalemm_gemm(h, &g, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT) {
        fprintf(stderr, "a short struct_size was accepted\n");
        ++failures;
      }
      g.struct_size = sizeof g;
      g.a.recipe = 42;
      if (scalemm_gemm(h, &g, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT) {
        fprintf(stderr, "recipe 42 was accepted\n");
        ++failures;
      }
      g.a.recipe = SCALEMM_RECIPE_TENSORWISE;
      if (scalemm_gemm(h, &g, NULL) != SCALEMM_STATUS_OK) {
        fprintf(stderr, "scalemm_gemm failed: %s\n", scalemm_last_error_message());
        ++failures;
      }
      for (i = 0; i < M * N; ++i) wrong += d[i] != 64.0f;
      if (wrong) {
        fprintf(stderr, "%d of %d outputs differ from 64 (d[0] = %g)\n", wrong, M * N, (double)d[0]);
        ++failures;
      }
      /* Grouped, m-grouped: rows {1, 0, 3} of A against three experts; tensorwise scales per group. */
      {
        scalemm_grouped_gemm_t gg;
        int64_t sizes[3] = {1, 0, 3};
        float gsa[3] = {0.5f, 0.5f, 0.5f}, gsb[3] = {2.0f, 2.0f, 2.0f};
        unsigned char gb[3 * N * K];
        memset(gb, 0x40, sizeof gb);
        memset(&gg, 0, sizeof gg);
        gg.struct_size = sizeof gg;
        gg.group_dim = SCALEMM_GROUP_DIM_M, gg.groups = 3, gg.group_sizes = sizes;
        gg.m = M, gg.n = N, gg.k = K;
        gg.a = g.a, gg.a.scale = gsa;
        gg.b = g.b, gg.b.data = gb, gg.b.scale = gsb;
        gg.d = d, gg.d_dtype = SCALEMM_DTYPE_F32, gg.alpha = 1.0f, gg.memory_space = SCALEMM_MEMORY_HOST;
        for (i = 0; i < M * N; ++i) d[i] = -1.0f;
        sizes[2] = 2; /* sizes no longer add up to M */
        if (scalemm_grouped_gemm(h, &gg, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT || d[0] != -1.0f ||
            strstr(scalemm_last_error_message(), "group-size-sum") == NULL) {
          fprintf(stderr, "bad group sizes were not rejected with a named error: %s\n", scalemm_last_error_message());
          ++failures;
        }
        sizes[2] = 3;
        if (scalemm_grouped_gemm(h, &gg, NULL) != SCALEMM_STATUS_OK) {
          fprintf(stderr, "scalemm_grouped_gemm failed: %s\n", scalemm_last_error_message());
          ++failures;
        }
        for (wrong = 0, i = 0; i < M * N; ++i) wrong += d[i] != 64.0f;
        if (wrong || scalemm_grouped_plan_explain(h, &gg, text, sizeof text, &needed) != SCALEMM_STATUS_OK ||
            strstr(text, "3 distinct group shape(s)") == NULL) {
          fprintf(stderr, "grouped: %d wrong outputs; explain \"%s\"\n", wrong, text);
          ++failures;
        }
        /* The 0.4 fields: a grouped backend outside the enum, and device-side sizes on a host call. */
        for (i = 0; i < M * N; ++i) d[i] = -1.0f;
        gg.backend = 7;
        if (scalemm_grouped_gemm(h, &gg, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT || d[0] != -1.0f ||
            strstr(scalemm_last_error_message(), "grouped_gemm.backend") == NULL) {
          fprintf(stderr, "an unknown grouped backend was not named: %s\n", scalemm_last_error_message());
          ++failures;
        }
        gg.backend = SCALEMM_GROUPED_BACKEND_PER_GROUP;
        gg.group_sizes = NULL, gg.group_sizes_device = sizes;
        if (scalemm_grouped_gemm(h, &gg, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT || d[0] != -1.0f ||
            strstr(scalemm_last_error_message(), "group-sizes-space") == NULL) {
          fprintf(stderr, "device-side sizes on a host call were not named: %s\n", scalemm_last_error_message());
          ++failures;
        }
        gg.group_sizes = sizes, gg.group_sizes_device = NULL;
        gg.backend = SCALEMM_GROUPED_BACKEND_CUTLASS; /* host memory: the CUTLASS kernel cannot run it */
        if (scalemm_grouped_gemm(h, &gg, NULL) != SCALEMM_STATUS_UNSUPPORTED || d[0] != -1.0f ||
            strstr(scalemm_last_error_message(), "CUTLASS grouped kernel cannot run this call") == NULL) {
          fprintf(stderr, "an impossible CUTLASS request was not refused: %s\n", scalemm_last_error_message());
          ++failures;
        }
        gg.backend = SCALEMM_GROUPED_BACKEND_AUTO;
        /* The 0.5 field: graph_replay outside 0/1 is named; on host arrays it has nothing to capture. */
        gg.graph_replay = 2;
        if (scalemm_grouped_gemm(h, &gg, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT || d[0] != -1.0f ||
            strstr(scalemm_last_error_message(), "grouped_gemm.graph_replay") == NULL) {
          fprintf(stderr, "a bad graph_replay was not named: %s\n", scalemm_last_error_message());
          ++failures;
        }
        gg.graph_replay = 1;
        {
          uint64_t captures = 7, replays = 7;
          if (scalemm_grouped_gemm(h, &gg, NULL) != SCALEMM_STATUS_OK || d[0] != 64.0f ||
              scalemm_grouped_graph_counts(h, &captures, &replays) != SCALEMM_STATUS_OK || captures != 0 ||
              replays != 0 || scalemm_grouped_graph_counts(NULL, NULL, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT) {
            fprintf(stderr, "graph_replay on host arrays: d[0] = %g, %llu captures: %s\n", (double)d[0],
                    (unsigned long long)captures, scalemm_last_error_message());
            ++failures;
          }
        }
        gg.graph_replay = 0;
      }
      /* FP8 output: D = e4m3(0.25 * 64) = 16.0 (0x58), amax 64. */
      {
        unsigned char d8[M * N];
        float ds = 0.25f, amax = -1.0f;
        int bad = 0;
        memset(d8, 0, sizeof d8);
        g.d = d8, g.d_dtype = SCALEMM_DTYPE_E4M3, g.d_scale = &ds, g.d_amax = &amax;
        if (scalemm_gemm(h, &g, NULL) != SCALEMM_STATUS_OK) {
          fprintf(stderr, "FP8 output failed: %s\n", scalemm_last_error_message());
          ++failures;
        }
        for (i = 0; i < M * N; ++i) bad += d8[i] != 0x58;
        if (bad || amax != 64.0f) {
          fprintf(stderr, "FP8 output: %d codes differ from 0x58, amax %g\n", bad, (double)amax);
          ++failures;
        }
        /* A struct from before d_scale existed: FP8 output is then a named error, nothing written. */
        memset(d8, 0, sizeof d8);
        g.struct_size = offsetof(scalemm_gemm_t, d_scale);
        if (scalemm_gemm(h, &g, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT ||
            strstr(scalemm_last_error_message(), "fp8-out-d-scale") == NULL || d8[0] != 0) {
          fprintf(stderr, "FP8 output without a D scale: %s\n", scalemm_last_error_message());
          ++failures;
        }
        g.struct_size = sizeof g;
        /* A D scale that cannot be meant (0, negative, NaN, inf) is refused by name, nothing written. */
        {
          const float bad_scales[] = {0.0f, -0.0f, -2.0f, NAN, INFINITY};
          size_t j;
          for (j = 0; j < sizeof bad_scales / sizeof bad_scales[0]; ++j) {
            ds = bad_scales[j];
            g.d_scale = &ds;
            memset(d8, 0, sizeof d8);
            if (scalemm_gemm(h, &g, NULL) != SCALEMM_STATUS_INVALID_ARGUMENT ||
                strstr(scalemm_last_error_message(), "d-scale-value") == NULL || d8[0] != 0) {
              fprintf(stderr, "D scale %g was not refused by name: %s\n", (double)ds, scalemm_last_error_message());
              ++failures;
            }
          }
        }
        g.d = d, g.d_dtype = SCALEMM_DTYPE_F32, g.d_scale = NULL, g.d_amax = NULL;
      }
      if (scalemm_handle_destroy(h) != SCALEMM_STATUS_OK) ++failures;
    }
    {
      scalemm_handle_options_t o;
      scalemm_handle_t h2 = NULL;
      memset(&o, 0, sizeof o);
      o.struct_size = sizeof o, o.force_backend = -1, o.autotune = 7;
      if (scalemm_handle_create(&h2, &o) != SCALEMM_STATUS_INVALID_ARGUMENT ||
          strstr(scalemm_last_error_message(), "options.autotune") == NULL) {
        fprintf(stderr, "autotune 7 was accepted: %s\n", scalemm_last_error_message());
        ++failures;
      }
      o.autotune = 1;
      if (scalemm_handle_create(&h2, &o) != SCALEMM_STATUS_OK || h2 == NULL) {
        fprintf(stderr, "autotune off was refused: %s\n", scalemm_last_error_message());
        ++failures;
      } else {
        scalemm_handle_destroy(h2);
      }
    }
  }

  printf("scalemm %s C ABI: %s\n", v ? v : "?", failures ? "FAILED" : "ok");
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
