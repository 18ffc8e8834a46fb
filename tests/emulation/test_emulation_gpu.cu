// [gpu] cases: the device build of the same functors must agree with the host byte for byte.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <memory>

#include "detail/fast_codecs.cuh"
#include "emu_test_util.hpp"
#include "scalemm/detail/device_buffer.hpp"
#include "scalemm/status.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/quantize.hpp"

using namespace emu_test;

namespace {

/// A device buffer holding a copy of host bytes, or `bytes` of fill (zero unless told: counters).
struct DevBuf : scalemm::detail::DeviceBuffer {
  explicit DevBuf(size_t bytes, int fill = 0) : DeviceBuffer(bytes, fill) {}
  template <class T>
  explicit DevBuf(const std::vector<T>& h) : DeviceBuffer(h) {}
};

std::vector<float> wide(std::mt19937_64& g, int64_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-20, 20), z(0, 15);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = z(g) == 0 ? 0.0f : std::ldexp(d(g), e(g));
  // Every 7th run of 16 elements 2^-40 smaller: NVFP4 blocks with subnormal or zero scales (the
  // saturating path of the tile kernel) beside normal ones, in rows and, for most widths, columns.
  for (int64_t i = 0; i < n; ++i)
    if ((i / 16) % 7 == 3) v[size_t(i)] = std::ldexp(v[size_t(i)], -40);
  if (n > 7) v[7] = std::numeric_limits<float>::quiet_NaN();  // one NaN block, one Inf block
  if (n > 0) v[size_t(n / 2)] = std::numeric_limits<float>::infinity();
  return v;
}

/// CHECKs got == want byte for byte; on a mismatch the failure names the case and shows the first
/// differing element (index, both values as hex) and the number of differing elements.
void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int elem_bytes,
                       const std::string& what, const std::string& dtype) {
  REQUIRE(got.size() == want.size());
  int64_t first = -1, ndiff = 0;
  std::string got_hex, want_hex;
  for (size_t i = 0; i < got.size(); i += size_t(elem_bytes)) {
    if (std::memcmp(&got[i], &want[i], size_t(elem_bytes)) == 0) continue;
    ++ndiff;
    if (first >= 0) continue;
    first = int64_t(i) / elem_bytes;
    char buf[64];
    for (int b = elem_bytes - 1; b >= 0; --b) {  // little endian: print most significant byte first
      std::snprintf(buf, sizeof buf, "%02x", got[i + size_t(b)]);
      got_hex += buf;
      std::snprintf(buf, sizeof buf, "%02x", want[i + size_t(b)]);
      want_hex += buf;
    }
  }
  CAPTURE(what, dtype, first, ndiff, got_hex, want_hex);
  CHECK(ndiff == 0);
}

/// Device tensor from host ExactOperand-like bytes.
struct DevOperand {
  DevBuf data, scales, global;
  QuantizedTensor t;
  DevOperand(const QuantizedTensor& h, const std::vector<uint8_t>& d, const std::vector<uint8_t>& s, float g)
      : data(d), scales(s), global(std::vector<float>{g}) {
    t = h;
    t.data = data.p;
    t.scales = scales.p;
    t.global_scale = h.global_scale ? global.as<float>() : nullptr;
  }
};

}  // namespace

namespace {

struct Shape {
  int64_t r, c;
};

/// Quantizes the same data on the host and the GPU for every recipe x format x direction set x
/// (mode, source type) and CHECKs byte identity of data, scales and the NVFP4 global scale.
///   misalign: the device source starts one element past a 16-byte boundary and the device data
///   outputs one byte past theirs, so that every vector load and store path is refused.
///   dir_sets: which direction sets to run (bit 0 rowwise, bit 1 columnwise).
void check_quantizers_identical(const Shape* shapes, size_t n_shapes, bool misalign, std::initializer_list<int> dir_sets) {
  for (size_t si = 0; si < n_shapes; ++si) {
    const Shape sh = shapes[si];
    const int64_t R = sh.r, C = sh.c;
    auto g = scalemm::testing::rng(901 + uint64_t(R * 1000 + C));
    // f32: finite data (real tensor amax: NVFP4 S_enc != 1, tensorwise scale from data); bf16: with the
    // NaN and Inf blocks; f16: finite, clamped into the f16 range (f16 subnormals included).
    const auto xn = wide(g, R * C);
    std::vector<float> x(xn);
    for (auto& v : x)
      if (!std::isfinite(v)) v = 0.5f;
    std::vector<uint16_t> xb(x.size()), xh(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      xb[i] = fmt::encode_bf16(xn[i]);
      xh[i] = fmt::encode_f16(std::max(-60000.0f, std::min(60000.0f, x[i])));
    }
    // Device copies, shifted by one element when misaligned (the buffers are cudaMalloc-aligned).
    const size_t sh4 = misalign ? 1 : 0;
    std::vector<float> x_pad(sh4, 0.0f);
    x_pad.insert(x_pad.end(), x.begin(), x.end());
    std::vector<uint16_t> xb_pad(sh4, 0), xh_pad(sh4, 0);
    xb_pad.insert(xb_pad.end(), xb.begin(), xb.end());
    xh_pad.insert(xh_pad.end(), xh.begin(), xh.end());
    DevBuf dx(x_pad), dxb(xb_pad), dxh(xh_pad);
    for (Recipe r : kAllRecipes)
      for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
        for (int dirs : dir_sets)
          for (int alt = 0; alt < 3; ++alt) {
            if (!shape_fits(r, dirs, R, C)) continue;
            const ScaleMode mode = sweep_mode(r, alt);
            const DType src_dtype = alt == 0 ? DType::kF32 : alt == 1 ? DType::kBF16 : DType::kF16;
            auto cfg = make_cfg(r, f, dirs & 1, dirs & 2, mode,
                                alt == 1 && r != Recipe::kNvfp4 ? DType::kE5M2 : DType::kE4M3);
            INFO(recipe_name(r) << " " << format_name(f) << " dirs=" << dirs << " mode " << to_string(mode) << " src "
                                << to_string(src_dtype) << " shape " << R << "x" << C
                                << (misalign ? " misaligned" : ""));
            const float* hx = alt == 0 ? x.data()
                              : alt == 1 ? reinterpret_cast<const float*>(xb.data())
                                         : reinterpret_cast<const float*>(xh.data());
            auto h = quantize_h(hx, R, C, cfg, 0xA5, src_dtype);
            const int64_t db = data_bytes(cfg, R, C);
            const size_t ob = misalign ? 1 : 0;
            DevBuf d(size_t(db) + ob, 0xEE), s(size_t(rowwise_layout(cfg, R, C).bytes()), 0xA5);
            DevBuf dt(size_t(db) + ob, 0xEE), st(size_t(columnwise_layout(cfg, R, C).bytes()), 0xA5), gs(4);
            QuantizeOutputs o{cfg.rowwise ? d.as<uint8_t>() + ob : nullptr, cfg.rowwise ? s.p : nullptr,
                              cfg.columnwise ? dt.as<uint8_t>() + ob : nullptr, cfg.columnwise ? st.p : nullptr,
                              gs.as<float>()};
            const void* sp = alt == 0   ? static_cast<const void*>(dx.as<float>() + sh4)
                             : alt == 1 ? static_cast<const void*>(dxb.as<uint16_t>() + sh4)
                                        : static_cast<const void*>(dxh.as<uint16_t>() + sh4);
            SourceMatrix src{sp, src_dtype, R, C};
            scalemm::quantize::quantize(src, cfg, o, nullptr, 0, nullptr);
            SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
            const auto strip = [ob](std::vector<uint8_t> v) {
              v.erase(v.begin(), v.begin() + std::ptrdiff_t(ob));
              return v;
            };
            if (cfg.rowwise) {
              expect_same_bytes(strip(d.download()), h.data, 1, "rowwise data", "");
              expect_same_bytes(s.download(), h.scales, 1, "rowwise scales", "");
            }
            if (cfg.columnwise) {
              expect_same_bytes(strip(dt.download()), h.data_t, 1, "columnwise data", "");
              expect_same_bytes(st.download(), h.scales_t, 1, "columnwise scales", "");
            }
            if (r == Recipe::kNvfp4) CHECK(gs.download<float>()[0] == h.global);
          }
  }
}

}  // namespace

