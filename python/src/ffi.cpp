// XLA FFI handlers: scalemm's ops inside jax.jit (scalemm.jax registers them with jax.ffi).
//
// Each op has a Host handler (XLA's cpu platform: the library's host path, the reference emulator)
// and a CUDA one (XLA's stream, the device's current context). The library checks every call as it
// runs; scalemm.jax ran the same checks (ffi_calls.cpp) at trace time, so an error here is one only
// the data can show (a NaN scale in host memory, invalid device-side group sizes). Library errors come
// back as FFI errors whose text starts with the status name ("SCALEMM_STATUS_INVALID_LAYOUT: ...").
//
// Command buffers: no handler carries the command-buffer trait. The library allocates a stream's
// cuBLASLt workspace and grows its scratch on the stream's first call of a larger problem (cudaMalloc
// and a synchronisation), which a CUDA graph capture cannot contain; XLA runs the call outside its
// command buffers instead. GEMM workspace: the library's per-stream one (XLA keeps one compute stream
// per device, so it is allocated once); the quantizer's scratch is an extra result XLA allocates.
//
// Built only where jaxlib's FFI headers were found at configure time (SCALEMM_XLA_FFI); otherwise the
// module says why (ffi_unavailable), and scalemm.jax raises that at import.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace nb = nanobind;

#ifndef SCALEMM_XLA_FFI

void scalemm_register_ffi(nb::module_& m) {
  m.attr("ffi_unavailable") = "the extension was built without jaxlib's XLA FFI headers (jax was not importable by "
                              "the Python that configured the build)";
}

#else

#include "ffi_calls.hpp"
#include "scalemm/detail/device_state.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/quantize.hpp"
#include "scalemm/status.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using namespace scalemm;
using namespace scalemm::ffi_calls;

namespace {

using Buf = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;

Handle& handle() {
  static auto* h = new Handle();  // leaked: XLA may run a handler during interpreter teardown
  return *h;
}

ffi::ErrorCode ffi_code(StatusCode c) {
  switch (c) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kInvalidLayout: return ffi::ErrorCode::kInvalidArgument;
    case StatusCode::kUnsupported: return ffi::ErrorCode::kUnimplemented;
    case StatusCode::kOutOfMemory: return ffi::ErrorCode::kResourceExhausted;
    default: return ffi::ErrorCode::kInternal;
  }
}

template <class F>
ffi::Error guarded(const F& f) {
  try {
    f();
    return ffi::Error::Success();
  } catch (const Error& e) {
    return ffi::Error(ffi_code(e.code()), std::string(status_code_name(e.code())) + ": " + e.status().message);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("scalemm: ") + e.what());
  }
}

std::vector<int64_t> dims(const ffi::AnyBuffer& b) {
  auto d = b.dimensions();
  return std::vector<int64_t>(d.begin(), d.end());
}

int64_t k_of(const ffi::AnyBuffer& data, int64_t dtype) {
  const auto d = data.dimensions();
  return d.size() ? d.back() * (DType(dtype) == DType::kE2M1 ? 2 : 1) : 0;
}

OperandDesc operand(int64_t dtype, int64_t recipe, int64_t scale_dtype, const ffi::AnyBuffer& scale) {
  return OperandDesc{int(dtype), int(recipe), int(scale_dtype), dims(scale)};
}

