// The grouped kernels when CUTLASS's headers were not found at configure time (lib/CMakeLists.txt builds
// this file instead of cutlass_grouped_sm90a.cu and contiguous_grouped_sm90a.cu): absent, so the
// per-group backend runs every call.
#include "backends/contiguous_grouped.hpp"
#include "backends/cutlass_grouped.hpp"

namespace scalemm {

namespace backends::cutlass_grouped {
bool built() { return false; }
std::string blocker(const GroupedGemmArgs&, const DeviceTarget&) { return "not built"; }
size_t workspace_bytes(const GroupedGemmArgs&, const DeviceTarget&) { return 0; }
void run(const GroupedGemmArgs&, Stream, char*, size_t, uint64_t) {
  throw Error(StatusCode::kInternal, "cutlass_grouped: not built");
}
std::string describe(const GroupedGemmArgs&) { return "not built"; }
}  // namespace backends::cutlass_grouped

namespace backends::contiguous_grouped {
bool built() { return false; }
std::string blocker(const GroupedGemmArgs&, const DeviceTarget&) { return "not built"; }
void run(const GroupedGemmArgs&, Stream, Tiles) { throw Error(StatusCode::kInternal, "contiguous_grouped: not built"); }
std::string describe(const GroupedGemmArgs&, Tiles) { return "not built"; }
}  // namespace backends::contiguous_grouped

}  // namespace scalemm
