// What the dense and the grouped linear layer (linear.cpp, grouped_linear.cpp) share: LinearCore (the
// state and steps both layers' Impl derive from), the checks of their recipe and options, the recipes
// and quantizer settings a LinearRecipe stands for, their GEMM operands, and their buffers (one allocation, device or host memory, carved into 256-byte aligned
// pieces; with `clear`, zeroed once, so that the bytes between two pieces are defined).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_alloc.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/linear.hpp"
#include "scalemm/quantize.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"

namespace scalemm::detail {

constexpr size_t kLinearAlign = 256;
inline size_t linear_aligned(size_t b) { return (b + kLinearAlign - 1) / kLinearAlign * kLinearAlign; }

class LinearArena {
 public:
  /// `owner` names the layer in an overflow error ("ScaledLinear").
  LinearArena(const char* owner, MemorySpace space, bool clear) : owner_(owner), space_(space), clear_(clear) {}
  ~LinearArena() { release(); }
  LinearArena(const LinearArena&) = delete;
  LinearArena& operator=(const LinearArena&) = delete;

  void allocate(size_t bytes) {
    release();
    const size_t n = std::max<size_t>(bytes, 1);
    if (space_ == MemorySpace::kDevice) {
      cuda_check(detail::device_malloc(&base_, n), std::string(owner_) + " buffers (" + std::to_string(n) + " B)");
      if (clear_) cuda_check(cudaMemset(base_, 0, n), "cudaMemset");
    } else {
      host_.assign(n + kLinearAlign, 0);
      const auto p = reinterpret_cast<uintptr_t>(host_.data());
      base_ = host_.data() + (linear_aligned(p) - p);
    }
    bytes_ = bytes;
    used_ = 0;
  }
  void release() {
    if (base_ && space_ == MemorySpace::kDevice) cudaFree(base_);
    host_.clear();
    host_.shrink_to_fit();
    base_ = nullptr;
    bytes_ = used_ = 0;
  }
  char* take(size_t bytes) {
    char* p = static_cast<char*>(base_) + used_;
    used_ += linear_aligned(bytes);
    if (used_ > bytes_) throw Error(StatusCode::kInternal, std::string(owner_) + ": arena overflow");
    return p;
  }
  bool empty() const { return base_ == nullptr; }

