// The GPU conversion and content-check kernels, run on the CPU emulation (see cuda_runtime.h here),
// must produce exactly what the host conversions produce: every recipe, format pair, shapes with
// partial blocks and padding, misaligned pointers, transposes, broadcast counts, grouped operands.
// This runs everywhere (CTest label "host"); the [gpu] cases in test_layouts_gpu.cu run the same
// kernels on a real device.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/validate.hpp"

using namespace scalemm;
using namespace scalemm::layouts;

namespace {

int g_fails = 0, g_runs = 0;

void check(bool ok, const std::string& what) {
  ++g_runs;
  if (!ok && ++g_fails <= 30) std::printf("FAILED: %s\n", what.c_str());
}

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& g) {
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = uint8_t(g() | 1);
  return v;
}

// A buffer at a chosen phase from 16-byte alignment, followed by poison.
struct Buf {
  std::vector<uint8_t> v;
  size_t shift;
  Buf(size_t n, size_t misalign) : v(n + 64, 0xCD), shift(misalign) {}
  uint8_t* p() { return v.data() + (16 - reinterpret_cast<uintptr_t>(v.data()) % 16) % 16 + shift; }
};

const ScaleFormat kFormats[2] = {ScaleFormat::kCompact, ScaleFormat::kCublasLt};

void relayouts(std::mt19937_64& g) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> sweeps = {
      {{1, 5, 33, 128, 257}, {16, 100, 128, 300, 640, 1000}}, {{300}, {7168 + 16}}};
  for (const auto& [rows, ks] : sweeps)
    for (Recipe rc : kAllRecipes)
      for (int64_t R : rows)
        for (int64_t K : ks)
          for (ScaleFormat ff : kFormats)
            for (ScaleFormat tf : kFormats)
              for (int mis = 0; mis < 2; ++mis) {
                // Misaligned pointers and same-format copies on a subset keep the run short.
                if ((mis && R % 2 == 0) || (ff == tf && R != 33 && R != 300)) continue;
                const ScaleLayout from(rc, R, K, ff), to(rc, R, K, tf);
                auto src = random_bytes(size_t(from.with_format(ScaleFormat::kCompact).bytes()), g);
                if (ff == ScaleFormat::kCublasLt) src = to_cublaslt(from.with_format(ScaleFormat::kCompact), src.data());
                std::vector<uint8_t> want(size_t(to.bytes()));
                convert(from, src.data(), to, want.data());
                const size_t eb = size_t(from.scale_bytes());
                Buf bs(src.size(), mis * eb), bd(want.size(), mis * 3 * eb);
                std::memcpy(bs.p(), src.data(), src.size());
                gpu::convert(from, bs.p(), to, bd.p(), nullptr);
                check(std::memcmp(bd.p(), want.data(), want.size()) == 0 && bd.p()[want.size()] == 0xCD,
                      from.to_string() + " -> " + to.to_string() + (mis ? " (misaligned)" : ""));
              }
}

void transposes(std::mt19937_64& g) {
  for (Recipe rc : {Recipe::kBlock128x128, Recipe::kMxfp8_32x32})
    for (int64_t R : {1, 129, 1000})
      for (int64_t K : {32, 640, 4096 + 32})
        for (ScaleFormat ff : kFormats)
          for (ScaleFormat tf : kFormats) {
            const ScaleLayout from(rc, R, K, ff), to = transposed(from, tf);
            auto src = random_bytes(size_t(from.with_format(ScaleFormat::kCompact).bytes()), g);
            if (ff == ScaleFormat::kCublasLt) src = to_cublaslt(from.with_format(ScaleFormat::kCompact), src.data());
            std::vector<uint8_t> want(size_t(to.bytes())), got(want.size() + 4, 0xCD);
            transpose(from, src.data(), to, want.data());
            gpu::transpose(from, src.data(), to, got.data(), nullptr);
            check(std::memcmp(got.data(), want.data(), want.size()) == 0 && got[want.size()] == 0xCD,
                  "transpose " + from.to_string() + " -> " + to.to_string());
          }
}

