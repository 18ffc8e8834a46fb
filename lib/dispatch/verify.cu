#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "scalemm/emulation/compare.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/io/call_record.hpp"
#include "scalemm/io/npy.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "base/operands.hpp"
#include "dispatch/verify.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"

using scalemm::detail::cuda_check;

namespace scalemm::verify {
namespace {
// Output element i in the unscaled domain: FP8 outputs are divided by their D scale.
__device__ float load_out(const void* d, DType t, int64_t i, const float* d_scale = nullptr) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(d)[i];
    case DType::kBF16: return formats::decode_bf16(static_cast<const uint16_t*>(d)[i]);
    case DType::kE4M3: return formats::decode_e4m3(static_cast<const uint8_t*>(d)[i]) / *d_scale;
    case DType::kE5M2: return formats::decode_e5m2(static_cast<const uint8_t*>(d)[i]) / *d_scale;
    default: return formats::decode_f16(static_cast<const uint16_t*>(d)[i]);
  }
}

// The reference as an FP8 output represents it: saturated at the format's largest finite value.
__host__ __device__ inline float saturate_like_output(float v, DType t, float d_scale) {
  if (!is_fp8_output(t)) return v;
  const float lim = fp8_output_max(t) / d_scale;
  return v > lim ? lim : (v < -lim ? -lim : v);
}

// The dequantized value of element (r, kk) of an operand, located through the layout contract.
struct OperandView {
  const uint8_t* data;
  DType dtype;
  const void* scales;
  layouts::ScaleLayout layout;

  __device__ float raw(int64_t r, int64_t kk) const {
    const int64_t k = layout.k;
    switch (dtype) {
      case DType::kE4M3: return formats::decode_e4m3(data[r * k + kk]);
      case DType::kE5M2: return formats::decode_e5m2(data[r * k + kk]);
      default: return formats::decode_e2m1(formats::get_e2m1(data, r * k + kk));
    }
  }
  __device__ float scale(int64_t r, int64_t kk) const {
    const int64_t o = layout.offset_of_element(r, kk);
    switch (layout.scale_dtype()) {
      case DType::kE8M0: return formats::decode_e8m0(static_cast<const uint8_t*>(scales)[o]);
      case DType::kUE4M3: return formats::decode_ue4m3(static_cast<const uint8_t*>(scales)[o]);
      default: return static_cast<const float*>(scales)[o];
    }
  }
  __device__ float operator()(int64_t r, int64_t kk) const { return raw(r, kk) * scale(r, kk); }

  // The 16 unscaled values of row r at kk0..kk0+15 (kk0 % 16 == 0), read with one vector load where
  // the address allows: the sample check's latency is that of a few dependent loads, not of a loop.
  __device__ void raw16(int64_t r, int64_t kk0, float (&v)[16]) const {
    const int64_t e = r * layout.k + kk0;
    if (dtype == DType::kE2M1) {
      uint8_t b[8];
      const uint8_t* p = data + e / 2;
      if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        memcpy(b, &w, 8);
      } else {
#pragma unroll
        for (int q = 0; q < 8; ++q) b[q] = p[q];
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {  // element 2q in the low nibble (formats::get_e2m1)
        v[2 * q] = formats::decode_e2m1(uint8_t(b[q] & 0xF));
        v[2 * q + 1] = formats::decode_e2m1(uint8_t(b[q] >> 4));
      }
      return;
    }
    uint8_t b[16];
    const uint8_t* p = data + e;
    if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
      const uint4 w = *reinterpret_cast<const uint4*>(p);
      memcpy(b, &w, 16);
    } else {
#pragma unroll
      for (int q = 0; q < 16; ++q) b[q] = p[q];
    }
    const bool e4m3 = dtype == DType::kE4M3;
#pragma unroll
    for (int q = 0; q < 16; ++q) v[q] = e4m3 ? formats::decode_e4m3(b[q]) : formats::decode_e5m2(b[q]);
  }
};

