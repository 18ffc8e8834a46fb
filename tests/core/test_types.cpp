#include <catch2/catch.hpp>

#include "scalemm/scalemm.hpp"

using namespace scalemm;

TEST_CASE("every dtype, recipe and scale format round-trips through its canonical name", "[core]") {
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto t = static_cast<DType>(i);
    CAPTURE(i);
    REQUIRE(parse_dtype(to_string(t)) == t);
  }
  for (Recipe r : kAllRecipes) REQUIRE(parse_recipe(to_string(r)) == r);
  REQUIRE(parse_scale_format("compact") == ScaleFormat::kCompact);
  REQUIRE(parse_scale_format("cublaslt") == ScaleFormat::kCublasLt);
  REQUIRE(parse_memory_space("device") == MemorySpace::kDevice);
}

TEST_CASE("recipe names are exactly the documented spellings", "[core]") {
  CHECK(to_string(Recipe::kTensorwise) == "tensorwise");
  CHECK(to_string(Recipe::kRowwise) == "rowwise");
  CHECK(to_string(Recipe::kBlock1x128) == "block1x128");
  CHECK(to_string(Recipe::kBlock128x128) == "block128x128");
  CHECK(to_string(Recipe::kMxfp8) == "mxfp8");
  CHECK(to_string(Recipe::kMxfp8_32x32) == "mxfp8-32x32");
  CHECK(to_string(Recipe::kNvfp4) == "nvfp4");
  CHECK(all_recipe_names() == "tensorwise, rowwise, block1x128, block128x128, mxfp8, mxfp8-32x32, nvfp4");
}

TEST_CASE("parsers accept aliases case-insensitively and reject everything else", "[core]") {
  CHECK(parse_dtype("FP32") == DType::kF32);
  CHECK(parse_dtype("float8_e4m3fn") == DType::kE4M3);
  CHECK(parse_dtype("float8_e8m0fnu") == DType::kE8M0);
  CHECK(parse_recipe("MXFP8") == Recipe::kMxfp8);
  CHECK_FALSE(parse_dtype("e4m4").has_value());
  CHECK_FALSE(parse_recipe("").has_value());
  CHECK_FALSE(parse_recipe("block64x64").has_value());
  CHECK_FALSE(parse_scale_format("swizzled").has_value());
}

TEST_CASE("a bad name raises an invalid-argument error that names the argument and the choices", "[core]") {
  try {
    parse_recipe_or_throw("mxfp9", "--recipe");
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kInvalidArgument);
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("--recipe"));
    CHECK_THAT(what, Catch::Contains("'mxfp9'"));
    CHECK_THAT(what, Catch::Contains("mxfp8-32x32"));
  }
}

TEST_CASE("status codes have stable names and errors carry them", "[core]") {
  CHECK(std::string(status_code_name(StatusCode::kInvalidLayout)) == "SCALEMM_STATUS_INVALID_LAYOUT");
  CHECK(std::string(status_code_name(static_cast<StatusCode>(123))) == "SCALEMM_STATUS_UNKNOWN");
  Error e(StatusCode::kUnsupported, "mxfp8 needs sm_100");
  CHECK(e.status().code == StatusCode::kUnsupported);
  CHECK(std::string(e.what()) == "SCALEMM_STATUS_UNSUPPORTED: mxfp8 needs sm_100");
}

TEST_CASE("a diagnostic prints argument, rule, expected, actual and fix", "[core]") {
  Diagnostic d{"scale_b", "blk128-kblock-stride",
               "block128x128 in cublaslt format needs its K-block stride padded to a multiple of 4 "
               "(K=640 -> 5 K-blocks -> 8)",
               "8", "5", "Convert with layouts::to_cublaslt."};
  CHECK(d.to_string() ==
        "scale_b: block128x128 in cublaslt format needs its K-block stride padded to a multiple of 4 "
        "(K=640 -> 5 K-blocks -> 8): expected 8, got 5. Convert with layouts::to_cublaslt. "
        "[blk128-kblock-stride]");
  CHECK_NOTHROW(throw_if_any({}));
  CHECK_THROWS_AS(throw_if_any({d}), Error);
}

TEST_CASE("tensor references know their size, span and contiguity", "[core]") {
  auto t = TensorRef::contiguous(nullptr, DType::kE4M3, {7, 129});
  CHECK(t.numel() == 7 * 129);
  CHECK(t.span_bytes() == 7 * 129);
  CHECK(t.is_contiguous());
  CHECK(t.shape_string() == "[7, 129]");
  auto fp4 = TensorRef::contiguous(nullptr, DType::kE2M1, {3, 32});
  CHECK(fp4.span_bytes() == 48);
  auto tr = t;
  std::swap(tr.shape[0], tr.shape[1]);
  std::swap(tr.strides[0], tr.strides[1]);
  CHECK_FALSE(tr.is_contiguous());
  CHECK(tr.span_bytes() == 7 * 129);
  CHECK_THROWS_AS(TensorRef::contiguous(nullptr, DType::kF32, {1, 2, 3, 4, 5}), Error);
  CHECK_THROWS_AS(TensorRef::contiguous(nullptr, DType::kF32, {-1}), Error);
}
