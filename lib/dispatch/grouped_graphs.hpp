// Whole-call graphs of grouped calls (GroupedGemmArgs::graph_replay): captured on a call's first run,
// replayed while the call repeats exactly.
#pragma once

#include <functional>
#include <string>

#include "dispatch/verify.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"

namespace scalemm::dispatch {

/// Why a graph_replay call runs without its graph (empty: it can have one).
std::string graph_blocker(const GroupedGemmArgs& a, Stream stream, verify::Mode mode);

/// Replays the graph of `a` on `stream` if the handle has one; otherwise runs `run` (which allocates
/// whatever the call needs and computes D), then captures it for the next time.
void run_with_graph(Handle::Impl& impl, const GroupedGemmArgs& a, Stream stream, int device,
                    const std::function<void()>& run);

}  // namespace scalemm::dispatch
