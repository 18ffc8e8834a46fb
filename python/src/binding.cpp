// scalemm._scalemm: the thin layer between the Python package and the C++ library.
//
// Every function takes raw addresses (ints), element counts and enum values that the Python side has
// already read off the caller's arrays (NumPy, torch, CuPy, DLPack): that keeps one call to a few
// integer conversions, so the host overhead of a GEMM is the library's own plus a Python frame.
// Shape and dtype checks of the data live in Python; scale tensors are judged here by the library's
// own contract (layouts::validate_scale), so the error names the rule; what the package needs to know
// of a scale layout (sizes, padding, element types) it reads from ScaleLayout and RecipeLayout here,
// by name, and keeps no formulas of its own. Library errors become the
// Python classes registered with set_error_classes (scalemm.Error subclasses).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "scalemm/detail/device_state.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/scalemm.h"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"
#include "scalemm/moe.hpp"
#include "scalemm/quantize.hpp"

namespace nb = nanobind;
using namespace scalemm;

namespace {

// Python classes for each StatusCode (index = code), set once at import by scalemm/_errors.py.
std::vector<nb::object>& error_classes() {
  static auto* v = new std::vector<nb::object>();  // leaked: must outlive interpreter teardown order
  return *v;
}

[[noreturn]] void fail(StatusCode code, const std::string& message) { throw Error(code, message); }

void* ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }
MemorySpace space_of(int s) { return s == 0 ? MemorySpace::kHost : MemorySpace::kDevice; }

// The library allocates a stream's cuBLASLt workspace on the stream's first GEMM and grows its scratch
// on a stream's first call of a larger problem (cudaMalloc, and a synchronisation): neither may happen
// inside a CUDA graph capture. A call that would be the first of its problem on a capturing stream is
// refused with the fix instead of failing inside the capture. `seen` holds the streams on which this
// problem has already run.
// A stream's value names it only together with a device: the legacy default stream is 0 on every
// device, so the key is (current device, stream); the caller has made the arrays' device current.
using StreamKey = std::pair<int, uintptr_t>;
StreamKey stream_key(uintptr_t stream) { return {scalemm::detail::current_device(), stream}; }

void check_capture(std::set<StreamKey>& seen, uintptr_t stream, const std::string& problem) {
  if (seen.count(stream_key(stream))) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_of(stream), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone)
    throw Error(StatusCode::kUnsupported,
                "stream: first call of " + problem + " on this stream is inside a CUDA graph capture: expected the "
                "problem to have run on the capturing stream before, got a stream new to it. Run the call once "
                "on the capture stream before capturing (torch.cuda.graph(g, stream=s) after a warm-up under "
                "torch.cuda.stream(s)): the library allocates its per-stream workspace on first use.");
}

TensorRef tensor_ref(uintptr_t data, int dtype, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& strides, int space, const char* argument) {
  if (shape.size() != strides.size() || shape.size() > size_t(TensorRef::kMaxRank))
    fail(StatusCode::kInvalidArgument, std::string(argument) + ": a tensor of rank 0 to 4 with one stride per "
                                           "dimension is expected, got rank " + std::to_string(shape.size()));
  TensorRef t;
  t.data = ptr(data);
  t.dtype = DType(dtype);
  t.rank = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  t.space = space_of(space);
  return t;
}

// Structural rules always; content rules (NaN scales, nonzero padding) only for host data, where
// they cost no synchronisation.
Diagnostics check_scale(uintptr_t data, int dtype, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& strides, const layouts::ScaleLayout& layout, int space,
                        const char* argument, bool content) {
  const TensorRef t = tensor_ref(data, dtype, shape, strides, space, argument);
  layouts::ValidateOptions opt;
  opt.check_content = content && space == 0;
  opt.required_space = space_of(space);
  return layouts::validate_scale(t, layout, argument, opt);
}

struct ScaleArg {
  uintptr_t ptr;
  int dtype;
  std::vector<int64_t> shape, strides;
};

GemmOperand operand(uintptr_t data, int dtype, int recipe, const ScaleArg& s, int format, float global_scale) {
  GemmOperand o;
  o.data = ptr(data);
  o.dtype = DType(dtype);
  o.recipe = Recipe(recipe);
  o.scale = ptr(s.ptr);
  o.scale_format = ScaleFormat(format);
  o.global_scale = global_scale;
  return o;
}

using Operand = std::tuple<uintptr_t, int, int, uintptr_t, int, std::vector<int64_t>, std::vector<int64_t>, int, float>;
//                         data       dtype recipe scale  sdtype shape                 strides                fmt  global

ScaleArg scale_arg(const Operand& o) { return {std::get<3>(o), std::get<4>(o), std::get<5>(o), std::get<6>(o)}; }
GemmOperand operand(const Operand& o, const ScaleArg& s) {
  return operand(std::get<0>(o), std::get<1>(o), std::get<2>(o), s, std::get<7>(o), std::get<8>(o));
}

GemmArgs make_args(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, uintptr_t d, int d_dtype,
                   uintptr_t bias, float alpha, int space, bool check, bool fast_accum = false) {
  GemmArgs g;
  g.fast_accum = fast_accum;
  g.m = m;
  g.n = n;
  g.k = k;
  const ScaleArg sa = scale_arg(a), sb = scale_arg(b);
  g.a = operand(a, sa);
  g.b = operand(b, sb);
  g.d = ptr(d);
  g.d_dtype = DType(d_dtype);
  g.bias = ptr(bias);
  g.alpha = alpha;
  g.space = space_of(space);
  if (check) {
    // The scale tensors' own shapes and strides (the library sees only their addresses); for host
    // data also their content (NaN or non-positive scales, nonzero padding), which costs no sync.
    const layouts::ScaleLayout la(g.a.recipe, m, k, g.a.scale_format), lb(g.b.recipe, n, k, g.b.scale_format);
    Diagnostics diags;
    if (m >= 1 && k >= 1) diags = check_scale(sa.ptr, sa.dtype, sa.shape, sa.strides, la, space, "scale_a", true);
    if (n >= 1 && k >= 1) {
      Diagnostics db = check_scale(sb.ptr, sb.dtype, sb.shape, sb.strides, lb, space, "scale_b", true);
      diags.insert(diags.end(), db.begin(), db.end());
    }
    throw_if_any(diags, StatusCode::kInvalidLayout);
  }
  return g;
}

