// Scaled GEMM in framework terms: D (M,N) = alpha * A (M,K) * B^T (+ bias), B given as (N,K), as in a
// linear layer Y = X W^T. A and B are row-major with K contiguous; each has its own recipe, data dtype
// and scale format. The mapping to cuBLASLt's column-major TN form (operand and scale-pointer swap)
// happens inside; callers never see it.
//
// Two phases, as everywhere in scalemm: plan() is pure host work (testable against simulated
// devices) and says which backend will run, why, which conversions it needs and how much workspace;
// Handle::gemm() executes a plan on a stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scalemm/formats.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"

namespace scalemm {

struct GroupedGemmArgs;  // grouped.hpp
struct HandleAccess;     // library-internal (lib/dispatch/handle.cpp)

/// One input operand: data (rows, K) row-major with K contiguous, and its scales.
struct GemmOperand {
  const void* data = nullptr;  ///< E4M3/E5M2 bytes, or E2M1 packed two per byte (element 2i low nibble)
  DType dtype = DType::kE4M3;
  Recipe recipe = Recipe::kTensorwise;
  const void* scale = nullptr;  ///< scale buffer, laid out as ScaleLayout(recipe, rows, K, scale_format)
  ScaleFormat scale_format = ScaleFormat::kCompact;
  float global_scale = 1.0f;  ///< NVFP4: the per-tensor decode scale (1/S_enc); 1 for other recipes
};

/// D (M,N) = alpha * A (M,K) * B^T (+ bias[N]). All pointers in `space`.
///
/// FP8 output (d_dtype e4m3 or e5m2) needs `d_scale`: D = fp8(d_scale * (alpha * A * B^T + bias)),
/// rounded to nearest even and saturated to the format's largest finite value, as cuBLASLt does with
/// D_SCALE_POINTER. `d_amax`, when given, receives max |alpha * A * B^T + bias| over D (before d_scale:
/// the amax a delayed-scaling recipe feeds into the next d_scale). cuBLASLt runs FP8 output natively
/// only with tensorwise scales on both operands; every other pair goes through an fp32 D and one
/// quantizing pass (the plan says so).
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  GemmOperand a, b;
  void* d = nullptr;
  DType d_dtype = DType::kBF16;  ///< bf16, f16, f32, or e4m3/e5m2 with d_scale
  const void* bias = nullptr;    ///< optional bf16 [N]
  float alpha = 1.0f;
  MemorySpace space = MemorySpace::kDevice;
  /// FP8 output only: fp32 scalar multiplier applied before conversion; positive and finite (a host
  /// one is checked by validate(), rule d-scale-value; a device one is read by the kernel only).
  const float* d_scale = nullptr;
  float* d_amax = nullptr;         ///< FP8 output only, optional: fp32 scalar receiving the output's amax
  /// Tensorwise and rowwise operands only: cuBLASLt's FP8 kernels may keep their tensor-core partial
  /// sums without the periodic promotion to fp32 (CUBLASLT_MATMUL_DESC_FAST_ACCUM; torch's
  /// use_fast_accum): faster, less exact for long K. A permission: backends other than cuBLASLt
  /// accumulate exactly, and explain() says which applies. Off by default.
  bool fast_accum = false;
};

/// True for the output types that need a D scale.
SCALEMM_HD constexpr bool is_fp8_output(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }
/// Largest finite value of an FP8 output type, where its D saturates (E4M3 448, E5M2 57344).
SCALEMM_HD constexpr float fp8_output_max(DType t) {
  return t == DType::kE5M2 ? formats::kE5M2Max : formats::kE4M3Max;
}

/// Where a GEMM runs. The planner tries them in this order: contiguous (where its measured rule
/// takes the call), native, convert-native, emulated, reference. The values are the C ABI's.
enum class Backend : uint8_t {
  kNative = 0,          ///< cuBLASLt with the recipe's own scale mode
  kConvertNative = 1,   ///< convert the recipe (e.g. power-of-two 128x128 -> MXFP8), then cuBLASLt
  kEmulated = 2,        ///< exact dequantization to BF16, then a cuBLASLt BF16 GEMM (fp32 accumulate)
  kReference = 3,       ///< the reference emulator (GPU when there is one, else the host)
  /// scalemm's blockwise kernel (block1x128 x block128x128, compact or cuBLASLt-format scales read in
  /// place, bf16 out, sm_90) as one group: `auto` takes it at M <= 256 where its tiles fill enough SMs,
  /// saving cuBLASLt's host path and, for compact scales, the conversion launch, and for the largest
  /// outputs (M >= 4096, N and K >= 2048, M x N >= 2^25), where it measured faster (docs/dispatch.md)
  kContiguous = 4,
};
inline constexpr int kBackendCount = 5;
std::string_view to_string(Backend b);
std::optional<Backend> parse_backend(std::string_view s);

