// The C ABI: thin wrappers that translate exceptions into status codes.
#include "scalemm/scalemm.h"

#include <string>

#include "scalemm/status.hpp"
#include "scalemm/types.hpp"
#include "scalemm/version.hpp"

namespace {

thread_local std::string g_last_error;

// to_string() views point into string literals, so .data() is a NUL-terminated static string.
template <typename Enum>
const char* enum_name(int value, int lo, int hi) {
  if (value < lo || value > hi) return "unknown";
  return scalemm::to_string(static_cast<Enum>(value)).data();
}

}  // namespace

static_assert(SCALEMM_STATUS_INTERNAL == static_cast<int>(scalemm::StatusCode::kInternal),
              "C and C++ status codes must agree");
static_assert(SCALEMM_DTYPE_U8 == static_cast<int>(scalemm::DType::kU8), "C and C++ dtypes must agree");
static_assert(SCALEMM_RECIPE_NVFP4 == static_cast<int>(scalemm::Recipe::kNvfp4),
              "C and C++ recipes must agree");

extern "C" {

const char* scalemm_version(void) { return SCALEMM_VERSION_STRING; }

const char* scalemm_status_string(int status) {
  if (status < 0 || status >= scalemm::kStatusCodeCount) return "SCALEMM_STATUS_UNKNOWN";
  return scalemm::status_code_name(static_cast<scalemm::StatusCode>(status));
}

const char* scalemm_dtype_name(int dtype) {
  return enum_name<scalemm::DType>(dtype, 0, scalemm::kDTypeCount - 1);
}
const char* scalemm_recipe_name(int recipe) { return enum_name<scalemm::Recipe>(recipe, 1, 7); }
const char* scalemm_scale_format_name(int format) {
  return enum_name<scalemm::ScaleFormat>(format, 0, 1);
}

const char* scalemm_last_error_message(void) { return g_last_error.c_str(); }

}  // extern "C"