TEST_CASE("Host and GPU quantizers are byte-identical for every recipe, mode, format and direction",
          "[emulation][gpu]") {
  // Shapes: partial 128x128 tiles with R % 4 = 2 (scalar transposed stores), odd R and C % 4 = 2
  // (scalar loads and stores everywhere), whole tiles (vector paths only), a single row, a tiny
  // matrix, and rows that do not fill a 32-row MX block. NVFP4 needs even C (rowwise) / even R
  // (columnwise): odd shapes skip those directions. 384x272: whole tiles with R and C multiples of 16
  // (the NVFP4 row+col tile path of one block per lane) beside partial ones.
  const Shape shapes[] = {{258, 392}, {131, 202}, {256, 256}, {1, 6}, {5, 3}, {40, 136}, {384, 272}};
  check_quantizers_identical(shapes, std::size(shapes), false, {1, 2, 3});
}

TEST_CASE("Host and GPU quantizers are byte-identical on long rows, K tails and misaligned buffers",
          "[emulation][gpu]") {
  // The fused rowwise-recipe kernel (one CTA per row up to 8192 columns) at and past its limit, K with
  // a tail block and K/128 not a multiple of 4 (the row kernel's 4-chunk groups end early), rows 1, 7
  // and 129; then misaligned source and outputs (scalar loads and stores on every path).
  const Shape shapes[] = {{1, 8192}, {7, 8192}, {3, 8194}, {129, 640}, {7, 1000}, {129, 1160}, {2, 8320}};
  check_quantizers_identical(shapes, std::size(shapes), false, {1, 3});
  const Shape odd[] = {{7, 1000}, {129, 392}, {1, 8192}, {6, 130}};
  check_quantizers_identical(odd, std::size(odd), true, {1, 2, 3});
}

TEST_CASE("A given tensor amax (one read of the source) gives the host's bytes on the GPU", "[emulation][gpu]") {
  // Tensorwise and NVFP4 with the amax supplied in device memory: the true amax, a quarter of it
  // (saturation) and its negative; bf16 and f32 sources; both directions and each alone.
  auto g = scalemm::testing::rng(907);
  for (const Shape sh : {Shape{258, 392}, Shape{130, 8200}, Shape{2, 6}, Shape{256, 400}}) {
    const int64_t R = sh.r, C = sh.c;
    std::vector<float> x = wide(g, R * C);
    for (auto& v : x)
      if (!std::isfinite(v)) v = 0.25f;
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = fmt::encode_bf16(x[i]);
    float am = 0.0f;
    for (size_t i = 0; i < x.size(); ++i) am = std::max(am, std::fabs(fmt::decode_bf16(xb[i])));
    DevBuf dx(x), dxb(xb);
    for (float given : {am, am / 4.0f, -am})
      for (Recipe r : {Recipe::kTensorwise, Recipe::kNvfp4})
        for (int dirs : {1, 2, 3})
          for (DType sd : {DType::kBF16, DType::kF32}) {
            const auto cfg = make_cfg(r, ScaleFormat::kCublasLt, dirs & 1, dirs & 2);
            INFO(recipe_name(r) << " dirs=" << dirs << " src " << to_string(sd) << " shape " << R << "x" << C
                                << " amax " << given);
            const float* hx = sd == DType::kF32 ? x.data() : reinterpret_cast<const float*>(xb.data());
            const auto h = quantize_h(hx, R, C, cfg, 0xA5, sd, &given);
            const int64_t db = data_bytes(cfg, R, C);
            DevBuf d(size_t(db), 0xEE), s(size_t(rowwise_layout(cfg, R, C).bytes()), 0xA5);
            DevBuf dt(size_t(db), 0xEE), st(size_t(columnwise_layout(cfg, R, C).bytes()), 0xA5), gs(4);
            DevBuf da(std::vector<float>{given});
            QuantizeOutputs o{cfg.rowwise ? d.p : nullptr, cfg.rowwise ? s.p : nullptr, cfg.columnwise ? dt.p : nullptr,
                              cfg.columnwise ? st.p : nullptr, gs.as<float>()};
            SourceMatrix src{sd == DType::kF32 ? dx.p : dxb.p, sd, R, C, da.as<float>()};
            scalemm::quantize::quantize(src, cfg, o, nullptr, 0, nullptr);
            SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
            if (cfg.rowwise) {
              expect_same_bytes(d.download(), h.data, 1, "rowwise data", "");
              expect_same_bytes(s.download(), h.scales, 1, "rowwise scales", "");
            }
            if (cfg.columnwise) {
              expect_same_bytes(dt.download(), h.data_t, 1, "columnwise data", "");
              expect_same_bytes(st.download(), h.scales_t, 1, "columnwise scales", "");
            }
            if (r == Recipe::kNvfp4) CHECK(gs.download<float>()[0] == h.global);
          }
  }
}

