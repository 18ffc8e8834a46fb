// The C ABI: thin wrappers that translate exceptions into status codes.
#include "scalemm/scalemm.h"

#include <cstddef>
#include <cstring>
#include <string>

#include "scalemm/gemm.hpp"
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

// Runs `fn`, turning every exception into a status code and the thread's last error message.
template <typename Fn>
scalemm_status_t guarded(Fn&& fn) {
  try {
    fn();
    g_last_error.clear();
    return SCALEMM_STATUS_OK;
  } catch (const scalemm::Error& e) {
    g_last_error = e.what();
    return static_cast<scalemm_status_t>(e.code());
  } catch (const std::bad_alloc&) {
    g_last_error = "SCALEMM_STATUS_OUT_OF_MEMORY: host allocation failed";
    return SCALEMM_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    g_last_error = std::string("SCALEMM_STATUS_INTERNAL: ") + e.what();
    return SCALEMM_STATUS_INTERNAL;
  }
}

void require(bool cond, const std::string& what) {
  if (!cond) throw scalemm::Error(scalemm::StatusCode::kInvalidArgument, what);
}

template <typename Enum>
Enum checked_enum(int32_t v, int lo, int hi, const char* field) {
  require(v >= lo && v <= hi, std::string(field) + ": value " + std::to_string(v) + " is outside the enum [" +
                                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<Enum>(v);
}

scalemm::GemmOperand operand_from(const scalemm_operand_t& o, const char* name) {
  scalemm::GemmOperand op;
  op.data = o.data;
  op.dtype = checked_enum<scalemm::DType>(o.dtype, 0, scalemm::kDTypeCount - 1, (std::string(name) + ".dtype").c_str());
  op.recipe = checked_enum<scalemm::Recipe>(o.recipe, 1, 7, (std::string(name) + ".recipe").c_str());
  op.scale = o.scale;
  op.scale_format =
      checked_enum<scalemm::ScaleFormat>(o.scale_format, 0, 1, (std::string(name) + ".scale_format").c_str());
  op.global_scale = o.global_scale;
  return op;
}

// The fields of scalemm_gemm_t that the caller's struct_size covers.
scalemm::GemmArgs args_from(const scalemm_gemm_t* g) {
  require(g != nullptr, "gemm: null descriptor");
  require(g->struct_size >= offsetof(scalemm_gemm_t, memory_space) + sizeof(int32_t),
          "gemm.struct_size: " + std::to_string(g->struct_size) + " is smaller than the first version of "
          "scalemm_gemm_t (" + std::to_string(offsetof(scalemm_gemm_t, memory_space) + sizeof(int32_t)) +
          "); set it to sizeof(scalemm_gemm_t)");
  scalemm::GemmArgs a;
  a.m = g->m, a.n = g->n, a.k = g->k;
  a.a = operand_from(g->a, "gemm.a");
  a.b = operand_from(g->b, "gemm.b");
  a.d = g->d;
  a.d_dtype = checked_enum<scalemm::DType>(g->d_dtype, 0, scalemm::kDTypeCount - 1, "gemm.d_dtype");
  a.bias = g->bias;
  a.alpha = g->alpha;
  a.space = checked_enum<scalemm::MemorySpace>(g->memory_space, 0, 1, "gemm.memory_space");
  if (g->struct_size >= offsetof(scalemm_gemm_t, d_amax) + sizeof(float*)) {
    a.d_scale = g->d_scale;
    a.d_amax = g->d_amax;
  }
  return a;
}

}  // namespace

struct scalemm_handle {
  scalemm::Handle impl;
  explicit scalemm_handle(scalemm::HandleOptions o) : impl(o) {}
};

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

scalemm_status_t scalemm_handle_create(scalemm_handle_t* handle, const scalemm_handle_options_t* options) {
  return guarded([&] {
    require(handle != nullptr, "handle: null output pointer");
    *handle = nullptr;
    scalemm::HandleOptions o;
    if (options) {
      require(options->struct_size >= offsetof(scalemm_handle_options_t, autotune),
              "options.struct_size: set it to sizeof(scalemm_handle_options_t)");
      o.plan.strict = options->strict != 0;
      if (options->force_backend >= 0)
        o.plan.force = checked_enum<scalemm::Backend>(options->force_backend, 0, 3, "options.force_backend");
      if (options->struct_size >= offsetof(scalemm_handle_options_t, autotune) + sizeof(int32_t))
        o.autotune = checked_enum<scalemm::Autotune>(options->autotune, 0, 2, "options.autotune");
    }
    *handle = new scalemm_handle(o);
  });
}

scalemm_status_t scalemm_handle_destroy(scalemm_handle_t handle) {
  return guarded([&] { delete handle; });
}

scalemm_status_t scalemm_gemm(scalemm_handle_t handle, const scalemm_gemm_t* gemm, void* stream) {
  return guarded([&] {
    require(handle != nullptr, "handle: null");
    handle->impl.gemm(args_from(gemm), static_cast<scalemm::Stream>(stream));
  });
}

scalemm_status_t scalemm_plan_explain(scalemm_handle_t handle, const scalemm_gemm_t* gemm, int32_t* backend,
                                      char* buf, size_t buf_size, size_t* needed) {
  return guarded([&] {
    require(handle != nullptr, "handle: null");
    const scalemm::GemmArgs args = args_from(gemm);
    scalemm::throw_if_any(scalemm::validate(args), scalemm::StatusCode::kInvalidArgument);
    const scalemm::Plan plan = handle->impl.plan(args);
    const std::string text = "backend " + std::string(scalemm::to_string(plan.backend)) + ": " + plan.explain();
    if (backend) *backend = static_cast<int32_t>(plan.backend);
    if (needed) *needed = text.size() + 1;
    if (buf && buf_size) {
      const size_t n = text.size() < buf_size - 1 ? text.size() : buf_size - 1;
      std::memcpy(buf, text.data(), n);
      buf[n] = '\0';
    }
  });
}

const char* scalemm_backend_name(int backend) {
  if (backend < 0 || backend > 3) return "unknown";
  return scalemm::to_string(static_cast<scalemm::Backend>(backend)).data();
}

}  // extern "C"
