// [gpu] tests of the layout kernels: every GPU conversion is byte-identical to the host one (the
// oracle, tested in test_layouts.cpp), writes every destination byte, works at odd alignments,
// inside CUDA graph capture and in one launch for grouped operands; the device content check
// finds what the host check finds.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "layout_test_util.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/validate.hpp"
#include "support/test_support.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"

using namespace scalemm;
using namespace scalemm::layouts;
using scalemm::layouts::testutil::fill_buffer;
using scalemm::layouts::testutil::kKs;
using scalemm::layouts::testutil::kRows;

namespace {

// A device buffer `misalign` bytes past an aligned address, poisoned with 0xCD including 64 bytes
// beyond its end, so that tests can misalign on purpose and see overruns.
struct DevBuf {
  scalemm::detail::DeviceBuffer mem;
  size_t bytes = 0;
  size_t shift = 0;
  // DeviceBuffer's fill finishes before the tests' cudaStreamNonBlocking streams could read it.
  DevBuf(size_t n, size_t misalign = 0) : mem(n + 64, 0xCD), bytes(n), shift(misalign) {
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  unsigned char* p() const { return mem.as<unsigned char>() + shift; }
  void upload(const std::vector<uint8_t>& h) {
    REQUIRE(h.size() <= bytes);
    SCALEMM_CUDA_CHECK(cudaMemcpy(p(), h.data(), h.size(), cudaMemcpyHostToDevice));
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(bytes);
    SCALEMM_CUDA_CHECK(cudaMemcpy(h.data(), p(), bytes, cudaMemcpyDeviceToHost));
    return h;
  }
  // The bytes right after the buffer must still be poison (no overrun).
  bool tail_intact() const {
    unsigned char t[16];
    SCALEMM_CUDA_CHECK(cudaMemcpy(t, p() + bytes, 16, cudaMemcpyDeviceToHost));
    for (unsigned char c : t)
      if (c != 0xCD) return false;
    return true;
  }
};

struct OwnedStream {
  cudaStream_t s = nullptr;
  OwnedStream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~OwnedStream() { cudaStreamDestroy(s); }
};

std::vector<uint8_t> gpu_convert(const ScaleLayout& from, const std::vector<uint8_t>& src, const ScaleLayout& to,
                                 cudaStream_t st, size_t misalign_src = 0, size_t misalign_dst = 0) {
  DevBuf ds(src.size(), misalign_src), dd(size_t(to.bytes()), misalign_dst);
  ds.upload(src);
  gpu::convert(from, ds.p(), to, dd.p(), st);
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
  REQUIRE(dd.tail_intact());
  return dd.download();
}

}  // namespace

TEST_CASE("GPU conversions are byte-identical to the host ones for every recipe and shape", "[gpu][layouts]") {
  OwnedStream st;
  auto g = scalemm::testing::rng(0x6b1);
  const ScaleFormat fmts[2] = {ScaleFormat::kCompact, ScaleFormat::kCublasLt};
  for (Recipe rc : kAllRecipes)
    for (int64_t R : kRows)
      for (int64_t K : kKs)
        for (ScaleFormat ff : fmts)
          for (ScaleFormat tf : fmts) {
            const ScaleLayout from(rc, R, K, ff), to(rc, R, K, tf);
            CAPTURE(from.to_string(), to.to_string());
            // A cublaslt source is itself built by the host, so that its padding is zero.
            std::vector<uint8_t> src = fill_buffer(from.with_format(ScaleFormat::kCompact), g);
            if (ff == ScaleFormat::kCublasLt) src = to_cublaslt(from.with_format(ScaleFormat::kCompact), src.data());
            std::vector<uint8_t> want(size_t(to.bytes()));
            convert(from, src.data(), to, want.data());
            REQUIRE(gpu_convert(from, src, to, st.s) == want);
          }
}

TEST_CASE("GPU conversions handle large operands, every tile path and misaligned pointers", "[gpu][layouts]") {
  OwnedStream st;
  auto g = scalemm::testing::rng(0x6b2);
  for (Recipe rc : kAllRecipes)
    for (auto [R, K] : {std::pair<int64_t, int64_t>{4099, 7168}, {1000, 16384 + 16}, {300, 1024}, {8192, 640}}) {
      const ScaleLayout c(rc, R, K, ScaleFormat::kCompact), l = c.with_format(ScaleFormat::kCublasLt);
      CAPTURE(c.to_string());
      const auto src = fill_buffer(c, g);
      const auto want = to_cublaslt(c, src.data());
      const size_t eb = size_t(c.scale_bytes());
      REQUIRE(gpu_convert(c, src, l, st.s) == want);
      REQUIRE(gpu_convert(c, src, l, st.s, eb, 3 * eb) == want);  // odd 16-byte phases on both sides
      REQUIRE(gpu_convert(l, want, c, st.s) == src);
      REQUIRE(gpu_convert(l, want, c, st.s, 2 * eb, eb) == src);
    }
}

TEST_CASE("GPU transposes and block128x128 -> mxfp8 broadcasts match the host", "[gpu][layouts]") {
  OwnedStream st;
  auto g = scalemm::testing::rng(0x6b3);
  const ScaleFormat fmts[2] = {ScaleFormat::kCompact, ScaleFormat::kCublasLt};
  for (Recipe rc : {Recipe::kBlock128x128, Recipe::kMxfp8_32x32})
    for (int64_t R : {1, 33, 129, 1000, 7168})
      for (int64_t K : {32, 640, 1000, 4096 + 32})
        for (ScaleFormat ff : fmts)
          for (ScaleFormat tf : fmts) {
            const ScaleLayout from(rc, R, K, ff), to = transposed(from, tf);
            CAPTURE(from.to_string(), to.to_string());
            std::vector<uint8_t> src = fill_buffer(from.with_format(ScaleFormat::kCompact), g);
            if (ff == ScaleFormat::kCublasLt) src = to_cublaslt(from.with_format(ScaleFormat::kCompact), src.data());
            std::vector<uint8_t> want(size_t(to.bytes()));
            transpose(from, src.data(), to, want.data());
            DevBuf ds(src.size()), dd(want.size());
            ds.upload(src);
            gpu::transpose(from, ds.p(), to, dd.p(), st.s);
            SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st.s));
            REQUIRE(dd.download() == want);
          }
  for (Recipe target : {Recipe::kMxfp8, Recipe::kMxfp8_32x32})
    for (ScaleFormat tf : fmts)
      for (auto [R, K] : {std::pair<int64_t, int64_t>{1, 32}, {300, 640}, {4096, 7168}}) {
        const ScaleLayout b(Recipe::kBlock128x128, R, K, ScaleFormat::kCompact);
        const ScaleLayout m = mxfp8_layout_for(b, target, tf);
        CAPTURE(m.to_string());
        std::vector<float> s(size_t(b.size()));
        for (size_t i = 0; i < s.size(); ++i) s[i] = std::ldexp(1.0f, int(g() % 60) - 30);
        if (s.size() > 2) s[1] = 0.3f, s[s.size() - 1] = 0.0f;
        std::vector<uint8_t> want(size_t(m.bytes()));
        const BroadcastResult res = broadcast_block128_to_mxfp8(b, s.data(), m, want.data());
        DevBuf ds(s.size() * 4), dd(want.size()), cnt(8);
        SCALEMM_CUDA_CHECK(cudaMemcpy(ds.p(), s.data(), s.size() * 4, cudaMemcpyHostToDevice));
        SCALEMM_CUDA_CHECK(cudaMemsetAsync(cnt.p(), 0, 8, st.s));  // on the kernel's stream: st.s does not wait for the default stream
        gpu::broadcast_block128_to_mxfp8(b, reinterpret_cast<const float*>(ds.p()), m, dd.p(),
                                         reinterpret_cast<unsigned long long*>(cnt.p()), st.s);
        SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st.s));
        REQUIRE(dd.download() == want);
        unsigned long long n = 0;
        SCALEMM_CUDA_CHECK(cudaMemcpy(&n, cnt.p(), 8, cudaMemcpyDeviceToHost));
        REQUIRE(int64_t(n) == res.inexact);
      }
}

