// cuBLASLt's grouped matmul API: the version -> capability table on simulated versions and the probe of
// the loaded library (reported by `scalemm info`, never used to run a GEMM).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "cublaslt/cublaslt_grouped.hpp"
#include "scalemm/device.hpp"

using namespace scalemm;
using backends::lt_grouped_api;

namespace {
bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }
bool any_contains(const std::vector<std::string>& v, const std::string& s) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& x) { return x.find(s) != std::string::npos; });
}
}  // namespace

TEST_CASE("cuBLASLt grouped API: version gates on simulated versions", "[dispatch][grouped][lt-grouped]") {
  SECTION("13.1: absent, nothing supported") {
    const auto g = lt_grouped_api(false, 130100, 90);
    CHECK_FALSE(g.present);
    CHECK(g.supports.empty());
    CHECK(g.hazards.empty());
    CHECK(g.note.find("no grouped matmul API") != std::string::npos);
    CHECK(g.summary().find("absent (cuBLASLt 13.1.0; the API arrived in 13.2.0)") == 0);
    CHECK(g.summary().find("per-group backend") != std::string::npos);
  }
  SECTION("13.2: present, no FP8 block scaling on Hopper, its hazards") {
    const auto g = lt_grouped_api(true, 130200, 90);
    CHECK(g.present);
    CHECK(g.supports.empty());
    CHECK(any_contains(g.hazards, "wrong wgrad"));
    CHECK(any_contains(g.hazards, "empty"));
    CHECK(any_contains(g.hazards, "replayed CUDA graph"));
    CHECK(any_contains(g.hazards, "experimental"));
    CHECK(g.summary().find("present (cuBLASLt 13.2.0): no scaled FP8/FP4 recipe on sm_90") == 0);
  }
  SECTION("13.4 on Hopper: blockwise, not tensorwise; the graph hazard stays, the empty-group one is gone") {
    const auto g = lt_grouped_api(true, 130400, 90);
    CHECK(g.supports == std::vector<std::string>{"blockwise"});
    CHECK_FALSE(any_contains(g.hazards, "wrong wgrad"));
    CHECK(any_contains(g.hazards, "replayed CUDA graph"));
    CHECK(g.summary().find("blockwise on sm_90") != std::string::npos);
  }
  SECTION("13.5 on Hopper: tensorwise too") {
    const auto g = lt_grouped_api(true, 130500, 90);
    CHECK(has(g.supports, "blockwise"));
    CHECK(has(g.supports, "tensorwise"));
  }
  SECTION("13.8: no version hazard left but the experimental API") {
    const auto g = lt_grouped_api(true, 130800, 90);
    CHECK_FALSE(any_contains(g.hazards, "replayed CUDA graph"));
    CHECK(any_contains(g.hazards, "experimental"));
  }
  SECTION("Blackwell: MXFP8 and tensorwise from 13.3, NVFP4 from 13.4, never FP8 block scaling") {
    CHECK(lt_grouped_api(true, 130200, 100).supports.empty());
    const auto g133 = lt_grouped_api(true, 130300, 100);
    CHECK(has(g133.supports, "mxfp8"));
    CHECK(has(g133.supports, "tensorwise"));
    CHECK_FALSE(has(g133.supports, "nvfp4"));
    const auto g = lt_grouped_api(true, 130500, 100);
    CHECK(has(g.supports, "nvfp4"));
    CHECK_FALSE(has(g.supports, "blockwise"));
  }
  SECTION("architectures the API does not list, and no device") {
    CHECK(lt_grouped_api(true, 130500, 89).supports.empty());
    CHECK(lt_grouped_api(true, 130500, 120).supports.empty());
    const auto none = lt_grouped_api(true, 130500, 0);
    CHECK(none.supports.empty());
    CHECK(none.summary().find("on no device") != std::string::npos);
  }
  SECTION("a library of 13.2 or later that does not export the symbol is reported absent") {
    const auto g = lt_grouped_api(false, 130400, 90);
    CHECK(g.supports.empty());
    CHECK(g.summary().find("no cublasLtGroupedMatrixLayoutCreate exported") != std::string::npos);
  }
}

TEST_CASE("cuBLASLt grouped API: the probe agrees with the loaded library's version", "[dispatch][grouped][lt-grouped]") {
  const size_t version = query_devices().cublaslt_version;
  const auto g = backends::probe_lt_grouped_api(90);
  CHECK(g.version == version);
  // The symbol arrived in 13.2: a 13.1 library cannot export it. (A newer one normally does.)
  if (version < backends::lt_grouped_min_version()) CHECK_FALSE(g.present);
  INFO(g.summary());
  CHECK(g.summary().find(g.present ? "present" : "absent") == 0);
}
