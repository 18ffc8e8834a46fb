// Host tests of the scale-layout contracts: offsets, padded-grid bijection, conversions, goldens,
// transposes, broadcast, grouped conversion, validation rules and seeded random properties.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/layouts/validate.hpp"
#include "support/test_support.hpp"
#include "layout_test_util.hpp"

using namespace scalemm;
using namespace scalemm::layouts;
using scalemm::layouts::testutil::fill_buffer;
using scalemm::layouts::testutil::kKs;
using scalemm::layouts::testutil::kRows;
using scalemm::layouts::testutil::load_bits;

namespace {

TensorRef flat(void* data, const ScaleLayout& l, MemorySpace space = MemorySpace::kHost) {
  return TensorRef::contiguous(data, l.scale_dtype(), {l.size()}, space);
}

TensorRef view2(void* data, DType t, int64_t s0, int64_t s1, int64_t st0, int64_t st1) {
  TensorRef r;
  r.data = data;
  r.dtype = t;
  r.rank = 2;
  r.shape = {s0, s1, 0, 0};
  r.strides = {st0, st1, 0, 0};
  return r;
}

bool has_rule(const Diagnostics& d, const std::string& rule) {
  for (const auto& x : d)
    if (x.rule == rule) return true;
  return false;
}

// 16-byte aligned host storage.
struct Aligned {
  std::vector<uint8_t> raw;
  uint8_t* p;
  explicit Aligned(size_t n) : raw(n + 32, 0) {
    p = raw.data() + ((16 - reinterpret_cast<uintptr_t>(raw.data()) % 16) % 16);
  }
};

void set_f32(void* p, int64_t i, float v) { std::memcpy(static_cast<uint8_t*>(p) + i * 4, &v, 4); }

}  // namespace

/// Calls fn(layout) for every recipe, both formats, every row count of kRows and every K of kKs.
template <class F>
void for_each_layout(F&& fn) {
  for (Recipe rc : kAllRecipes)
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
      for (int64_t R : kRows)
        for (int64_t K : kKs) {
          const ScaleLayout l(rc, R, K, f);
          CAPTURE(l.to_string());
          fn(l);
        }
}

// ---------------------------------------------------------------------------------------------------
TEST_CASE("the padded grid maps one-to-one onto every buffer, and offset is increasing along K", "[layouts]") {
  for_each_layout([&](const ScaleLayout& l) {
    std::vector<uint8_t> hit(size_t(l.size()), 0);
    int64_t visited = 0;
    for (int64_t p = 0; p < l.padded_rows(); ++p)
      for (int64_t kb = 0; kb < l.padded_kblocks(); ++kb) {
        const int64_t o = l.padded_offset(p, kb);
        REQUIRE(o >= 0);
        REQUIRE(o < l.size());
        REQUIRE(hit[size_t(o)] == 0);
        hit[size_t(o)] = 1;
        ++visited;
        if (kb > 0) REQUIRE(o > l.padded_offset(p, kb - 1));
      }
    REQUIRE(visited == l.size());
    // Every data row reaches the stored row that holds its scale.
    for (int64_t r = 0; r < l.rows; ++r)
      REQUIRE(l.offset(r, 0) == l.padded_offset(r / l.row_step(), 0));
  });
}

// Properties of offset() that the specialised GPU kernels (layouts/cuda/convert.cu) rely on; they take
// bases and strides from offset() and these tests keep them honest.
TEST_CASE("compact buffers and block1x128 / block128x128 buffers are affine in the padded grid", "[layouts][property]") {
  std::vector<int64_t> ks(kKs.begin(), kKs.end());
  ks.push_back(32 * 300 + 16);
  for (Recipe rc : kAllRecipes)
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt}) {
      const bool affine = f == ScaleFormat::kCompact || rc == Recipe::kBlock1x128 || rc == Recipe::kBlock128x128 ||
                          rc == Recipe::kRowwise || rc == Recipe::kTensorwise;
      if (!affine) continue;
      for (int64_t R : kRows)
        for (int64_t K : ks) {
          const ScaleLayout l(rc, R, K, f);
          CAPTURE(l.to_string());
          const int64_t o = l.padded_offset(0, 0), sp = l.padded_offset(1, 0) - o, sc = l.padded_offset(0, 1) - o;
          // Compact buffers are row-major with K-blocks adjacent (the byte kernels read 16 at a time).
          if (f == ScaleFormat::kCompact && l.kblocks() > 1) REQUIRE(sc == 1);
          for (int64_t p = 0; p < l.padded_rows(); ++p)
            for (int64_t c = 0; c < l.padded_kblocks(); ++c) REQUIRE(l.padded_offset(p, c) == o + p * sp + c * sc);
        }
    }
}

TEST_CASE("offset is a row term plus a K-block term in every layout", "[layouts][property]") {
  // offset(r, kb) == offset(r, 0) + offset(0, kb): the quantizer's row kernel takes the row term
  // once per item and adds offset(0, kb) per block.
  std::vector<int64_t> ks(kKs.begin(), kKs.end());
  ks.push_back(32 * 300 + 16);
  for (Recipe rc : kAllRecipes)
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
      for (int64_t R : kRows)
        for (int64_t K : ks) {
          const ScaleLayout l(rc, R, K, f);
          CAPTURE(l.to_string());
          for (int64_t r = 0; r < R; ++r)
            for (int64_t kb = 0; kb < l.kblocks(); ++kb) REQUIRE(l.offset(r, kb) == l.offset(r, 0) + l.offset(0, kb));
        }
}