TEST_CASE("Host and GPU dequantization agree bit for bit in f32 and bf16", "[emulation][gpu]") {
  // Shapes: K with a partial 128-chunk (200), K % 4 = 2 (scalar stores, 202), tiny (5 x 6), and a
  // K-slice view whose row stride exceeds K; every recipe, both scale formats, e4m3 and e5m2 data,
  // f32/bf16/f16 output. NaN and Inf blocks included (outputs use the canonical NaN).
  struct Shape {
    int64_t r, c;
  };
  for (const Shape sh : {Shape{130, 200}, Shape{67, 202}, Shape{5, 6}})
    for (ScaleFormat f : {ScaleFormat::kCublasLt, ScaleFormat::kCompact})
      for (int e5 = 0; e5 < 2; ++e5) {
        const int64_t R = sh.r, C = sh.c;
        auto g = scalemm::testing::rng(902 + uint64_t(R));
        const auto x = wide(g, R * C);
        for (Recipe r : kAllRecipes) {
          if (e5 && r == Recipe::kNvfp4) continue;
          auto cfg = make_cfg(r, f, true, false, ScaleMode::kDefault, e5 ? DType::kE5M2 : DType::kE4M3);
          auto h = quantize_h(x.data(), R, C, cfg);
          DevOperand dop(h.rowwise(), h.data, h.scales, h.global);
          for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
            const std::string what = std::string(recipe_name(r)) + " " + format_name(f) + (e5 ? " e5m2 " : " ") +
                                     std::to_string(R) + "x" + std::to_string(C);
            const size_t bytes = size_t(R * C) * size_t(dtype_bits(out) / 8);
            std::vector<uint8_t> hd(bytes);
            dequantize_host(h.rowwise(), hd.data(), out);
            DevBuf dd(bytes);
            scalemm::quantize::dequantize(dop.t, dd.p, out, nullptr);
            SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
            expect_same_bytes(dd.download(), hd, int(dtype_bits(out) / 8), what, std::string(to_string(out)));
            // A strided view: columns [0, C - 2) with row stride C. Tensorwise only, whose one scale
            // does not depend on K (other layouts' grids change with K).
            if (r == Recipe::kTensorwise && C > 2) {
              QuantizedTensor hv = h.rowwise(), dv = dop.t;
              hv.layout = dv.layout = ScaleLayout(r, R, C - 2, f);
              hv.ld = dv.ld = C;
              const size_t vb = size_t(R * (C - 2)) * size_t(dtype_bits(out) / 8);
              std::vector<uint8_t> hvd(vb);
              dequantize_host(hv, hvd.data(), out);
              DevBuf dvd(vb);
              scalemm::quantize::dequantize(dv, dvd.p, out, nullptr);
              SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
              expect_same_bytes(dvd.download(), hvd, int(dtype_bits(out) / 8), what + " strided view",
                                std::string(to_string(out)));
            }
          }
        }
      }
}

TEST_CASE("quantize::transpose moves every byte of a batch of matrices to its transposed place", "[emulation][gpu]") {
  // Whole 64x64 tiles with 16-byte accesses, tails in both dimensions, a single element, widths that
  // allow the vector load but not the vector store (and the reverse), and a source one byte off
  // alignment (byte path throughout). The output is poisoned first: every byte must be written.
  struct Shape {
    int64_t b, r, c, offset;
  };
  for (const Shape sh : {Shape{1, 1, 1, 0}, Shape{1, 7, 129, 0}, Shape{3, 64, 64, 0}, Shape{2, 130, 4096, 0},
                         Shape{1, 4096, 48, 0}, Shape{1, 200, 336, 0}, Shape{2, 128, 256, 1}, Shape{1, 0, 5, 0}}) {
    const int64_t n = sh.b * sh.r * sh.c;
    auto g = scalemm::testing::rng(77 + uint64_t(n));
    std::vector<uint8_t> h(size_t(n + sh.offset));
    for (auto& v : h) v = uint8_t(g());
    DevBuf src(h), dst(size_t(std::max<int64_t>(n, 1)), 0xAB);
    scalemm::quantize::transpose(static_cast<uint8_t*>(src.p) + sh.offset, sh.b, sh.r, sh.c, dst.p, nullptr);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = dst.download();
    int64_t wrong = 0;
    for (int64_t b = 0; b < sh.b; ++b)
      for (int64_t r = 0; r < sh.r; ++r)
        for (int64_t c = 0; c < sh.c; ++c)
          wrong += got[size_t(b * sh.r * sh.c + c * sh.r + r)] != h[size_t(sh.offset + b * sh.r * sh.c + r * sh.c + c)];
    INFO(sh.b << " x " << sh.r << " x " << sh.c << " offset " << sh.offset);
    CHECK(wrong == 0);
  }
  bool named = false;  // a null buffer is refused by name, before anything is enqueued
  try {
    scalemm::quantize::transpose(nullptr, 1, 4, 4, nullptr, nullptr);
  } catch (const Error& e) {
    named = std::string(e.what()).find("quantize::transpose") != std::string::npos;
  }
  CHECK(named);
}

TEST_CASE("GPU reference GEMM equals the exact product on exact-by-construction inputs, odd shapes included",
          "[emulation][gpu]") {
  for (Recipe r : kAllRecipes)
    for (int64_t M : {1, 7, 129}) {
      INFO(recipe_name(r) << " M=" << M);
      auto g = scalemm::testing::rng(903 + uint64_t(M));
      const int64_t N = 130, K = 200;
      const auto a = make_exact(r, M, K, ScaleFormat::kCublasLt, Pattern::kSmallInts, g);
      const auto b = make_exact(r, N, K, ScaleFormat::kCublasLt, Pattern::kSmallInts, g);
      std::vector<float> bias(static_cast<size_t>(N));
      for (int64_t j = 0; j < N; ++j) bias[size_t(j)] = float(int(j % 5) - 2);
      DevOperand da(a.tensor(), a.data, a.scales, a.global), db(b.tensor(), b.data, b.scales, b.global);
      DevBuf dbias(bias);
      for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
        const auto want = encode_out(exact_product(a, b, 0.5, bias.data()), out);
        DevBuf dd(want.size(), 0xCD);
        GemmOptions o;
        o.alpha = 0.5f;
        o.bias = dbias.as<float>();
        o.out_dtype = out;
        gemm_device(da.t, db.t, dd.p, o, nullptr, 0, nullptr);
        SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(dd.download() == want);
      }
    }
}

