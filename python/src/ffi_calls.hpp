// The calls behind scalemm's XLA FFI handlers (ffi.cpp), in terms of the library alone: each builds the
// library's argument struct from a descriptor (what jit knows at trace time: shapes, element types,
// recipes) and the buffers' addresses. The trace-time checks (scalemm.jax) and the handlers run the
// same builders, so a call refused at trace time names the library's rule, and one that passes there
// is validated again by the library when it runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/numerics/quantized.hpp"

namespace scalemm::ffi_calls {

/// One operand of a GEMM: element codes (DType values), recipe, its scale buffer's shape.
struct OperandDesc {
  int dtype = 0, recipe = 0, scale_dtype = 0;
  std::vector<int64_t> scale_shape;
};

struct GemmDesc {
  int64_t m = 0, n = 0, k = 0;
  OperandDesc a, b;
  int format = 0, d_dtype = 0;
  bool fast_accum = false;
};

struct Pointers {
  const void *a = nullptr, *scale_a = nullptr, *b = nullptr, *scale_b = nullptr;
  void* d = nullptr;
  float global_a = 1.0f, global_b = 1.0f;
};

/// The scale contract of one operand's buffer (dense row-major, shape o.scale_shape): structural rules,
/// and content rules for host data when `content`.
Diagnostics check_scale(const void* data, const OperandDesc& o, const layouts::ScaleLayout& layout, MemorySpace space,
                        const char* argument, bool content);

/// A dense call's arguments; throws scalemm::Error for a broken scale contract (structural rules, and
/// content rules for host data when `content`) and for anything the library's validate() refuses.
GemmArgs gemm_args(const GemmDesc& d, const Pointers& p, MemorySpace space, bool content);

struct GroupedDesc {
  GemmDesc gemm;  // m = rows of A (sum M_g, or M), k = K (or sum K_g)
  int group_dim = 0;   // 0 m, 1 k
  int64_t groups = 0;
  bool sizes_int64 = false;
  int backend = 0;     // GroupedBackend
};

/// A grouped call: `sizes` host sizes (host calls) or `sizes_device` (device calls). The scale buffers
/// are the whole tensors' (m-grouped A: a per-row compact recipe, whose grid does not depend on the
/// sizes; the library's own rule for device-side sizes).
GroupedGemmArgs grouped_args(const GroupedDesc& d, const Pointers& p, const int64_t* sizes, const void* sizes_device,
                             MemorySpace space);

struct QuantizeDesc {
  int src_dtype = 0;
  int64_t rows = 0, cols = 0;
  int recipe = 0, data_dtype = 0, format = 0;
  bool rowwise = true, columnwise = false;
};

numerics::QuantizeConfig quantize_config(const QuantizeDesc& d);
/// Throws for a quantization the library refuses (emulation::validate with the outputs asked for).
void check_quantize(const QuantizeDesc& d);

/// Placeholder address for checks that read no buffer (validate() wants pointers).
void* placeholder();

}  // namespace scalemm::ffi_calls