TEST_CASE("has_padding is true exactly when some buffer position is not a real scale", "[layouts][property]") {
  // scalemm::quantize::quantize clears a scale buffer before the kernels write it only when has_padding().
  for_each_layout([&](const ScaleLayout& l) {
    bool any_pad = false;
    for (int64_t p = 0; p < l.padded_rows(); ++p)
      for (int64_t kb = 0; kb < l.padded_kblocks(); ++kb) any_pad = any_pad || !l.is_real(p, kb);
    REQUIRE(l.has_padding() == any_pad);
  });
}

TEST_CASE("rows 32 apart in one 128-row group are one row32_step apart in every layout", "[layouts][property]") {
  // offset(r + 32 i, kb) == offset(r, kb) + i * row32_step() within an aligned 128-row group: the NVFP4
  // row+col tile kernel locates one scale per lane and steps to the lane's other rows.
  for_each_layout([&](const ScaleLayout& l) {
    const int64_t step = l.row32_step();
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t i = -(r % 128) / 32; r % 128 + 32 * i < 128; ++i) {
        if (r + 32 * i >= l.rows) break;
        for (int64_t kb = 0; kb < l.kblocks(); kb += 3) REQUIRE(l.offset(r + 32 * i, kb) == l.offset(r, kb) + i * step);
      }
  });
}

TEST_CASE("adjacent rows of one 32-row group are one row1_step apart in every layout", "[layouts][property]") {
  // offset(r + 1, kb) == offset(r, kb) + row1_step() when r % 32 < 31: the NVFP4 row+col tile kernel
  // locates the scales of a column pair's first column and steps to the second.
  for_each_layout([&](const ScaleLayout& l) {
    const int64_t step = l.row1_step();
    for (int64_t r = 0; r + 1 < l.rows; ++r) {
      if (r % 32 == 31) continue;
      for (int64_t kb = 0; kb < l.kblocks(); kb += 3) REQUIRE(l.offset(r + 1, kb) == l.offset(r, kb) + step);
    }
  });
}

TEST_CASE("the rows of a 32x32 or 128x128 block read one scale", "[layouts][property]") {
  // The tiled fills compute one word per aligned 32-row group: offset(r, kb) == offset(r - r % 32, kb).
  for (Recipe rc : {Recipe::kMxfp8_32x32, Recipe::kBlock128x128})
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt}) {
      if (rc == Recipe::kMxfp8_32x32 && f == ScaleFormat::kCublasLt) continue;  // replicated buffer: never a fill source
      for (int64_t R : kRows)
        for (int64_t K : kKs) {
          const ScaleLayout l(rc, R, K, f);
          CAPTURE(l.to_string());
          REQUIRE(l.block_rows() % 32 == 0);
          for (int64_t r = 0; r < R; ++r)
            for (int64_t kb = 0; kb < l.kblocks(); ++kb) REQUIRE(l.offset(r, kb) == l.offset(r - r % 32, kb));
        }
    }
}

TEST_CASE("a 128-row strip of a 128x4-tiled buffer is one run of 512-byte tiles, lane-major", "[layouts][property]") {
  // padded_offset(p0 + t + 32j, c0 + 4q + i) == padded_offset(p0, c0) + 512q + 16t + 4j + i for
  // p0 % 128 == 0, c0 % 128 == 0 (the kernels' units), t < 32, j < 4, i < 4.
  std::vector<int64_t> ks(kKs.begin(), kKs.end());
  ks.push_back(32 * 300 + 16);
  ks.push_back(16 * 129);
  for (Recipe rc : {Recipe::kMxfp8, Recipe::kMxfp8_32x32, Recipe::kNvfp4})
    for (int64_t R : kRows)
      for (int64_t K : ks) {
        const ScaleLayout l(rc, R, K, ScaleFormat::kCublasLt);
        CAPTURE(l.to_string());
        REQUIRE(l.row_step() == 1);
        REQUIRE(l.padded_rows() % 128 == 0);
        REQUIRE(l.padded_kblocks() % 4 == 0);
        for (int64_t p = 0; p < l.padded_rows(); ++p)
          for (int64_t c = 0; c < l.padded_kblocks(); ++c) {
            const int64_t x = p % 128, y = c % 128;
            REQUIRE(l.padded_offset(p, c) ==
                    l.padded_offset(p - x, c - y) + 512 * (y / 4) + 16 * (x % 32) + 4 * (x / 32) + y % 4);
          }
      }
}

