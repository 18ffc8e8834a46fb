// Staging memory of a stream for calls that prepare their operands before the dense path runs (the
// k-grouped gather of backends/per_group.cpp) or that carry their own arguments (the CUTLASS grouped
// kernel's per-group arrays). Separate from the plans' scratch, which each dense call takes under its
// own lock.
#pragma once

#include <cstddef>
#include <mutex>

#include "dispatch/verify.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm::dispatch {

/// `ptr` holds at least the bytes asked for until `lock` is released: one grouped call at a time per
/// stream stages into it. Growing synchronises the stream first, as the plan scratch does.
struct StagingScratch {
  std::unique_lock<std::mutex> lock;
  char* ptr = nullptr;
};
StagingScratch staging_scratch(Handle::Impl& impl, Stream stream, size_t bytes);

/// The handle's settings that grouped calls follow as dense calls do.
const HandleOptions& handle_options(const Handle::Impl& impl);
verify::Mode handle_verify_mode(const Handle::Impl& impl);

}  // namespace scalemm::dispatch