TEST_CASE("GPU grouped conversion runs in one launch, inside graph capture, and matches the host", "[gpu][layouts]") {
  OwnedStream st;
  const uint32_t seed = scalemm::testing::seed();
  INFO("seed " << seed);
  auto g = scalemm::testing::rng(0x6b4);
  for (Recipe rc : kAllRecipes)
    for (int G : {1, 3, 64}) {
      std::vector<int64_t> offs(size_t(G) + 1, 0);
      for (int i = 0; i < G; ++i) offs[size_t(i) + 1] = offs[size_t(i)] + int64_t(g() % 300) * (g() % 4 == 0 ? 0 : 1);
      const int64_t K = 128 * int64_t(1 + g() % 9) - int64_t(g() % 2) * 40;
      CAPTURE(to_string(rc), G, K);
      const auto co = grouped_offsets(rc, K, ScaleFormat::kCompact, offs.data(), G);
      const auto lo = grouped_offsets(rc, K, ScaleFormat::kCublasLt, offs.data(), G);
      const int eb = ScaleLayout(rc, 1, K, ScaleFormat::kCompact).scale_bytes();
      std::vector<uint8_t> src(size_t(co.back() * eb));
      for (auto& x : src) x = uint8_t(g() | 1);
      std::vector<uint8_t> want(size_t(lo.back() * eb));
      convert_grouped(rc, K, offs.data(), G, ScaleFormat::kCompact, src.data(), ScaleFormat::kCublasLt, want.data());

      DevBuf ds(std::max<size_t>(src.size(), 1)), dd(std::max<size_t>(want.size(), 1)), doffs(offs.size() * 8);
      ds.upload(src);
      SCALEMM_CUDA_CHECK(cudaMemcpy(doffs.p(), offs.data(), offs.size() * 8, cudaMemcpyHostToDevice));
      const auto* d_offs = reinterpret_cast<const int64_t*>(doffs.p());
      // Captured into a graph, then replayed.
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
      gpu::convert_grouped(rc, K, d_offs, G, offs.back(), ScaleFormat::kCompact, ds.p(), ScaleFormat::kCublasLt, dd.p(),
                           st.s);
      SCALEMM_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
      size_t nodes = 0;
      SCALEMM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
      REQUIRE(nodes == 1);  // one launch for all groups
      SCALEMM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      SCALEMM_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st.s));
      auto got = dd.download();
      got.resize(want.size());
      REQUIRE(got == want);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      // And back, without a graph.
      DevBuf back(std::max<size_t>(src.size(), 1));
      gpu::convert_grouped(rc, K, d_offs, G, 0, ScaleFormat::kCublasLt, dd.p(), ScaleFormat::kCompact, back.p(), st.s);
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st.s));
      auto b = back.download();
      b.resize(src.size());
      REQUIRE(b == src);
    }
}