TEST_CASE("buffer sizes match the cuBLASLt contract formulas", "[layouts]") {
  auto cd = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  auto ru = [&](int64_t a, int64_t b) { return cd(a, b) * b; };
  for (int64_t R : kRows)
    for (int64_t K : kKs) {
      CAPTURE(R, K);
      const auto lt = ScaleFormat::kCublasLt;
      const auto cp = ScaleFormat::kCompact;
      CHECK(ScaleLayout(Recipe::kTensorwise, R, K, lt).size() == 1);
      CHECK(ScaleLayout(Recipe::kRowwise, R, K, lt).size() == R);
      CHECK(ScaleLayout(Recipe::kBlock1x128, R, K, lt).size() == ru(R, 4) * cd(K, 128));
      CHECK(ScaleLayout(Recipe::kBlock1x128, R, K, cp).size() == R * cd(K, 128));
      CHECK(ScaleLayout(Recipe::kBlock128x128, R, K, lt).size() == cd(R, 128) * ru(cd(K, 128), 4));
      CHECK(ScaleLayout(Recipe::kBlock128x128, R, K, cp).size() == cd(R, 128) * cd(K, 128));
      CHECK(ScaleLayout(Recipe::kMxfp8, R, K, lt).size() == ru(R, 128) * ru(cd(K, 32), 4));
      CHECK(ScaleLayout(Recipe::kMxfp8, R, K, cp).size() == R * cd(K, 32));
      CHECK(ScaleLayout(Recipe::kMxfp8_32x32, R, K, lt).size() == ru(R, 128) * ru(cd(K, 32), 4));
      CHECK(ScaleLayout(Recipe::kMxfp8_32x32, R, K, cp).size() == cd(R, 32) * cd(K, 32));
      CHECK(ScaleLayout(Recipe::kNvfp4, R, K, lt).size() == ru(R, 128) * ru(cd(K, 16), 4));
      CHECK(ScaleLayout(Recipe::kNvfp4, R, K, cp).size() == R * cd(K, 16));
    }
}

TEST_CASE("every logical scale lands at offset(), padding is zero and round trips are identities", "[layouts]") {
  auto g = scalemm::testing::rng(0x1a7);
  for (Recipe rc : kAllRecipes)
    for (int64_t R : kRows)
      for (int64_t K : kKs) {
        const ScaleLayout c(rc, R, K, ScaleFormat::kCompact);
        const ScaleLayout l = c.with_format(ScaleFormat::kCublasLt);
        CAPTURE(c.to_string(), l.to_string());
        const std::vector<uint8_t> src = fill_buffer(c, g);
        std::vector<uint8_t> dst(size_t(l.bytes()), 0xCD);  // poison: every byte must be written
        to_cublaslt(c, src.data(), dst.data());
        const int eb = c.scale_bytes();
        for (int64_t r = 0; r < R; ++r)
          for (int64_t kb = 0; kb < c.kblocks(); ++kb)
            REQUIRE(load_bits(dst.data(), l.offset(r, kb), eb) == load_bits(src.data(), c.offset(r, kb), eb));
        const ContentReport rep = check_content(l, dst.data());
        REQUIRE(rep.count[int(ContentRule::kPaddingNonzero)] == 0);
        REQUIRE(rep.count[int(ContentRule::kReplicaMismatch)] == 0);
        std::vector<uint8_t> back(size_t(c.bytes()), 0xCD);
        to_compact(l, dst.data(), back.data());
        REQUIRE(back == src);
        // Vector forms agree.
        REQUIRE(to_cublaslt(c, src.data()) == dst);
        REQUIRE(to_compact(l, dst.data()) == src);
        // Same-format conversion is a copy.
        std::vector<uint8_t> same(dst.size());
        convert(l, dst.data(), l, same.data());
        REQUIRE(same == dst);
      }
}

// ---- goldens: hand-computed buffers, written out literally ------------------------------------------
TEST_CASE("golden: tensorwise and rowwise buffers are the scales themselves", "[layouts][golden]") {
  const float tw[1] = {0.5f};
  float out[1] = {0};
  to_cublaslt(ScaleLayout(Recipe::kTensorwise, 3, 100, ScaleFormat::kCompact), tw, out);
  CHECK(out[0] == 0.5f);
  const float rw[3] = {1.f, 2.f, 3.f};
  float rout[3] = {0, 0, 0};
  to_cublaslt(ScaleLayout(Recipe::kRowwise, 3, 100, ScaleFormat::kCompact), rw, rout);
  CHECK(std::vector<float>(rout, rout + 3) == std::vector<float>{1.f, 2.f, 3.f});
}

TEST_CASE("golden: block1x128 R=3 K=300 is outer-major with rows padded to 4", "[layouts][golden]") {
  const float compact[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};  // rows (1,2,3), (4,5,6), (7,8,9)
  const std::vector<float> expected = {1, 4, 7, 0, 2, 5, 8, 0, 3, 6, 9, 0};
  const ScaleLayout c(Recipe::kBlock1x128, 3, 300, ScaleFormat::kCompact);
  std::vector<float> out(12, -1.f);
  to_cublaslt(c, compact, out.data());
  CHECK(out == expected);
  std::vector<float> back(9, -1.f);
  to_compact(c.with_format(ScaleFormat::kCublasLt), expected.data(), back.data());
  CHECK(back == std::vector<float>(compact, compact + 9));
}

