// What the convert-then-native backend reuses of the native one: compact -> cuBLASLt scale
// conversions (planned and run) and the cuBLASLt call of a problem.
#pragma once

#include "backends/backend.hpp"

namespace scalemm::backends::native {

/// Workspace tags of the scale conversions (the convert-native backend numbers its own from 2).
enum Slot : int { kScaleA = 0, kScaleB = 1 };

/// Plans the compact -> cuBLASLt conversions a native call needs (Plan::convert_scale_a/b, their
/// conversions and workspace slices) and sets the plan's cuBLASLt scale modes.
void plan_scales(const GemmProblem& p, Plan& plan);

/// A compact scale buffer that cuBLASLt reads as it is, off 16-byte alignment: copied to the slice
/// `tag` of the plan (reserved by plan_scales, or by the caller's plan), scale_ptr pointed at it.
void realign(const GemmOperand& op, int64_t rows, int64_t k, const Plan& plan, const RunContext& ctx, int tag,
             const void*& scale_ptr);

/// Runs the planned conversions into their slices; scale_ptr[0/1] end up at what cuBLASLt reads.
void run_scales(const GemmArgs& args, const Plan& plan, const RunContext& ctx, const void* scale_ptr[2]);

/// The cuBLASLt call of `args` with A's data and rows replaced (a padded copy) and D redirected.
LtCall lt_call(const GemmArgs& args, const void* const scale_ptr[2], const void* a_data, int64_t m, void* d);

/// alpha times both global scales (NVFP4's decode scales; 1 for other recipes).
inline float folded_alpha(const GemmArgs& args) { return args.alpha * args.a.global_scale * args.b.global_scale; }

}  // namespace scalemm::backends::native
