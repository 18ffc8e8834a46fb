#include "cublaslt/cublaslt.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "support/tool_marks.hpp"
#include "support/hash.hpp"
#include "scalemm/status.hpp"

namespace scalemm::backends {
namespace {

std::string lt_status_text(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "cublasStatus " + std::to_string(int(s));
  }
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kE4M3: return CUDA_R_8F_E4M3;
    case DType::kE5M2: return CUDA_R_8F_E5M2;
    case DType::kE2M1: return CUDA_R_4F_E2M1;
    default: throw Error(StatusCode::kInternal, "cuBLASLt backend: no CUDA type for " + std::string(to_string(t)));
  }
}

int alignment_class(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % a) != 0) a /= 2;
  return a;
}

// Everything that decides descriptors and the algorithm (pointers excluded, alignment classes in).
using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int, bool, bool, int, int, int, int, bool, bool>;

// Prepared problems are found by hash: a warm call's lookup stays constant however many shapes ran.
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = detail::kHashSeed;
    std::apply([&h](const auto&... v) { ((h = detail::hash_mix(h, uint64_t(v))), ...); }, k);
    return size_t(h);
  }
};

Key key_of(const LtCall& c) {
  return Key{c.m, c.n, c.k, int(c.a_dtype), int(c.b_dtype), int(c.d_dtype), c.a_scale_mode, c.b_scale_mode,
             c.bias != nullptr, c.alpha_device != nullptr, alignment_class(c.a), alignment_class(c.b),
             alignment_class(c.d), alignment_class(c.bias), c.d_amax != nullptr, c.fast_accum};
}

std::string describe(const LtCall& c) {
  std::ostringstream os;
  os << "D(" << c.m << 'x' << c.n << ", " << to_string(c.d_dtype) << ") = A(" << c.m << 'x' << c.k << ", "
     << to_string(c.a_dtype) << ") * B(" << c.n << 'x' << c.k << ", " << to_string(c.b_dtype) << ")^T";
  return os.str();
}

}  // namespace

struct Prepared {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatrixLayout_t c = nullptr;  // C's own layout when D is FP8 (cuBLASLt wants a bf16 C then)
  cublasLtMatmulAlgo_t algo{};
  size_t algo_workspace = 0;
  int candidates = 1;  // heuristic results considered (1 unless autotuning)
  int chosen = 0;      // index of the one in use

  ~Prepared() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct LtContext::Impl {
  cublasLtHandle_t handle = nullptr;
  bool autotune = false;
  std::unordered_map<Key, std::unique_ptr<Prepared>, KeyHash> cache;
};

namespace {
// Autotune choices are per process, device and problem key: every context (every stream's arena, every
// Handle, the benchmark's raw calls) then runs the same algorithm for the same problem, and a problem
// is timed once.
std::mutex g_tuned_mu;
std::map<std::pair<int, Key>, int> g_tuned;

int current_device() {
  int d = 0;
  cudaGetDevice(&d);
  return d;
}
}  // namespace

// Every cuBLASLt status goes through cublas_check: one message form with the CUDA checks.
// (The message is built only on failure: these calls sit on the per-call path.)
#define SCALEMM_LT(call, what)                                                         \
  do {                                                                                 \
    const cublasStatus_t s_ = (call);                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) cublas_check(int(s_), std::string(what) + ": " #call); \
  } while (0)

namespace {

void launch(cublasLtHandle_t handle, Prepared& p, const cublasLtMatmulAlgo_t& algo, const LtCall& c, void* workspace,
            size_t workspace_bytes, Stream stream, const char* note = "") {
  // SCALEMM_LT evaluates its context argument only on failure: nothing is formatted per call.
  // Per-call pointers (cheap attribute writes; the descriptor is owned by this serialised context).
  SCALEMM_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.b_scale, sizeof(void*)), describe(c) + note);
  SCALEMM_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.a_scale, sizeof(void*)), describe(c) + note);
  if (c.bias)
    SCALEMM_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof(void*)), describe(c) + note);
  if (c.d_scale)
    SCALEMM_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &c.d_scale, sizeof(void*)), describe(c) + note);
  if (c.d_amax)
    SCALEMM_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &c.d_amax, sizeof(void*)), describe(c) + note);
  const float beta = 0.0f;
  const void* alpha = c.alpha_device ? static_cast<const void*>(c.alpha_device) : static_cast<const void*>(&c.alpha);
  const void* beta_ptr = &beta;
  if (c.alpha_device) beta_ptr = c.alpha_device + 1;  // device mode: beta lives right after alpha (zero)
  // beta = 0: C is not read. With an FP8 D, C is described as bf16 (the only C types cuBLASLt pairs
  // with an FP8 D) and passed as null: since CUDA 13 cuBLASLt rejects C == D with different
  // descriptors (INVALID_VALUE, measured on H100 with cuBLASLt 13.1).
  const void* c_ptr = p.c ? nullptr : c.d;
  SCALEMM_LT(cublasLtMatmul(handle, p.desc, alpha, c.b, p.a, c.a, p.b, beta_ptr, c_ptr, p.c ? p.c : p.d, c.d, p.d, &algo,
                            workspace, workspace_bytes, reinterpret_cast<cudaStream_t>(stream)),
             describe(c) + note);
}