// fp32 dot product of row i of A and row j of B by one block of kDotThreads threads. Each thread takes
// whole chunks of 16 K-elements: every recipe's block_k is a multiple of 16 (16, 32, 128 or K), so a
// chunk has one scale per operand and its 16 products of FP8/FP4 values are summed before scaling.
// A thread issues its loads together; at K <= 4096 that is one round of loads per operand.
constexpr int kDotThreads = 256;
__device__ float block_dot(const OperandView& a, const OperandView& b, int64_t i, int64_t j, int64_t k) {
  __shared__ float partial[kDotThreads / 32];
  float acc = 0.0f;
  const int64_t full = k / 16 * 16;
  for (int64_t kk0 = int64_t(threadIdx.x) * 16; kk0 < full; kk0 += int64_t(kDotThreads) * 16) {
    float va[16], vb[16];
    const float sa = a.scale(i, kk0), sb = b.scale(j, kk0);
    a.raw16(i, kk0, va);
    b.raw16(j, kk0, vb);
    float chunk = 0.0f;
#pragma unroll
    for (int q = 0; q < 16; ++q) chunk = fmaf(va[q], vb[q], chunk);
    acc += (chunk * sa) * sb;
  }
  for (int64_t kk = full + threadIdx.x; kk < k; kk += kDotThreads) acc = fmaf(a(i, kk), b(j, kk), acc);
  for (int off = 16; off; off /= 2) acc += __shfl_down_sync(0xFFFFFFFFu, acc, off);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
  __syncthreads();
  float sum = 0.0f;
  if (threadIdx.x == 0)
    for (int w = 0; w < kDotThreads / 32; ++w) sum += partial[w];
  return sum;  // meaningful in thread 0
}

// One warp per sampled output element: fp32 dot product, dequantizing on the fly.
__global__ void sampled_dot(OperandView a, OperandView b, const void* d, DType d_dtype, const float* d_scale,
                            int64_t n, int64_t k, const int64_t* rows, const int64_t* cols, int64_t count, float alpha,
                            const uint16_t* bias, float* ref_out, float* test_out) {
  const int64_t s = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (s >= count) return;
  const int64_t i = rows[s], j = cols[s];
  float acc = 0.0f;
  for (int64_t kk = lane; kk < k; kk += 32) acc = fmaf(a(i, kk), b(j, kk), acc);
  for (int off = 16; off; off /= 2) acc += __shfl_down_sync(0xFFFFFFFFu, acc, off);
  if (lane == 0) {
    float v = alpha * acc;
    if (bias) v += formats::decode_bf16(bias[j]);
    ref_out[s] = d_scale ? saturate_like_output(v, d_dtype, *d_scale) : v;
    test_out[s] = load_out(d, d_dtype, i * n + j, d_scale);
  }
}

__device__ inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Verdict {
  unsigned violations;
  unsigned nonfinite;
  int worst;          // sample index of the largest |err| - tol, -1 if none
  float worst_ref, worst_test, worst_tol, ref_scale;
  unsigned long long worst_i, worst_j;
};

// Block-wide reductions by warp shuffles and one shared slot per warp (blockDim.x == kDotThreads).
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* slots) {
  for (int off = 16; off; off /= 2) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  __syncthreads();  // slots may still be read from a previous reduction
  if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = v;
  __syncthreads();
  v = slots[0];
  for (int w = 1; w < kDotThreads / 32; ++w) v = op(v, slots[w]);
  return v;
}