// A grouped call (grouped.hpp). The size rules (G, negative sizes, their sum, K-block boundaries of
// k-grouped sizes) are the library's validate(); the scale buffers are concatenations of per-group
// buffers, so they are judged here by their byte size (contiguous, any shape) against the contract's
// offsets; k-grouped scales, being the whole tensor's, may also be given in their natural shape.
// Device-side sizes (sizes_device != 0) are read by the library on the device: sizes is then empty and
// `groups` gives G.
GroupedGemmArgs make_grouped(int dim, const std::vector<int64_t>& sizes, uintptr_t sizes_device, bool sizes_int64,
                             int64_t groups, int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b,
                             uintptr_t d, int d_dtype, float alpha, int space, int grouped_backend,
                             bool fast_accum = false) {
  GroupedGemmArgs g;
  g.fast_accum = fast_accum;
  g.backend = GroupedBackend(grouped_backend);
  g.group_dim = dim == 1 ? GroupDim::kK : GroupDim::kM;
  g.groups = groups;
  g.group_sizes = sizes_device ? nullptr : sizes.data();
  g.group_sizes_device = ptr(sizes_device);
  g.group_sizes_int64 = sizes_int64;
  g.m = m, g.n = n, g.k = k;
  const ScaleArg sa = scale_arg(a), sb = scale_arg(b);
  g.a = operand(a, sa);
  g.b = operand(b, sb);
  g.d = ptr(d);
  g.d_dtype = DType(d_dtype);
  g.alpha = alpha;
  g.space = space_of(space);
  if (g.group_dim == GroupDim::kM && m == 0) {
    // Every group empty (no rows routed): nothing is read from A or written to D, whose empty arrays
    // may report a null address; the library's checks want pointers.
    alignas(16) static uint8_t placeholder[16];
    if (!g.a.data) g.a.data = placeholder;
    if (!g.a.scale) g.a.scale = placeholder;
    if (!g.d) g.d = placeholder;
  }
  // The sizes here (the offsets below need them); the operands when the call runs, as its backend needs.
  throw_if_any(validate_sizes(g), StatusCode::kInvalidArgument);

  const bool mg = g.group_dim == GroupDim::kM;
  const int64_t G = g.groups;
  auto check = [&](const ScaleArg& s, const GemmOperand& o, int64_t rows, int64_t want, const char* argument,
                   const std::string& what, const std::string& fix) {
    int64_t elems = 1, expect = 1;
    bool contiguous = true;
    for (size_t i = s.shape.size(); i-- > 0;) {
      if (s.shape[i] != 1 && s.strides[i] != expect) contiguous = false;
      expect *= s.shape[i];
      elems *= s.shape[i];
    }
    if (elems == 0) contiguous = true;  // no elements: any strides
    const int64_t bytes = elems * (s.dtype == int(DType::kF32) ? 4 : 1);
    if (contiguous && bytes == want) return;
    if (!mg) {  // the whole tensor's scales in their own shape: the layout contract names what is wrong
      const layouts::ScaleLayout l(o.recipe, rows, k, o.scale_format);
      throw_if_any(check_scale(s.ptr, s.dtype, s.shape, s.strides, l, space, argument, false),
                   StatusCode::kInvalidLayout);
      return;
    }
    Diagnostic diag;
    diag.argument = argument;
    diag.rule = "grouped-scale-buffer";
    diag.message = what;
    diag.expected = "a contiguous buffer of " + std::to_string(want) + " bytes";
    diag.actual = std::string(contiguous ? "" : "a non-contiguous buffer of ") + std::to_string(bytes) + " bytes";
    diag.fix = fix;
    throw_if_any(Diagnostics{diag}, StatusCode::kInvalidLayout);
  };
  const bool lt_a = g.a.scale_format == ScaleFormat::kCublasLt, lt_b = g.b.scale_format == ScaleFormat::kCublasLt;
  const std::string pad16 = " In cublaslt format each group's buffer is padded with zero bytes to a multiple of 16.";
  if (mg) {
    // With device-side sizes A is a per-row compact recipe (validate() said so): the whole tensor's scales.
    const int64_t a_bytes = g.group_sizes_device ? layouts::ScaleLayout(g.a.recipe, m, k, g.a.scale_format).bytes()
                                                 : grouped_scale_offsets(g).back();
    check(sa, g.a, m, a_bytes, "scale_a",
          "m-grouped A scales are each group's (M_g, K) scale buffer, concatenated in group order",
          "Concatenate the groups' scales (flattened) in group order." + std::string(lt_a ? pad16 : ""));
    check(sb, g.b, n, G * grouped_b_scale_stride(g), "scale_b",
          "m-grouped B scales are one (N, K) operand's scale buffer per expert, stacked",
          "Stack the experts' scales: (G, *one operand's scales)." + std::string(lt_b ? pad16 : ""));
  } else {
    check(sa, g.a, m, layouts::ScaleLayout(g.a.recipe, m, k, g.a.scale_format).bytes(), "scale_a",
          "k-grouped A scales are the whole (M, sum K_g) tensor's", "");
    check(sb, g.b, n, layouts::ScaleLayout(g.b.recipe, n, k, g.b.scale_format).bytes(), "scale_b",
          "k-grouped B scales are the whole (N, sum K_g) tensor's", "");
  }
  return g;
}

HandleOptions handle_options(int backend) {
  HandleOptions o;
  if (backend >= 0) o.plan.force = Backend(backend);
  return o;
}

/// The quantizers' config from the binding's codes; the directions follow the outputs asked for (an
/// address of 0: not written).
emulation::QuantizeConfig quantize_config(int recipe, int data_dtype, int format, bool rowwise = true,
                                          bool columnwise = false) {
  emulation::QuantizeConfig cfg;
  cfg.recipe = Recipe(recipe);
  cfg.data_dtype = DType(data_dtype);
  cfg.format = ScaleFormat(format);
  cfg.rowwise = rowwise;
  cfg.columnwise = columnwise;
  return cfg;
}

nb::tuple diag_tuple(const Diagnostic& d) {
  return nb::make_tuple(d.argument, d.rule, d.message, d.expected, d.actual, d.fix, d.to_string());
}

// A GEMM whose shapes, types and scale tensor shapes/strides were validated once (Handle.prepare):
// run() takes only the addresses, so that a framework's repeated calls of one shape cost a handful of
// integer conversions. Handle::gemm still checks every per-call property (null pointers, alignment);
// host scales are still content-checked per call, since their values change.
// Runs `call` for `stream`: the first time on a stream, after refusing a graph capture (the library
// allocates its per-stream memory on first use), then remembering the stream. `problem()` names the
// call in that error.
template <class Call, class Problem>
void run_checked(std::set<StreamKey>& seen, uintptr_t stream, const Problem& problem, const Call& call) {
  const StreamKey key = stream_key(stream);
  if (seen.count(key)) return call();
  check_capture(seen, stream, problem());
  call();
  seen.insert(key);
}

