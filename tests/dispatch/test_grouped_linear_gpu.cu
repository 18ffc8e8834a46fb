// GroupedScaledLinear on the GPU: every expert's Y rows, dX rows and dW are bit-identical to a dense
// ScaledLinear run on that expert alone (same recipe, same options), for blockwise FP8 and MXFP8, G = 1
// and 4 with uneven and empty experts; forward and dgrad also with group sizes off the token blocks.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "device_buffer.hpp"
#include "linear_inputs.hpp"
#include "scalemm/grouped_linear.hpp"
#include "scalemm/linear.hpp"
#include "support/test_support.hpp"
#include "scalemm/detail/cuda_check.hpp"

using namespace scalemm;
using scalemm::testing::Dev;

namespace {

template <class T>
std::vector<T> download(const void* p, size_t count) {
  std::vector<T> out(count);
  if (count) SCALEMM_CUDA_CHECK(cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

template <class T>
int64_t byte_mismatches(const T* a, const T* b, size_t count) {
  int64_t bad = 0;
  for (size_t i = 0; i < count; ++i) bad += std::memcmp(a + i, b + i, sizeof(T)) != 0;
  return bad;
}

void check_against_dense(LinearRecipe lr, const std::vector<int64_t>& sizes, bool exact, bool wgrad,
                         std::mt19937_64& rng) {
  const int64_t n = 256, k = 512, g = int64_t(sizes.size());
  const int64_t t = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  CAPTURE(to_string(lr), g, t, exact, wgrad);
  const auto x = scalemm::testing::make_input(t, k, exact, rng);
  const auto w = scalemm::testing::make_input(g * n, k, exact, rng);
  const auto dy = scalemm::testing::make_input(t, n, exact, rng);
  Dev dx_in(x), dw_in(w), ddy(dy);
  cudaStream_t s;
  SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Handle h;

  // The grouped layer, outputs poisoned.
  Dev y(size_t(t * n) * 2), dx(size_t(t * k) * 2), dw(size_t(g * n * k) * 4);
  SCALEMM_CUDA_CHECK(cudaMemset(y.p, 0xFF, y.bytes));
  SCALEMM_CUDA_CHECK(cudaMemset(dx.p, 0xFF, dx.bytes));
  SCALEMM_CUDA_CHECK(cudaMemset(dw.p, 0xFF, dw.bytes));
  GroupedScaledLinear grouped(h, lr, g, n, k);
  grouped.set_weight(dw_in.as<float>(), s);
  grouped.forward(dx_in.as<float>(), sizes.data(), y.as<uint16_t>(), s);
  grouped.backward(ddy.as<float>(), dx.as<uint16_t>(), wgrad ? dw.as<float>() : nullptr, s);
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
  const auto gy = download<uint16_t>(y.p, size_t(t * n));
  const auto gdx = download<uint16_t>(dx.p, size_t(t * k));
  const auto gdw = download<float>(dw.p, size_t(g * n * k));

  // One dense ScaledLinear per non-empty expert on the same inputs.
  int64_t row = 0;
  for (int64_t e = 0; e < g; ++e) {
    const int64_t mg = sizes[size_t(e)];
    CAPTURE(e, mg);
    if (mg == 0) {
      if (wgrad)
        for (int64_t i = 0; i < n * k; ++i) REQUIRE(gdw[size_t(e * n * k + i)] == 0.0f);
      continue;
    }
    ScaledLinear dense(h, lr, n, k);
    Dev ey(size_t(mg * n) * 2), edx(size_t(mg * k) * 2), edw(size_t(n * k) * 4);
    dense.set_weight(dw_in.as<float>() + e * n * k, s);
    dense.forward(dx_in.as<float>() + row * k, mg, ey.as<uint16_t>(), s);
    dense.backward(ddy.as<float>() + row * n, edx.as<uint16_t>(), wgrad ? edw.as<float>() : nullptr, s);
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto ry = download<uint16_t>(ey.p, size_t(mg * n));
    const auto rdx = download<uint16_t>(edx.p, size_t(mg * k));
    CHECK(byte_mismatches(ry.data(), gy.data() + row * n, ry.size()) == 0);
    CHECK(byte_mismatches(rdx.data(), gdx.data() + row * k, rdx.size()) == 0);
    if (wgrad) {
      const auto rdw = download<float>(edw.p, size_t(n * k));
      CHECK(byte_mismatches(rdw.data(), gdw.data() + e * n * k, rdw.size()) == 0);
    }
    row += mg;
  }
  SCALEMM_CUDA_CHECK(cudaStreamDestroy(s));
  SCALEMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

TEST_CASE("GroupedScaledLinear: every expert bit-identical to a dense ScaledLinear on its tokens",
          "[gpu][dispatch][grouped][linear][grouped-linear]") {
  auto rng = scalemm::testing::rng(0x6A21);
  for (LinearRecipe lr : {LinearRecipe::kBlockwiseFp8, LinearRecipe::kMxfp8}) {
    const int64_t b = lr == LinearRecipe::kBlockwiseFp8 ? 128 : 32;
    for (bool exact : {true, false}) {
      check_against_dense(lr, {2 * b}, exact, true, rng);
      check_against_dense(lr, {b, 0, 3 * b, 2 * b}, exact, true, rng);
    }
    // Forward and dgrad with sizes off the token blocks (wgrad would be refused by name).
    check_against_dense(lr, {3, 0, 5, 130}, false, false, rng);
  }
}
