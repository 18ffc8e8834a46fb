// Device allocations for GPU test cases: freed on scope exit, filled from the host on request.
#pragma once

#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"

namespace scalemm::testing {

/// The library's one device allocation (scalemm/detail/device_buffer.hpp): uploads finish before use.
using Dev = scalemm::detail::DeviceBuffer;

}  // namespace scalemm::testing
