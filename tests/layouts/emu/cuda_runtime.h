// CPU emulation of the small CUDA subset that layouts/cuda/convert.cu uses, so that the GPU kernels'
// logic (tiling, staging, quads, grouped bases, reductions) runs and is checked on machines without a
// GPU. Placed first on the include path of test_layouts_emu only, it stands in for <cuda_runtime.h>.
//
// Model: a launch runs its blocks one after another; the threads of a block are ucontext coroutines
// scheduled round-robin, switching only at __syncthreads() and warp shuffles (which every thread of
// the kernels reaches uniformly). "Device" pointers are host pointers. Atomics are plain updates
// (one OS thread). __shared__ variables become function statics, shared by the threads of a block.
// What it cannot show: real concurrency, memory-ordering bugs, alignment faults, performance.
#pragma once
#include <ucontext.h>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <vector>
#include <functional>
#include <algorithm>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__
struct dim3 { unsigned x = 1, y = 1, z = 1; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct uint4 { unsigned x, y, z, w; };
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToDevice };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount };
struct CUstream_st;
typedef CUstream_st* cudaStream_t;
inline const char* cudaGetErrorName(cudaError_t) { return "emu"; }
inline const char* cudaGetErrorString(cudaError_t) { return "emu"; }
inline cudaError_t cudaGetLastError() { return 0; }
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return 0; }
inline cudaError_t cudaSetDevice(int) { return 0; }
// One emulated device: every stream is device 0's.
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
inline cudaError_t cudaStreamGetDevice(cudaStream_t, int* d) { *d = 0; return 0; }
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1 };
inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* s) { *s = cudaStreamCaptureStatusNone; return 0; }
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = 3; return 0; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) { memset(p, v, n); return 0; }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) { memcpy(d, s, n); return 0; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return 0; }

namespace emu {
struct Ctx { dim3 tid, bid, bdim, gdim; };
inline thread_local int cur = 0;
inline std::vector<Ctx> ctxs;
inline std::vector<ucontext_t> uctx;
inline ucontext_t main_ctx;
inline int nthreads = 0;
inline std::vector<int> done;
inline std::vector<unsigned long long> xchg;
inline std::function<void()> body;
inline void yield_next() {
  int me = cur;
  int nx = (me + 1) % nthreads;
  cur = nx;
  swapcontext(&uctx[me], &uctx[nx]);
}
// Barrier: cooperative round robin; all threads must reach it.
inline int gen = 0;
inline int arrived = 0;
inline void barrier() {
  int g = gen;
  if (++arrived == nthreads) { arrived = 0; gen++; return; }
  while (gen == g) yield_next();
}
inline void entry() {
  body();
  done[cur] = 1;
  // Spin until all done.
  for (;;) {
    bool all = true;
    for (int i = 0; i < nthreads; ++i) all = all && done[i];
    if (all) { setcontext(&main_ctx); }
    yield_next();
  }
}
inline std::vector<std::vector<char>> stacks;
template <class F>
void run_grid(dim3 g, dim3 b, F f) {
  nthreads = int(b.x * b.y * b.z);
  ctxs.assign(nthreads, {});
  uctx.assign(nthreads, {});
  done.assign(nthreads, 0);
  xchg.assign(nthreads, 0);
  if ((int)stacks.size() < nthreads) stacks.resize(nthreads, std::vector<char>(256 * 1024));
  for (unsigned by = 0; by < g.y; ++by)
    for (unsigned bx = 0; bx < g.x; ++bx) {
      body = f;
      gen = 0; arrived = 0;
      std::fill(done.begin(), done.end(), 0);
      for (int t = 0; t < nthreads; ++t) {
        ctxs[t].tid = dim3(t % b.x, (t / b.x) % b.y, 0);
        ctxs[t].bid = dim3(bx, by, 0);
        ctxs[t].bdim = b; ctxs[t].gdim = g;
        getcontext(&uctx[t]);
        uctx[t].uc_stack.ss_sp = stacks[t].data();
        uctx[t].uc_stack.ss_size = stacks[t].size();
        uctx[t].uc_link = nullptr;
        makecontext(&uctx[t], entry, 0);
      }
      cur = 0;
      swapcontext(&main_ctx, &uctx[0]);
    }
}
}  // namespace emu
#define threadIdx (emu::ctxs[emu::cur].tid)
#define blockIdx (emu::ctxs[emu::cur].bid)
#define blockDim (emu::ctxs[emu::cur].bdim)
#define gridDim (emu::ctxs[emu::cur].gdim)
inline void __syncthreads() { emu::barrier(); }
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
  unsigned long long u = 0; memcpy(&u, &v, sizeof(T));
  emu::barrier();
  emu::xchg[emu::cur] = u;
  emu::barrier();
  unsigned long long r = emu::xchg[emu::cur ^ o];
  emu::barrier();
  T out; memcpy(&out, &r, sizeof(T)); return out;
}
template <class T> T __shfl_sync(unsigned, T v, int src) {
  unsigned long long u = 0; memcpy(&u, &v, sizeof(T));
  emu::barrier();
  emu::xchg[emu::cur] = u;
  emu::barrier();
  unsigned long long r = emu::xchg[(emu::cur & ~31) | (src & 31)];
  emu::barrier();
  T out; memcpy(&out, &r, sizeof(T)); return out;
}
template <class T> T __ldg(const T* p) { return *p; }
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  return unsigned(((static_cast<unsigned long long>(hi) << 32) | lo) >> (s & 31));
}
template <class T> T atomicAdd(T* p, T v) { T o = *p; *p += v; return o; }
template <class T> T atomicMin(T* p, T v) { T o = *p; if (v < *p) *p = v; return o; }
template <class T> T atomicMax(T* p, T v) { T o = *p; if (v > *p) *p = v; return o; }
template <class T> T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
namespace emu {
template <class... P>
struct Launcher {
  void (*k)(P...); dim3 g, b;
  template <class... A> void operator()(A... a) { run_grid(g, b, [=] { k(P(a)...); }); }
};
template <class... P> Launcher<P...> launch(void (*k)(P...), dim3 g, dim3 b, int = 0, cudaStream_t = nullptr) { return {k, g, b}; }
}