TEST_CASE("GPU reference GEMM is bit-identical to the host GEMM on random data", "[emulation][gpu]") {
  auto g = scalemm::testing::rng(904);
  const int64_t M = 300, N = 260, K = 1000;
  const auto a = random_normal(g, M * K), b = random_normal(g, N * K);
  for (Recipe r : {Recipe::kBlock1x128, Recipe::kMxfp8, Recipe::kNvfp4}) {
    INFO(recipe_name(r));
    auto qa = quantize_h(a.data(), M, K, make_cfg(r, ScaleFormat::kCublasLt));
    auto qb = quantize_h(b.data(), N, K, make_cfg(r, ScaleFormat::kCublasLt));
    std::vector<float> hd(size_t(M * N));
    gemm_host(qa.rowwise(), qb.rowwise(), hd.data());
    DevOperand da(qa.rowwise(), qa.data, qa.scales, qa.global), db(qb.rowwise(), qb.data, qb.scales, qb.global);
    const size_t ws = gemm_device_workspace_bytes(da.t, db.t);
    DevBuf w(ws), dd(size_t(M * N) * 4);
    gemm_device(da.t, db.t, dd.p, GemmOptions{}, w.p, ws, nullptr);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = dd.download<float>();
    const auto c = compare(hd.data(), got.data(), M * N);
    INFO(c.to_string());
    CHECK(c.bitwise_equal());
  }
}

TEST_CASE("GPU grouped GEMMs (row groups with an empty group, K groups) equal the host", "[emulation][gpu]") {
  auto g = scalemm::testing::rng(905);
  const int64_t N = 130, K = 200;
  const std::vector<int64_t> sizes = {3, 0, 129};
  const std::vector<int64_t> offs = {0, 3, 3, 132};
  std::vector<ExactOperand> A, B;
  for (auto s : sizes) {
    A.push_back(make_exact(Recipe::kMxfp8, s, K, ScaleFormat::kCublasLt, Pattern::kSmallInts, g));
    B.push_back(make_exact(Recipe::kMxfp8, N, K, ScaleFormat::kCublasLt, Pattern::kSmallInts, g));
  }
  std::vector<QuantizedTensor> ha, hb;
  std::vector<std::unique_ptr<DevOperand>> da, db;
  std::vector<QuantizedTensor> ta, tb;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ha.push_back(A[i].tensor());
    hb.push_back(B[i].tensor());
    da.emplace_back(new DevOperand(ha[i], A[i].data, A[i].scales, A[i].global));
    db.emplace_back(new DevOperand(hb[i], B[i].data, B[i].scales, B[i].global));
    ta.push_back(da[i]->t);
    tb.push_back(db[i]->t);
  }
  std::vector<float> hd(size_t(offs.back() * N));
  grouped_gemm_rows_host(ha.data(), hb.data(), offs.data(), 3, hd.data());
  DevBuf dd(hd.size() * 4);
  grouped_gemm_rows_device(ta.data(), tb.data(), offs.data(), 3, dd.p, GemmOptions{}, nullptr, 0, nullptr);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(dd.download<float>() == hd);
  // K groups: same M for all groups (use groups 2's A with itself against each B as a 2D x 2D case)
  std::vector<QuantizedTensor> ka = {ta[2], ta[2]}, kb = {tb[0], tb[2]}, hka = {ha[2], ha[2]}, hkb = {hb[0], hb[2]};
  std::vector<float> hk(size_t(2 * 129 * N));
  grouped_gemm_k_host(hka.data(), hkb.data(), 2, hk.data());
  DevBuf dk(hk.size() * 4);
  grouped_gemm_k_device(ka.data(), kb.data(), 2, dk.p, GemmOptions{}, nullptr, 0, nullptr);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(dk.download<float>() == hk);
}

// ---- the kernels' element codecs against the software encoder, on every fp32 pattern ------------

namespace {

namespace ed = scalemm::numerics::detail;

/// The software reference of one element: encode_satfinite with the element's MiniFloat (equal to
/// formats::encode_*(x, kSatFinite), host test "The emulator's 32-bit element encoder ...").
template <int E>
__device__ uint32_t sw_encode(uint32_t b) {
  if constexpr (E == 0) return ed::encode_satfinite(b, fmt::detail::e4m3_format());
  else if constexpr (E == 1) return ed::encode_satfinite(b, fmt::detail::e5m2_format());
  else return ed::encode_satfinite(b, fmt::detail::e2m1_format());
}

/// Pattern of the pair's high element for low pattern b: an odd multiplier and an add make it a
/// bijection of the 32-bit patterns, so over the sweep every pattern is also a high element.
__host__ __device__ inline uint32_t partner(uint32_t b) { return b * 2654435761u + 0x9E3779B9u; }

/// Grid-stride over all 2^32 low patterns: encode_pair<E> (what the quantizer kernels call) against
/// the software encoder of both elements. Counts mismatches; keeps the smallest mismatching pattern.
template <int E>
__global__ void sweep_encode_kernel(unsigned long long* bad, unsigned long long* first) {
  const uint64_t n = uint64_t(1) << 32;
  const uint64_t step = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long local = 0, lfirst = ~0ull;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint32_t b = uint32_t(i), b2 = partner(b);
    const uint32_t got = ed::encode_pair<E>(fmt::bits_float(b), fmt::bits_float(b2));
    const uint32_t want = sw_encode<E>(b) | (sw_encode<E>(b2) << (E == 2 ? 4 : 8));
    if (got != want) {
      ++local;
      if (lfirst == ~0ull) lfirst = b;
    }
  }
  if (local) {
    atomicAdd(bad, local);
    atomicMin(first, lfirst);
  }
}

/// Grid-stride over all 2^32 patterns b: encode_e2m1x4_not_nan (the NVFP4 kernels' packed encoder) of
/// b, partner(b), partner^2(b), partner^3(b) against encode_e2m1_not_nan of each, so every non-NaN
/// pattern is each of the four elements once (NaN patterns become 0: the encoder's contract is
/// non-NaN inputs). Same counters as sweep_encode_kernel.
__global__ void sweep_e2m1x4_kernel(unsigned long long* bad, unsigned long long* first) {
  const uint64_t n = uint64_t(1) << 32;
  const uint64_t step = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long local = 0, lfirst = ~0ull;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    uint32_t b[4] = {uint32_t(i), 0, 0, 0};
    for (int j = 1; j < 4; ++j) b[j] = partner(b[j - 1]);
    for (int j = 0; j < 4; ++j)  // non-NaN inputs only (the kernels replace a NaN block's codes)
      if ((b[j] & 0x7FFFFFFFu) > 0x7F800000u) b[j] = 0;
    const uint32_t got = ed::encode_e2m1x4_not_nan(fmt::bits_float(b[0]), fmt::bits_float(b[1]),
                                                   fmt::bits_float(b[2]), fmt::bits_float(b[3]));
    uint32_t want = 0;
    for (int j = 0; j < 4; ++j) want |= ed::encode_e2m1_not_nan(fmt::bits_float(b[j])) << (4 * j);
    if (got != want) {
      ++local;
      if (lfirst == ~0ull) lfirst = b[0];
    }
  }
  if (local) {
    atomicAdd(bad, local);
    atomicMin(first, lfirst);
  }
}

