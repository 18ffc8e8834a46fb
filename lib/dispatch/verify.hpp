// Per-call verification against the reference emulator (SCALEMM_VERIFY=off|sample|full).
//
// sample: asynchronous. Right behind the GEMM, on the same stream, a kernel recomputes a seeded set of
//         output elements (dequantizing A and B on the fly through the layout contract) and a second one
//         compares them within the tolerance; the verdict lands in pinned memory and is collected at
//         the next call on that stream (or by AsyncSampler::drain). No host sync, no allocation.
// full:   synchronous. The reference recomputes all of D before the call returns.
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

/// Synchronises `stream`, recomputes the reference (all of D for kFull, every row for 4 seeded columns
/// and every column for 4 seeded rows for kSample) and compares. Throws on mismatch.
void check(const GemmArgs& args, const Plan& plan, Mode mode, Stream stream);

/// The tolerance a backend's result must meet against the reference: emulation::gemm_tolerance (fp32
/// accumulation in another order) widened for FP8 tensor-core kernels, whose MMA accumulates with
/// reduced precision.
emulation::Tolerance tolerance_for(const GemmArgs& args, const Plan& plan, double ref_scale);

/// The asynchronous sample checker of one stream (owned by the Handle's per-stream arena).
class AsyncSampler {
 public:
  static constexpr int kSamples = 128;  ///< output elements recomputed per call (a wrong layout corrupts most of D)
  static constexpr int kSlots = 4;      ///< checks in flight before the oldest is waited for

  AsyncSampler();
  ~AsyncSampler();
  AsyncSampler(const AsyncSampler&) = delete;
  AsyncSampler& operator=(const AsyncSampler&) = delete;

  /// Enqueues the check of the call just enqueued on `stream`. Throws the failure of an earlier call
  /// when a slot has to be reused.
  void enqueue(const GemmArgs& args, const Plan& plan, Stream stream);
  /// Throws Error(kVerificationFailed) for the first finished check that failed; returns otherwise.
  void poll();
  /// Waits for every check in flight, then as poll().
  void drain();

  struct Impl;

 private:
  Impl* impl_;
};

/// Writes a call (device or host pointers) to `dir`: a.npy, scale_a.npy, b.npy, scale_b.npy,
/// [bias.npy], d.npy (the result under test) and call.json. Returns the directory.
std::string dump_call(const GemmArgs& args, const Plan& plan, const std::string& dir, const std::string& note);

}  // namespace scalemm::verify
