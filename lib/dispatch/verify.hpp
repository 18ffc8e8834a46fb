// Per-call verification against the reference emulator (SCALEMM_VERIFY=off|sample|full).
//
// sample: the reference dequantizes A and B to f32 on the device and recomputes a seeded set of
//         output elements (every row for a few columns and every column for a few rows);
// full:   the reference recomputes all of D.
// On a mismatch beyond gemm_tolerance it reports shapes, recipes, backend, the worst element and its
// error vs the tolerance, dumps the call under SCALEMM_VERIFY_DUMP (inputs as .npy + call.json, which
// `scalemm replay` reproduces) and throws Error(kVerificationFailed).
#pragma once

#include <string>

#include "scalemm/emulation/compare.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm::verify {

enum class Mode { kOff, kSample, kFull };

/// SCALEMM_VERIFY, defaulting to kFull in builds without NDEBUG (Debug) and kOff otherwise.
/// An unknown value throws Error(kInvalidArgument).
Mode mode_from_environment();
Mode parse_mode(const std::string& s);

/// Synchronises `stream`, recomputes the reference and compares. Throws on mismatch.
void check(const GemmArgs& args, const Plan& plan, Mode mode, Stream stream);

/// The tolerance a backend's result must meet against the reference: emulation::gemm_tolerance (fp32
/// accumulation in another order) widened for FP8 tensor-core kernels, whose MMA accumulates with
/// reduced precision.
emulation::Tolerance tolerance_for(const GemmArgs& args, const Plan& plan, double ref_scale);

/// Writes a call (device or host pointers) to `dir`: a.npy, scale_a.npy, b.npy, scale_b.npy,
/// [bias.npy], d.npy (the result under test) and call.json. Returns the directory.
std::string dump_call(const GemmArgs& args, const Plan& plan, const std::string& dir, const std::string& note);

}  // namespace scalemm::verify