// One block: tolerance from the samples' magnitude, then violations and the worst one (count <= blockDim).
__device__ void judge_samples(const float* ref, const float* test, int count, double atol_per_scale, double rtol,
                              int64_t m, int64_t n, uint64_t seed, Verdict* out) {
  __shared__ float fslots[kDotThreads / 32];
  __shared__ unsigned uslots[kDotThreads / 32];
  __shared__ unsigned long long kslots[kDotThreads / 32];
  const int s = threadIdx.x;
  // Written by other blocks of this grid: read through L2, never a stale L1 line.
  const float r = s < count ? __ldcg(ref + s) : 0.0f, t = s < count ? __ldcg(test + s) : 0.0f;
  const float ref_scale =
      block_reduce(s < count && isfinite(r) ? fabsf(r) : 0.0f, [](float x, float y) { return fmaxf(x, y); }, fslots);
  const double atol = atol_per_scale * ref_scale;
  unsigned viol = 0, nonfin = 0;
  float excess = -1.0f;
  if (s < count) {
    if (isfinite(r) != isfinite(t) || isnan(r) != isnan(t)) {
      nonfin = viol = 1;
      excess = 3.4e38f;
    } else if (isfinite(r)) {
      const double err = fabs(double(t) - double(r)), tol = atol + rtol * fabs(double(r));
      if (err > tol) viol = 1, excess = float(err - tol);
    }
  }
  // Worst sample: the largest excess as (float bits << 32 | index); excess >= 0 orders like its bits.
  const unsigned long long key =
      excess >= 0.0f ? (static_cast<unsigned long long>(__float_as_uint(excess)) << 32) | unsigned(s) : 0ull;
  const unsigned long long worst_key = block_reduce(key, [](auto x, auto y) { return x > y ? x : y; }, kslots);
  const unsigned total_viol = block_reduce(viol, [](unsigned x, unsigned y) { return x + y; }, uslots);
  const unsigned total_nonfin = block_reduce(nonfin, [](unsigned x, unsigned y) { return x + y; }, uslots);
  if (threadIdx.x == 0) {
    Verdict v{};
    v.violations = total_viol;
    v.nonfinite = total_nonfin;
    v.worst = total_viol ? int(worst_key & 0xFFFFFFFFu) : -1;
    v.ref_scale = ref_scale;
    if (v.worst >= 0) {
      const uint64_t h = mix64(seed + uint64_t(v.worst) * 0x9E3779B97F4A7C15ull);
      v.worst_i = (h >> 32) % uint64_t(m);
      v.worst_j = (h & 0xFFFFFFFFu) % uint64_t(n);
      v.worst_ref = __ldcg(ref + v.worst);
      v.worst_test = __ldcg(test + v.worst);
      v.worst_tol = float(atol + rtol * fabs(double(v.worst_ref)));
    }
    *out = v;
  }
}

// One launch per check: block s recomputes sample s; the last block to finish judges them all and
// writes the verdict straight into mapped pinned host memory (no copy, no second launch).
__global__ void __launch_bounds__(kDotThreads) sample_and_judge(OperandView a, OperandView b, const void* d,
                                                                DType d_dtype, const float* d_scale, int64_t m,
                                                                int64_t n, int64_t k,
                                                                uint64_t seed, int count, float alpha,
                                                                const uint16_t* bias, float* ref_out,
                                                                float* test_out, unsigned* blocks_done,
                                                                double atol_per_scale, double rtol,
                                                                Verdict* verdict) {
  const int s = blockIdx.x;
  const uint64_t h = mix64(seed + uint64_t(s) * 0x9E3779B97F4A7C15ull);
  const int64_t i = int64_t((h >> 32) % uint64_t(m)), j = int64_t((h & 0xFFFFFFFFu) % uint64_t(n));
  const float acc = block_dot(a, b, i, j, k);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    float v = alpha * acc;
    if (bias) v += formats::decode_bf16(bias[j]);
    ref_out[s] = d_scale ? saturate_like_output(v, d_dtype, *d_scale) : v;
    test_out[s] = load_out(d, d_dtype, i * n + j, d_scale);
    __threadfence();
    last = atomicAdd(blocks_done, 1u) == unsigned(count - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  judge_samples(ref_out, test_out, count, atol_per_scale, rtol, m, n, seed, verdict);
  // No system fence: the host reads the verdict only after the stream event behind this kernel has
  // completed, which orders it after every write of the kernel.
  if (threadIdx.x == 0) *blocks_done = 0;  // ready for the next check on this slot
}

__global__ void widen(const void* d, DType t, const float* d_scale, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = load_out(d, t, i, d_scale);
}

}  // namespace

emulation::Tolerance tolerance_for(const GemmArgs& args, const Plan& plan, double ref_scale) {
  emulation::Tolerance tol = emulation::gemm_tolerance(args.k, args.a.dtype, args.d_dtype, ref_scale);
  const bool fp8_tensor_cores = (plan.backend == Backend::kNative || plan.backend == Backend::kConvertNative ||
                                 plan.backend == Backend::kContiguous) &&
                                args.a.dtype != DType::kE2M1;
  if (fp8_tensor_cores) {
    // Hopper's FP8 MMA adds the products of one instruction with about 14 bits of precision before the
    // fp32 accumulator sees them, so a native FP8 result differs from an fp32-accumulated reference
    // by ~2^-13 relative (77.8-78.3 dB measured on H200, docs/dispatch.md). Bound: 2^-11 per
    // sqrt(K/32) MMA groups, times the output's magnitude — 10x the measured worst case, and still
    // 100x below what a wrong scale or stride produces.
    const double groups = std::sqrt(std::max(1.0, double(args.k) / 32.0));
    tol.atol = std::max(tol.atol, std::ldexp(1.0, -11) * groups * ref_scale);
  }
  return tol;
}

