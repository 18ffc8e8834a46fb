// The dense planner's run half (planner.cpp, beside the backend table and plan()).
#pragma once

#include "backends/backend.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm::dispatch {

/// Runs `plan` (made for `args`'s problem) through its backend; a staged FP8 output is written to the
/// plan's slice by the backend and converted into args.d afterwards.
void execute(const GemmArgs& args, const Plan& plan, const backends::RunContext& ctx);

}  // namespace scalemm::dispatch