struct Prepared {
  Handle* handle = nullptr;
  GemmArgs args;
  ScaleArg sa, sb;
  bool host = false;
  int device = -1;  // the operands' device, made current for each run (its default stream is theirs)
  mutable std::set<StreamKey> seen;  // streams this problem has run on (guarded by the GIL)

  void run(uintptr_t a, uintptr_t scale_a, uintptr_t b, uintptr_t scale_b, uintptr_t d, uintptr_t bias,
           uintptr_t stream) const {
    GemmArgs g = args;
    g.a.data = ptr(a);
    g.a.scale = ptr(scale_a);
    g.b.data = ptr(b);
    g.b.scale = ptr(scale_b);
    g.d = ptr(d);
    g.bias = ptr(bias);
    if (host) {
      const layouts::ScaleLayout la(g.a.recipe, g.m, g.k, g.a.scale_format), lb(g.b.recipe, g.n, g.k, g.b.scale_format);
      Diagnostics diags = check_scale(scale_a, sa.dtype, sa.shape, sa.strides, la, 0, "scale_a", true);
      Diagnostics db = check_scale(scale_b, sb.dtype, sb.shape, sb.strides, lb, 0, "scale_b", true);
      diags.insert(diags.end(), db.begin(), db.end());
      throw_if_any(diags, StatusCode::kInvalidLayout);
      nb::gil_scoped_release release;
      handle->gemm(g, nullptr);
    } else {
      const scalemm::detail::DeviceScope scope(device);
      run_checked(
          seen, stream, [&] { return GemmProblem::from(g).to_string(); }, [&] { handle->gemm(g, stream_of(stream)); });
    }
  }
};

// A grouped call on device arrays validated once (its first call of a signature): later calls set
// the addresses and run. Host sizes are part of the signature; device-side sizes are an address.
struct PreparedGrouped {
  Handle* handle = nullptr;
  GroupedGemmArgs args;
  std::vector<int64_t> sizes;
  std::string problem;
  int device = -1;  // the operands' device, made current for each run
  mutable std::set<StreamKey> seen;  // streams this signature has run on (guarded by the GIL)

  void run(uintptr_t a, uintptr_t scale_a, uintptr_t b, uintptr_t scale_b, uintptr_t d, uintptr_t sizes_device,
           uintptr_t stream) const {
    GroupedGemmArgs g = args;
    g.a.data = ptr(a);
    g.a.scale = ptr(scale_a);
    g.b.data = ptr(b);
    g.b.scale = ptr(scale_b);
    g.d = ptr(d);
    if (g.group_sizes_device) g.group_sizes_device = ptr(sizes_device);
    else g.group_sizes = sizes.data();
    const scalemm::detail::DeviceScope scope(device);
    run_checked(seen, stream, [&] { return problem; }, [&] { handle->grouped_gemm(g, stream_of(stream)); });
  }
};

// What a recipe's scale layout is at any size: the rule behind ScaleLayout's sizes, for callers that
// size scale arrays without concrete extents (torch's fake implementations trace symbolic sizes).
// Read off the contract at one size that equals no block, so these facts have no second copy; the
// package's tests check the sizes they give against ScaleLayout at many extents.
struct RecipeLayout {
  int recipe = 0;
  std::string name;
  int scale_dtype = 0;
  std::string scale_dtype_name;
  int scale_bytes = 0;
  int64_t block_rows = 0;        ///< data rows per scale; 0: all rows (one scale per tensor)
  int64_t block_k = 0;           ///< K elements per scale; 0: all of K
  int64_t lt_row_step = 0;       ///< data rows per stored row of the cuBLASLt buffer; 0: all rows
  int64_t lt_row_multiple = 1;   ///< stored rows of the cuBLASLt buffer are padded to this multiple
  int64_t lt_kblock_multiple = 1;  ///< and its K-blocks to this one
  bool lt_tiled = false;         ///< the cuBLASLt buffer is 128x4-tiled
  bool scalar = false;           ///< one scale for the whole operand (compact: a 0-d array)
  bool two_level = false;        ///< block scales plus one global decode scale (passed by value)
  bool packed_fp4 = false;       ///< the operand's data is E2M1, two values per byte
};

// A recipe code from Python, refused by name when it is none of the library's.
Recipe recipe_of(int code) {
  for (Recipe r : kAllRecipes)
    if (int(r) == code) return r;
  fail(StatusCode::kInvalidArgument, "recipe: unknown recipe code: expected the code of one of " +
                                         all_recipe_names() + ", got " + std::to_string(code) +
                                         ". Map names with scalemm._core.recipe_code.");
}

RecipeLayout recipe_layout(Recipe r) {
  constexpr int64_t kOdd = 1000003;  // a prime: no block size divides it or equals it
  const layouts::ScaleLayout c(r, kOdd, kOdd, ScaleFormat::kCompact), lt = c.with_format(ScaleFormat::kCublasLt);
  RecipeLayout o;
  o.recipe = int(r);
  o.name = std::string(to_string(r));
  o.scale_dtype = int(c.scale_dtype());
  o.scale_dtype_name = std::string(to_string(c.scale_dtype()));
  o.scale_bytes = c.scale_bytes();
  o.block_rows = c.block_rows() == kOdd ? 0 : c.block_rows();
  o.block_k = c.block_k() == kOdd ? 0 : c.block_k();
  o.lt_row_step = lt.row_step() == kOdd ? 0 : lt.row_step();
  o.lt_row_multiple = layouts::ScaleLayout(r, 1, kOdd, ScaleFormat::kCublasLt).padded_rows();
  o.lt_kblock_multiple = layouts::ScaleLayout(r, kOdd, 1, ScaleFormat::kCublasLt).padded_kblocks();
  o.lt_tiled = layouts::recipe_is_tiled(r);
  o.scalar = o.block_rows == 0 && o.block_k == 0;
  o.two_level = r == Recipe::kNvfp4;
  o.packed_fp4 = r == Recipe::kNvfp4;
  return o;
}

std::map<std::string, std::set<StreamKey>>& seen_problems() {
  static auto* m = new std::map<std::string, std::set<StreamKey>>();
  return *m;
}

}  // namespace