TEST_CASE("GPU batched conversions (whole buffers and K slices, any count) match the host in few launches",
          "[gpu][layouts]") {
  // convert_batch: what a grouped call's groups would each convert, in one launch per 256 small ones;
  // large whole buffers go through the bandwidth kernels. Byte-identical to convert() / slice_kblocks().
  OwnedStream st;
  auto g = scalemm::testing::rng(0x6b7);
  for (int count : {1, 2, 3, 40, 300}) {
    std::vector<gpu::ScaleConversion> conv;
    std::vector<std::vector<uint8_t>> want;
    std::vector<std::unique_ptr<DevBuf>> srcs, dsts;
    bool any_large = false;
    for (int i = 0; i < count; ++i) {
      const Recipe rc = kAllRecipes[g() % std::size(kAllRecipes)];
      const ScaleFormat ff = g() % 2 ? ScaleFormat::kCompact : ScaleFormat::kCublasLt;
      const ScaleFormat tf = ff == ScaleFormat::kCompact ? ScaleFormat::kCublasLt : ScaleFormat::kCompact;
      const bool large = count == 3 && i == 1;  // past kSmallConversionElements: the bandwidth path
      const int64_t rows = large ? 70001 : int64_t(1 + g() % 300);
      const ScaleLayout one(rc, 1, 1, ScaleFormat::kCompact);
      const int64_t bk = rc == Recipe::kTensorwise || rc == Recipe::kRowwise ? 128 : one.block_k();
      const int64_t k = large ? 4096 : bk * int64_t(1 + g() % 12);
      const bool slice = !large && g() % 2;
      const int64_t kb0 = slice ? int64_t(g() % 3) : 0;
      const ScaleLayout from(rc, rows, slice ? k + (kb0 + int64_t(g() % 2)) * bk : k, ff);
      const ScaleLayout to(rc, rows, k, tf);
      const int64_t first = rc == Recipe::kTensorwise || rc == Recipe::kRowwise ? 0 : kb0;
      std::vector<uint8_t> src(size_t(from.bytes()));
      for (auto& x : src) x = uint8_t(g() | 1);
      std::vector<uint8_t> w(size_t(to.bytes()));
      slice_kblocks(from, src.data(), first, to, w.data());
      any_large |= large && to.size() > gpu::kSmallConversionElements;
      srcs.push_back(std::make_unique<DevBuf>(std::max<size_t>(src.size(), 1)));
      srcs.back()->upload(src);
      dsts.push_back(std::make_unique<DevBuf>(std::max<size_t>(w.size(), 1)));
      conv.push_back({from, to, srcs.back()->p(), dsts.back()->p(), first});
      want.push_back(std::move(w));
    }
    CAPTURE(count);
    cudaGraph_t graph;
    SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
    gpu::convert_batch(conv.data(), count, st.s);
    SCALEMM_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
    size_t nodes = 0;
    SCALEMM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    CHECK(nodes == size_t((count - (any_large ? 1 : 0) + 255) / 256 + (any_large ? 1 : 0)));
    cudaGraphExec_t exec;
    SCALEMM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    SCALEMM_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st.s));
    for (int i = 0; i < count; ++i) {
      auto got = dsts[size_t(i)]->download();
      got.resize(want[size_t(i)].size());
      CAPTURE(i, to_string(conv[size_t(i)].to.recipe), conv[size_t(i)].to.rows, conv[size_t(i)].to.k, conv[size_t(i)].kb0);
      CHECK(got == want[size_t(i)]);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST_CASE("the device content check finds what the host check finds, without a host sync", "[gpu][layouts]") {
  OwnedStream st;
  auto g = scalemm::testing::rng(0x6b5);
  DevBuf rep(sizeof(ContentReport));
  auto* d_rep = reinterpret_cast<ContentReport*>(rep.p());
  for (Recipe rc : kAllRecipes)
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt}) {
      const ScaleLayout c(rc, 257, 1000, ScaleFormat::kCompact), l = c.with_format(f);
      CAPTURE(l.to_string());
      auto buf = testutil::fill_valid(c, g);
      if (f == ScaleFormat::kCublasLt) buf = to_cublaslt(c, buf.data());
      // Break a few things: a NaN/zero value, and a padding element where there is padding.
      if (l.scale_bytes() == 4) {
        const float bad[2] = {0.0f, NAN};
        std::memcpy(buf.data() + l.offset(5, 0) * 4, &bad[0], 4);
        std::memcpy(buf.data() + l.offset(256, 0) * 4, &bad[1], 4);
      } else {
        buf[size_t(l.offset(5, 0))] = 0xFF;
        buf[size_t(l.offset(256, 7))] = l.scale_dtype() == DType::kE8M0 ? 0xFF : 0x7F;
      }
      if (l.size() > l.logical_size() && f == ScaleFormat::kCublasLt && rc != Recipe::kMxfp8_32x32)
        buf[size_t(l.padded_offset(l.padded_rows() - 1, l.padded_kblocks() - 1) * l.scale_bytes())] = 1;
      const ContentReport want = check_content(l, buf.data());
      DevBuf d(buf.size());
      d.upload(buf);
      gpu::check_content_async(l, d.p(), d_rep, st.s);
      ContentReport got;
      SCALEMM_CUDA_CHECK(cudaMemcpyAsync(&got, d_rep, sizeof(got), cudaMemcpyDeviceToHost, st.s));
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st.s));
      REQUIRE(got.any == want.any);
      for (int i = 0; i < kContentRuleCount; ++i) {
        CAPTURE(content_rule_id(ContentRule(i)));
        REQUIRE(got.count[i] == want.count[i]);
        REQUIRE(got.first_offset[i] == want.first_offset[i]);
      }
      // validate_device = structural rules + the device content check.
      TensorRef t = TensorRef::contiguous(d.p(), l.scale_dtype(), {l.size()}, MemorySpace::kDevice);
      TensorRef th = TensorRef::contiguous(buf.data(), l.scale_dtype(), {l.size()});
      ValidateOptions o;
      o.require_alignment = false;
      const Diagnostics dd = gpu::validate_device(t, l, "scale_a", d_rep, st.s, o);
      const Diagnostics dh = validate_scale(th, l, "scale_a", o);
      REQUIRE(to_string(dd) == to_string(dh));
      REQUIRE(!dd.empty());
    }
}