void broadcasts(std::mt19937_64& g) {
  for (Recipe target : {Recipe::kMxfp8, Recipe::kMxfp8_32x32})
    for (ScaleFormat tf : kFormats)
      for (auto [R, K] : {std::pair<int64_t, int64_t>{1, 32}, {300, 640}, {300, 7168}}) {
        const ScaleLayout b(Recipe::kBlock128x128, R, K, ScaleFormat::kCompact);
        const ScaleLayout m = mxfp8_layout_for(b, target, tf);
        std::vector<float> s(size_t(b.size()));
        for (auto& v : s) v = std::ldexp(1.0f, int(g() % 60) - 30);
        if (s.size() > 2) s[1] = 0.3f, s.back() = 0.0f;
        std::vector<uint8_t> want(size_t(m.bytes())), got(want.size() + 4, 0xCD);
        const BroadcastResult res = broadcast_block128_to_mxfp8(b, s.data(), m, want.data());
        unsigned long long n = 0;
        gpu::broadcast_block128_to_mxfp8(b, s.data(), m, got.data(), &n, nullptr);
        check(std::memcmp(got.data(), want.data(), want.size()) == 0 && int64_t(n) == res.inexact,
              "broadcast " + m.to_string());
      }
}

void grouped(std::mt19937_64& g) {
  for (Recipe rc : kAllRecipes)
    for (int G : {1, 3, 17, 600}) {  // 600: groups span three windows of 256 (for_each_unit)
      const int64_t max_rows = G > 256 ? 40 : 300;
      std::vector<int64_t> offs(size_t(G) + 1, 0);
      for (int i = 0; i < G; ++i) offs[size_t(i) + 1] = offs[size_t(i)] + int64_t(g() % max_rows) * (g() % 4 == 0 ? 0 : 1);
      const int64_t K = 128 * int64_t(1 + g() % 9) - int64_t(g() % 2) * 40;
      const auto co = grouped_offsets(rc, K, ScaleFormat::kCompact, offs.data(), G);
      const auto lo = grouped_offsets(rc, K, ScaleFormat::kCublasLt, offs.data(), G);
      const int eb = ScaleLayout(rc, 1, K, ScaleFormat::kCompact).scale_bytes();
      auto src = random_bytes(size_t(co.back() * eb), g);
      src.reserve(src.size() + 16);
      std::vector<uint8_t> want(size_t(lo.back() * eb)), got(want.size() + 16, 0xCD), back(src.size() + 16, 0xCD);
      convert_grouped(rc, K, offs.data(), G, ScaleFormat::kCompact, src.data(), ScaleFormat::kCublasLt, want.data());
      gpu::convert_grouped(rc, K, offs.data(), G, offs.back(), ScaleFormat::kCompact, src.data(),
                           ScaleFormat::kCublasLt, got.data(), nullptr);
      const std::string what = std::string(to_string(rc)) + " G=" + std::to_string(G) + " K=" + std::to_string(K);
      // want is empty when every group is: memcmp with its null data() is undefined even for 0 bytes (UBSan).
      check((want.empty() || std::memcmp(got.data(), want.data(), want.size()) == 0) && got[want.size()] == 0xCD,
            "grouped " + what);
      gpu::convert_grouped(rc, K, offs.data(), G, 0, ScaleFormat::kCublasLt, got.data(), ScaleFormat::kCompact,
                           back.data(), nullptr);
      check(src.empty() || std::memcmp(back.data(), src.data(), src.size()) == 0, "grouped back " + what);
    }
}

