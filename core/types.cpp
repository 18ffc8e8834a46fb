#include "scalemm/types.hpp"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "scalemm/status.hpp"

namespace scalemm {
namespace {

struct Name {
  std::string_view text;
  int value;
};

// Canonical spelling first for each value; aliases after it.
constexpr Name kDTypeNames[] = {
    {"f32", 0},   {"fp32", 0},  {"float32", 0},       {"f16", 1},          {"fp16", 1},
    {"float16", 1}, {"bf16", 2}, {"bfloat16", 2},     {"e4m3", 3},         {"float8_e4m3fn", 3},
    {"e4m3fn", 3}, {"e5m2", 4},  {"float8_e5m2", 4},  {"e2m1", 5},         {"float4_e2m1fn", 5},
    {"fp4", 5},   {"e8m0", 6},  {"float8_e8m0fnu", 6}, {"ue8m0", 6},        {"ue4m3", 7},
    {"u8", 8},    {"uint8", 8},
};
constexpr Name kRecipeNames[] = {
    {"tensorwise", 1},  {"rowwise", 2},      {"block1x128", 3},  {"blockwise1x128", 3},
    {"block128x128", 4}, {"blockwise128x128", 4}, {"mxfp8", 5}, {"mxfp8-1x32", 5},
    {"mxfp8-32x32", 6}, {"nvfp4", 7},
};
constexpr Name kScaleFormatNames[] = {{"compact", 0}, {"cublaslt", 1}, {"cublasLt", 1}};
constexpr Name kMemorySpaceNames[] = {{"host", 0}, {"device", 1}};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

template <size_t N>
std::string_view name_of(const Name (&table)[N], int value) {
  for (const auto& n : table)
    if (n.value == value) return n.text;
  return "unknown";
}

template <size_t N>
std::optional<int> value_of(const Name (&table)[N], std::string_view s) {
  const std::string l = lower(s);
  for (const auto& n : table)
    if (lower(n.text) == l) return n.value;
  return std::nullopt;
}

template <size_t N>
std::string canonical_names(const Name (&table)[N]) {
  std::string out;
  int last = -1;
  for (const auto& n : table) {
    if (n.value == last) continue;
    last = n.value;
    if (!out.empty()) out += ", ";
    out += n.text;
  }
  return out;
}

[[noreturn]] void throw_unknown(std::string_view what, std::string_view s, std::string_view argument,
                                const std::string& accepted) {
  throw Error(StatusCode::kInvalidArgument, std::string(argument) + ": unknown " + std::string(what) +
                                                " '" + std::string(s) + "'; expected one of: " + accepted);
}

}  // namespace

std::string_view to_string(DType t) { return name_of(kDTypeNames, static_cast<int>(t)); }
std::string_view to_string(Recipe r) { return name_of(kRecipeNames, static_cast<int>(r)); }
std::string_view to_string(ScaleFormat f) { return name_of(kScaleFormatNames, static_cast<int>(f)); }
std::string_view to_string(MemorySpace m) { return name_of(kMemorySpaceNames, static_cast<int>(m)); }

std::optional<DType> parse_dtype(std::string_view s) {
  auto v = value_of(kDTypeNames, s);
  return v ? std::optional<DType>(static_cast<DType>(*v)) : std::nullopt;
}
std::optional<Recipe> parse_recipe(std::string_view s) {
  auto v = value_of(kRecipeNames, s);
  return v ? std::optional<Recipe>(static_cast<Recipe>(*v)) : std::nullopt;
}
std::optional<ScaleFormat> parse_scale_format(std::string_view s) {
  auto v = value_of(kScaleFormatNames, s);
  return v ? std::optional<ScaleFormat>(static_cast<ScaleFormat>(*v)) : std::nullopt;
}
std::optional<MemorySpace> parse_memory_space(std::string_view s) {
  auto v = value_of(kMemorySpaceNames, s);
  return v ? std::optional<MemorySpace>(static_cast<MemorySpace>(*v)) : std::nullopt;
}

std::string all_dtype_names() { return canonical_names(kDTypeNames); }
std::string all_recipe_names() { return canonical_names(kRecipeNames); }

DType parse_dtype_or_throw(std::string_view s, std::string_view argument) {
  if (auto v = parse_dtype(s)) return *v;
  throw_unknown("dtype", s, argument, all_dtype_names());
}
Recipe parse_recipe_or_throw(std::string_view s, std::string_view argument) {
  if (auto v = parse_recipe(s)) return *v;
  throw_unknown("recipe", s, argument, all_recipe_names());
}
ScaleFormat parse_scale_format_or_throw(std::string_view s, std::string_view argument) {
  if (auto v = parse_scale_format(s)) return *v;
  throw_unknown("scale format", s, argument, canonical_names(kScaleFormatNames));
}

TensorRef TensorRef::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                MemorySpace space) {
  SCALEMM_EXPECTS(shape.size() <= static_cast<size_t>(kMaxRank), StatusCode::kInvalidArgument,
                  "TensorRef::contiguous: rank " + std::to_string(shape.size()) + " exceeds " +
                      std::to_string(kMaxRank));
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.space = space;
  t.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t e : shape) {
    SCALEMM_EXPECTS(e >= 0, StatusCode::kInvalidArgument,
                    "TensorRef::contiguous: negative extent " + std::to_string(e));
    t.shape[i++] = e;
  }
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

int64_t TensorRef::span_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < rank; ++d) last += (shape[d] - 1) * strides[d];
  return dtype_storage_bytes(dtype, last + 1);
}

bool TensorRef::is_contiguous() const {
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

std::string TensorRef::shape_string() const {
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < rank; ++d) os << (d ? ", " : "") << shape[d];
  os << ']';
  return os.str();
}

std::string TensorRef::to_string() const {
  std::ostringstream os;
  os << scalemm::to_string(dtype) << shape_string() << " strides (";
  for (int d = 0; d < rank; ++d) os << (d ? ", " : "") << strides[d];
  os << ") on " << scalemm::to_string(space) << " @" << data;
  return os.str();
}

}  // namespace scalemm