Mode parse_mode(const std::string& s) {
  if (s == "off" || s == "0" || s.empty()) return Mode::kOff;
  if (s == "sample") return Mode::kSample;
  if (s == "full" || s == "1") return Mode::kFull;
  throw Error(StatusCode::kInvalidArgument, "SCALEMM_VERIFY: unknown mode '" + s + "'; expected off, sample or full");
}

Mode mode_from_environment() {
  if (const char* v = std::getenv("SCALEMM_VERIFY")) return parse_mode(v);
#ifdef NDEBUG
  return Mode::kOff;
#else
  return Mode::kFull;
#endif
}

void check(const GemmArgs& args, const Plan& plan, Mode mode, Stream stream) {
  if (mode == Mode::kOff || args.space == MemorySpace::kHost) return;
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  cuda_check(cudaStreamSynchronize(cs), "synchronising the call under test");
  const float alpha = args.alpha * args.a.global_scale * args.b.global_scale;

  std::vector<float> ref, test;
  std::vector<int64_t> rows, cols;
  if (mode == Mode::kFull) {
    const size_t count = static_cast<size_t>(args.m * args.n);
    detail::DeviceBuffer ref_d(count * 4 + 16, -1, "verify: reference D"),  // 16 spare bytes, as the reference kernels had
        test_d(count * 4 + 16, -1, "verify: D in f32");
    emulation::GemmOptions opt;
    opt.alpha = alpha;
    opt.out_dtype = DType::kF32;
    detail::DeviceBuffer bias32(static_cast<size_t>(args.n) * 4 + 16, -1, "verify: bias in f32");
    if (args.bias) {
      std::vector<uint16_t> hb(static_cast<size_t>(args.n));
      cuda_check(cudaMemcpy(hb.data(), args.bias, hb.size() * 2, cudaMemcpyDeviceToHost), "bias copy");
      std::vector<float> fb(hb.size());
      for (size_t i = 0; i < hb.size(); ++i) fb[i] = formats::decode_bf16(hb[i]);
      cuda_check(cudaMemcpy(bias32.as<float>(), fb.data(), fb.size() * 4, cudaMemcpyHostToDevice), "bias copy");
      opt.bias = bias32.as<float>();
    }
    const auto qa = base::as_quantized(args.a, args.m, args.k), qb = base::as_quantized(args.b, args.n, args.k);
    const size_t ws = emulation::gemm_device_workspace_bytes(qa, qb);
    detail::DeviceBuffer w(ws + 16, -1, "verify: reference workspace");
    emulation::gemm_device(qa, qb, ref_d.as<float>(), opt, w.p, ws, cs);
    widen<<<1024, 256, 0, cs>>>(args.d, args.d_dtype, args.d_scale, test_d.as<float>(), int64_t(count));
    ref.resize(count);
    test.resize(count);
    cuda_check(cudaMemcpyAsync(ref.data(), ref_d.as<float>(), count * 4, cudaMemcpyDeviceToHost, cs), "copy back");
    cuda_check(cudaMemcpyAsync(test.data(), test_d.as<float>(), count * 4, cudaMemcpyDeviceToHost, cs), "copy back");
    cuda_check(cudaStreamSynchronize(cs), "full reference");
    if (args.d_scale) {  // FP8 output: compare with the reference as the output saturates it
      float ds = 1.0f;
      cuda_check(cudaMemcpy(&ds, args.d_scale, sizeof(float), cudaMemcpyDeviceToHost), "d_scale copy");
      for (float& v : ref) v = saturate_like_output(v, args.d_dtype, ds);
    }
  } else {
    // Every row for a few columns and every column for a few rows, seeded by the shape.
    std::mt19937_64 rng(uint64_t(args.m) * 1000003u ^ uint64_t(args.n) * 7919u ^ uint64_t(args.k));
    const int lines = 4;
    for (int t = 0; t < lines; ++t) {
      const int64_t j = int64_t(rng() % uint64_t(args.n)), i = int64_t(rng() % uint64_t(args.m));
      for (int64_t r = 0; r < args.m; ++r) rows.push_back(r), cols.push_back(j);
      for (int64_t c = 0; c < args.n; ++c) rows.push_back(i), cols.push_back(c);
    }
    const size_t count = rows.size();
    detail::DeviceBuffer ref_d(count * 4 + 16, -1, "verify: sampled reference"),  // 16 spare bytes, as above
        test_d(count * 4 + 16, -1, "verify: sampled D");
    detail::DeviceBuffer rows_d(count * 8 + 16, -1, "verify: sample rows"), cols_d(count * 8 + 16, -1, "verify: sample columns");
    const OperandView a_view{static_cast<const uint8_t*>(args.a.data), args.a.dtype, args.a.scale,
                             layouts::ScaleLayout(args.a.recipe, args.m, args.k, args.a.scale_format)};
    const OperandView b_view{static_cast<const uint8_t*>(args.b.data), args.b.dtype, args.b.scale,
                             layouts::ScaleLayout(args.b.recipe, args.n, args.k, args.b.scale_format)};
    cuda_check(cudaMemcpyAsync(rows_d.as<int64_t>(), rows.data(), count * 8, cudaMemcpyHostToDevice, cs), "indices");
    cuda_check(cudaMemcpyAsync(cols_d.as<int64_t>(), cols.data(), count * 8, cudaMemcpyHostToDevice, cs), "indices");
    const int64_t threads = int64_t(count) * 32;
    sampled_dot<<<unsigned((threads + 255) / 256), 256, 0, cs>>>(
        a_view, b_view, args.d, args.d_dtype, args.d_scale, args.n, args.k, rows_d.as<int64_t>(), cols_d.as<int64_t>(), int64_t(count), alpha,
        static_cast<const uint16_t*>(args.bias), ref_d.as<float>(), test_d.as<float>());
    ref.resize(count);
    test.resize(count);
    cuda_check(cudaMemcpyAsync(ref.data(), ref_d.as<float>(), count * 4, cudaMemcpyDeviceToHost, cs), "copy back");
    cuda_check(cudaMemcpyAsync(test.data(), test_d.as<float>(), count * 4, cudaMemcpyDeviceToHost, cs), "copy back");
    cuda_check(cudaStreamSynchronize(cs), "sampled reference");
  }

  double ref_scale = 0.0;
  for (float v : ref)
    if (std::isfinite(v)) ref_scale = std::max(ref_scale, double(std::fabs(v)));
  const emulation::Tolerance tol = tolerance_for(args, plan, ref_scale);
  const emulation::Comparison cmp = emulation::compare(ref.data(), test.data(), int64_t(ref.size()), &tol);
  if (cmp.within_tolerance()) return;

  std::ostringstream os;
  const int64_t w = cmp.first_violation >= 0 ? cmp.first_violation : cmp.max_abs_index;
  const int64_t wi = mode == Mode::kFull ? w / args.n : rows[size_t(w)];
  const int64_t wj = mode == Mode::kFull ? w % args.n : cols[size_t(w)];
  os << "verification failed for " << GemmProblem::from(args).to_string() << " on backend "
     << to_string(plan.backend) << ": " << cmp.violations << " of " << cmp.count
     << (mode == Mode::kFull ? " elements" : " sampled elements") << " outside tolerance " << tol.to_string()
     << "; first at D[" << wi << ',' << wj << "] = " << test[size_t(w)] << " vs reference " << ref[size_t(w)]
     << " (|err| " << std::fabs(double(test[size_t(w)]) - ref[size_t(w)]) << "); " << cmp.to_string();
  if (const char* dir = std::getenv("SCALEMM_VERIFY_DUMP")) {
    std::ostringstream sub;
    sub << dir << "/call-" << args.m << 'x' << args.n << 'x' << args.k << '-' << to_string(args.a.recipe) << '-'
        << to_string(args.b.recipe) << '-' << std::hex << (reinterpret_cast<uintptr_t>(args.d) & 0xFFFFFF);
    os << "; dumped to " << dump_call(args, plan, sub.str(), os.str());
  }
  throw Error(StatusCode::kVerificationFailed, os.str());
}

