// The GPU kernels of layouts/cuda/convert.cu compiled as plain C++ against the CPU emulation in
// this directory (its cuda_runtime.h shadows the real one for this target only).
#include "../../../layouts/cuda/convert.cu"
