// The C ABI: thin wrappers that translate exceptions into status codes.
#include "scalemm/scalemm.h"

#include <cstddef>
#include <cstring>
#include <string>

#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"
#include "scalemm/version.hpp"

// Every C enum value equals its C++ counterpart, and the ranges the C ABI checks come from the C++
// enums: adding a value to one side without the other fails to compile here.
#define SCALEMM_SAME(c, cpp) static_assert(int(c) == int(cpp), #c " differs from " #cpp)
SCALEMM_SAME(SCALEMM_STATUS_OK, scalemm::StatusCode::kOk);
SCALEMM_SAME(SCALEMM_STATUS_INVALID_ARGUMENT, scalemm::StatusCode::kInvalidArgument);
SCALEMM_SAME(SCALEMM_STATUS_INVALID_LAYOUT, scalemm::StatusCode::kInvalidLayout);
SCALEMM_SAME(SCALEMM_STATUS_UNSUPPORTED, scalemm::StatusCode::kUnsupported);
SCALEMM_SAME(SCALEMM_STATUS_CUDA_ERROR, scalemm::StatusCode::kCudaError);
SCALEMM_SAME(SCALEMM_STATUS_CUBLAS_ERROR, scalemm::StatusCode::kCublasError);
SCALEMM_SAME(SCALEMM_STATUS_OUT_OF_MEMORY, scalemm::StatusCode::kOutOfMemory);
SCALEMM_SAME(SCALEMM_STATUS_VERIFICATION_FAILED, scalemm::StatusCode::kVerificationFailed);
SCALEMM_SAME(SCALEMM_STATUS_IO_ERROR, scalemm::StatusCode::kIoError);
SCALEMM_SAME(SCALEMM_STATUS_INTERNAL, scalemm::StatusCode::kInternal);
static_assert(scalemm::kStatusCodeCount == SCALEMM_STATUS_INTERNAL + 1, "a status code without a C value");
SCALEMM_SAME(SCALEMM_DTYPE_F32, scalemm::DType::kF32);
SCALEMM_SAME(SCALEMM_DTYPE_F16, scalemm::DType::kF16);
SCALEMM_SAME(SCALEMM_DTYPE_BF16, scalemm::DType::kBF16);
SCALEMM_SAME(SCALEMM_DTYPE_E4M3, scalemm::DType::kE4M3);
SCALEMM_SAME(SCALEMM_DTYPE_E5M2, scalemm::DType::kE5M2);
SCALEMM_SAME(SCALEMM_DTYPE_E2M1, scalemm::DType::kE2M1);
SCALEMM_SAME(SCALEMM_DTYPE_E8M0, scalemm::DType::kE8M0);
SCALEMM_SAME(SCALEMM_DTYPE_UE4M3, scalemm::DType::kUE4M3);
SCALEMM_SAME(SCALEMM_DTYPE_U8, scalemm::DType::kU8);
static_assert(scalemm::kDTypeCount == SCALEMM_DTYPE_U8 + 1, "a dtype without a C value");
SCALEMM_SAME(SCALEMM_RECIPE_TENSORWISE, scalemm::Recipe::kTensorwise);
SCALEMM_SAME(SCALEMM_RECIPE_ROWWISE, scalemm::Recipe::kRowwise);
SCALEMM_SAME(SCALEMM_RECIPE_BLOCK1X128, scalemm::Recipe::kBlock1x128);
SCALEMM_SAME(SCALEMM_RECIPE_BLOCK128X128, scalemm::Recipe::kBlock128x128);
SCALEMM_SAME(SCALEMM_RECIPE_MXFP8, scalemm::Recipe::kMxfp8);
SCALEMM_SAME(SCALEMM_RECIPE_MXFP8_32X32, scalemm::Recipe::kMxfp8_32x32);
SCALEMM_SAME(SCALEMM_RECIPE_NVFP4, scalemm::Recipe::kNvfp4);
static_assert(scalemm::kAllRecipes.size() == SCALEMM_RECIPE_NVFP4, "a recipe without a C value");
SCALEMM_SAME(SCALEMM_SCALE_FORMAT_COMPACT, scalemm::ScaleFormat::kCompact);
SCALEMM_SAME(SCALEMM_SCALE_FORMAT_CUBLASLT, scalemm::ScaleFormat::kCublasLt);
SCALEMM_SAME(SCALEMM_BACKEND_NATIVE, scalemm::Backend::kNative);
SCALEMM_SAME(SCALEMM_BACKEND_CONVERT_NATIVE, scalemm::Backend::kConvertNative);
SCALEMM_SAME(SCALEMM_BACKEND_EMULATED, scalemm::Backend::kEmulated);
SCALEMM_SAME(SCALEMM_BACKEND_REFERENCE, scalemm::Backend::kReference);
SCALEMM_SAME(SCALEMM_BACKEND_CONTIGUOUS, scalemm::Backend::kContiguous);
static_assert(scalemm::kBackendCount == SCALEMM_BACKEND_CONTIGUOUS + 1, "a backend without a C value");
SCALEMM_SAME(SCALEMM_GROUP_DIM_M, scalemm::GroupDim::kM);
SCALEMM_SAME(SCALEMM_GROUP_DIM_K, scalemm::GroupDim::kK);
SCALEMM_SAME(SCALEMM_GROUPED_BACKEND_AUTO, scalemm::GroupedBackend::kAuto);
SCALEMM_SAME(SCALEMM_GROUPED_BACKEND_CUTLASS, scalemm::GroupedBackend::kCutlass);
SCALEMM_SAME(SCALEMM_GROUPED_BACKEND_PER_GROUP, scalemm::GroupedBackend::kPerGroup);
SCALEMM_SAME(SCALEMM_GROUPED_BACKEND_CONTIGUOUS, scalemm::GroupedBackend::kContiguous);
SCALEMM_SAME(SCALEMM_MEMORY_HOST, scalemm::MemorySpace::kHost);
SCALEMM_SAME(SCALEMM_MEMORY_DEVICE, scalemm::MemorySpace::kDevice);
#undef SCALEMM_SAME