TEST_CASE("golden: block128x128 R=200 K=640 pads the K-block stride from 5 to 8", "[layouts][golden]") {
  const float compact[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<float> expected = {1, 2, 3, 4, 5, 0, 0, 0, 6, 7, 8, 9, 10, 0, 0, 0};
  std::vector<float> out(16, -1.f);
  to_cublaslt(ScaleLayout(Recipe::kBlock128x128, 200, 640, ScaleFormat::kCompact), compact, out.data());
  CHECK(out == expected);
}

namespace {
void check_sparse_golden(const std::vector<uint8_t>& buf, size_t size, const std::map<int, uint8_t>& nonzero) {
  REQUIRE(buf.size() == size);
  for (size_t i = 0; i < buf.size(); ++i) {
    CAPTURE(i);
    auto it = nonzero.find(int(i));
    CHECK(buf[i] == (it == nonzero.end() ? 0 : it->second));
  }
}
}  // namespace

TEST_CASE("golden: mxfp8 R=2 K=160 fills two 128x4 tiles", "[layouts][golden]") {
  const uint8_t compact[10] = {0x70, 0x71, 0x72, 0x73, 0x74, 0x80, 0x81, 0x82, 0x83, 0x84};
  const ScaleLayout c(Recipe::kMxfp8, 2, 160, ScaleFormat::kCompact);
  const auto out = to_cublaslt(c, compact);
  // row 0: s0..3 at 0..3, s4 at 512; row 1: s0..3 at 16..19, s4 at 528
  check_sparse_golden(out, 1024,
                      {{0, 0x70}, {1, 0x71}, {2, 0x72}, {3, 0x73}, {512, 0x74},
                       {16, 0x80}, {17, 0x81}, {18, 0x82}, {19, 0x83}, {528, 0x84}});
}

TEST_CASE("golden: nvfp4 R=1 K=80 puts the fifth scale in the second tile", "[layouts][golden]") {
  const uint8_t compact[5] = {0x38, 0x39, 0x3a, 0x3b, 0x3c};
  const auto out = to_cublaslt(ScaleLayout(Recipe::kNvfp4, 1, 80, ScaleFormat::kCompact), compact);
  check_sparse_golden(out, 1024, {{0, 0x38}, {1, 0x39}, {2, 0x3a}, {3, 0x3b}, {512, 0x3c}});
}

TEST_CASE("golden: mxfp8-32x32 R=33 K=32 replicates each scale to its 32 rows", "[layouts][golden]") {
  const uint8_t compact[2] = {0x81, 0x7c};
  const auto out = to_cublaslt(ScaleLayout(Recipe::kMxfp8_32x32, 33, 32, ScaleFormat::kCompact), compact);
  check_sparse_golden(out, 512,
                      {{0, 0x81},   {16, 0x81},  {32, 0x81},  {48, 0x81},  {64, 0x81},  {80, 0x81},  {96, 0x81},
                       {112, 0x81}, {128, 0x81}, {144, 0x81}, {160, 0x81}, {176, 0x81}, {192, 0x81}, {208, 0x81},
                       {224, 0x81}, {240, 0x81}, {256, 0x81}, {272, 0x81}, {288, 0x81}, {304, 0x81}, {320, 0x81},
                       {336, 0x81}, {352, 0x81}, {368, 0x81}, {384, 0x81}, {400, 0x81}, {416, 0x81}, {432, 0x81},
                       {448, 0x81}, {464, 0x81}, {480, 0x81}, {496, 0x81}, {4, 0x7c}});
}

// ---- transposes -------------------------------------------------------------------------------------
TEST_CASE("block128x128 and mxfp8-32x32 grids transpose exactly in every format", "[layouts][transpose]") {
  auto g = scalemm::testing::rng(0x7a5);
  for (Recipe rc : {Recipe::kBlock128x128, Recipe::kMxfp8_32x32})
    for (int64_t R : {1, 33, 128, 129, 257, 700})
      for (int64_t K : {32, 100, 640, 1000}) {
        const ScaleLayout c(rc, R, K, ScaleFormat::kCompact);
        const ScaleLayout ct = transposed(c, ScaleFormat::kCompact);
        CAPTURE(c.to_string());
        REQUIRE(ct.rows == K);
        REQUIRE(ct.k == R);
        const auto src = fill_buffer(c, g);
        std::vector<uint8_t> t(size_t(ct.bytes()));
        transpose(c, src.data(), ct, t.data());
        // Grid (gr, kb) of W is grid (kb, gr) of W^T (row-major compact grids, indexed directly).
        const int eb = c.scale_bytes();
        for (int64_t gr = 0; gr < c.grid_rows(); ++gr)
          for (int64_t kb = 0; kb < c.kblocks(); ++kb)
            REQUIRE(load_bits(t.data(), kb * ct.kblocks() + gr, eb) == load_bits(src.data(), gr * c.kblocks() + kb, eb));
        std::vector<uint8_t> back(src.size());
        transpose(ct, t.data(), c, back.data());
        REQUIRE(back == src);
        // Transposing straight into the cublaslt format equals transpose-then-convert.
        const ScaleLayout lt = transposed(c, ScaleFormat::kCublasLt);
        std::vector<uint8_t> direct(size_t(lt.bytes())), via(size_t(lt.bytes()));
        transpose(c, src.data(), lt, direct.data());
        to_cublaslt(ct, t.data(), via.data());
        REQUIRE(direct == via);
        // ... and from the cublaslt format too.
        const auto srcl = to_cublaslt(c, src.data());
        std::vector<uint8_t> from_l(t.size());
        transpose(c.with_format(ScaleFormat::kCublasLt), srcl.data(), ct, from_l.data());
        REQUIRE(from_l == t);
      }
  CHECK_THROWS_AS(transposed(ScaleLayout(Recipe::kBlock1x128, 4, 128, ScaleFormat::kCompact), ScaleFormat::kCompact),
                  Error);
}

// ---- block128x128 -> mxfp8 ----------------------------------------------------------------------------
TEST_CASE("block128x128 power-of-two scales broadcast exactly to mxfp8 and the rest are counted", "[layouts][broadcast]") {
  auto g = scalemm::testing::rng(0xb0c);
  for (Recipe target : {Recipe::kMxfp8, Recipe::kMxfp8_32x32})
    for (ScaleFormat tf : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
      for (int64_t R : {1, 129, 300})
        for (int64_t K : {32, 200, 640}) {
          const ScaleLayout b(Recipe::kBlock128x128, R, K, ScaleFormat::kCompact);
          const ScaleLayout m = mxfp8_layout_for(b, target, tf);
          CAPTURE(b.to_string(), m.to_string());
          std::vector<float> s(size_t(b.size()));
          std::uniform_int_distribution<int> e(-127, 127);
          for (auto& v : s) v = std::ldexp(1.0f, e(g));
          std::vector<uint8_t> out(size_t(m.bytes()), 0xCD);
          const BroadcastResult res = broadcast_block128_to_mxfp8(b, s.data(), m, out.data());
          REQUIRE(res.exact());
          REQUIRE(res.diagnostics("scale_b").empty());
          // Check in the compact mxfp8 grid: (r, s32) takes the 128x128 scale of (r/128, s32/4).
          const ScaleLayout mc = m.with_format(ScaleFormat::kCompact);
          const auto compact = tf == ScaleFormat::kCompact ? out : to_compact(m, out.data());
          for (int64_t gr = 0; gr < mc.grid_rows(); ++gr)
            for (int64_t kb = 0; kb < mc.kblocks(); ++kb) {
              const int64_t r = gr * mc.block_rows();
              const float want = s[size_t((r / 128) * b.kblocks() + kb / 4)];
              REQUIRE(compact[size_t(gr * mc.kblocks() + kb)] == uint8_t(std::ilogb(want) + 127));
            }
          if (tf == ScaleFormat::kCublasLt) REQUIRE(check_content(m, out.data()).any == 0);
          // Two inexact scales: counted once each, written as NaN.
          if (s.size() > 1) s.back() = -0.5f;
          s[0] = 3.0f;
          const BroadcastResult bad = broadcast_block128_to_mxfp8(b, s.data(), m, out.data());
          REQUIRE(bad.inexact == (s.size() > 1 ? 2 : 1));
          REQUIRE(bad.first_inexact_index == 0);
          REQUIRE(bad.first_inexact_value == 3.0f);
          REQUIRE(out[size_t(m.offset(0, 0))] == 0xFF);
          REQUIRE(has_rule(bad.diagnostics("scale_b"), "blk128-to-mxfp8-not-power-of-two"));
        }
}

// ---- grouped -----------------------------------------------------------------------------------------
TEST_CASE("grouped conversion pads each group on its own and places it at the summed sizes", "[layouts][grouped]") {
  auto g = scalemm::testing::rng(0x640);
  for (Recipe rc : kAllRecipes) {
    const std::vector<int64_t> offs = {0, 5, 5, 133, 300, 301, 557};  // includes an empty group
    const int G = int(offs.size()) - 1;
    const int64_t K = 640 + 40;
    const auto co = grouped_offsets(rc, K, ScaleFormat::kCompact, offs.data(), G);
    const auto lo = grouped_offsets(rc, K, ScaleFormat::kCublasLt, offs.data(), G);
    CAPTURE(to_string(rc));
    std::vector<uint8_t> src;
    for (int i = 0; i < G; ++i) {
      const auto part = fill_buffer(ScaleLayout(rc, offs[i + 1] - offs[i], K, ScaleFormat::kCompact), g);
      src.insert(src.end(), part.begin(), part.end());
    }
    const int eb = ScaleLayout(rc, 1, K, ScaleFormat::kCompact).scale_bytes();
    REQUIRE(int64_t(src.size()) == co.back() * eb);
    std::vector<uint8_t> dst(size_t(lo.back() * eb), 0xCD);
    convert_grouped(rc, K, offs.data(), G, ScaleFormat::kCompact, src.data(), ScaleFormat::kCublasLt, dst.data());
    for (int i = 0; i < G; ++i) {
      const ScaleLayout c(rc, offs[i + 1] - offs[i], K, ScaleFormat::kCompact);
      const ScaleLayout l = c.with_format(ScaleFormat::kCublasLt);
      REQUIRE(lo[i + 1] - lo[i] == l.size());
      std::vector<uint8_t> one(size_t(l.bytes()));
      to_cublaslt(c, src.data() + co[i] * eb, one.data());
      REQUIRE(std::equal(one.begin(), one.end(), dst.begin() + lo[i] * eb));
    }
    std::vector<uint8_t> back(src.size(), 0xCD);
    convert_grouped(rc, K, offs.data(), G, ScaleFormat::kCublasLt, dst.data(), ScaleFormat::kCompact, back.data());
    REQUIRE(back == src);
  }
}

// ---- validation: known-wrong layouts ----------------------------------------------------------------
TEST_CASE("an unpadded block128x128 leading dimension is rejected as blk128-kblock-stride", "[layouts][validate]") {
  const ScaleLayout l(Recipe::kBlock128x128, 200, 640, ScaleFormat::kCublasLt);
  Aligned buf(64 * 4);
  for (int i = 0; i < 10; ++i) set_f32(buf.p, i, 1.0f);
  const auto d = validate_scale(view2(buf.p, DType::kF32, 2, 5, 5, 1), l, "scale_b");
  REQUIRE(d.size() == 1);
  CHECK(d[0].to_string() ==
        "scale_b: block128x128 in cublaslt format needs its K-block stride padded to a multiple of 4 "
        "(K=640 -> 5 K-blocks -> 8): expected 8, got 5. Convert with layouts::to_cublaslt. [blk128-kblock-stride]");
  // The same unpadded buffer given flat.
  const auto d1 = validate_scale(TensorRef::contiguous(buf.p, DType::kF32, {10}), l, "scale_b");
  REQUIRE(has_rule(d1, rules::kBlk128KBlockStride));
  // Padded: accepted in both the (rows, L4) and PyTorch's (L4, rows):(1, L4) views.
  std::vector<float> padded(16, 0.f);
  Aligned pb(16 * 4);
  for (int r = 0; r < 2; ++r)
    for (int kb = 0; kb < 5; ++kb) set_f32(pb.p, l.offset(r * 128, kb), 1.0f);
  CHECK(validate_scale(view2(pb.p, DType::kF32, 2, 8, 8, 1), l, "scale_b").empty());
  CHECK(validate_scale(view2(pb.p, DType::kF32, 2, 5, 8, 1), l, "scale_b").empty());
  CHECK(validate_scale(view2(pb.p, DType::kF32, 8, 2, 1, 8), l, "scale_b").empty());
  CHECK(validate_scale(flat(pb.p, l), l, "scale_b").empty());
}

TEST_CASE("a K-major block1x128 buffer is rejected as vec128-k-major", "[layouts][validate]") {
  const ScaleLayout l(Recipe::kBlock1x128, 8, 300, ScaleFormat::kCublasLt);
  Aligned buf(24 * 4);
  for (int i = 0; i < 24; ++i) set_f32(buf.p, i, 2.0f);
  const auto d = validate_scale(view2(buf.p, DType::kF32, 8, 3, 3, 1), l, "scale_a");
  REQUIRE(d.size() == 1);
  CHECK(d[0].rule == rules::kVec128KMajor);
  CHECK(d[0].argument == "scale_a");
  CHECK_THAT(d[0].fix, Catch::Contains("to_cublaslt"));
  // PyTorch's (M, L):(1, M) and TE's (L, roundup(M,4)) row-major views are the right layout.
  CHECK(validate_scale(view2(buf.p, DType::kF32, 8, 3, 1, 8), l, "scale_a").empty());
  CHECK(validate_scale(view2(buf.p, DType::kF32, 3, 8, 8, 1), l, "scale_a").empty());
  // The compact layout accepts the row-major grid.
  CHECK(validate_scale(view2(buf.p, DType::kF32, 8, 3, 3, 1), l.with_format(ScaleFormat::kCompact), "scale_a").empty());
}

TEST_CASE("an M-major block128x128 buffer is rejected as blk128-m-major", "[layouts][validate]") {
  const ScaleLayout l(Recipe::kBlock128x128, 256, 1024, ScaleFormat::kCublasLt);  // 2 x 8 grid, L4 = 8
  Aligned buf(16 * 4);
  for (int i = 0; i < 16; ++i) set_f32(buf.p, i, 1.0f);
  CHECK(has_rule(validate_scale(view2(buf.p, DType::kF32, 2, 8, 1, 2), l, "scale_b"), rules::kBlk128MMajor));
  CHECK(has_rule(validate_scale(view2(buf.p, DType::kF32, 8, 2, 2, 1), l, "scale_b"), rules::kBlk128MMajor));
  CHECK(validate_scale(view2(buf.p, DType::kF32, 2, 8, 8, 1), l, "scale_b").empty());
}

TEST_CASE("NaN E8M0 codes, NaN UE4M3 codes and bad fp32 scales are found in host buffers", "[layouts][validate]") {
  {
    const ScaleLayout l(Recipe::kMxfp8, 5, 96, ScaleFormat::kCublasLt);
    Aligned buf(size_t(l.size()));
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t kb = 0; kb < 3; ++kb) buf.p[l.offset(r, kb)] = 127;
    CHECK(validate_scale(flat(buf.p, l), l, "scale_a").empty());
    buf.p[l.offset(3, 2)] = 0xFF;
    const auto d = validate_scale(flat(buf.p, l), l, "scale_a");
    REQUIRE(d.size() == 1);
    CHECK(d[0].rule == rules::kE8M0Nan);
    CHECK_THAT(d[0].message, Catch::Contains("data row 3, K-block 2"));
    buf.p[l.offset(3, 2)] = 127;
    buf.p[l.padded_offset(7, 0)] = 1;  // a padding row
    CHECK(has_rule(validate_scale(flat(buf.p, l), l, "scale_a"), rules::kPaddingNonzero));
  }
  {
    const ScaleLayout l(Recipe::kNvfp4, 2, 64, ScaleFormat::kCompact);
    uint8_t buf[8] = {0x38, 0x38, 0x38, 0x38, 0x38, 0xFF, 0x38, 0x38};
    CHECK(has_rule(validate_scale(flat(buf, l), l, "scale_b"), rules::kUE4M3Nan));
  }
  {
    const ScaleLayout l(Recipe::kBlock1x128, 2, 256, ScaleFormat::kCompact);
    float s[4] = {1.f, 0.f, -2.f, NAN};
    const auto d = validate_scale(flat(s, l), l, "scale_a");
    CHECK(has_rule(d, rules::kF32NonPositive));
    CHECK(has_rule(d, rules::kF32NonFinite));
    s[3] = INFINITY;
    CHECK(has_rule(validate_scale(flat(s, l), l, "scale_a"), rules::kF32NonFinite));
    ValidateOptions o;
    o.check_content = false;
    CHECK(validate_scale(flat(s, l), l, "scale_a", o).empty());
  }
  {
    const ScaleLayout l(Recipe::kMxfp8_32x32, 64, 64, ScaleFormat::kCublasLt);
    const uint8_t compact[4] = {120, 121, 122, 123};
    auto buf = to_cublaslt(l.with_format(ScaleFormat::kCompact), compact);
    Aligned a(buf.size());
    std::memcpy(a.p, buf.data(), buf.size());
    CHECK(validate_scale(flat(a.p, l), l, "scale_b").empty());
    a.p[l.offset(5, 1)] = 99;
    CHECK(has_rule(validate_scale(flat(a.p, l), l, "scale_b"), rules::kReplicaMismatch));
  }
}

TEST_CASE("dtype, element count, shape, alignment, memory space and null pointers are checked", "[layouts][validate]") {
  const ScaleLayout l(Recipe::kMxfp8, 130, 160, ScaleFormat::kCublasLt);  // 256 x 8 = 2048 B
  Aligned buf(size_t(l.size()) + 16);
  CHECK(validate_scale(flat(buf.p, l), l, "scale_a").empty());
  CHECK(validate_scale(TensorRef::contiguous(buf.p, DType::kU8, {l.size()}), l, "scale_a").empty());
  CHECK(has_rule(validate_scale(TensorRef::contiguous(buf.p, DType::kF32, {l.size()}), l, "scale_a"), rules::kDType));
  const auto count = validate_scale(TensorRef::contiguous(buf.p, DType::kE8M0, {130 * 5}), l, "scale_a");
  REQUIRE(has_rule(count, rules::kElementCount));
  CHECK_THAT(count[0].message, Catch::Contains("compact grid"));
  CHECK(has_rule(validate_scale(TensorRef::contiguous(buf.p, DType::kE8M0, {130, 5}), l, "scale_a"), rules::kShape));
  CHECK(validate_scale(TensorRef::contiguous(buf.p, DType::kE8M0, {256, 8}), l, "scale_a").empty());
  CHECK(has_rule(validate_scale(TensorRef::contiguous(buf.p, DType::kE8M0, {2, 256, 4}), l, "scale_a"), rules::kShape));
  CHECK(has_rule(validate_scale(TensorRef::contiguous(buf.p + 4, DType::kE8M0, {l.size()}), l, "scale_a"),
                 rules::kAlignment));
  ValidateOptions dev;
  dev.required_space = MemorySpace::kDevice;
  CHECK(has_rule(validate_scale(flat(buf.p, l), l, "scale_a", dev), rules::kMemorySpace));
  CHECK(has_rule(validate_scale(flat(nullptr, l), l, "scale_a"), rules::kNull));
  TensorRef strided = flat(buf.p, l);
  strided.shape[0] = l.size() / 2;
  strided.strides[0] = 2;
  CHECK(has_rule(validate_scale(strided, l, "scale_a"), rules::kStrides));
  // Compact buffers need no 16-byte alignment unless asked.
  const ScaleLayout c = l.with_format(ScaleFormat::kCompact);
  std::fill(buf.p, buf.p + c.size() + 1, uint8_t(127));
  CHECK(validate_scale(TensorRef::contiguous(buf.p + 1, DType::kE8M0, {130, 5}), c, "scale_a").empty());
  // A tensorwise scale may be a scalar.
  float one = 1.0f;
  TensorRef scalar;
  scalar.data = &one;
  scalar.dtype = DType::kF32;
  ValidateOptions noalign;
  noalign.require_alignment = false;
  CHECK(validate_scale(scalar, ScaleLayout(Recipe::kTensorwise, 7, 64, ScaleFormat::kCublasLt), "scale_a", noalign).empty());
}

TEST_CASE("GEMM-side conditions of each contract are checked", "[layouts][validate]") {
  CHECK(validate_gemm(Recipe::kBlock1x128, Recipe::kBlock128x128, 256, 512, 1024).empty());
  CHECK(has_rule(validate_gemm(Recipe::kTensorwise, Recipe::kTensorwise, 64, 64, 520), rules::kFp8KMultiple16));
  CHECK(has_rule(validate_gemm(Recipe::kNvfp4, Recipe::kNvfp4, 64, 64, 48), rules::kFp4KMultiple32));
  CHECK(has_rule(validate_gemm(Recipe::kBlock1x128, Recipe::kBlock1x128, 130, 64, 256), rules::kVec128Outer4));
  CHECK(has_rule(validate_gemm(Recipe::kBlock1x128, Recipe::kBlock128x128, 128, 130, 256), rules::kBlk128Outer4));
  CHECK(has_rule(validate_gemm(Recipe::kBlock128x128, Recipe::kBlock128x128, 128, 128, 256), rules::kBlk128Both));
  CHECK(has_rule(validate_gemm(Recipe::kMxfp8, Recipe::kNvfp4, 128, 128, 256), rules::kRecipePair));
  CHECK(validate_gemm(Recipe::kMxfp8, Recipe::kMxfp8_32x32, 128, 128, 256).empty());
  CHECK(has_rule(validate_gemm(Recipe::kRowwise, Recipe::kRowwise, 0, 128, 256), rules::kDims));
}

// Found by tests/fuzz/fuzz_layout_validate: the "pad to" hint computed round_up(k, 16) for K near
// INT64_MAX, a signed overflow (UBSan), and printed a negative number.
TEST_CASE("GEMM-side conditions near INT64_MAX name the padding without overflowing", "[layouts][validate]") {
  const int64_t big = INT64_MAX - 2;  // odd: not a multiple of 4, 16 or 32
  for (auto [ra, rb, rule] : {std::tuple{Recipe::kTensorwise, Recipe::kTensorwise, rules::kFp8KMultiple16},
                              std::tuple{Recipe::kNvfp4, Recipe::kNvfp4, rules::kFp4KMultiple32}}) {
    const Diagnostics d = validate_gemm(ra, rb, 64, 64, big);
    REQUIRE(has_rule(d, rule));
    for (const auto& g : d)
      if (g.rule == rule) CHECK(g.fix.find("to a multiple of") != std::string::npos);
  }
  const Diagnostics d = validate_gemm(Recipe::kBlock1x128, Recipe::kBlock128x128, big, big, 256);
  CHECK(has_rule(d, rules::kVec128Outer4));
  CHECK(has_rule(d, rules::kBlk128Outer4));
  for (const auto& g : d) CHECK(g.fix.find('-') == std::string::npos);
  // Ordinary values keep the exact number.
  const Diagnostics small = validate_gemm(Recipe::kTensorwise, Recipe::kTensorwise, 64, 64, 520);
  REQUIRE(has_rule(small, rules::kFp8KMultiple16));
  CHECK(small[0].fix == "Pad K with zero columns to 528.");
}

// Found by tests/fuzz/fuzz_layout_validate (a libFuzzer timeout): with K = 0 the buffer is empty,
// but the content check and the conversions walked every one of the (up to 2^31) empty stored rows.
TEST_CASE("an empty scale buffer of many rows validates and converts at once", "[layouts][validate]") {
  for (Recipe r : kAllRecipes) {
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt}) {
      CAPTURE(to_string(r), to_string(f));
      const ScaleLayout l(r, int64_t(1) << 40, 0, f);
      if (l.size() != 0) continue;  // tensorwise and rowwise keep their scales with K = 0
      uint8_t dummy[16] = {};
      TensorRef t = TensorRef::contiguous(dummy, l.scale_dtype(), {0});
      CHECK(validate_scale(t, l, "scale").empty());
      CHECK(!check_content(l, dummy).any);
      convert(l, dummy, l.with_format(f == ScaleFormat::kCompact ? ScaleFormat::kCublasLt : ScaleFormat::kCompact),
              dummy);
    }
  }
}

