// Umbrella header of the scalemm C++ API.
#pragma once

#include "scalemm/config.hpp"
#include "scalemm/device.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"
#include "scalemm/version.hpp"