int tuned_choice(cublasLtHandle_t handle, const Key& key, Prepared& p, const LtCall& c,
                 const cublasLtMatmulHeuristicResult_t* results, int found, void* workspace, size_t workspace_bytes,
                 Stream stream) {
  const std::pair<int, Key> gkey{current_device(), key};
  {
    std::lock_guard<std::mutex> lock(g_tuned_mu);
    auto t = g_tuned.find(gkey);
    if (t != g_tuned.end() && t->second < found) return t->second;
  }
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cs, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
    return 0;  // timing is impossible inside a capture: the heuristic's first choice, not remembered
  // Time each candidate on the call's own buffers (its output is rewritten by the real call right
  // after): 2 warm-ups, median of 5. One host synchronisation per new problem, then never again.
  cudaEvent_t ev[2];
  if (cudaEventCreate(&ev[0]) != cudaSuccess) return 0;
  if (cudaEventCreate(&ev[1]) != cudaSuccess) {
    cudaEventDestroy(ev[0]);
    return 0;
  }
  int best = 0;
  float best_ms = 0.0f;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > workspace_bytes) continue;
    std::vector<float> times;
    bool ok = true;
    for (int rep = 0; rep < 7 && ok; ++rep) {
      cudaEventRecord(ev[0], cs);
      try {
        launch(handle, p, results[i].algo, c, workspace, workspace_bytes, stream, " (autotune)");
      } catch (const Error&) {
        ok = false;  // a candidate that fails to launch is skipped, not fatal
      }
      cudaEventRecord(ev[1], cs);
      if (cudaEventSynchronize(ev[1]) != cudaSuccess) ok = false;
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, ev[0], ev[1]);
      if (rep >= 2) times.push_back(ms);
    }
    if (!ok) continue;
    std::sort(times.begin(), times.end());
    const float med = times[times.size() / 2];
    if (best_ms == 0.0f || med < best_ms) best_ms = med, best = i;
  }
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  cudaGetLastError();  // a skipped candidate may have left a launch error behind
  std::lock_guard<std::mutex> lock(g_tuned_mu);
  return g_tuned.emplace(gkey, best).first->second;  // a concurrent tuner's choice wins if it came first
}

}  // namespace

LtContext::LtContext() : impl_(new Impl) {
  SCALEMM_LT(cublasLtCreate(&impl_->handle), "cuBLASLt handle");
}