/// The machine a plan is made for: a device of this process, or a simulated one for planning tests
/// and `scalemm info --sm`.
struct DeviceTarget {
  int sm = 0;                   ///< 90 for sm_90; 0 = no GPU
  int multiprocessors = 0;
  size_t cublaslt_version = 0;  ///< cublasLtGetVersion() form: 130100 for 13.1.0
  std::string name;
  int ordinal = -1;             ///< CUDA device ordinal; -1 for no GPU or a simulated machine of no device

  bool has_gpu() const { return sm > 0; }
  std::string to_string() const;  ///< "sm_90 (NVIDIA H200, 132 SMs), cuBLASLt 13.1.0"
  /// to_string() with the device named: "device 1: sm_90 (NVIDIA H200, 132 SMs), cuBLASLt 13.1.0".
  std::string describe() const;

  /// The calling thread's current device (cudaGetDevice), or sm = 0 when there is none.
  static DeviceTarget current();
  /// Device `ordinal` of this process; throws Error(kInvalidArgument) when there is no such device.
  static DeviceTarget of_device(int ordinal);
  /// Every device of this process, in ordinal order (empty without a GPU); queried once.
  static const std::vector<DeviceTarget>& all();
  /// A machine for planning tests; `ordinal` >= 0 makes it a device of a simulated multi-GPU process.
  static DeviceTarget simulated(int sm, size_t cublaslt_version, int ordinal = -1);
};

/// Everything about a GEMM that decides its plan, and nothing that changes per call (no pointers).
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  DType a_dtype = DType::kE4M3, b_dtype = DType::kE4M3;
  Recipe a_recipe = Recipe::kTensorwise, b_recipe = Recipe::kTensorwise;
  ScaleFormat a_format = ScaleFormat::kCompact, b_format = ScaleFormat::kCompact;
  DType d_dtype = DType::kBF16;
  bool has_bias = false;
  bool has_amax = false;  ///< FP8 output with d_amax
  MemorySpace space = MemorySpace::kDevice;
  bool fast_accum = false;  ///< GemmArgs::fast_accum

  static GemmProblem from(const GemmArgs& args);
  bool operator==(const GemmProblem& o) const;
  std::string to_string() const;  ///< "mxfp8(e4m3) x mxfp8(e4m3) -> bf16, M=128 N=256 K=512"
};

struct PlanOptions {
  bool strict = false;                 ///< refuse anything but the native backend
  std::optional<Backend> force;        ///< run exactly this backend (error when it cannot)
};

/// A scale or data conversion the plan runs before the GEMM.
struct PlannedConversion {
  std::string what;        ///< "scale_a: mxfp8 compact -> cublaslt (128x4 tiles)"
  int64_t output_bytes = 0;
};

struct Plan {
  Backend backend = Backend::kReference;
  std::vector<std::string> reasons;  ///< why each earlier backend was passed over, then why this one
  std::vector<PlannedConversion> conversions;
  /// The machine it was planned for (DeviceTarget::describe()); explain() ends with it.
  std::string target;
  /// Scratch the execution needs (besides the cuBLASLt workspace): the end of the last slice below.
  /// The single total: the Handle allocates exactly this and the backend's run() takes its slices.
  size_t workspace_bytes = 0;
  /// One piece of the workspace, reserved by the backend's plan(): `tag` is the backend's own slot
  /// number, `offset` is 256-byte aligned.
  struct WorkspaceSlice {
    int tag = 0;
    size_t offset = 0;
    size_t bytes = 0;
  };
  std::vector<WorkspaceSlice> workspace;
  /// Appends a slice of `bytes` (rounded up to 256) and returns its offset.
  size_t reserve(int tag, size_t bytes);
  /// The slice reserved under `tag`; throws Error(kInternal) when there is none.
  const WorkspaceSlice& workspace_slice(int tag) const;
  // cuBLASLt scale modes (cublasLtMatmulMatrixScale_t values) of the library's A and B, i.e. of the
  // user's B and A after the row-major swap; -1 when cuBLASLt is not used.
  int cublas_scale_mode_a = -1;
  int cublas_scale_mode_b = -1;
  /// Native plans: whether the user's A/B scales must be converted to the cuBLASLt layout before the
  /// call (false when they already are in it, or when the compact buffer is the same layout).
  bool convert_scale_a = false;
  bool convert_scale_b = false;
  /// Convert-native plans for VEC128/BLK128x128 pairs with M not a multiple of 4 (e.g. M = 1 in
  /// decoding): cuBLASLt runs M rounded up to 4, on a copy of A with zero rows appended, into a
  /// scratch D whose first M rows are copied out. 0 when not padding.
  int64_t padded_m = 0;
  /// FP8 output on a backend other than native: the backend writes an fp32 D of this many bytes at
  /// the end of the workspace, and one pass applies d_scale, records the amax and converts. 0 otherwise.
  size_t staged_output_bytes = 0;