// NVFP4's global decode scale is taken by value: on the device one 4-byte copy and a wait on the stream.
float global_of(const ffi::AnyBuffer& g, int64_t recipe, bool host, cudaStream_t stream) {
  if (Recipe(recipe) != Recipe::kNvfp4) return 1.0f;
  float v = 1.0f;
  if (host) return *static_cast<const float*>(g.untyped_data());
  if (cudaMemcpyAsync(&v, g.untyped_data(), sizeof v, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    throw Error(StatusCode::kCudaError, "scaled_mm: could not read the NVFP4 global decode scale");
  return v;
}

ffi::Error gemm(bool host, cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer ga, ffi::AnyBuffer gb,
                ffi::Result<ffi::AnyBuffer> d, int64_t recipe_a, int64_t recipe_b, int64_t dtype_a, int64_t dtype_b,
                int64_t sdtype_a, int64_t sdtype_b, int64_t format, int64_t d_dtype, bool fast_accum) {
  return guarded([&] {
    const detail::DeviceScope scope(host ? -1 : device);
    GemmDesc desc;
    desc.m = a.dimensions()[0], desc.n = b.dimensions()[0], desc.k = k_of(a, dtype_a);
    desc.a = operand(dtype_a, recipe_a, sdtype_a, sa);
    desc.b = operand(dtype_b, recipe_b, sdtype_b, sb);
    desc.format = int(format), desc.d_dtype = int(d_dtype), desc.fast_accum = fast_accum;
    Pointers p{a.untyped_data(), sa.untyped_data(), b.untyped_data(), sb.untyped_data(), d->untyped_data(),
               global_of(ga, recipe_a, host, stream), global_of(gb, recipe_b, host, stream)};
    const GemmArgs g = gemm_args(desc, p, host ? MemorySpace::kHost : MemorySpace::kDevice, host);
    handle().gemm(g, host ? nullptr : stream);
  });
}

ffi::Error grouped(bool host, cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                   ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer sizes, ffi::Result<ffi::AnyBuffer> d,
                   int64_t recipe_a, int64_t recipe_b, int64_t dtype_a, int64_t dtype_b, int64_t sdtype_a,
                   int64_t sdtype_b, int64_t format, int64_t d_dtype, int64_t group_dim, int64_t backend) {
  return guarded([&] {
    const detail::DeviceScope scope(host ? -1 : device);
    GroupedDesc desc;
    desc.group_dim = int(group_dim);
    desc.groups = int64_t(sizes.element_count());
    desc.sizes_int64 = sizes.element_type() == ffi::DataType::S64;
    desc.backend = int(backend);
    GemmDesc& e = desc.gemm;
    e.m = a.dimensions()[0], e.k = k_of(a, dtype_a);
    e.n = group_dim == 0 ? b.dimensions()[1] : b.dimensions()[0];
    e.a = operand(dtype_a, recipe_a, sdtype_a, sa);
    e.b = operand(dtype_b, recipe_b, sdtype_b, sb);
    e.format = int(format), e.d_dtype = int(d_dtype);
    Pointers p{a.untyped_data(), sa.untyped_data(), b.untyped_data(), sb.untyped_data(), d->untyped_data()};
    std::vector<int64_t> host_sizes;
    if (host) {  // host sizes are read here: the library takes them as int64
      host_sizes.resize(size_t(desc.groups));
      for (size_t i = 0; i < host_sizes.size(); ++i)
        host_sizes[i] = desc.sizes_int64 ? static_cast<const int64_t*>(sizes.untyped_data())[i]
                                         : static_cast<const int32_t*>(sizes.untyped_data())[i];
    }
    const GroupedGemmArgs g = grouped_args(desc, p, host ? host_sizes.data() : nullptr,
                                           host ? nullptr : sizes.untyped_data(),
                                           host ? MemorySpace::kHost : MemorySpace::kDevice);
    handle().grouped_gemm(g, host ? nullptr : stream);
  });
}

int src_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return int(DType::kF32);
    case ffi::DataType::F16: return int(DType::kF16);
    case ffi::DataType::BF16: return int(DType::kBF16);
    default: return -1;
  }
}