std::string dump_call(const GemmArgs& args, const Plan& plan, const std::string& dir, const std::string& note) {
  std::filesystem::create_directories(dir);
  auto fetch = [&](const void* p, size_t bytes) {
    std::vector<uint8_t> v(bytes);
    if (bytes == 0) return v;
    if (args.space == MemorySpace::kHost) std::memcpy(v.data(), p, bytes);
    else cuda_check(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), "dump copy");
    return v;
  };
  auto operand = [&](const GemmOperand& op, int64_t rows, const std::string& name) {
    io::NpyArray data;
    data.descr = "|u1";
    const int64_t cols = op.dtype == DType::kE2M1 ? args.k / 2 : args.k;
    data.shape = {rows, cols};
    data.data = fetch(op.data, size_t(rows * cols));
    io::write_npy(dir + "/" + name + ".npy", data);
    const layouts::ScaleLayout l(op.recipe, rows, args.k, op.scale_format);
    io::NpyArray sc;
    sc.descr = l.scale_bytes() == 4 ? "<f4" : "|u1";
    sc.shape = {l.size()};
    sc.data = fetch(op.scale, size_t(l.bytes()));
    io::write_npy(dir + "/scale_" + name + ".npy", sc);
  };
  operand(args.a, args.m, "a");
  operand(args.b, args.n, "b");
  if (args.bias) {
    io::NpyArray b;
    b.descr = "<u2";
    b.shape = {args.n};
    b.data = fetch(args.bias, size_t(args.n) * 2);
    io::write_npy(dir + "/bias.npy", b);
  }
  io::NpyArray d;
  const bool fp8_out = is_fp8_output(args.d_dtype);
  d.descr = args.d_dtype == DType::kF32 ? "<f4" : args.d_dtype == DType::kF16 ? "<f2" : fp8_out ? "|u1" : "<u2";
  d.shape = {args.m, args.n};
  d.data = fetch(args.d, size_t(args.m * args.n) * (args.d_dtype == DType::kF32 ? 4 : fp8_out ? 1 : 2));
  io::write_npy(dir + "/d.npy", d);

  io::CallRecord r;
  r.m = args.m, r.n = args.n, r.k = args.k;
  r.alpha = args.alpha;
  for (auto [rec, op] : {std::pair<io::CallRecord::Operand*, const GemmOperand*>{&r.a, &args.a}, {&r.b, &args.b}})
    *rec = {op->recipe, op->dtype, op->scale_format, op->global_scale};
  r.d_dtype = args.d_dtype;
  if (args.d_scale) {  // FP8 output: the D scale's value (the amax pointer is an output, not recorded)
    float ds = 0.0f;
    const auto got = fetch(args.d_scale, sizeof(float));
    std::memcpy(&ds, got.data(), sizeof(float));
    r.d_scale = ds;
  }
  r.bias = args.bias != nullptr;
  r.backend = std::string(to_string(plan.backend));
  r.plan = plan.explain();
  r.note = note;
  io::write_call_record(dir, r);
  return dir;
}