// ---- seeded random properties -------------------------------------------------------------------------
TEST_CASE("random shapes: conversions round-trip, keep padding zero and validate clean", "[layouts][property]") {
  const uint32_t seed = scalemm::testing::seed();
  INFO("seed " << seed << " (replay with SCALEMM_TEST_SEED=" << seed << ")");
  auto g = scalemm::testing::rng(0x9a7d);
  std::uniform_int_distribution<int> rrow(1, 700), rk(1, 3000), rrec(0, int(kAllRecipes.size()) - 1);
  for (int it = 0; it < 300; ++it) {
    const Recipe rc = kAllRecipes[size_t(rrec(g))];
    const int64_t R = rrow(g), K = rk(g);
    const ScaleLayout c(rc, R, K, ScaleFormat::kCompact);
    const ScaleLayout l = c.with_format(ScaleFormat::kCublasLt);
    CAPTURE(it, c.to_string());
    auto src = testutil::fill_valid(c, g);
    const auto dst = to_cublaslt(c, src.data());
    REQUIRE(int64_t(dst.size()) == l.bytes());
    REQUIRE(to_compact(l, dst.data()) == src);
    Aligned a(dst.size());
    std::memcpy(a.p, dst.data(), dst.size());
    const auto d = validate_scale(flat(a.p, l), l, "scale");
    INFO(to_string(d));
    REQUIRE(d.empty());
    REQUIRE(validate_scale(flat(src.data(), c), c, "scale").empty());
  }
}
