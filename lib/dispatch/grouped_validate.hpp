// Validation of a grouped call (grouped.hpp's validate and validate_sizes, and the handle's own checks
// before it runs one).
#pragma once

#include "scalemm/grouped.hpp"

namespace scalemm::dispatch {

/// How far validate_grouped() goes: the arguments and sizes only (validate_sizes); the operands as whole
/// tensors (A's (m, K), B's first expert: enough for a one-launch backend, whose plan demands per-row
/// compact A scales and 16-byte rows, and far cheaper for large G); or group by group as each group's
/// dense call will see them (validate).
enum class Depth { kSizes, kWhole, kPerGroup };

Diagnostics validate_grouped(const GroupedGemmArgs& a, Depth depth);

}  // namespace scalemm::dispatch
