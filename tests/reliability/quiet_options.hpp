// Handle options of the reliability tests: deterministic (no autotuning), verification as asked
// (off unless a test is about it), a backend forced when given.
#pragma once

#include <optional>

#include "scalemm/gemm.hpp"

namespace scalemm::testing {

inline HandleOptions quiet(std::optional<Backend> force = std::nullopt, VerifyMode verify = VerifyMode::kOff) {
  HandleOptions ho;
  ho.verify = verify;
  ho.autotune = Autotune::kOff;
  ho.plan.force = force;
  return ho;
}

}  // namespace scalemm::testing
