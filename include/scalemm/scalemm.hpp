// Umbrella header of the scalemm C++ API: every public header (the C ABI is scalemm/scalemm.h).
#pragma once

#include "scalemm/config.hpp"
#include "scalemm/device.hpp"
#include "scalemm/emulation/compare.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/io/call_record.hpp"
#include "scalemm/io/npy.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/linear.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"
#include "scalemm/version.hpp"