ffi::Error quantize(bool host, cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                    ffi::Result<ffi::AnyBuffer> data, ffi::Result<ffi::AnyBuffer> scales,
                    ffi::Result<ffi::AnyBuffer> data_t, ffi::Result<ffi::AnyBuffer> scales_t,
                    ffi::Result<ffi::AnyBuffer> global, ffi::Result<ffi::AnyBuffer> workspace, int64_t recipe,
                    int64_t data_dtype, int64_t format, bool rowwise, bool columnwise) {
  return guarded([&] {
    const detail::DeviceScope scope(host ? -1 : device);
    QuantizeDesc desc;
    desc.src_dtype = src_dtype(x.element_type());
    desc.rows = x.dimensions()[0], desc.cols = x.dimensions()[1];
    desc.recipe = int(recipe), desc.data_dtype = int(data_dtype), desc.format = int(format);
    desc.rowwise = rowwise, desc.columnwise = columnwise;
    const emulation::SourceMatrix s{x.untyped_data(), DType(desc.src_dtype), desc.rows, desc.cols, nullptr};
    const emulation::QuantizeConfig cfg = quantize_config(desc);
    const emulation::QuantizeOutputs out{
        rowwise ? data->untyped_data() : nullptr, rowwise ? scales->untyped_data() : nullptr,
        columnwise ? data_t->untyped_data() : nullptr, columnwise ? scales_t->untyped_data() : nullptr,
        Recipe(recipe) == Recipe::kNvfp4 ? static_cast<float*>(global->untyped_data()) : nullptr};
    emulation::validate(s, cfg, out);
    if (host) emulation::quantize_host(s, cfg, out);
    else
      scalemm::quantize::quantize(s, cfg, out, workspace->untyped_data(), workspace->size_bytes(), stream);
  });
}

ffi::Error dequantize(bool host, cudaStream_t stream, int32_t device, ffi::AnyBuffer data, ffi::AnyBuffer scales,
                      ffi::AnyBuffer global, ffi::Result<ffi::AnyBuffer> out, int64_t dtype, int64_t recipe,
                      int64_t scale_dtype, int64_t format, int64_t out_dtype) {
  return guarded([&] {
    const detail::DeviceScope scope(host ? -1 : device);
    emulation::QuantizedTensor t;
    t.data = data.untyped_data();
    t.dtype = DType(dtype);
    t.scales = scales.untyped_data();
    t.layout = layouts::ScaleLayout(Recipe(recipe), data.dimensions()[0], k_of(data, dtype), ScaleFormat(format));
    t.global_scale = Recipe(recipe) == Recipe::kNvfp4 ? static_cast<const float*>(global.untyped_data()) : nullptr;
    // The scale contract: structural rules always, content rules for host data.
    throw_if_any(check_scale(t.scales, operand(dtype, recipe, scale_dtype, scales), t.layout,
                             host ? MemorySpace::kHost : MemorySpace::kDevice, "scales", host));
    if (host) emulation::dequantize_host(t, out->untyped_data(), DType(out_dtype));
    else scalemm::quantize::dequantize(t, out->untyped_data(), DType(out_dtype), stream);
  });
}

// ---- bindings: one Host and one CUDA symbol per op -------------------------------------------------

// A GEMM's operand attributes, shared by the dense and the grouped call.
template <class B>
auto operand_attrs(B b) {
  return std::move(b).template Attr<int64_t>("recipe_a").template Attr<int64_t>("recipe_b")
      .template Attr<int64_t>("dtype_a").template Attr<int64_t>("dtype_b").template Attr<int64_t>("sdtype_a")
      .template Attr<int64_t>("sdtype_b").template Attr<int64_t>("format").template Attr<int64_t>("d_dtype");
}

template <class B>
auto gemm_binding(B b) {
  // One expression: Binding moves only into the next Binding (its move constructor is private).
  return operand_attrs(std::move(b).template Arg<Buf>().template Arg<Buf>().template Arg<Buf>().template Arg<Buf>()
                           .template Arg<Buf>().template Arg<Buf>().template Ret<Buf>())
      .template Attr<bool>("fast_accum");
}

template <class B>
auto grouped_binding(B b) {
  return operand_attrs(std::move(b).template Arg<Buf>().template Arg<Buf>().template Arg<Buf>().template Arg<Buf>()
                           .template Arg<Buf>().template Ret<Buf>())
      .template Attr<int64_t>("group_dim").template Attr<int64_t>("backend");
}