/// Grid-stride over all 2^32 patterns b, for the NVFP4 tile kernel's two shortcuts (counters [0] and
/// [2], first offenders [1] and [3]):
///   * the scale byte: nvfp4_scale_byte (GPU: div6_fma in its range, no NaN or clamp test) against the
///     division, NaN test, clamp and software UE4M3 encoder, for every non-negative amax (NaN and Inf
///     included) and three global scales;
///   * e2m1x4_small (no saturation) against encode_e2m1_not_nan, for inputs in [0, 7) in each of the
///     four positions (b, partner(b), ...; others become 0).
__global__ void sweep_nvfp4_steps_kernel(unsigned long long* c) {
  const uint64_t n = uint64_t(1) << 32;
  const uint64_t step = uint64_t(gridDim.x) * blockDim.x;
  const float sencs[3] = {1.0f, 0.0123f, 3.5e20f};
  unsigned long long bad[2] = {0, 0}, first[2] = {~0ull, ~0ull};
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint32_t b = uint32_t(i);
    if (b <= 0x7FFFFFFFu) {
      const float amax = fmt::bits_float(b);
      for (float senc : sencs) {
        float sb = (amax / 6.0f) * senc;
        sb = sb < 448.0f ? sb : 448.0f;
        const uint8_t want = ed::is_nan_f(amax) ? 0x7F : fmt::encode_ue4m3(sb, fmt::Saturation::kSatFinite);
        if (ed::nvfp4_scale_byte(amax, senc) != want) {
          ++bad[0];
          if (first[0] == ~0ull) first[0] = b;
        }
      }
    }
    uint32_t v[4] = {b, 0, 0, 0};
    for (int j = 1; j < 4; ++j) v[j] = partner(v[j - 1]);
    for (int j = 0; j < 4; ++j)
      if (v[j] >= 0x40E00000u) v[j] = 0;  // [0, 7) only: non-negative patterns below 7.0
    const uint32_t got = ed::e2m1x4_small(fmt::bits_float(v[0]), fmt::bits_float(v[1]), fmt::bits_float(v[2]),
                                          fmt::bits_float(v[3]));
    uint32_t want = 0;
    for (int j = 0; j < 4; ++j) want |= ed::encode_e2m1_not_nan(fmt::bits_float(v[j])) << (4 * j);
    if (got != want) {
      ++bad[1];
      if (first[1] == ~0ull) first[1] = b;
    }
  }
  for (int k = 0; k < 2; ++k)
    if (bad[k]) {
      atomicAdd(&c[2 * k], bad[k]);
      atomicMin(&c[2 * k + 1], first[k]);
    }
}

/// Every pair of FP8 codes: decode_fp8_pair<E> (the dequantization kernel's decoder) against the
/// formats decoder; NaN codes only need to give a NaN (outputs store NaN canonically).
template <int E>
__global__ void sweep_decode_kernel(unsigned long long* bad, unsigned long long* first) {
  const uint32_t c = uint32_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= 0x10000u) return;
  float lo, hi;
  ed::decode_fp8_pair<E>(c, lo, hi);
  const float want_lo = E == 0 ? fmt::decode_e4m3(uint8_t(c)) : fmt::decode_e5m2(uint8_t(c));
  const float want_hi = E == 0 ? fmt::decode_e4m3(uint8_t(c >> 8)) : fmt::decode_e5m2(uint8_t(c >> 8));
  const auto same = [](float a, float b) {
    return ed::is_nan_f(a) ? ed::is_nan_f(b) : fmt::float_bits(a) == fmt::float_bits(b);
  };
  if (!same(lo, want_lo) || !same(hi, want_hi)) {
    atomicAdd(bad, 1ull);
    atomicMin(first, (unsigned long long)c);
  }
}

__global__ void hw_fp8_flag_kernel(int* flag) { *flag = SCALEMM_EMU_HW_FP8; }