// ---- asynchronous sample checks ----------------------------------------------------------------

struct AsyncSampler::Impl {
  struct Slot {
    float* ref = nullptr;   // device, kSamples
    float* test = nullptr;  // device, kSamples
    unsigned* blocks_done = nullptr;  // device counter for the last-block judge
    Verdict* verdict_h = nullptr;     // mapped pinned host memory, written by the device
    Verdict* verdict_d = nullptr;     // its device address
    cudaEvent_t done = nullptr;
    bool pending = false;
    GemmProblem problem;  // the call, for the report (formatted only on failure)
    Backend backend = Backend::kNative;
  };
  Slot slots[kSlots];
  int next = 0;
  uint64_t calls = 0;

  void collect(Slot& s) {  // s.done has completed
    s.pending = false;
    const Verdict& v = *s.verdict_h;
    if (v.violations == 0) return;
    std::ostringstream os;
    os << "verification failed (sample mode, reported after the call returned) for " << s.problem.to_string()
       << " on backend " << to_string(s.backend) << ": "
       << v.violations << " of " << kSamples << " sampled elements outside tolerance";
    if (v.nonfinite) os << " (" << v.nonfinite << " NaN/Inf mismatches)";
    if (v.worst >= 0)
      os << "; worst D[" << v.worst_i << ',' << v.worst_j << "] = " << v.worst_test << " vs reference "
         << v.worst_ref << " (|err| " << std::fabs(double(v.worst_test) - v.worst_ref) << ", tolerance "
         << v.worst_tol << ")";
    os << ". Rerun with SCALEMM_VERIFY=full to stop at the call and dump it (SCALEMM_VERIFY_DUMP).";
    throw Error(StatusCode::kVerificationFailed, os.str());
  }
};