template <class B>
auto quantize_binding(B b) {
  return std::move(b).template Arg<Buf>().template Ret<Buf>().template Ret<Buf>()
      .template Ret<Buf>().template Ret<Buf>().template Ret<Buf>()
      .template Ret<Buf>()
      .template Attr<int64_t>("recipe").template Attr<int64_t>("data_dtype").template Attr<int64_t>("format")
      .template Attr<bool>("rowwise").template Attr<bool>("columnwise");
}

template <class B>
auto dequantize_binding(B b) {
  return std::move(b).template Arg<Buf>().template Arg<Buf>().template Arg<Buf>()
      .template Ret<Buf>()
      .template Attr<int64_t>("dtype").template Attr<int64_t>("recipe").template Attr<int64_t>("scale_dtype")
      .template Attr<int64_t>("format").template Attr<int64_t>("out_dtype");
}

auto host_bind() { return ffi::Ffi::Bind(); }
auto cuda_bind() { return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>(); }

ffi::Error gemm_host(Buf a, Buf b, Buf sa, Buf sb, Buf ga, Buf gb, Out d, int64_t ra, int64_t rb, int64_t ta,
                     int64_t tb, int64_t sta, int64_t stb, int64_t fmt, int64_t od, bool fast) {
  return gemm(true, nullptr, -1, a, b, sa, sb, ga, gb, d, ra, rb, ta, tb, sta, stb, fmt, od, fast);
}
ffi::Error gemm_cuda(cudaStream_t s, int32_t dev, Buf a, Buf b, Buf sa, Buf sb, Buf ga, Buf gb, Out d, int64_t ra,
                     int64_t rb, int64_t ta, int64_t tb, int64_t sta, int64_t stb, int64_t fmt, int64_t od, bool fast) {
  return gemm(false, s, dev, a, b, sa, sb, ga, gb, d, ra, rb, ta, tb, sta, stb, fmt, od, fast);
}
ffi::Error grouped_host(Buf a, Buf b, Buf sa, Buf sb, Buf sz, Out d, int64_t ra, int64_t rb, int64_t ta, int64_t tb,
                        int64_t sta, int64_t stb, int64_t fmt, int64_t od, int64_t dim, int64_t be) {
  return grouped(true, nullptr, -1, a, b, sa, sb, sz, d, ra, rb, ta, tb, sta, stb, fmt, od, dim, be);
}
ffi::Error grouped_cuda(cudaStream_t s, int32_t dev, Buf a, Buf b, Buf sa, Buf sb, Buf sz, Out d, int64_t ra,
                        int64_t rb, int64_t ta, int64_t tb, int64_t sta, int64_t stb, int64_t fmt, int64_t od,
                        int64_t dim, int64_t be) {
  return grouped(false, s, dev, a, b, sa, sb, sz, d, ra, rb, ta, tb, sta, stb, fmt, od, dim, be);
}
ffi::Error quantize_host(Buf x, Out q, Out sc, Out qt, Out st, Out g, Out ws, int64_t r, int64_t dt, int64_t fmt,
                         bool row, bool col) {
  return quantize(true, nullptr, -1, x, q, sc, qt, st, g, ws, r, dt, fmt, row, col);
}
ffi::Error quantize_cuda(cudaStream_t s, int32_t dev, Buf x, Out q, Out sc, Out qt, Out st, Out g, Out ws, int64_t r,
                         int64_t dt, int64_t fmt, bool row, bool col) {
  return quantize(false, s, dev, x, q, sc, qt, st, g, ws, r, dt, fmt, row, col);
}
ffi::Error dequantize_host(Buf q, Buf sc, Buf g, Out out, int64_t dt, int64_t r, int64_t sdt, int64_t fmt,
                           int64_t od) {
  return dequantize(true, nullptr, -1, q, sc, g, out, dt, r, sdt, fmt, od);
}
ffi::Error dequantize_cuda(cudaStream_t s, int32_t dev, Buf q, Buf sc, Buf g, Out out, int64_t dt, int64_t r,
                           int64_t sdt, int64_t fmt, int64_t od) {
  return dequantize(false, s, dev, q, sc, g, out, dt, r, sdt, fmt, od);
}

}  // namespace