NB_MODULE(_scalemm, m) {
  m.doc() = "scalemm native layer (use the scalemm package, not this module)";
  // The package keeps its Handles and prepared calls for the life of the process (module-level
  // caches); nanobind would report them as leaks at interpreter exit.
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const int code = int(e.code());
      auto& classes = error_classes();
      PyObject* cls = code >= 0 && size_t(code) < classes.size() && classes[size_t(code)].is_valid()
                          ? classes[size_t(code)].ptr()
                          : PyExc_RuntimeError;
      PyObject* exc = PyObject_CallFunction(cls, "ss", e.status().message.c_str(), status_code_name(e.code()));
      if (exc) {
        PyErr_SetObject(cls, exc);
        Py_DECREF(exc);
      }
    }
  });

  m.def("set_error_classes", [](std::vector<nb::object> classes) { error_classes() = std::move(classes); });
  void scalemm_register_ffi(nb::module_&);  // XLA FFI handlers for scalemm.jax (ffi.cpp)
  scalemm_register_ffi(m);
  m.def("version", [] { return std::string(scalemm_version()); });
  m.def("status_name", [](int code) { return std::string(status_code_name(StatusCode(code))); });
  m.def("device", [] {
    const DeviceTarget t = DeviceTarget::current();
    return nb::make_tuple(t.sm, t.to_string());
  });
  // Name tables, so that Python maps names to enum values once, at import.
  m.def("dtype_names", [] {
    std::vector<std::string> v;
    for (int i = 0; i < kDTypeCount; ++i) v.emplace_back(to_string(DType(i)));
    return v;
  });
  m.def("recipe_names", [] {
    std::vector<std::tuple<std::string, int>> v;
    for (Recipe r : kAllRecipes) v.emplace_back(std::string(to_string(r)), int(r));
    return v;
  });
  m.def("backend_names", [] {
    std::vector<std::string> v;
    for (int i = 0; i < 4; ++i) v.emplace_back(to_string(Backend(i)));
    return v;
  });

  // One operand's scale layout (layouts::ScaleLayout), its facts by name: the package reads sizes,
  // element types and padding from here rather than keeping its own copy of the formulas.
  nb::class_<layouts::ScaleLayout>(m, "ScaleLayout")
      .def("__init__",
           [](layouts::ScaleLayout* l, int recipe, int64_t rows, int64_t k, int format) {
             if (format != int(ScaleFormat::kCompact) && format != int(ScaleFormat::kCublasLt))
               fail(StatusCode::kInvalidArgument, "format: unknown scale format code: expected 0 (compact) or 1 "
                                                  "(cublaslt), got " + std::to_string(format) + ".");
             new (l) layouts::ScaleLayout(recipe_of(recipe), rows, k, ScaleFormat(format));
           },
           nb::arg("recipe"), nb::arg("rows"), nb::arg("k"), nb::arg("format"))
      .def_prop_ro("recipe", [](const layouts::ScaleLayout& l) { return int(l.recipe); })
      .def_prop_ro("recipe_name", [](const layouts::ScaleLayout& l) { return std::string(to_string(l.recipe)); })
      .def_prop_ro("rows", [](const layouts::ScaleLayout& l) { return l.rows; })
      .def_prop_ro("k", [](const layouts::ScaleLayout& l) { return l.k; })
      .def_prop_ro("format", [](const layouts::ScaleLayout& l) { return int(l.format); })
      .def_prop_ro("scale_dtype", [](const layouts::ScaleLayout& l) { return int(l.scale_dtype()); })
      .def_prop_ro("scale_dtype_name", [](const layouts::ScaleLayout& l) { return std::string(to_string(l.scale_dtype())); })
      .def_prop_ro("scale_bytes", &layouts::ScaleLayout::scale_bytes)
      .def_prop_ro("block_rows", &layouts::ScaleLayout::block_rows)
      .def_prop_ro("block_k", &layouts::ScaleLayout::block_k)
      .def_prop_ro("grid_rows", &layouts::ScaleLayout::grid_rows)
      .def_prop_ro("kblocks", &layouts::ScaleLayout::kblocks)
      .def_prop_ro("padded_rows", &layouts::ScaleLayout::padded_rows)
      .def_prop_ro("padded_kblocks", &layouts::ScaleLayout::padded_kblocks)
      .def_prop_ro("row_step", &layouts::ScaleLayout::row_step)
      .def_prop_ro("real_rows", &layouts::ScaleLayout::real_rows)
      .def_prop_ro("has_padding", &layouts::ScaleLayout::has_padding)
      .def_prop_ro("tiled", [](const layouts::ScaleLayout& l) {
        return l.format == ScaleFormat::kCublasLt && layouts::recipe_is_tiled(l.recipe);
      })
      .def_prop_ro("size", &layouts::ScaleLayout::size)
      .def_prop_ro("bytes", &layouts::ScaleLayout::bytes)
      .def_prop_ro("description", &layouts::ScaleLayout::to_string)
      .def_prop_ro("shape_stride", &layouts::ScaleLayout::shape_stride_string)
      .def("offset", &layouts::ScaleLayout::offset, nb::arg("r"), nb::arg("kb"))
      .def("__repr__", [](const layouts::ScaleLayout& l) { return "ScaleLayout(" + l.to_string() + ")"; });

  nb::class_<RecipeLayout>(m, "RecipeLayout")
      .def_ro("recipe", &RecipeLayout::recipe)
      .def_ro("name", &RecipeLayout::name)
      .def_ro("scale_dtype", &RecipeLayout::scale_dtype)
      .def_ro("scale_dtype_name", &RecipeLayout::scale_dtype_name)
      .def_ro("scale_bytes", &RecipeLayout::scale_bytes)
      .def_ro("block_rows", &RecipeLayout::block_rows)
      .def_ro("block_k", &RecipeLayout::block_k)
      .def_ro("lt_row_step", &RecipeLayout::lt_row_step)
      .def_ro("lt_row_multiple", &RecipeLayout::lt_row_multiple)
      .def_ro("lt_kblock_multiple", &RecipeLayout::lt_kblock_multiple)
      .def_ro("lt_tiled", &RecipeLayout::lt_tiled)
      .def_ro("scalar", &RecipeLayout::scalar)
      .def_ro("two_level", &RecipeLayout::two_level)
      .def_ro("packed_fp4", &RecipeLayout::packed_fp4)
      .def("__repr__", [](const RecipeLayout& l) { return "RecipeLayout(" + l.name + ")"; });
  m.def("recipe_layout", [](int recipe) { return recipe_layout(recipe_of(recipe)); }, nb::arg("recipe"));

  // (grid_rows, kblocks, padded_rows, padded_kblocks, size, scale_bytes, scale_dtype, description):
  // the ScaleLayout's facts as a tuple, for callers written before the class.
  m.def("layout_info", [](int recipe, int64_t rows, int64_t k, int format) {
    const layouts::ScaleLayout l(Recipe(recipe), rows, k, ScaleFormat(format));
    return nb::make_tuple(l.grid_rows(), l.kblocks(), l.padded_rows(), l.padded_kblocks(), l.size(), l.scale_bytes(),
                          int(l.scale_dtype()), l.to_string());
  });

  nb::class_<Handle>(m, "Handle")
      .def("__init__", [](Handle* h, int backend) { new (h) Handle(handle_options(backend)); }, nb::arg("backend"))
      .def("target", [](Handle& h) { return h.target().to_string(); })
      .def(
          "gemm",
          [](Handle& h, int64_t mm, int64_t n, int64_t k, const Operand& a, const Operand& b, uintptr_t d, int d_dtype,
             uintptr_t bias, float alpha, int space, uintptr_t stream, bool fast_accum) {
            const GemmArgs g = make_args(mm, n, k, a, b, d, d_dtype, bias, alpha, space, true, fast_accum);
            // Host data runs the host reference synchronously: let other Python threads run meanwhile.
            if (space == 0) {
              nb::gil_scoped_release release;
              h.gemm(g, stream_of(stream));
            } else {
              const std::string problem = GemmProblem::from(g).to_string();
              auto& seen = seen_problems()[problem + " @" + std::to_string(reinterpret_cast<uintptr_t>(&h))];
              check_capture(seen, stream, problem);
              h.gemm(g, stream_of(stream));
              seen.insert(stream_key(stream));
            }
          })
      .def(
          "prepare",
          [](Handle& h, int64_t mm, int64_t n, int64_t k, const Operand& a, const Operand& b, int d_dtype, bool bias,
             float alpha, int space, int device, bool fast_accum) {
            static uint8_t placeholder[16];
            const uintptr_t any = reinterpret_cast<uintptr_t>(placeholder);
            Prepared p;
            p.handle = &h;
            p.args = make_args(mm, n, k, a, b, any, d_dtype, bias ? any : 0, alpha, space, true, fast_accum);
            p.sa = ScaleArg{std::get<3>(a), std::get<4>(a), std::get<5>(a), std::get<6>(a)};
            p.sb = ScaleArg{std::get<3>(b), std::get<4>(b), std::get<5>(b), std::get<6>(b)};
            p.host = space == 0;
            p.device = p.host ? -1 : device;
            return p;
          },
          nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("a"), nb::arg("b"), nb::arg("d_dtype"), nb::arg("bias"),
          nb::arg("alpha"), nb::arg("space"), nb::arg("device") = -1, nb::arg("fast_accum") = false,
          nb::keep_alive<0, 1>())
      // Benchmark support: `iters` calls of Handle::gemm from C++ on `stream`, timed with CUDA events
      // (milliseconds per call), the baseline for the Python call's own overhead.
      .def("time_gemm",
           [](Handle& h, int64_t mm, int64_t n, int64_t k, const Operand& a, const Operand& b, uintptr_t d, int d_dtype,
              uintptr_t bias, float alpha, uintptr_t stream, int iters) {
             const GemmArgs g = make_args(mm, n, k, a, b, d, d_dtype, bias, alpha, 1, true);
             cudaEvent_t start, stop;
             if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess)
               fail(StatusCode::kCudaError, "time_gemm: cudaEventCreate failed");
             h.gemm(g, stream_of(stream));  // warm: plan cached, scratch grown
             cudaEventRecord(start, stream_of(stream));
             for (int i = 0; i < iters; ++i) h.gemm(g, stream_of(stream));
             cudaEventRecord(stop, stream_of(stream));
             cudaEventSynchronize(stop);
             float ms = 0;
             cudaEventElapsedTime(&ms, start, stop);
             cudaEventDestroy(start);
             cudaEventDestroy(stop);
             return double(ms) / iters;
           })
      .def("explain",
           [](Handle& h, int64_t mm, int64_t n, int64_t k, const Operand& a, const Operand& b, int d_dtype,
              uintptr_t bias, float alpha, int space, bool fast_accum) {
             static uint8_t placeholder[16];  // plan() reads no buffer; validate() wants a D pointer
             const GemmArgs g = make_args(mm, n, k, a, b, reinterpret_cast<uintptr_t>(placeholder), d_dtype, bias,
                                          alpha, space, true, fast_accum);
             throw_if_any(validate(g), StatusCode::kInvalidArgument);  // as gemm() would
             const Plan p = h.plan(g);
             return nb::make_tuple(std::string(to_string(p.backend)), p.explain());
           })
      // Grouped GEMMs (grouped.hpp): group_dim 0 = m, 1 = k; the sizes are host integers, or (sizes empty)
      // G integers at the device address sizes_device.
      .def("grouped_gemm",
           [](Handle& h, int dim, const std::vector<int64_t>& sizes, uintptr_t sizes_device, bool sizes_int64,
              int64_t groups, int64_t mm, int64_t n, int64_t k, const Operand& a, const Operand& b, uintptr_t d,
              int d_dtype, float alpha, int space, int grouped_backend, uintptr_t stream, bool fast_accum) {
             const GroupedGemmArgs g = make_grouped(dim, sizes, sizes_device, sizes_int64, groups, mm, n, k, a, b, d,
                                                    d_dtype, alpha, space, grouped_backend, fast_accum);
             if (space == 0) {
               nb::gil_scoped_release release;
               h.grouped_gemm(g, stream_of(stream));
               return;
             }
             // First calls allocate per-stream memory, as for gemm(). Keyed without the sizes, which
             // change call by call in MoE layers (a key per split would grow without bound).
             const std::string problem = "grouped " + std::string(to_string(g.group_dim)) + " G=" +
                                         std::to_string(g.groups) + " " + std::to_string(mm) + "x" + std::to_string(n) +
                                         "x" + std::to_string(k);
             auto& seen = seen_problems()[problem + " @" + std::to_string(reinterpret_cast<uintptr_t>(&h))];
             check_capture(seen, stream, problem);
             h.grouped_gemm(g, stream_of(stream));
             seen.insert(stream_key(stream));
           })
      .def(
          "prepare_grouped",
          [](Handle& h, int dim, const std::vector<int64_t>& sizes, uintptr_t sizes_device, bool sizes_int64,
             int64_t groups, int64_t mm, int64_t n, int64_t k, const Operand& a, const Operand& b, int d_dtype,
             float alpha, int space, int grouped_backend, int device, bool fast_accum) {
            alignas(16) static uint8_t placeholder[16];  // D's address comes with each run
            PreparedGrouped p;
            p.handle = &h;
            p.device = space == 0 ? -1 : device;
            p.sizes = sizes;
            p.args = make_grouped(dim, p.sizes, sizes_device, sizes_int64, groups, mm, n, k, a, b,
                                  reinterpret_cast<uintptr_t>(placeholder), d_dtype, alpha, space, grouped_backend,
                                  fast_accum);
            p.problem = "grouped " + std::string(to_string(p.args.group_dim)) + " G=" + std::to_string(groups) + " " +
                        std::to_string(mm) + "x" + std::to_string(n) + "x" + std::to_string(k);
            return p;
          },
          nb::arg("dim"), nb::arg("sizes"), nb::arg("sizes_device"), nb::arg("sizes_int64"), nb::arg("groups"),
          nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("a"), nb::arg("b"), nb::arg("d_dtype"), nb::arg("alpha"),
          nb::arg("space"), nb::arg("grouped_backend"), nb::arg("device") = -1, nb::arg("fast_accum") = false,
          nb::keep_alive<0, 1>())
      .def("explain_grouped",
           [](Handle& h, int dim, const std::vector<int64_t>& sizes, uintptr_t sizes_device, bool sizes_int64,
              int64_t groups, int64_t mm, int64_t n, int64_t k, const Operand& a, const Operand& b, int d_dtype,
              float alpha, int space, int grouped_backend, bool fast_accum) {
             alignas(16) static uint8_t placeholder[16];  // explain() reads no buffer; validate() wants a D pointer
             const uintptr_t d = reinterpret_cast<uintptr_t>(placeholder);
             const GroupedGemmArgs g = make_grouped(dim, sizes, sizes_device, sizes_int64, groups, mm, n, k, a, b, d,
                                                    d_dtype, alpha, space, grouped_backend, fast_accum);
             return h.explain(g);
           });

  nb::class_<PreparedGrouped>(m, "PreparedGrouped")
      .def("run", &PreparedGrouped::run, nb::arg("a"), nb::arg("scale_a"), nb::arg("b"), nb::arg("scale_b"),
           nb::arg("d"), nb::arg("sizes_device"), nb::arg("stream"));

  nb::class_<Prepared>(m, "Prepared")
      .def("run", &Prepared::run, nb::arg("a"), nb::arg("scale_a"), nb::arg("b"), nb::arg("scale_b"), nb::arg("d"),
           nb::arg("bias"), nb::arg("stream"));

  // Quantizes a row-major (rows, cols) f32/bf16/f16 source. data_t/scales_t (0 = none) receive the
  // transposed operand (cols, rows) with blocks along rows. global_out: NVFP4's decode scale (f32).
  // workspace (0: the call allocates its own, stream-ordered): device scratch of at least
  // quantize_workspace_bytes for the same arguments, e.g. from the framework's caching allocator.
  m.def("quantize_workspace_bytes", [](int src_dtype, int64_t rows, int64_t cols, int recipe, int data_dtype, int format,
                                       bool rowwise, bool columnwise) {
    emulation::SourceMatrix s{nullptr, DType(src_dtype), rows, cols, nullptr};
    return scalemm::quantize::workspace_bytes(s, quantize_config(recipe, data_dtype, format, rowwise, columnwise));
  });
  m.def("quantize", [](uintptr_t src, int src_dtype, int64_t rows, int64_t cols, int recipe, int data_dtype, int format,
                       uintptr_t data, uintptr_t scales, uintptr_t data_t, uintptr_t scales_t, uintptr_t global_out,
                       int space, uintptr_t stream, uintptr_t workspace, size_t workspace_bytes) {
    emulation::SourceMatrix s{ptr(src), DType(src_dtype), rows, cols, nullptr};
    const emulation::QuantizeConfig cfg = quantize_config(recipe, data_dtype, format, data != 0, data_t != 0);
    emulation::QuantizeOutputs out{ptr(data), ptr(scales), ptr(data_t), ptr(scales_t),
                                   static_cast<float*>(ptr(global_out))};
    emulation::validate(s, cfg, out);
    if (space == 0) {
      nb::gil_scoped_release release;
      emulation::quantize_host(s, cfg, out);
    } else {
      scalemm::quantize::quantize(s, cfg, out, ptr(workspace), workspace ? workspace_bytes : 0, stream_of(stream));
    }
  }, nb::arg("src"), nb::arg("src_dtype"), nb::arg("rows"), nb::arg("cols"), nb::arg("recipe"), nb::arg("data_dtype"),
     nb::arg("format"), nb::arg("data"), nb::arg("scales"), nb::arg("data_t"), nb::arg("scales_t"), nb::arg("global_out"),
     nb::arg("space"), nb::arg("stream"), nb::arg("workspace") = 0, nb::arg("workspace_bytes") = 0);

  // MoE tokens (rows, cols) sorted by group, device sizes: rowwise (data may be 0: skipped) and
  // columnwise into the 128-row-aligned k-grouped layout of padded_rows (quantize::quantize_grouped).
  m.def("quantize_grouped", [](uintptr_t src, int src_dtype, int64_t rows, int64_t cols, int recipe, int data_dtype,
                               int format, uintptr_t sizes, int64_t groups, int64_t padded_rows, uintptr_t data,
                               uintptr_t scales, uintptr_t data_t, uintptr_t scales_t, uintptr_t stream) {
    emulation::SourceMatrix s{ptr(src), DType(src_dtype), rows, cols, nullptr};
    const emulation::QuantizeConfig cfg = quantize_config(recipe, data_dtype, format, data != 0, true);
    const scalemm::quantize::TokenGroups g{static_cast<const int64_t*>(ptr(sizes)), groups, padded_rows};
    scalemm::quantize::quantize_grouped(s, cfg, g, emulation::QuantizeOutputs{ptr(data), ptr(scales), ptr(data_t),
                                                                             ptr(scales_t), nullptr},
                                        stream_of(stream));
  });
  m.def("padded_token_rows", &scalemm::quantize::padded_token_rows);

  // The quantizers with a scale mode (numerics::ScaleMode code: 0 default, 2 amax-pow2, ...): quantize()
  // (space 0: the host emulator) and the grouped quantizer with an optional dispatch gather
  // (TokenGroups::gather of source_rows rows, 0: none) and row weights (0: none).
  m.def("quantize_mode", [](uintptr_t src, int src_dtype, int64_t rows, int64_t cols, int recipe, int data_dtype,
                            int format, int mode, uintptr_t data, uintptr_t scales, uintptr_t data_t,
                            uintptr_t scales_t, int space, uintptr_t stream) {
    emulation::SourceMatrix s{ptr(src), DType(src_dtype), rows, cols, nullptr};
    emulation::QuantizeConfig cfg = quantize_config(recipe, data_dtype, format, data != 0, data_t != 0);
    cfg.mode = emulation::ScaleMode(mode);
    const emulation::QuantizeOutputs out{ptr(data), ptr(scales), ptr(data_t), ptr(scales_t), nullptr};
    emulation::validate(s, cfg, out);
    if (space == 0) {
      nb::gil_scoped_release release;
      emulation::quantize_host(s, cfg, out);
    } else {
      scalemm::quantize::quantize(s, cfg, out, nullptr, 0, stream_of(stream));
    }
  });
  m.def("quantize_grouped_rows", [](uintptr_t src, int src_dtype, int64_t rows, int64_t cols, int recipe,
                                    int data_dtype, int format, int mode, uintptr_t sizes, int64_t groups,
                                    int64_t padded_rows, uintptr_t gather, int64_t source_rows, uintptr_t row_weight,
                                    uintptr_t data, uintptr_t scales, uintptr_t data_t, uintptr_t scales_t,
                                    uintptr_t stream) {
    emulation::SourceMatrix s{ptr(src), DType(src_dtype), rows, cols, nullptr};
    emulation::QuantizeConfig cfg = quantize_config(recipe, data_dtype, format, data != 0, true);
    cfg.mode = emulation::ScaleMode(mode);
    scalemm::quantize::TokenGroups g{static_cast<const int64_t*>(ptr(sizes)), groups, padded_rows};
    g.gather = static_cast<const int64_t*>(ptr(gather));
    g.source_rows = source_rows;
    g.row_weight = static_cast<const float*>(ptr(row_weight));
    scalemm::quantize::quantize_grouped(s, cfg, g, emulation::QuantizeOutputs{ptr(data), ptr(scales), ptr(data_t),
                                                                             ptr(scales_t), nullptr},
                                        stream_of(stream));
  });

  // part 0: quantize_grouped_swiglu of src = gate_up (rows, 2 cols); 1: its backward, src the
  // product's gradient (rows, cols) and gate_up the forward's input.
  m.def("quantize_grouped_swiglu", [](int part, uintptr_t src, int src_dtype, int64_t rows, int64_t cols, int recipe,
                                      int data_dtype, int format, int mode, uintptr_t gate_up, uintptr_t sizes,
                                      int64_t groups, int64_t padded_rows, uintptr_t data, uintptr_t scales,
                                      uintptr_t data_t, uintptr_t scales_t, uintptr_t stream) {
    emulation::QuantizeConfig cfg = quantize_config(recipe, data_dtype, format, data != 0, true);
    cfg.mode = emulation::ScaleMode(mode);
    const scalemm::quantize::TokenGroups g{static_cast<const int64_t*>(ptr(sizes)), groups, padded_rows};
    const emulation::QuantizeOutputs o{ptr(data), ptr(scales), ptr(data_t), ptr(scales_t), nullptr};
    if (part == 0)
      scalemm::quantize::quantize_grouped_swiglu(emulation::SourceMatrix{ptr(src), DType(src_dtype), rows, 2 * cols, nullptr},
                                                 cfg, g, o, stream_of(stream));
    else
      scalemm::quantize::quantize_grouped_swiglu_grad(emulation::SourceMatrix{ptr(src), DType(src_dtype), rows, cols, nullptr},
                                                      ptr(gate_up), cfg, g, o, stream_of(stream));
  });

  // MoE dispatch and combine (scalemm::moe): space 0 runs them on host memory.
  m.def("moe_route_workspace_bytes", &scalemm::moe::route_workspace_bytes);
  m.def("moe_route", [](uintptr_t index, int64_t tokens, int64_t top_k, int64_t experts, uintptr_t pos,
                        uintptr_t row_pair, uintptr_t sizes, uintptr_t workspace, size_t workspace_bytes, int space,
                        uintptr_t stream) {
    const scalemm::moe::TopK tk{static_cast<const int64_t*>(ptr(index)), tokens, top_k, experts};
    scalemm::moe::route(tk, static_cast<int64_t*>(ptr(pos)), static_cast<int64_t*>(ptr(row_pair)),
                        static_cast<int64_t*>(ptr(sizes)), ptr(workspace), workspace_bytes, space_of(space),
                        stream_of(stream));
  });
  m.def("moe_combine", [](uintptr_t y, int dtype, int64_t rows, int64_t hidden, uintptr_t pos, int64_t tokens,
                          int64_t top_k, uintptr_t weights, uintptr_t out, int space, uintptr_t stream) {
    scalemm::moe::combine(ptr(y), DType(dtype), rows, hidden, static_cast<const int64_t*>(ptr(pos)), tokens, top_k,
                          static_cast<const float*>(ptr(weights)), ptr(out), space_of(space), stream_of(stream));
  });
  m.def("moe_combine_weight_grad", [](uintptr_t dout, uintptr_t y, int dtype, int64_t rows, int64_t hidden,
                                      uintptr_t pos, int64_t tokens, int64_t top_k, uintptr_t dw, int space,
                                      uintptr_t stream) {
    scalemm::moe::combine_weight_grad(ptr(dout), ptr(y), DType(dtype), rows, hidden,
                                      static_cast<const int64_t*>(ptr(pos)), tokens, top_k,
                                      static_cast<float*>(ptr(dw)), space_of(space), stream_of(stream));
  });

  // An activation fused into the 1D-block quantizer (quantize::quantize_activation): GELU (tanh) of
  // src (input 0), or src * GELU'(input) (the activation's backward); columnwise always, rowwise when
  // data is not 0. apply_activation: the activation alone, written in src's type.
  m.def("quantize_activation", [](uintptr_t src, int src_dtype, int64_t rows, int64_t cols, int recipe,
                                  int data_dtype, int format, int activation, uintptr_t input, uintptr_t data,
                                  uintptr_t scales, uintptr_t data_t, uintptr_t scales_t, uintptr_t stream) {
    emulation::SourceMatrix s{ptr(src), DType(src_dtype), rows, cols, nullptr};
    const emulation::QuantizeConfig cfg = quantize_config(recipe, data_dtype, format, data != 0, true);
    const emulation::QuantizeOutputs o{ptr(data), ptr(scales), ptr(data_t), ptr(scales_t), nullptr};
    const auto act = scalemm::quantize::Activation(activation);
    if (input) scalemm::quantize::quantize_activation_grad(s, ptr(input), act, cfg, o, stream_of(stream));
    else scalemm::quantize::quantize_activation(s, act, cfg, o, stream_of(stream));
  });
  // SwiGLU fused into the quantizer: part 0 silu(src) * a (src gate, a up), 1 the gate's gradient
  // (src the product's gradient, a gate, b up), 2 the up's gradient (a gate). apply_swiglu: alone.
  m.def("quantize_swiglu", [](int part, uintptr_t src, int src_dtype, int64_t rows, int64_t cols, int recipe,
                              int data_dtype, int format, uintptr_t a, uintptr_t b, uintptr_t data, uintptr_t scales,
                              uintptr_t data_t, uintptr_t scales_t, uintptr_t stream) {
    emulation::SourceMatrix s{ptr(src), DType(src_dtype), rows, cols, nullptr};
    const emulation::QuantizeConfig cfg = quantize_config(recipe, data_dtype, format, data != 0, true);
    const emulation::QuantizeOutputs o{ptr(data), ptr(scales), ptr(data_t), ptr(scales_t), nullptr};
    if (part == 0) scalemm::quantize::quantize_swiglu(s, ptr(a), cfg, o, stream_of(stream));
    else scalemm::quantize::quantize_swiglu_grad(s, ptr(a), ptr(b), scalemm::quantize::SwigluInput(part - 1), cfg, o,
                                                 stream_of(stream));
  });
  m.def("apply_swiglu", [](int part, uintptr_t src, int src_dtype, int64_t rows, int64_t cols, uintptr_t a,
                           uintptr_t b, uintptr_t out, uintptr_t stream) {
    const emulation::SourceMatrix s{ptr(src), DType(src_dtype), rows, cols, nullptr};
    if (part == 0) scalemm::quantize::apply_swiglu(s, ptr(a), ptr(out), stream_of(stream));
    else scalemm::quantize::apply_swiglu_grad(s, ptr(a), ptr(b), scalemm::quantize::SwigluInput(part - 1), ptr(out),
                                              stream_of(stream));
  });
  m.def("apply_activation", [](uintptr_t src, int src_dtype, int64_t rows, int64_t cols, int activation,
                               uintptr_t input, uintptr_t out, uintptr_t stream) {
    scalemm::quantize::apply_activation(emulation::SourceMatrix{ptr(src), DType(src_dtype), rows, cols, nullptr},
                                        ptr(input), scalemm::quantize::Activation(activation), ptr(out),
                                        stream_of(stream));
  });

  // Dequantizes a K-contiguous operand (rows, k) to f32/bf16/f16. global_ptr: NVFP4 decode scale
  // (one f32 in the same memory space) or 0.
  m.def("dequantize", [](uintptr_t data, int dtype, int recipe, int64_t rows, int64_t k, uintptr_t scales,
                         int64_t scales_dtype, std::vector<int64_t> scales_shape, std::vector<int64_t> scales_strides,
                         int format, uintptr_t global_ptr, uintptr_t out, int out_dtype, int space, uintptr_t stream) {
    emulation::QuantizedTensor t;
    t.data = ptr(data);
    t.dtype = DType(dtype);
    t.scales = ptr(scales);
    t.layout = layouts::ScaleLayout(Recipe(recipe), rows, k, ScaleFormat(format));
    t.global_scale = static_cast<const float*>(ptr(global_ptr));
    throw_if_any(check_scale(scales, int(scales_dtype), scales_shape, scales_strides, t.layout, space, "scales", true));
    if (space == 0) {
      nb::gil_scoped_release release;
      emulation::dequantize_host(t, ptr(out), DType(out_dtype));
    } else {
      scalemm::quantize::dequantize(t, ptr(out), DType(out_dtype), stream_of(stream));
    }
  });

  // The FP8 data of an exact-transpose operand transposed on the device (batch of packed matrices).
  m.def("transpose_bytes", [](uintptr_t src, int64_t batch, int64_t rows, int64_t cols, uintptr_t dst,
                              uintptr_t stream) {
    scalemm::quantize::transpose(ptr(src), batch, rows, cols, ptr(dst), stream_of(stream));
  });

  // Its scales: a (rows, k) operand's compact or cublaslt scales -> the transpose's, in to_format.
  m.def("transpose_scales", [](int recipe, int64_t rows, int64_t k, int from_format, uintptr_t src, int to_format,
                               uintptr_t dst, uintptr_t stream) {
    const layouts::ScaleLayout from(Recipe(recipe), rows, k, ScaleFormat(from_format));
    layouts::gpu::transpose(from, ptr(src), layouts::transposed(from, ScaleFormat(to_format)), ptr(dst),
                            stream_of(stream));
  });

  // Re-lays out one operand's scale buffer (compact <-> cublaslt); the source is judged first.
  m.def("convert", [](int recipe, int64_t rows, int64_t k, int from_format, uintptr_t src, int src_dtype,
                      std::vector<int64_t> shape, std::vector<int64_t> strides, int to_format, uintptr_t dst, int space,
                      uintptr_t stream) {
    const layouts::ScaleLayout from(Recipe(recipe), rows, k, ScaleFormat(from_format));
    const layouts::ScaleLayout to = from.with_format(ScaleFormat(to_format));
    throw_if_any(check_scale(src, src_dtype, shape, strides, from, space, "scales", false));
    if (space == 0)
      layouts::convert(from, ptr(src), to, ptr(dst));
    else
      layouts::gpu::convert(from, ptr(src), to, ptr(dst), stream_of(stream));
  });

  // Every broken rule of a scale tensor, as (argument, rule, message, expected, actual, fix, text).
  // Device data: content rules run on the device and this SYNCHRONISES the stream (opt-in).
  m.def("check", [](int recipe, int64_t rows, int64_t k, int format, uintptr_t data, int dtype,
                    std::vector<int64_t> shape, std::vector<int64_t> strides, int space, bool content,
                    std::string argument, uintptr_t stream) {
    const layouts::ScaleLayout l(Recipe(recipe), rows, k, ScaleFormat(format));
    Diagnostics diags;
    const TensorRef t = tensor_ref(data, dtype, shape, strides, space, argument.c_str());
    if (space != 0 && content) {
      layouts::ContentReport* report = nullptr;
      if (cudaMalloc(reinterpret_cast<void**>(&report), sizeof(layouts::ContentReport)) != cudaSuccess)
        fail(StatusCode::kOutOfMemory, "check: could not allocate the device content report");
      try {
        diags = layouts::gpu::validate_device(t, l, argument, report, stream_of(stream));
      } catch (...) {
        cudaFree(report);
        throw;
      }
      cudaFree(report);
    } else {
      layouts::ValidateOptions opt;
      opt.check_content = content && space == 0;
      diags = layouts::validate_scale(t, l, argument, opt);
    }
    std::vector<nb::tuple> out;
    for (const auto& d : diags) out.push_back(diag_tuple(d));
    return out;
  });
}