template <int E>
void run_encode_sweep(const char* name) {
  DevBuf counters(2 * sizeof(unsigned long long));
  SCALEMM_CUDA_CHECK(cudaMemset(counters.as<unsigned long long>() + 1, 0xFF, sizeof(unsigned long long)));
  sweep_encode_kernel<E><<<4096, 256>>>(counters.as<unsigned long long>(), counters.as<unsigned long long>() + 1);
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto h = counters.download<unsigned long long>();
  const unsigned long long bad = h[0];
  char first[64] = "none";
  if (bad) std::snprintf(first, sizeof first, "low 0x%08llx high 0x%08x", h[1], partner(uint32_t(h[1])));
  CAPTURE(name, bad, first);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("The kernels' pair encoders equal the software encoder on all 2^32 fp32 patterns (E4M3, E5M2, E2M1)",
          "[emulation][gpu]") {
  // E4M3/E5M2: the hardware cvt.rn.satfinite.{e4m3,e5m2}x2.f32 on sm_89+ (which this build targets
  // decides at compile time; the flag is printed); E2M1: the branch-free encoder. Each of the 2^32
  // patterns is the low element once and the high element once (partner() is a bijection).
  DevBuf flag(sizeof(int));
  hw_fp8_flag_kernel<<<1, 1>>>(flag.as<int>());
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  const int hw = flag.download<int>()[0];
  WARN("FP8 pair encoder on this device: " << (hw ? "hardware cvt (sm_89+)" : "software"));
  run_encode_sweep<0>("e4m3");
  run_encode_sweep<1>("e5m2");
  run_encode_sweep<2>("e2m1");
}

TEST_CASE("The packed E2M1 encoder of the NVFP4 kernels equals the element encoder on all 2^32 fp32 patterns "
          "in every position",
          "[emulation][gpu]") {
  DevBuf counters(2 * sizeof(unsigned long long));
  SCALEMM_CUDA_CHECK(cudaMemset(counters.as<unsigned long long>(), 0, sizeof(unsigned long long)));
  SCALEMM_CUDA_CHECK(cudaMemset(counters.as<unsigned long long>() + 1, 0xFF, sizeof(unsigned long long)));
  sweep_e2m1x4_kernel<<<4096, 256>>>(counters.as<unsigned long long>(), counters.as<unsigned long long>() + 1);
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto h = counters.download<unsigned long long>();
  const unsigned long long bad = h[0];
  char first[32] = "none";
  if (bad) std::snprintf(first, sizeof first, "0x%08llx", h[1]);
  CAPTURE(bad, first);
  CHECK(bad == 0);
}

TEST_CASE("The NVFP4 tile kernel's scale byte and unsaturated encoder equal the reference steps on all 2^32 "
          "patterns",
          "[emulation][gpu]") {
  DevBuf counters(4 * sizeof(unsigned long long));
  auto* c = counters.as<unsigned long long>();
  for (int k = 0; k < 2; ++k) {
    SCALEMM_CUDA_CHECK(cudaMemset(c + 2 * k, 0, sizeof(unsigned long long)));
    SCALEMM_CUDA_CHECK(cudaMemset(c + 2 * k + 1, 0xFF, sizeof(unsigned long long)));
  }
  sweep_nvfp4_steps_kernel<<<4096, 256>>>(c);
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto h = counters.download<unsigned long long>();
  char first_byte[32] = "none", first_small[32] = "none";
  if (h[0]) std::snprintf(first_byte, sizeof first_byte, "0x%08llx", h[1]);
  if (h[2]) std::snprintf(first_small, sizeof first_small, "0x%08llx", h[3]);
  CAPTURE(h[0], first_byte, h[2], first_small);
  CHECK(h[0] == 0);
  CHECK(h[2] == 0);
}

TEST_CASE("The dequantization kernel's FP8 pair decoder equals the formats decoder on every code pair",
          "[emulation][gpu]") {
  for (int e = 0; e < 2; ++e) {
    DevBuf counters(2 * sizeof(unsigned long long));
    SCALEMM_CUDA_CHECK(cudaMemset(counters.as<unsigned long long>() + 1, 0xFF, sizeof(unsigned long long)));
    if (e == 0) sweep_decode_kernel<0><<<256, 256>>>(counters.as<unsigned long long>(), counters.as<unsigned long long>() + 1);
    else sweep_decode_kernel<1><<<256, 256>>>(counters.as<unsigned long long>(), counters.as<unsigned long long>() + 1);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto h = counters.download<unsigned long long>();
    const unsigned long long bad = h[0], first = h[1];
    CAPTURE(e, bad, first);
    CHECK(bad == 0);
  }
}

namespace {

/// quantize_grouped against its definition: quantize_host of the tokens rowwise, and of the (R, C)
/// matrix holding every group's rows from a 128-row boundary (zero rows elsewhere) columnwise.
void check_grouped_tokens(const std::vector<int64_t>& sizes, int64_t T, int64_t C, int64_t extra_rows, Recipe r,
                          ScaleFormat f, DType src_dtype, DType fp8, bool rowwise) {
  const int64_t G = int64_t(sizes.size());
  const int64_t R = scalemm::quantize::padded_token_rows(T, G) + extra_rows;
  auto g = scalemm::testing::rng(911 + uint64_t(T * 131 + C + G));
  const auto xn = wide(g, T * C);
  std::vector<uint16_t> x(size_t(T * C)), xp(size_t(R * C), 0);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = src_dtype == DType::kBF16 ? fmt::encode_bf16(xn[i])
                                     : fmt::encode_f16(std::isfinite(xn[i]) ? std::max(-60000.0f, std::min(60000.0f, xn[i])) : 0.5f);
  // The definition: group g's rows at P_g (sizes past T lose their rows beyond T; negative sizes are 0).
  int64_t s0 = 0, p0 = 0;
  for (int64_t m : sizes) {
    m = std::max<int64_t>(m, 0);
    for (int64_t i = 0; i < m && s0 + i < T && p0 + i < R; ++i)
      std::memcpy(&xp[size_t((p0 + i) * C)], &x[size_t((s0 + i) * C)], size_t(C) * 2);
    s0 += m;
    p0 += (m + 127) / 128 * 128;
  }
  const auto cfg = make_cfg(r, f, rowwise, true, ScaleMode::kDefault, fp8);
  auto cfg_r = cfg, cfg_c = cfg;
  cfg_r.columnwise = false;
  cfg_c.rowwise = false;
  HostQuant hr;
  if (rowwise) hr = quantize_h(reinterpret_cast<const float*>(x.data()), T, C, cfg_r, 0xA5, src_dtype);
  const auto hc = quantize_h(reinterpret_cast<const float*>(xp.data()), R, C, cfg_c, 0xA5, src_dtype);

  DevBuf dx(x.empty() ? std::vector<uint16_t>{0} : x), dsz(sizes);
  DevBuf d(size_t(std::max<int64_t>(data_bytes(cfg, T, C), 1)), 0xEE);
  DevBuf s(size_t(std::max<int64_t>(rowwise_layout(cfg, T, C).bytes(), 1)), 0xA5);
  DevBuf dt(size_t(data_bytes(cfg, R, C)), 0xEE), st(size_t(columnwise_layout(cfg, R, C).bytes()), 0xA5);
  const QuantizeOutputs o{rowwise ? d.p : nullptr, rowwise ? s.p : nullptr, dt.p, st.p, nullptr};
  scalemm::quantize::quantize_grouped(SourceMatrix{dx.p, src_dtype, T, C}, cfg, {dsz.as<int64_t>(), G, R}, o, nullptr);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  if (rowwise && T > 0) {
    auto dd = d.download(), ss = s.download();
    dd.resize(hr.data.size());
    ss.resize(hr.scales.size());
    expect_same_bytes(dd, hr.data, 1, "rowwise data", "");
    expect_same_bytes(ss, hr.scales, 1, "rowwise scales", "");
  }
  expect_same_bytes(dt.download(), hc.data_t, 1, "columnwise data", "");
  expect_same_bytes(st.download(), hc.scales_t, 1, "columnwise scales", "");
}

}  // namespace

TEST_CASE("Grouped tokens quantize to the tokens rowwise and the 128-row-aligned groups columnwise", "[emulation][gpu]") {
  // Groups that end inside a tile, on a tile boundary, one row past it, empty groups (first, middle,
  // last), a single group; K with a tail block and K % 4 = 2 (scalar paths); slack rows after the
  // last group; sizes summing past T (rows beyond T dropped) and a negative size (taken as 0).
  struct Case {
    std::vector<int64_t> sizes;
    int64_t T, C, extra;
  };
  const Case cases[] = {{{300, 0, 17, 1, 128, 250, 0, 64}, 760, 256, 0},
                        {{0, 0, 0, 5}, 5, 384, 128},
                        {{129}, 129, 200, 0},
                        {{128, 256}, 384, 130, 256},
                        {{0}, 0, 256, 0},
                        {{100, 100}, 150, 256, 0},
                        {{-3, 40, 7}, 47, 128, 0}};
  for (const auto& c : cases)
    for (Recipe r : {Recipe::kBlock1x128, Recipe::kMxfp8})
      for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
        for (DType sd : {DType::kBF16, DType::kF16}) {
          const DType fp8 = sd == DType::kF16 ? DType::kE5M2 : DType::kE4M3;
          for (bool rowwise : {true, false}) {
            std::string sz;
            for (int64_t m : c.sizes) sz += std::to_string(m) + " ";
            INFO(recipe_name(r) << " " << format_name(f) << " src " << to_string(sd) << " sizes " << sz << "T " << c.T
                                << " C " << c.C << " extra " << c.extra << (rowwise ? " row+col" : " col"));
            check_grouped_tokens(c.sizes, c.T, c.C, c.extra, r, f, sd, fp8, rowwise);
          }
        }
}

namespace {
/// Runs `call`, which must refuse with kInvalidArgument and name `what` (the argument) in its message.
template <class Call>
void expect_invalid(Call&& call, const char* what) {
  try {
    call();
    FAIL("accepted; expected an error naming " << what);
  } catch (const scalemm::Error& e) {
    CAPTURE(e.what());
    CHECK(e.code() == scalemm::StatusCode::kInvalidArgument);
    CHECK(std::string(e.what()).find(what) != std::string::npos);
  }
}
}  // namespace

TEST_CASE("quantize_grouped names what is wrong before anything runs", "[emulation][quantize]") {
  using scalemm::quantize::quantize_grouped;
  using scalemm::quantize::TokenGroups;
  uint16_t src[256] = {};
  uint8_t data[256], scales[64], data_t[256 * 2], scales_t[64];
  const int64_t sizes[1] = {1};  // never read: every call below is refused first
  const QuantizeOutputs o{data, scales, data_t, scales_t, nullptr};
  const SourceMatrix x{src, DType::kBF16, 1, 128};
  const auto expect = [&](const SourceMatrix& s, const QuantizeConfig& cfg, const TokenGroups& g, const char* what) {
    expect_invalid([&] { quantize_grouped(s, cfg, g, o, nullptr); }, what);
  };
  const auto ok = make_cfg(Recipe::kBlock1x128, ScaleFormat::kCompact, true, true);
  expect(x, make_cfg(Recipe::kBlock128x128, ScaleFormat::kCompact, true, true), {sizes, 1, 128}, "cfg.recipe");
  expect(SourceMatrix{src, DType::kF32, 1, 128}, ok, {sizes, 1, 128}, "src.dtype");
  expect(x, make_cfg(Recipe::kBlock1x128, ScaleFormat::kCompact, true, false), {sizes, 1, 128}, "cfg.columnwise");
  expect(x, ok, {nullptr, 1, 128}, "groups");
  expect(x, ok, {sizes, 0, 128}, "groups");
  expect(x, ok, {sizes, 2, 128}, "groups.padded_rows");  // 1 token in 2 groups needs 256 rows
  expect(x, ok, {sizes, 1, 200}, "groups.padded_rows");
  CHECK(scalemm::quantize::padded_token_rows(1, 2) == 256);
  CHECK(scalemm::quantize::padded_token_rows(0, 1) == 128);
  CHECK(scalemm::quantize::padded_token_rows(32768, 16) == 34816);
}

namespace {

/// The fused activations, each against its definition: the activation alone (written in the source's
/// type by apply_*, the same arithmetic), then quantize().
enum class Fused { kGelu, kGeluGrad, kSwiglu, kSwigluGate, kSwigluUp };
const char* fused_name(Fused k) {
  const char* names[] = {"gelu", "gelu grad", "swiglu", "swiglu gate grad", "swiglu up grad"};
  return names[int(k)];
}

void check_fused(Fused kind, int64_t R, int64_t C, Recipe r, ScaleFormat f, DType src_dtype, bool rowwise) {
  auto g = scalemm::testing::rng(4242 + uint64_t(R * 977 + C) + uint64_t(kind));
  const auto enc = [&](float v) {
    return src_dtype == DType::kBF16 ? fmt::encode_bf16(v)
                                     : fmt::encode_f16(std::isfinite(v) ? std::max(-60000.0f, std::min(60000.0f, v)) : 0.5f);
  };
  const int64_t n = R * C;
  // src: the activation's input (forward) or an output gradient of wide range (backward); a, b: the
  // further inputs (GELU's input; SwiGLU's up, or gate and up).
  const bool backward = kind == Fused::kGeluGrad || kind == Fused::kSwigluGate || kind == Fused::kSwigluUp;
  const auto sn = backward ? wide(g, n) : random_normal(g, n, 3.0f), an = random_normal(g, n, 3.0f),
             bn = random_normal(g, n, 2.0f);
  std::vector<uint16_t> src(static_cast<size_t>(n)), a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    src[size_t(i)] = enc(sn[size_t(i)]);
    a[size_t(i)] = enc(an[size_t(i)]);
    b[size_t(i)] = enc(bn[size_t(i)]);
  }
  if (n > 3) {  // the activations' edges: a NaN, both infinities, in the source and in the first input
    const uint16_t nan = src_dtype == DType::kBF16 ? 0x7FC0 : 0x7E00, inf = src_dtype == DType::kBF16 ? 0x7F80 : 0x7C00;
    src[1] = a[2] = nan;
    src[2] = a[3] = inf;
    src[3] = a[1] = uint16_t(inf | 0x8000);
  }
  const DType fp8 = src_dtype == DType::kF16 ? DType::kE5M2 : DType::kE4M3;
  const auto cfg = make_cfg(r, f, rowwise, true, ScaleMode::kDefault, fp8);
  DevBuf ds(src), da(a), db(b), act(size_t(n) * 2, 0);
  const SourceMatrix sm{ds.p, src_dtype, R, C};
  namespace q = scalemm::quantize;
  switch (kind) {
    case Fused::kGelu: q::apply_activation(sm, nullptr, q::Activation::kGeluTanh, act.p, nullptr); break;
    case Fused::kGeluGrad: q::apply_activation(sm, da.p, q::Activation::kGeluTanh, act.p, nullptr); break;
    case Fused::kSwiglu: q::apply_swiglu(sm, da.p, act.p, nullptr); break;
    case Fused::kSwigluGate: q::apply_swiglu_grad(sm, da.p, db.p, q::SwigluInput::kGate, act.p, nullptr); break;
    case Fused::kSwigluUp: q::apply_swiglu_grad(sm, da.p, nullptr, q::SwigluInput::kUp, act.p, nullptr); break;
  }
  const auto out = [&](DevBuf& d, DevBuf& s, DevBuf& dt, DevBuf& st) {
    return QuantizeOutputs{rowwise ? d.p : nullptr, rowwise ? s.p : nullptr, dt.p, st.p, nullptr};
  };
  const size_t dbytes = size_t(data_bytes(cfg, R, C)), sr = size_t(rowwise_layout(cfg, R, C).bytes()),
               sc = size_t(columnwise_layout(cfg, R, C).bytes());
  DevBuf d0(dbytes, 0xEE), s0(sr, 0xA5), t0(dbytes, 0xEE), u0(sc, 0xA5), d1(dbytes, 0xEE), s1(sr, 0xA5),
      t1(dbytes, 0xEE), u1(sc, 0xA5);
  q::quantize(SourceMatrix{act.p, src_dtype, R, C}, cfg, out(d0, s0, t0, u0), nullptr, 0, nullptr);
  const auto o1 = out(d1, s1, t1, u1);
  switch (kind) {
    case Fused::kGelu: q::quantize_activation(sm, q::Activation::kGeluTanh, cfg, o1, nullptr); break;
    case Fused::kGeluGrad: q::quantize_activation_grad(sm, da.p, q::Activation::kGeluTanh, cfg, o1, nullptr); break;
    case Fused::kSwiglu: q::quantize_swiglu(sm, da.p, cfg, o1, nullptr); break;
    case Fused::kSwigluGate: q::quantize_swiglu_grad(sm, da.p, db.p, q::SwigluInput::kGate, cfg, o1, nullptr); break;
    case Fused::kSwigluUp: q::quantize_swiglu_grad(sm, da.p, nullptr, q::SwigluInput::kUp, cfg, o1, nullptr); break;
  }
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  if (rowwise) {
    expect_same_bytes(d1.download(), d0.download(), 1, "rowwise data", "");
    expect_same_bytes(s1.download(), s0.download(), 1, "rowwise scales", "");
  }
  expect_same_bytes(t1.download(), t0.download(), 1, "columnwise data", "");
  expect_same_bytes(u1.download(), u0.download(), 1, "columnwise scales", "");
}

}  // namespace