 private:
  const char* owner_;
  MemorySpace space_;
  bool clear_;
  std::vector<uint8_t> host_;
  void* base_ = nullptr;
  size_t bytes_ = 0, used_ = 0;
};

/// The recipe and data type checks of a layer's constructor; `owner` prefixes the message.
inline void check_linear_recipe(const char* owner, LinearRecipe recipe, const LinearOptions& options) {
  auto fail = [&](const std::string& what) {
    throw Error(StatusCode::kInvalidArgument, std::string(owner) + ": " + what);
  };
  if (recipe != LinearRecipe::kBlockwiseFp8 && recipe != LinearRecipe::kMxfp8)
    fail("unknown recipe " + std::to_string(int(recipe)));
  if (options.data_dtype != DType::kE4M3 && options.data_dtype != DType::kE5M2)
    fail("data dtype must be e4m3 or e5m2, got " + std::string(scalemm::to_string(options.data_dtype)));
}

/// The activation and weight recipes of a LinearRecipe.
inline Recipe activation_recipe_of(LinearRecipe r) {
  return r == LinearRecipe::kBlockwiseFp8 ? Recipe::kBlock1x128 : Recipe::kMxfp8;
}
inline Recipe weight_recipe_of(LinearRecipe r) {
  return r == LinearRecipe::kBlockwiseFp8 ? Recipe::kBlock128x128 : Recipe::kMxfp8_32x32;
}

/// The quantizer settings of a layer's operand of recipe `r`.
inline emulation::QuantizeConfig linear_quantize_config(const LinearOptions& options, Recipe r, bool rowwise,
                                                        bool columnwise) {
  emulation::QuantizeConfig cfg;
  cfg.recipe = r;
  cfg.data_dtype = options.data_dtype;
  cfg.format = options.scale_format;
  cfg.mode = (r == Recipe::kMxfp8 || r == Recipe::kMxfp8_32x32) ? emulation::ScaleMode::kDefault
             : options.power_of_two_scales                       ? emulation::ScaleMode::kAmaxPow2
                                                                 : emulation::ScaleMode::kAmax;
  cfg.rowwise = rowwise;
  cfg.columnwise = columnwise;
  return cfg;
}

/// A layer's GEMM operand: its quantized data and scales.
inline GemmOperand linear_operand(const LinearOptions& options, const void* data, Recipe r, const void* scales) {
  GemmOperand op;
  op.data = data;
  op.dtype = options.data_dtype;
  op.recipe = r;
  op.scale = scales;
  op.scale_format = options.scale_format;
  return op;
}

/// The arguments of the layer's last `which` GEMM (forward, dgrad, wgrad), from its records `last`
/// and `ran` (three each); `owner` names the layer in the error for an unknown or not yet run GEMM.
template <class Args>
const Args& last_linear_gemm(const char* owner, const Args (&last)[3], const bool (&ran)[3], LinearGemm which) {
  const int i = int(which);
  if (i < 0 || i > 2)
    throw Error(StatusCode::kInvalidArgument, std::string(owner) + ": unknown GEMM " + std::to_string(i));
  if (!ran[i])
    throw Error(StatusCode::kInvalidArgument, std::string(owner) + ": " + std::string(to_string(which)) + " has not run yet");
  return last[i];
}

/// What both layers hold and do the same way: the recipe's operands, the weight and activation
/// arenas (the activations' grown with M), the quantizer call (scalemm::quantize, for host and device memory)
/// and the record of the last forward, dgrad and wgrad GEMMs. `Args` is GemmArgs or GroupedGemmArgs;
/// each layer's Impl derives from this and adds its own buffers and GEMMs.
template <class Options, class Args>
struct LinearCore {
  LinearCore(const char* owner_name, Handle& h, LinearRecipe r, int64_t n_, int64_t k_, const Options& o,
             MemorySpace space, bool clear)
      : owner(owner_name), handle(&h), recipe(r), n(n_), k(k_), options(o), act(activation_recipe_of(r)),
        wt(weight_recipe_of(r)), weight_arena(owner_name, space, clear), act_arena(owner_name, space, clear) {
    check_linear_recipe(owner_name, r, o);
  }

  const char* owner;
  Handle* handle;
  LinearRecipe recipe;
  int64_t n, k;
  Options options;
  Recipe act, wt;  // the activations' and the weights' recipe

  LinearArena weight_arena, act_arena;
  char* w_workspace = nullptr;
  size_t w_workspace_bytes = 0;
  bool has_weight = false;
  int64_t capacity = 0;  // rows (M, or tokens) the activation buffers were sized for
  char* act_workspace = nullptr;
  size_t act_workspace_bytes = 0;

  Args last[3];
  bool ran[3] = {false, false, false};

  emulation::QuantizeConfig config(Recipe r, bool rowwise, bool columnwise) const {
    return linear_quantize_config(options, r, rowwise, columnwise);
  }
  GemmOperand operand(const void* data, Recipe r, const void* scales) const {
    return linear_operand(options, data, r, scales);
  }
  /// Quantizes an fp32 (rows, cols) source with `cfg` into `out`: scalemm::quantize, which runs host
  /// memory (a host layer's) on the host and device memory on `stream`.
  void quantize(const float* src, int64_t rows, int64_t cols, const emulation::QuantizeConfig& cfg,
                const emulation::QuantizeOutputs& out, void* ws, size_t ws_bytes, Stream stream) const {
    scalemm::quantize::quantize(emulation::SourceMatrix{src, DType::kF32, rows, cols}, cfg, out, ws, ws_bytes, stream);
  }
  /// A GEMM's arguments, with what dense and grouped calls share filled in.
  Args gemm_args(int64_t gm, int64_t gn, int64_t gk, const GemmOperand& a, const GemmOperand& b, void* d, DType d_dtype,
                 MemorySpace space) const {
    Args args;
    args.m = gm, args.n = gn, args.k = gk;
    args.a = a, args.b = b;
    args.d = d, args.d_dtype = d_dtype;
    args.space = space;
    return args;
  }
  void record(LinearGemm which, const Args& args) {
    last[int(which)] = args;
    ran[int(which)] = true;
  }
  void forget_gemms() { ran[0] = ran[1] = ran[2] = false; }
  const Args& last_gemm(LinearGemm which) const { return last_linear_gemm(owner, last, ran, which); }
};

}  // namespace scalemm::detail