namespace {

thread_local std::string g_last_error;

// The valid range of each enum, from the enums themselves.
template <typename Enum> struct Range;
template <> struct Range<scalemm::DType> { static constexpr int lo = 0, hi = scalemm::kDTypeCount - 1; };
template <> struct Range<scalemm::Recipe> {
  static constexpr int lo = int(scalemm::kAllRecipes.front()), hi = int(scalemm::kAllRecipes.back());
};
template <> struct Range<scalemm::ScaleFormat> {
  static constexpr int lo = int(scalemm::ScaleFormat::kCompact), hi = int(scalemm::ScaleFormat::kCublasLt);
};
template <> struct Range<scalemm::Backend> { static constexpr int lo = 0, hi = scalemm::kBackendCount - 1; };
template <> struct Range<scalemm::MemorySpace> {
  static constexpr int lo = int(scalemm::MemorySpace::kHost), hi = int(scalemm::MemorySpace::kDevice);
};
template <> struct Range<scalemm::GroupDim> {
  static constexpr int lo = int(scalemm::GroupDim::kM), hi = int(scalemm::GroupDim::kK);
};
template <> struct Range<scalemm::GroupedBackend> {
  static constexpr int lo = int(scalemm::GroupedBackend::kAuto), hi = int(scalemm::GroupedBackend::kContiguous);
};
template <> struct Range<scalemm::Autotune> {
  static constexpr int lo = int(scalemm::Autotune::kFromEnvironment), hi = int(scalemm::Autotune::kOn);
};

// to_string() views point into string literals, so .data() is a NUL-terminated static string.
template <typename Enum>
const char* enum_name(int value) {
  if (value < Range<Enum>::lo || value > Range<Enum>::hi) return "unknown";
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
Enum checked_enum(int32_t v, const std::string& field) {
  constexpr int lo = Range<Enum>::lo, hi = Range<Enum>::hi;
  require(v >= lo && v <= hi, std::string(field) + ": value " + std::to_string(v) + " is outside the enum [" +
                                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<Enum>(v);
}

scalemm::GemmOperand operand_from(const scalemm_operand_t& o, const char* name) {
  scalemm::GemmOperand op;
  op.data = o.data;
  op.dtype = checked_enum<scalemm::DType>(o.dtype, std::string(name) + ".dtype");
  op.recipe = checked_enum<scalemm::Recipe>(o.recipe, std::string(name) + ".recipe");
  op.scale = o.scale;
  op.scale_format =
      checked_enum<scalemm::ScaleFormat>(o.scale_format, std::string(name) + ".scale_format");
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
  a.d_dtype = checked_enum<scalemm::DType>(g->d_dtype, "gemm.d_dtype");
  a.bias = g->bias;
  a.alpha = g->alpha;
  a.space = checked_enum<scalemm::MemorySpace>(g->memory_space, "gemm.memory_space");
  if (g->struct_size >= offsetof(scalemm_gemm_t, d_amax) + sizeof(float*)) {
    a.d_scale = g->d_scale;
    a.d_amax = g->d_amax;
  }
  if (g->struct_size >= offsetof(scalemm_gemm_t, fast_accum) + sizeof(int32_t)) {
    require(g->fast_accum == 0 || g->fast_accum == 1,
            "gemm.fast_accum: expected 0 or 1, got " + std::to_string(g->fast_accum));
    a.fast_accum = g->fast_accum == 1;
  }
  return a;
}

scalemm::GroupedGemmArgs grouped_from(const scalemm_grouped_gemm_t* g) {
  require(g != nullptr, "grouped_gemm: null descriptor");
  require(g->struct_size >= offsetof(scalemm_grouped_gemm_t, memory_space) + sizeof(int32_t),
          "grouped_gemm.struct_size: " + std::to_string(g->struct_size) +
              " is smaller than scalemm_grouped_gemm_t; set it to sizeof(scalemm_grouped_gemm_t)");
  scalemm::GroupedGemmArgs a;
  a.group_dim = checked_enum<scalemm::GroupDim>(g->group_dim, "grouped_gemm.group_dim");
  a.groups = g->groups;
  a.group_sizes = g->group_sizes;
  a.m = g->m, a.n = g->n, a.k = g->k;
  a.a = operand_from(g->a, "grouped_gemm.a");
  a.b = operand_from(g->b, "grouped_gemm.b");
  a.d = g->d;
  a.d_dtype = checked_enum<scalemm::DType>(g->d_dtype, "grouped_gemm.d_dtype");
  a.alpha = g->alpha;
  a.space = checked_enum<scalemm::MemorySpace>(g->memory_space, "grouped_gemm.memory_space");
  if (g->struct_size >= offsetof(scalemm_grouped_gemm_t, backend) + sizeof(int32_t)) {
    a.group_sizes_device = g->group_sizes_device;
    require(g->group_sizes_int64 == 0 || g->group_sizes_int64 == 1,
            "grouped_gemm.group_sizes_int64: expected 0 (int32) or 1 (int64), got " + std::to_string(g->group_sizes_int64));
    a.group_sizes_int64 = g->group_sizes_int64 == 1;
    a.device_status = g->device_status;
    a.backend = checked_enum<scalemm::GroupedBackend>(g->backend, "grouped_gemm.backend");
  }
  if (g->struct_size >= offsetof(scalemm_grouped_gemm_t, graph_replay) + sizeof(int32_t)) {
    require(g->graph_replay == 0 || g->graph_replay == 1,
            "grouped_gemm.graph_replay: expected 0 or 1, got " + std::to_string(g->graph_replay));
    a.graph_replay = g->graph_replay == 1;
  }
  if (g->struct_size >= offsetof(scalemm_grouped_gemm_t, fast_accum) + sizeof(int32_t)) {
    require(g->fast_accum == 0 || g->fast_accum == 1,
            "grouped_gemm.fast_accum: expected 0 or 1, got " + std::to_string(g->fast_accum));
    a.fast_accum = g->fast_accum == 1;
  }
  return a;
}

void copy_text(const std::string& text, char* buf, size_t buf_size, size_t* needed) {
  if (needed) *needed = text.size() + 1;
  if (buf && buf_size) {
    const size_t n = text.size() < buf_size - 1 ? text.size() : buf_size - 1;
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
}

}  // namespace

struct scalemm_handle {
  scalemm::Handle impl;
  explicit scalemm_handle(scalemm::HandleOptions o) : impl(o) {}
};


extern "C" {

const char* scalemm_version(void) { return SCALEMM_VERSION_STRING; }

const char* scalemm_status_string(int status) {
  if (status < 0 || status >= scalemm::kStatusCodeCount) return "SCALEMM_STATUS_UNKNOWN";
  return scalemm::status_code_name(static_cast<scalemm::StatusCode>(status));
}

const char* scalemm_dtype_name(int dtype) {
  return enum_name<scalemm::DType>(dtype);
}
const char* scalemm_recipe_name(int recipe) { return enum_name<scalemm::Recipe>(recipe); }
const char* scalemm_scale_format_name(int format) {
  return enum_name<scalemm::ScaleFormat>(format);
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
        o.plan.force = checked_enum<scalemm::Backend>(options->force_backend, "options.force_backend");
      if (options->struct_size >= offsetof(scalemm_handle_options_t, autotune) + sizeof(int32_t))
        o.autotune = checked_enum<scalemm::Autotune>(options->autotune, "options.autotune");
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
    copy_text(text, buf, buf_size, needed);
  });
}

scalemm_status_t scalemm_grouped_gemm(scalemm_handle_t handle, const scalemm_grouped_gemm_t* gemm, void* stream) {
  return guarded([&] {
    require(handle != nullptr, "handle: null");
    handle->impl.grouped_gemm(grouped_from(gemm), static_cast<scalemm::Stream>(stream));
  });
}

scalemm_status_t scalemm_grouped_plan_explain(scalemm_handle_t handle, const scalemm_grouped_gemm_t* gemm, char* buf,
                                              size_t buf_size, size_t* needed) {
  return guarded([&] {
    require(handle != nullptr, "handle: null");
    copy_text(handle->impl.explain(grouped_from(gemm)), buf, buf_size, needed);
  });
}

scalemm_status_t scalemm_grouped_graph_counts(scalemm_handle_t handle, uint64_t* captures, uint64_t* replays) {
  return guarded([&] {
    require(handle != nullptr, "handle: null");
    const scalemm::Handle::GraphCounts c = handle->impl.grouped_graph_counts();
    if (captures) *captures = c.captures;
    if (replays) *replays = c.replays;
  });
}

const char* scalemm_backend_name(int backend) {
  return enum_name<scalemm::Backend>(backend);
}

}  // extern "C"