// The specialised kernels (affine fp32 tiles, 128x4 strips, tiled fills): odd row counts, scale
// counts that are not multiples of 4 or 16, several 128-column chunks, pointers off 16-byte alignment
// on either side, and grouped operands with empty groups.
void special_paths(std::mt19937_64& g) {
  const std::vector<int64_t> rows = {1, 3, 5, 127, 129, 257};
  const std::vector<std::pair<Recipe, std::vector<int64_t>>> cases = {
      {Recipe::kBlock1x128, {128, 128 * 3, 128 * 70, 128 * 129 + 5}},
      {Recipe::kBlock128x128, {128 * 3, 128 * 70, 128 * 129}},
      {Recipe::kMxfp8, {32 * 5, 32 * 130, 32 * 259, 32 * 512}},
      {Recipe::kNvfp4, {16 * 7, 16 * 257, 16 * 512}},
      {Recipe::kMxfp8_32x32, {32 * 5, 32 * 130, 32 * 259}}};
  for (const auto& [rc, ks] : cases)
    for (int64_t R : rows)
      for (int64_t K : ks)
        for (int dir = 0; dir < 2; ++dir)
          for (int mis : {0, 1, 3}) {
            if (mis && R != 5 && R != 129) continue;  // keep the run short
            const ScaleLayout c(rc, R, K, ScaleFormat::kCompact), l = c.with_format(ScaleFormat::kCublasLt);
            const ScaleLayout from = dir ? l : c, to = dir ? c : l;
            auto src = random_bytes(size_t(c.bytes()), g);
            if (dir) src = to_cublaslt(c, src.data());
            std::vector<uint8_t> want(size_t(to.bytes()));
            convert(from, src.data(), to, want.data());
            const size_t eb = size_t(from.scale_bytes());
            Buf bs(src.size(), mis * eb), bd(want.size(), (mis ? 4 - mis : 0) * eb);
            std::memcpy(bs.p(), src.data(), src.size());
            gpu::convert(from, bs.p(), to, bd.p(), nullptr);
            check(std::memcmp(bd.p(), want.data(), want.size()) == 0 && bd.p()[want.size()] == 0xCD,
                  "special " + from.to_string() + " -> " + to.to_string() + " mis " + std::to_string(mis));
          }
  // Transposes of block128x128 (affine tiles) with odd extents.
  for (int64_t R : {1, 129, 257})
    for (int64_t K : {128 * 3, 128 * 70 + 1})
      for (ScaleFormat ff : kFormats)
        for (ScaleFormat tf : kFormats) {
          const ScaleLayout from(Recipe::kBlock128x128, R * 128 - 1, K, ff), to = transposed(from, tf);
          auto src = random_bytes(size_t(from.bytes()), g);
          if (ff == ScaleFormat::kCublasLt) src = to_cublaslt(from.with_format(ScaleFormat::kCompact), src.data());
          std::vector<uint8_t> want(size_t(to.bytes()));
          transpose(from, src.data(), to, want.data());
          Buf bs(src.size(), 4), bd(want.size(), 8);
          std::memcpy(bs.p(), src.data(), src.size());
          gpu::transpose(from, bs.p(), to, bd.p(), nullptr);
          check(std::memcmp(bd.p(), want.data(), want.size()) == 0 && bd.p()[want.size()] == 0xCD,
                "special transpose " + from.to_string() + " -> " + to.to_string());
        }
  // Broadcasts: odd R, S not a multiple of 4, a misaligned destination, inexact scales counted.
  for (Recipe target : {Recipe::kMxfp8, Recipe::kMxfp8_32x32})
    for (int64_t R : {3, 129, 257})
      for (int64_t K : {32 * 5, 32 * 259})
        for (int mis : {0, 5}) {
          const ScaleLayout b(Recipe::kBlock128x128, R, K, ScaleFormat::kCompact);
          const ScaleLayout m = mxfp8_layout_for(b, target, ScaleFormat::kCublasLt);
          std::vector<float> s(size_t(b.size()));
          for (auto& v : s) v = g() % 5 == 0 ? 0.75f : std::ldexp(1.0f, int(g() % 60) - 30);
          std::vector<uint8_t> want(size_t(m.bytes()));
          const BroadcastResult res = broadcast_block128_to_mxfp8(b, s.data(), m, want.data());
          Buf bd(want.size(), size_t(mis));
          unsigned long long n = 0;
          gpu::broadcast_block128_to_mxfp8(b, s.data(), m, bd.p(), &n, nullptr);
          check(std::memcmp(bd.p(), want.data(), want.size()) == 0 && bd.p()[want.size()] == 0xCD &&
                    int64_t(n) == res.inexact,
                "special broadcast " + m.to_string() + " mis " + std::to_string(mis));
        }
  // Grouped: empty groups first, in the middle and last; odd sizes; both directions.
  const std::vector<int64_t> offs = {0, 0, 129, 129, 130, 387, 392, 392};
  const int G = int(offs.size()) - 1;
  for (Recipe rc : kAllRecipes)
    for (int64_t K : {int64_t(128 * 3), int64_t(32 * 130), int64_t(16 * 259)}) {
      const auto co = grouped_offsets(rc, K, ScaleFormat::kCompact, offs.data(), G);
      const auto lo = grouped_offsets(rc, K, ScaleFormat::kCublasLt, offs.data(), G);
      const int eb = ScaleLayout(rc, 1, K, ScaleFormat::kCompact).scale_bytes();
      const auto src = random_bytes(size_t(co.back() * eb), g);
      std::vector<uint8_t> want(size_t(lo.back() * eb));
      convert_grouped(rc, K, offs.data(), G, ScaleFormat::kCompact, src.data(), ScaleFormat::kCublasLt, want.data());
      Buf bs(src.size(), size_t(eb)), bd(want.size(), 0), back(src.size(), 3 * size_t(eb));
      std::memcpy(bs.p(), src.data(), src.size());
      gpu::convert_grouped(rc, K, offs.data(), G, offs.back(), ScaleFormat::kCompact, bs.p(), ScaleFormat::kCublasLt,
                           bd.p(), nullptr);
      const std::string what = std::string(to_string(rc)) + " K=" + std::to_string(K);
      check(std::memcmp(bd.p(), want.data(), want.size()) == 0 && bd.p()[want.size()] == 0xCD,
            "special grouped " + what);
      gpu::convert_grouped(rc, K, offs.data(), G, 0, ScaleFormat::kCublasLt, bd.p(), ScaleFormat::kCompact,
                           back.p(), nullptr);
      check(std::memcmp(back.p(), src.data(), src.size()) == 0 && back.p()[src.size()] == 0xCD,
            "special grouped back " + what);
    }
}

