// Helpers shared by scalemm tests: the run's seed, GPU presence, poison values.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace scalemm::testing {

/// The seed of this run: SCALEMM_TEST_SEED if set, else a fresh one. Printed at start-up so any
/// failure can be replayed with SCALEMM_TEST_SEED=<seed>.
uint32_t seed();

/// A generator seeded from seed() and a per-test salt, so tests do not share streams.
inline std::mt19937_64 rng(uint64_t salt) { return std::mt19937_64(uint64_t(seed()) * 0x9E3779B97F4A7C15ull ^ salt); }

bool gpu_available(std::string* reason = nullptr);
/// CUDA devices this process sees (0 without a GPU).
int gpu_count();
std::string gpu_name();

}  // namespace scalemm::testing