  /// "mxfp8 x mxfp8 on sm_90: cuBLASLt VEC32_UE8M0 needs sm_100 -> emulated: exact dequantization ...",
  /// then the conversions, the workspace and "planned for device 0: sm_90 (NVIDIA H200, 132 SMs), ...".
  std::string explain() const;
};

/// Checks arguments that do not depend on the backend: sizes, dtypes, recipe/dtype agreement, null
/// pointers, scale layouts and alignment (through the layout contract). Empty when valid.
Diagnostics validate(const GemmArgs& args);

/// Chooses the backend for a problem on a target. Throws Error(kUnsupported) in strict or forced mode
/// when the requested backend cannot run it, with the reason chain in the message.
Plan plan(const GemmProblem& problem, const DeviceTarget& target, const PlanOptions& options = {});

/// Per-call verification against the reference emulator (docs/dispatch.md).
enum class VerifyMode : uint8_t {
  kFromEnvironment = 0,  ///< SCALEMM_VERIFY=off|sample|full (default: full in Debug builds, off otherwise)
  kOff = 1,
  kSample = 2,           ///< asynchronous sampled check, reported at the next call or check_verification()
  kFull = 3,             ///< synchronous full check, with a dump under SCALEMM_VERIFY_DUMP on failure
};

/// Algorithm choice of the cuBLASLt backend.
enum class Autotune : uint8_t {
  kFromEnvironment = 0,  ///< SCALEMM_AUTOTUNE=1 turns it on (default off)
  kOff = 1,              ///< cuBLASLt's first heuristic choice: deterministic across runs
  kOn = 2,               ///< time the heuristic's candidates once per problem, keep the fastest
};

struct HandleOptions {
  PlanOptions plan;
  VerifyMode verify = VerifyMode::kFromEnvironment;
  /// With kOn the first call of each new problem times up to 16 cuBLASLt candidates on its own
  /// buffers (one host synchronisation; not inside a graph capture). The choice is shared by every
  /// handle of the process, so two handles run the same algorithm, but it may differ between runs:
  /// results are then reproducible within a process, not across processes.
  Autotune autotune = Autotune::kFromEnvironment;
  size_t cublaslt_workspace_bytes = size_t(32) << 20;  ///< per stream, as cuBLAS recommends for sm_90+
};

/// Owns a cuBLASLt handle, one cuBLASLt workspace per stream, the per-problem plan and heuristic
/// cache, and the scratch buffers plans ask for. Thread-safe: one Handle may serve many threads;
/// GEMMs on different streams never share a workspace.
///
/// Several GPUs: one Handle serves every device of the process. A call runs on its stream's device
/// (the current device for the default stream), planned for that device (the cache key holds it),
/// with the stream's resources allocated on that device and freed there. Device memory of another
/// device is refused by name (`pointer-device`, Error(kInvalidArgument)) before anything runs.
class Handle {
 public:
  explicit Handle(HandleOptions options = {});
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  /// The target of the calling thread's current device (the one a default-stream call plans for).
  const DeviceTarget& target() const;

  /// The plan this handle would use for `args` on `stream` (cached per problem and device). Plans are
  /// made for the device of the call: the stream's device, or the current device for the default
  /// stream (nullptr, cudaStreamLegacy, cudaStreamPerThread).
  Plan plan(const GemmArgs& args, Stream stream = nullptr);

  /// Validates, plans (cached), runs. Device pointers run on `stream`; host pointers run the host
  /// reference synchronously. Throws scalemm::Error; outputs are untouched when validation fails.
  void gemm(const GemmArgs& args, Stream stream = nullptr);

  /// Grouped GEMM (scalemm/grouped.hpp): validates the whole call first (nothing runs when any group
  /// is invalid), then runs every non-empty group through the dense path on `stream`, one cached
  /// plan per distinct group shape, so each group is bit-identical to the same dense call.
  void grouped_gemm(const GroupedGemmArgs& args, Stream stream = nullptr);
  /// The plan of each distinct group shape of `args`, one block per shape.
  std::string explain(const GroupedGemmArgs& args);
  /// Whole-call graphs of grouped calls made with graph_replay: captured, and calls that replayed one.
  struct GraphCounts {
    uint64_t captures = 0, replays = 0;
  };
  GraphCounts grouped_graph_counts() const;

  /// SCALEMM_VERIFY=sample checks run asynchronously and are reported at the next call on the same
  /// stream; this waits for every check in flight and throws Error(kVerificationFailed) for the first
  /// that failed. (SCALEMM_VERIFY=full reports inside gemm().)
  void check_verification();

  struct Impl;

 private:
  friend struct HandleAccess;
  std::unique_ptr<Impl> impl_;
};

}  // namespace scalemm