#define SCALEMM_HANDLERS(op)                                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(scalemm_##op##_host, op##_host, op##_binding(host_bind()));        \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(scalemm_##op##_cuda, op##_cuda, op##_binding(cuda_bind()));
SCALEMM_HANDLERS(gemm)
SCALEMM_HANDLERS(grouped)
SCALEMM_HANDLERS(quantize)
SCALEMM_HANDLERS(dequantize)
#undef SCALEMM_HANDLERS

void scalemm_register_ffi(nb::module_& m) {
  using Op = std::tuple<int, int, int, std::vector<int64_t>>;  // dtype, recipe, scale dtype, scale shape
  auto desc = [](const Op& o) { return OperandDesc{std::get<0>(o), std::get<1>(o), std::get<2>(o), std::get<3>(o)}; };
  // (FFI API major, minor, the jaxlib whose headers the handlers were compiled against)
  m.def("ffi_api_version", [] { return nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR, SCALEMM_JAXLIB_VERSION); });
  m.def("ffi_targets", [] {
    auto cap = [](XLA_FFI_Error* (*f)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(f)); };
    nb::dict d;
    d["scalemm_scaled_mm"] = nb::make_tuple(cap(scalemm_gemm_host), cap(scalemm_gemm_cuda));
    d["scalemm_scaled_grouped_mm"] = nb::make_tuple(cap(scalemm_grouped_host), cap(scalemm_grouped_cuda));
    d["scalemm_quantize"] = nb::make_tuple(cap(scalemm_quantize_host), cap(scalemm_quantize_cuda));
    d["scalemm_dequantize"] = nb::make_tuple(cap(scalemm_dequantize_host), cap(scalemm_dequantize_cuda));
    return d;
  });
  // Trace-time checks: the handlers' own argument builders on placeholder addresses (nothing is read).
  m.def("ffi_check_gemm", [desc](int64_t mm, int64_t n, int64_t k, const Op& a, const Op& b, int format, int d_dtype,
                                 bool fast_accum) {
    GemmDesc d{mm, n, k, desc(a), desc(b), format, d_dtype, fast_accum};
    void* p = placeholder();
    gemm_args(d, Pointers{p, p, p, p, p}, MemorySpace::kDevice, false);
  });
  m.def("ffi_check_grouped", [desc](int group_dim, int64_t groups, bool sizes_int64, int64_t mm, int64_t n, int64_t k,
                                    const Op& a, const Op& b, int format, int d_dtype, int backend) {
    GroupedDesc d;
    d.gemm = GemmDesc{mm, n, k, desc(a), desc(b), format, d_dtype, false};
    d.group_dim = group_dim, d.groups = groups, d.sizes_int64 = sizes_int64, d.backend = backend;
    void* p = placeholder();
    // As the device call sees it: device-side sizes, so the rules on A's scales that make them
    // independent of the split apply on every platform.
    grouped_args(d, Pointers{p, p, p, p, p}, nullptr, p, MemorySpace::kDevice);
  });
  m.def("ffi_check_scale", [](int recipe, int64_t rows, int64_t k, int format, int scale_dtype,
                              std::vector<int64_t> shape, const std::string& argument) {
    const OperandDesc o{0, recipe, scale_dtype, std::move(shape)};
    const layouts::ScaleLayout l(Recipe(recipe), rows, k, ScaleFormat(format));
    throw_if_any(check_scale(placeholder(), o, l, MemorySpace::kDevice, argument.c_str(), false));
  });
  m.def("ffi_check_quantize", [](int src, int64_t rows, int64_t cols, int recipe, int data_dtype, int format,
                                 bool rowwise, bool columnwise) {
    check_quantize(QuantizeDesc{src, rows, cols, recipe, data_dtype, format, rowwise, columnwise});
  });
}

#endif  // SCALEMM_XLA_FFI
