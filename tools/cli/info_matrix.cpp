// `scalemm info`'s support matrix: for every recipe pair, the backend plan() picks on this machine
// (or on a simulated one: --sm N [--cublas X.Y]) and why, read from the planner and the native-pair
// table; nothing here restates a capability. With several devices, every device gets its row (how many
// pairs each backend takes) and every distinct device its matrix.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "backends/cutlass_grouped.hpp"
#include "cublaslt/cublaslt_grouped.hpp"
#include "cli_io.hpp"
#include "base/capabilities.hpp"
#include "commands.hpp"
#include "scalemm/device.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/version.hpp"

namespace scalemm::cli {
namespace {

struct InfoCli {
  int sm = -1;
  std::string cublas;
  bool json = false;
  CLI::Option* cublas_opt = nullptr;
};

size_t parse_cublas_version(const std::string& s) {
  int major = 0, minor = 0, patch = 0;
  char tail = 0;
  const int got = std::sscanf(s.c_str(), "%d.%d.%d%c", &major, &minor, &patch, &tail);
  if (got < 2 || got > 3 || major < 1 || major > 99 || minor < 0 || minor > 99 || patch < 0 || patch > 99)
    throw Error(StatusCode::kInvalidArgument, "--cublas: expected a version like 13.1 or 12.9.1, got '" + s + "'");
  return base::cublaslt_version(major, minor, patch);
}

// The shape every pair is planned for: a multiple of every alignment rule, so the answer is about the
// recipes (and the machine), not the shape.
constexpr int64_t kShape = 256;

struct Row {
  Recipe a, b;
  std::string backend;
  std::vector<std::string> reasons;  // passed-over backends, then the chosen one
};

std::vector<Row> support_matrix(const DeviceTarget& t) {
  std::vector<Row> rows;
  for (Recipe ra : kAllRecipes) {
    for (Recipe rb : kAllRecipes) {
      GemmProblem p;
      p.m = p.n = p.k = kShape;
      p.a_recipe = ra;
      p.b_recipe = rb;
      p.a_dtype = ra == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3;
      p.b_dtype = rb == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3;
      p.d_dtype = DType::kBF16;
      p.space = t.has_gpu() ? MemorySpace::kDevice : MemorySpace::kHost;
      Row r{ra, rb, "", {}};
      try {
        const Plan plan = scalemm::plan(p, t);
        r.backend = std::string(to_string(plan.backend));
        r.reasons.assign(plan.reasons.begin() + (plan.reasons.empty() ? 0 : 1), plan.reasons.end());
      } catch (const Error& e) {
        r.backend = "none";
        r.reasons = {e.what()};
      }
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

DeviceTarget target_for(const InfoCli& c) {
  if (c.sm < 0) {
    if (c.cublas_opt && c.cublas_opt->count() > 0)
      throw Error(StatusCode::kInvalidArgument, "--cublas: only with --sm (it sets the simulated machine's "
                                                "cuBLASLt version); add --sm 90 or drop --cublas");
    return DeviceTarget::current();
  }
  size_t v = DeviceTarget::current().cublaslt_version;
  if (c.cublas_opt && c.cublas_opt->count() > 0) v = parse_cublas_version(c.cublas);
  if (v == 0) v = base::cublaslt_version(13, 1);
  return DeviceTarget::simulated(c.sm, v);
}

// One device's capability row: how many of the recipe pairs each backend takes.
std::string backend_counts(const std::vector<Row>& rows) {
  std::string out;
  for (const char* b : {"contiguous", "native", "convert-native", "emulated", "reference", "none"}) {
    int n = 0;
    for (const auto& r : rows) n += r.backend == b;
    if (n == 0 && (std::string(b) == "none" || std::string(b) == "contiguous")) continue;
    out += (out.empty() ? "" : ", ") + std::string(b) + " " + std::to_string(n);
  }
  return out + " of " + std::to_string(rows.size()) + " pairs";
}

nlohmann::json support_json(const std::vector<Row>& rows) {
  nlohmann::json m = nlohmann::json::array();
  for (const auto& r : rows)
    m.push_back({{"a", std::string(to_string(r.a))}, {"b", std::string(to_string(r.b))}, {"backend", r.backend},
                 {"reasons", r.reasons}});
  return m;
}

void print_matrix(const std::string& what, const DeviceTarget& t, const std::vector<Row>& rows, bool simulated) {
  std::printf("\nsupport matrix for %s%s (A x B, e4m3/e2m1 data, bf16 output, M=N=K=%lld):\n", what.c_str(),
              simulated ? " [simulated]" : "", static_cast<long long>(kShape));
  if (!t.has_gpu())
    std::printf("  (no GPU: every GEMM runs on the host reference emulator; --sm 90 or --sm 100 asks about a GPU)\n");
  for (const auto& r : rows) {
    const std::string pair = std::string(to_string(r.a)) + " x " + std::string(to_string(r.b));
    std::printf("  %-27s %-15s %s\n", pair.c_str(), r.backend.c_str(), r.reasons.empty() ? "" : r.reasons.back().c_str());
    // Why the native backend was passed over.
    if (r.backend != "native" && t.has_gpu())
      for (const auto& why : r.reasons)
        if (why.rfind("native: ", 0) == 0) std::printf("  %-27s %-15s   not native: %s\n", "", "", why.substr(8).c_str());
  }
}

// cuBLASLt's grouped matmul API on the target: probed in the loaded library, or, for a simulated
// machine, taken as present from 13.2 on. Reported only: grouped GEMMs run on scalemm's own backends.
backends::LtGroupedApi lt_grouped_for(const DeviceTarget& t, bool simulated) {
  if (simulated)
    return backends::lt_grouped_api(t.cublaslt_version >= backends::lt_grouped_min_version(), t.cublaslt_version, t.sm);
  return backends::probe_lt_grouped_api(t.has_gpu() ? t.sm : 0);
}

nlohmann::json lt_grouped_json(const backends::LtGroupedApi& g, bool simulated) {
  return {{"present", g.present}, {"version", g.version}, {"sm", g.sm}, {"supports", g.supports},
          {"hazards", g.hazards}, {"note", g.note},       {"simulated", simulated}, {"used", false},
          {"summary", g.summary()}};
}

void print_lt_grouped(const backends::LtGroupedApi& g, bool simulated) {
  std::printf("\ncuBLASLt grouped API%s: %s\n", simulated ? " [simulated: present from 13.2]" : "",
              g.summary().c_str());
  if (!g.note.empty()) std::printf("  %s\n", g.note.c_str());
  for (const auto& h : g.hazards) std::printf("  hazard: %s\n", h.c_str());
}

// Grouped GEMMs: what runs them here (the CUTLASS grouped kernel, if built) and cuBLASLt's grouped API.
void print_grouped(const DeviceTarget& t, bool simulated) {
  std::printf("\ngrouped GEMMs: CUTLASS grouped kernel %s; every other call runs one dense call per group\n",
              !backends::cutlass_grouped::built() ? "not built (tools/fetch-cutlass.sh, then reconfigure)"
              : t.sm == 90 ? "built, runs blockwise 1x128 x 128x128 / 1x128 and rowwise FP8 on this sm_90"
                           : "built for sm_90a, not this target");
  print_lt_grouped(lt_grouped_for(t, simulated), simulated);
}

void run(const InfoCli& c, const std::function<void()>& device_part) {
  const DeviceTarget t = target_for(c);
  const auto rows = support_matrix(t);
  const bool simulated = c.sm >= 0;
  // Every device of the process, each with its own matrix (the planner's answer per device).
  const std::vector<DeviceTarget>& devices = DeviceTarget::all();
  std::vector<std::vector<Row>> per_device;
  for (const auto& d : devices) per_device.push_back(support_matrix(d));
  if (c.json) {
    const DeviceQuery q = query_devices();
    nlohmann::json j;
    j["version"] = SCALEMM_VERSION_STRING;
    j["cuda_runtime"] = q.runtime_version;
    j["cuda_driver"] = q.driver_version;
    j["cublaslt"] = q.cublaslt_version;
    nlohmann::json devs = nlohmann::json::array();
    for (const auto& d : q.devices) {
      nlohmann::json dj = {{"ordinal", d.ordinal}, {"name", d.name}, {"sm", d.sm}, {"multiprocessors", d.multiprocessors},
                           {"global_memory_bytes", d.global_memory_bytes}};
      for (size_t i = 0; i < devices.size(); ++i)
        if (devices[i].ordinal == d.ordinal) {
          dj["target"] = devices[i].describe();
          dj["capabilities"] = backend_counts(per_device[i]);
          dj["support"] = support_json(per_device[i]);
        }
      devs.push_back(std::move(dj));
    }
    j["devices"] = devs;
    if (q.devices.empty()) j["no_device_reason"] = q.reason;
    j["target"] = {{"description", t.to_string()}, {"sm", t.sm}, {"cublaslt", t.cublaslt_version},
                   {"simulated", simulated}};
    if (!simulated && t.ordinal >= 0) j["target"]["ordinal"] = t.ordinal;
    j["shape"] = {{"m", kShape}, {"n", kShape}, {"k", kShape}};
    j["support"] = support_json(rows);
    size_t count = 0;
    const base::NativePair* pairs = base::native_pairs(&count);
    nlohmann::json np = nlohmann::json::array();
    for (size_t i = 0; i < count; ++i)
      np.push_back({{"a", std::string(to_string(pairs[i].a))}, {"b", std::string(to_string(pairs[i].b))},
                    {"supported", pairs[i].supported}, {"min_sm", pairs[i].min_sm}, {"max_sm", pairs[i].max_sm},
                    {"min_cublaslt", pairs[i].min_cublaslt}, {"source", pairs[i].source}});
    j["native_pairs"] = np;
    j["cublaslt_grouped_api"] = lt_grouped_json(lt_grouped_for(t, c.sm >= 0), c.sm >= 0);
    j["cutlass_grouped_kernel"] = {{"built", backends::cutlass_grouped::built()}, {"runs_here", backends::cutlass_grouped::built() && t.sm == 90}};
    std::cout << j.dump(2) << '\n';
    return;
  }
  device_part();
  if (!devices.empty()) {
    std::printf("\ncapabilities per device (backend of each recipe pair, M=N=K=%lld):\n", static_cast<long long>(kShape));
    for (size_t i = 0; i < devices.size(); ++i)
      std::printf("  %s: %s\n", devices[i].describe().c_str(), backend_counts(per_device[i]).c_str());
  }
  if (simulated || devices.size() <= 1) {
    print_matrix(t.to_string(), t, rows, simulated);
    print_grouped(t, simulated);
    return;
  }
  // Several devices: one matrix per distinct machine (sm and cuBLASLt decide every plan).
  for (size_t i = 0; i < devices.size(); ++i) {
    size_t same = i;
    for (size_t j = 0; j < i && same == i; ++j)
      if (devices[j].sm == devices[i].sm && devices[j].cublaslt_version == devices[i].cublaslt_version) same = j;
    if (same != i) {
      std::printf("\nsupport matrix for device %d: as for device %d (same sm_%d and cuBLASLt)\n", devices[i].ordinal,
                  devices[same].ordinal, devices[i].sm);
      continue;
    }
    print_matrix(devices[i].describe(), devices[i], per_device[i], false);
  }
  print_grouped(t, simulated);
}

}  // namespace

void extend_info_command(CLI::App* info, std::function<void()> device_part) {
  static InfoCli c;
  // Compute capabilities run from 3.0 to 12.x: a one-digit value (7 for sm_70?) is refused, not simulated.
  info->add_option("--sm", c.sm, "Ask about another machine: compute capability as major*10+minor (90, 100, 120)")
      ->check(whole_number(30, 199, "a compute capability as major*10+minor, e.g. 80, 89, 90, 100, 120; sm_90 is 90"));
  c.cublas_opt = info->add_option("--cublas", c.cublas, "With --sm: the cuBLASLt version, e.g. 13.4 (default: this one)");
  info->add_flag("--json", c.json, "Print everything as JSON");
  info->callback([device_part] { run(c, device_part); });
}

}  // namespace scalemm::cli
