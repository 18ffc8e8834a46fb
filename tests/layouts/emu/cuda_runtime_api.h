// The CPU emulation of the CUDA runtime API header (see cuda_runtime.h beside it).
#pragma once
#include "cuda_runtime.h"
