/* Compiled as strict C99: proves scalemm.h is a C header and the ABI answers from C. */
#include <scalemm/scalemm.h>
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
  printf("scalemm %s C ABI: %s\n", v ? v : "?", failures ? "FAILED" : "ok");
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
