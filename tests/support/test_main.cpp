// Catch2 main shared by every scalemm test executable.
//
// [gpu] test cases need a CUDA device. When none is usable, this main prints why and removes them from
// the run; if the run selected only [gpu] cases (as CTest does, one case per process) it exits with 77,
// which CTest reports as "Skipped". A [gpu] case therefore never passes silently on a CPU-only machine.
// [gpu][multi-gpu] cases need two devices: with one they are skipped the same way, saying so.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "scalemm/device.hpp"
#include "support/test_support.hpp"

namespace {

bool has_tag(const Catch::TestCase& t, const char* tag) {
  for (const auto& s : t.tags)
    if (s == tag) return true;
  return false;
}

// Escapes a test name for use as a Catch2 v2 test spec.
std::string escape_spec(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == ',' || c == '[' || c == ']' || c == '\\' || c == '"' || c == '~' || c == '*') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv)) return rc;
  const auto& cfg = session.config();
  if (cfg.listTests() || cfg.listTestNamesOnly() || cfg.listTags() || cfg.listReporters())
    return session.run();

  std::string reason;
  const bool gpu = scalemm::testing::gpu_available(&reason);
  const int devices = gpu ? scalemm::testing::gpu_count() : 0;
  std::printf("scalemm tests: seed %u (replay with SCALEMM_TEST_SEED=%u); CUDA device: %s\n",
              scalemm::testing::seed(), scalemm::testing::seed(),
              gpu ? scalemm::testing::gpu_name().c_str() : "none");
  const std::string multi_reason = "needs 2 CUDA devices, this process has " + std::to_string(devices);
  if (gpu && devices >= 2) return session.run();

  auto selected = Catch::filterTests(Catch::getAllTestCasesSorted(cfg), cfg.testSpec(), cfg);
  std::vector<std::string> host;
  int skipped = 0;
  for (const auto& t : selected) {
    const bool needs_gpu = has_tag(t, "gpu");
    const bool needs_two = needs_gpu && has_tag(t, "multi-gpu");
    if ((needs_gpu && !gpu) || needs_two) {
      std::printf("SKIPPED [gpu] \"%s\": %s\n", t.name.c_str(), gpu ? multi_reason.c_str() : reason.c_str());
      ++skipped;
    } else {
      host.push_back(t.name);
    }
  }
  if (gpu) reason = multi_reason;
  std::fflush(stdout);
  if (skipped == 0) return session.run();
  if (host.empty()) return 77;  // CTest: SKIP_RETURN_CODE

  std::string spec;
  for (const auto& n : host) spec += (spec.empty() ? "" : ",") + escape_spec(n);
  auto& data = session.configData();
  data.testsOrTags = {spec};
  session.useConfigData(data);
  int rc = session.run();
  std::printf("scalemm tests: %d [gpu] test case(s) skipped: %s\n", skipped,
              reason.c_str());
  return rc;
}
