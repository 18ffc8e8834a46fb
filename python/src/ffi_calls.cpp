// The library argument builders shared by scalemm.jax's trace-time checks and the XLA FFI handlers.
#include "ffi_calls.hpp"

#include <string>

#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/status.hpp"

namespace scalemm::ffi_calls {

void* placeholder() {
  alignas(256) static uint8_t bytes[256];
  return bytes;
}

namespace {

TensorRef scale_ref(const void* data, const OperandDesc& o, MemorySpace space, const char* argument) {
  std::vector<int64_t> shape = o.scale_shape;
  if (shape.empty()) shape = {1};  // a 0-d tensorwise scale is a buffer of one
  if (shape.size() > size_t(TensorRef::kMaxRank))
    throw Error(StatusCode::kInvalidArgument, std::string(argument) + ": a scale tensor of rank 0 to 4 is expected, "
                                                  "got rank " + std::to_string(shape.size()));
  TensorRef t;
  t.data = const_cast<void*>(data);
  t.dtype = DType(o.scale_dtype);
  t.rank = int(shape.size());
  int64_t stride = 1;  // XLA buffers are dense row-major
  for (int i = t.rank; i-- > 0;) {
    t.shape[size_t(i)] = shape[size_t(i)];
    t.strides[size_t(i)] = stride;
    stride *= shape[size_t(i)];
  }
  t.space = space;
  return t;
}

GemmOperand operand(const void* data, const OperandDesc& o, const void* scale, int format, float global) {
  GemmOperand g;
  g.data = data;
  g.dtype = DType(o.dtype);
  g.recipe = Recipe(o.recipe);
  g.scale = scale;
  g.scale_format = ScaleFormat(format);
  g.global_scale = global;
  return g;
}

}  // namespace

Diagnostics check_scale(const void* data, const OperandDesc& o, const layouts::ScaleLayout& l, MemorySpace space,
                        const char* argument, bool content) {
  layouts::ValidateOptions opt;
  opt.check_content = content && space == MemorySpace::kHost;
  opt.required_space = space;
  return layouts::validate_scale(scale_ref(data, o, space, argument), l, argument, opt);
}

GemmArgs gemm_args(const GemmDesc& d, const Pointers& p, MemorySpace space, bool content) {
  GemmArgs g;
  g.m = d.m, g.n = d.n, g.k = d.k;
  g.a = operand(p.a, d.a, p.scale_a, d.format, p.global_a);
  g.b = operand(p.b, d.b, p.scale_b, d.format, p.global_b);
  g.d = p.d;
  g.d_dtype = DType(d.d_dtype);
  g.space = space;
  g.fast_accum = d.fast_accum;
  Diagnostics diags;
  const layouts::ScaleLayout la(g.a.recipe, d.m, d.k, g.a.scale_format), lb(g.b.recipe, d.n, d.k, g.b.scale_format);
  if (d.m >= 1 && d.k >= 1) diags = check_scale(p.scale_a, d.a, la, space, "scale_a", content);
  if (d.n >= 1 && d.k >= 1) {
    Diagnostics db = check_scale(p.scale_b, d.b, lb, space, "scale_b", content);
    diags.insert(diags.end(), db.begin(), db.end());
  }
  throw_if_any(diags, StatusCode::kInvalidLayout);
  throw_if_any(validate(g), StatusCode::kInvalidArgument);
  return g;
}

GroupedGemmArgs grouped_args(const GroupedDesc& d, const Pointers& p, const int64_t* sizes, const void* sizes_device,
                             MemorySpace space) {
  const GemmDesc& e = d.gemm;
  GroupedGemmArgs g;
  g.group_dim = d.group_dim == 1 ? GroupDim::kK : GroupDim::kM;
  g.groups = d.groups;
  g.group_sizes = sizes;
  g.group_sizes_device = sizes_device;
  g.group_sizes_int64 = d.sizes_int64;
  g.m = e.m, g.n = e.n, g.k = e.k;
  g.a = operand(p.a ? p.a : placeholder(), e.a, p.scale_a ? p.scale_a : placeholder(), e.format, p.global_a);
  g.b = operand(p.b, e.b, p.scale_b, e.format, p.global_b);
  g.d = p.d ? p.d : placeholder();  // an m-grouped call with no rows has empty A and D
  g.d_dtype = DType(e.d_dtype);
  g.space = space;
  g.backend = GroupedBackend(d.backend);
  g.fast_accum = e.fast_accum;
  // The sizes' rules first (the library's), then the scale buffers as whole tensors (A's of an
  // m-grouped call by its per-row recipe: the rows of its grid are the tokens, whatever the split).
  throw_if_any(validate_sizes(g), StatusCode::kInvalidArgument);
  const bool mg = g.group_dim == GroupDim::kM;
  Diagnostics diags;
  if (g.m >= 1 && g.k >= 1)
    diags = check_scale(g.a.scale, e.a, layouts::ScaleLayout(g.a.recipe, g.m, g.k, g.a.scale_format), space,
                        "scale_a", false);
  if (!mg) {
    Diagnostics db = check_scale(p.scale_b, e.b, layouts::ScaleLayout(g.b.recipe, g.n, g.k, g.b.scale_format), space,
                                 "scale_b", false);
    diags.insert(diags.end(), db.begin(), db.end());
  } else {
    int64_t elems = 1;
    for (int64_t s : e.b.scale_shape) elems *= s;
    const int64_t bytes = elems * (e.b.scale_dtype == int(DType::kF32) ? 4 : 1);
    const int64_t want = g.groups * grouped_b_scale_stride(g);
    if (bytes != want) {
      Diagnostic diag;
      diag.argument = "scale_b";
      diag.rule = "grouped-scale-buffer";
      diag.message = "m-grouped B scales are one (N, K) operand's scale buffer per expert, stacked";
      diag.expected = "a buffer of " + std::to_string(want) + " bytes";
      diag.actual = std::to_string(bytes) + " bytes";
      diag.fix = "Stack the experts' scales: (G, *one operand's scales).";
      diags.push_back(diag);
    }
  }
  throw_if_any(diags, StatusCode::kInvalidLayout);
  return g;
}

numerics::QuantizeConfig quantize_config(const QuantizeDesc& d) {
  numerics::QuantizeConfig cfg;
  cfg.recipe = Recipe(d.recipe);
  cfg.data_dtype = DType(d.data_dtype);
  cfg.format = ScaleFormat(d.format);
  cfg.rowwise = d.rowwise;
  cfg.columnwise = d.columnwise;
  return cfg;
}

void check_quantize(const QuantizeDesc& d) {
  const numerics::SourceMatrix s{placeholder(), DType(d.src_dtype), d.rows, d.cols, nullptr};
  void* any = placeholder();
  const numerics::QuantizeOutputs out{d.rowwise ? any : nullptr, d.rowwise ? any : nullptr,
                                      d.columnwise ? any : nullptr, d.columnwise ? any : nullptr,
                                      d.recipe == int(Recipe::kNvfp4) ? static_cast<float*>(any) : nullptr};
  numerics::validate(s, quantize_config(d), out);
}

}  // namespace scalemm::ffi_calls