void contents(std::mt19937_64& g) {
  for (Recipe rc : kAllRecipes)
    for (ScaleFormat f : kFormats) {
      const ScaleLayout c(rc, 257, 1000, ScaleFormat::kCompact), l = c.with_format(f);
      auto buf = random_bytes(size_t(c.bytes()), g);
      if (f == ScaleFormat::kCublasLt) buf = to_cublaslt(c, buf.data());
      if (l.scale_bytes() == 1) buf[size_t(l.offset(5, 0))] = 0xFF;
      if (l.size() > l.logical_size() && f == ScaleFormat::kCublasLt && rc != Recipe::kMxfp8_32x32)
        buf[size_t(l.padded_offset(l.padded_rows() - 1, l.padded_kblocks() - 1) * l.scale_bytes())] = 1;
      const ContentReport want = check_content(l, buf.data());
      ContentReport got;
      gpu::check_content_async(l, buf.data(), &got, nullptr);
      bool ok = got.any == want.any;
      for (int i = 0; i < kContentRuleCount; ++i)
        ok = ok && got.count[i] == want.count[i] && got.first_offset[i] == want.first_offset[i];
      check(ok, "content check " + l.to_string());
    }
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  uint32_t seed = std::random_device{}();
  if (const char* s = std::getenv("SCALEMM_TEST_SEED")) seed = uint32_t(std::strtoul(s, nullptr, 10));
  std::printf("layouts kernels on the CPU emulator: seed %u (replay with SCALEMM_TEST_SEED=%u)\n", seed, seed);
  std::mt19937_64 g(seed);
  relayouts(g);
  transposes(g);
  broadcasts(g);
  grouped(g);
  special_paths(g);
  contents(g);
  std::printf("%d checks, %d failed\n", g_runs, g_fails);
  return g_fails == 0 ? 0 : 1;
}