namespace {

// Frees what a slot holds (null members are skipped): the destructor's work, and a failed
// constructor's, which would otherwise leak the slots allocated before the failure.
void release(AsyncSampler::Impl::Slot& s) {
  cudaFree(s.ref);
  cudaFree(s.test);
  cudaFree(s.blocks_done);
  cudaFreeHost(s.verdict_h);
  if (s.done) cudaEventDestroy(s.done);
}

}  // namespace

AsyncSampler::AsyncSampler() : impl_(new Impl) {
  const std::string buffers = "verify sample buffers (" + std::to_string(kSamples * sizeof(float)) + " B)";
  try {
    for (auto& s : impl_->slots) {
      cuda_check(detail::device_malloc(reinterpret_cast<void**>(&s.ref), kSamples * sizeof(float)), buffers);
      cuda_check(detail::device_malloc(reinterpret_cast<void**>(&s.test), kSamples * sizeof(float)), buffers);
      cuda_check(detail::device_malloc(reinterpret_cast<void**>(&s.blocks_done), sizeof(unsigned)),
                 "verify sample counter (4 B)");
      cuda_check(cudaMemset(s.blocks_done, 0, sizeof(unsigned)), "sample counter");
      cuda_check(cudaHostAlloc(&s.verdict_h, sizeof(Verdict), cudaHostAllocMapped), "pinned verdict");
      cuda_check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&s.verdict_d), s.verdict_h, 0), "verdict address");
      cuda_check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "sample event");
    }
  } catch (...) {
    for (auto& s : impl_->slots) release(s);
    delete impl_;
    throw;
  }
}

AsyncSampler::~AsyncSampler() {
  for (auto& s : impl_->slots) {
    if (s.pending && cudaEventSynchronize(s.done) == cudaSuccess && s.verdict_h->violations)
      std::fprintf(stderr, "scalemm: an unreported sample verification failed for %s (%u elements)\n",
                   s.problem.to_string().c_str(), s.verdict_h->violations);
    release(s);
  }
  delete impl_;
}

void AsyncSampler::poll() {
  for (auto& s : impl_->slots)
    if (s.pending && cudaEventQuery(s.done) == cudaSuccess) impl_->collect(s);
}

void AsyncSampler::drain() {
  for (auto& s : impl_->slots)
    if (s.pending) {
      cuda_check(cudaEventSynchronize(s.done), "waiting for a sample check");
      impl_->collect(s);
    }
}

void AsyncSampler::enqueue(const GemmArgs& args, const Plan& plan, Stream stream) {
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(cs, &capture);
  if (capture != cudaStreamCaptureStatusNone) return;  // a graph replays what was verified eagerly
  Impl::Slot& s = impl_->slots[impl_->next];
  impl_->next = (impl_->next + 1) % kSlots;
  if (s.pending) {  // the oldest check is still in flight: wait for it before reusing its buffers
    cuda_check(cudaEventSynchronize(s.done), "waiting for a sample check");
    impl_->collect(s);
  }
  const float alpha = args.alpha * args.a.global_scale * args.b.global_scale;
  const OperandView a_view{static_cast<const uint8_t*>(args.a.data), args.a.dtype, args.a.scale,
                           layouts::ScaleLayout(args.a.recipe, args.m, args.k, args.a.scale_format)};
  const OperandView b_view{static_cast<const uint8_t*>(args.b.data), args.b.dtype, args.b.scale,
                           layouts::ScaleLayout(args.b.recipe, args.n, args.k, args.b.scale_format)};
  const uint64_t seed = 0x5CA1E000ull + impl_->calls++;
  const emulation::Tolerance unit = tolerance_for(args, plan, 1.0);  // linear in the reference's scale
  sample_and_judge<<<kSamples, kDotThreads, 0, cs>>>(a_view, b_view, args.d, args.d_dtype, args.d_scale, args.m,
                                                     args.n, args.k,
                                                     seed, kSamples, alpha, static_cast<const uint16_t*>(args.bias),
                                                     s.ref, s.test, s.blocks_done, unit.atol, unit.rtol, s.verdict_d);
  cuda_check(cudaGetLastError(), "sample check launch");
  cuda_check(cudaEventRecord(s.done, cs), "sample event");
  s.pending = true;
  s.problem = GemmProblem::from(args);
  s.backend = plan.backend;
}

}  // namespace scalemm::verify