TEST_CASE("A fused activation quantizes to the activation written first, then quantized", "[emulation][gpu]") {
  // GELU, SwiGLU and their gradients; M = 1, 7, 129 (partial tiles), K tails (200, and 130: K % 4 = 2,
  // the scalar loads), whole tiles.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 128}, {7, 256}, {129, 200}, {130, 130}, {256, 384}, {300, 1024}};
  for (Fused kind : {Fused::kGelu, Fused::kGeluGrad, Fused::kSwiglu, Fused::kSwigluGate, Fused::kSwigluUp})
    for (const auto& [R, C] : shapes)
      for (Recipe r : {Recipe::kBlock1x128, Recipe::kMxfp8})
        for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
          for (DType sd : {DType::kBF16, DType::kF16})
            for (bool rowwise : {true, false}) {
              INFO(fused_name(kind) << " " << recipe_name(r) << " " << format_name(f) << " src " << to_string(sd) << " "
                                    << R << "x" << C << (rowwise ? " row+col" : " col"));
              check_fused(kind, R, C, r, f, sd, rowwise);
            }
}

TEST_CASE("quantize_activation names what is wrong before anything runs", "[emulation][quantize]") {
  using scalemm::quantize::Activation;
  uint16_t src[256] = {};
  uint8_t data[256], scales[64], data_t[256], scales_t[64];
  const QuantizeOutputs o{data, scales, data_t, scales_t, nullptr};
  const SourceMatrix x{src, DType::kBF16, 2, 128};
  const auto expect = [](auto call, const char* what) { expect_invalid(call, what); };
  const auto ok = make_cfg(Recipe::kBlock1x128, ScaleFormat::kCompact, true, true);
  using scalemm::quantize::quantize_activation;
  using scalemm::quantize::quantize_activation_grad;
  expect([&] { quantize_activation(x, Activation(7), ok, o, nullptr); }, "act");
  expect([&] { quantize_activation(x, Activation::kGeluTanh, make_cfg(Recipe::kTensorwise, ScaleFormat::kCompact, true, true), o, nullptr); },
         "cfg.recipe");
  expect([&] { quantize_activation(SourceMatrix{src, DType::kF32, 2, 128}, Activation::kGeluTanh, ok, o, nullptr); },
         "src.dtype");
  expect([&] { quantize_activation(x, Activation::kGeluTanh, make_cfg(Recipe::kBlock1x128), o, nullptr); },
         "cfg.columnwise");
  expect([&] { quantize_activation_grad(x, nullptr, Activation::kGeluTanh, ok, o, nullptr); }, "input");
  uint16_t act_out[256];
  expect([&] { scalemm::quantize::apply_activation(x, nullptr, Activation(0), act_out, nullptr); }, "act");
  expect([&] { scalemm::quantize::apply_activation(SourceMatrix{src, DType::kF32, 2, 128}, nullptr,
                                                   Activation::kGeluTanh, act_out, nullptr); },
         "src.dtype");
  using scalemm::quantize::SwigluInput;
  expect([&] { scalemm::quantize::quantize_swiglu(x, nullptr, ok, o, nullptr); }, "up");
  expect([&] { scalemm::quantize::quantize_swiglu_grad(x, src, nullptr, SwigluInput::kGate, ok, o, nullptr); }, "up");
  expect([&] { scalemm::quantize::quantize_swiglu_grad(x, nullptr, src, SwigluInput::kUp, ok, o, nullptr); }, "gate");
  expect([&] { scalemm::quantize::quantize_swiglu_grad(x, src, src, SwigluInput(5), ok, o, nullptr); }, "which");
  expect([&] { scalemm::quantize::apply_swiglu(x, nullptr, act_out, nullptr); }, "up");
}