LtContext::~LtContext() {
  impl_->cache.clear();
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

size_t LtContext::cached_problems() const { return impl_->cache.size(); }

void LtContext::matmul(const LtCall& c, void* workspace, size_t workspace_bytes, Stream stream) {
  const Key key = key_of(c);
  auto it = impl_->cache.find(key);
  if (it == impl_->cache.end()) {
    const std::string ctx = describe(c);
    auto p = std::make_unique<Prepared>();
    SCALEMM_LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), ctx);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), ctx);
    SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), ctx);
    // cuBLASLt A is the user's B: swap the scale modes with the operands.
    if (c.b_scale_mode >= 0) {
      const int32_t mode = c.b_scale_mode;
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)), ctx);
    }
    if (c.a_scale_mode >= 0) {
      const int32_t mode = c.a_scale_mode;
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)), ctx);
    }
    if (c.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bt = CUDA_R_16BF;
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), ctx);
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)), ctx);
    }
    if (c.fast_accum) {
      const int8_t on = 1;
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)), ctx);
    }
    if (c.alpha_device) {
      const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)), ctx);
    }
    // Scale pointers take part in the heuristic's checks: set them before the query.
    if (c.b_scale)
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.b_scale, sizeof(void*)), ctx);
    if (c.a_scale)
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.a_scale, sizeof(void*)), ctx);
    if (c.bias)
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof(void*)), ctx);
    if (c.d_scale)
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &c.d_scale, sizeof(void*)), ctx);
    if (c.d_amax)
      SCALEMM_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &c.d_amax, sizeof(void*)), ctx);

    SCALEMM_LT(cublasLtMatrixLayoutCreate(&p->a, cuda_type(c.b_dtype), uint64_t(c.k), uint64_t(c.n), int64_t(c.k)), ctx);
    SCALEMM_LT(cublasLtMatrixLayoutCreate(&p->b, cuda_type(c.a_dtype), uint64_t(c.k), uint64_t(c.m), int64_t(c.k)), ctx);
    SCALEMM_LT(cublasLtMatrixLayoutCreate(&p->d, cuda_type(c.d_dtype), uint64_t(c.n), uint64_t(c.m), int64_t(c.n)), ctx);
    if (is_fp8_output(c.d_dtype))
      SCALEMM_LT(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, uint64_t(c.n), uint64_t(c.m), int64_t(c.n)), ctx);

    cublasLtMatmulPreference_t pref = nullptr;
    SCALEMM_LT(cublasLtMatmulPreferenceCreate(&pref), ctx);
    const uint64_t ws = workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const uint32_t al_a = uint32_t(alignment_class(c.b)), al_b = uint32_t(alignment_class(c.a)),
                   al_d = uint32_t(alignment_class(c.d));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
    cublasLtMatmulHeuristicResult_t results[kAutotuneCandidates]{};
    int found = 0;
    const int wanted = impl_->autotune ? kAutotuneCandidates : 1;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(impl_->handle, p->desc, p->a, p->b, p->c ? p->c : p->d, p->d, pref,
                                                             wanted, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
      detail::throw_api_error(StatusCode::kCublasError, ctx + ": cublasLtMatmulAlgoGetHeuristic found no algorithm",
                              lt_status_text(hs).c_str(), "");
    int pick = 0;
    if (found > 1) pick = tuned_choice(impl_->handle, key, *p, c, results, found, workspace, workspace_bytes, stream);
    p->algo = results[pick].algo;
    p->algo_workspace = results[pick].workspaceSize;
    p->candidates = found;
    p->chosen = pick;
    it = impl_->cache.emplace(key, std::move(p)).first;
  }
  launch(impl_->handle, *it->second, it->second->algo, c, workspace, workspace_bytes, stream);
  mark_initialized(c.d, static_cast<size_t>(dtype_storage_bytes(c.d_dtype, c.m * c.n)), stream);
}


void LtContext::set_autotune(bool on) { impl_->autotune = on; }

std::pair<int, int> LtContext::algorithm_choice(const LtCall& c) const {
  auto it = impl_->cache.find(key_of(c));
  if (it == impl_->cache.end()) return {-1, 0};
  return {it->second->chosen, it->second->candidates};
}

void cublas_check(int status, const std::string& what) {
  const auto s = static_cast<cublasStatus_t>(status);
  if (s == CUBLAS_STATUS_SUCCESS) return;
  detail::throw_api_error(s == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kOutOfMemory : StatusCode::kCublasError, what,
                          lt_status_text(s).c_str(), "");
}

}  // namespace scalemm::backends
