#include "cli_io.hpp"

#include <algorithm>
#include <cstring>

#include "scalemm/layouts/validate.hpp"

namespace scalemm::cli {

std::optional<DType> npy_dtype(const std::string& descr) {
  if (descr == "<f4") return DType::kF32;
  if (descr == "<f2") return DType::kF16;
  if (descr == "|u1" || descr == "<u1") return DType::kU8;
  return std::nullopt;
}

LoadedScales load_scales(const io::NpyArray& array, const layouts::ScaleLayout& layout, std::string_view argument,
                         bool check_content) {
  LoadedScales out;
  const DType want = layout.scale_dtype();
  const std::string name = std::string(to_string(layout.recipe)) + " in " + std::string(to_string(layout.format)) +
                           " format";
  if (array.shape.size() > size_t(TensorRef::kMaxRank)) {
    out.diagnostics.push_back({std::string(argument), layouts::rules::kShape,
                               name + " is a rank-1 or rank-2 tensor", "rank 1 or 2",
                               "rank " + std::to_string(array.shape.size()), "Reshape the scale tensor."});
    return out;
  }
  const std::optional<DType> given = npy_dtype(array.descr);
  if (!given) {
    out.diagnostics.push_back({std::string(argument), layouts::rules::kDType,
                               name + " holds " + std::string(to_string(want)) + " scales",
                               std::string(to_string(want)) + (layout.scale_bytes() == 1 ? " (stored as uint8)" : " (float32)"),
                               io::npy_type_name(array.descr),
                               want == DType::kF32 ? "Save the scales as float32."
                                                   : "Save the raw scale bytes as uint8."});
  }
  static const uint8_t dummy[16] = {};
  TensorRef t;
  t.data = array.data.empty() ? const_cast<uint8_t*>(dummy) : const_cast<uint8_t*>(array.data.data());
  t.dtype = given ? *given : want;
  t.rank = int(array.shape.size());
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[size_t(i)] = array.shape[size_t(i)];
    t.strides[size_t(i)] = stride;
    stride *= std::max<int64_t>(array.shape[size_t(i)], 1);
  }
  t.space = MemorySpace::kHost;
  layouts::ValidateOptions opt;
  opt.check_content = check_content && given.has_value();
  opt.require_alignment = false;  // a file has no address; the CLI copies into aligned memory
  const Diagnostics v = layouts::validate_scale(t, layout, argument, opt);
  out.diagnostics.insert(out.diagnostics.end(), v.begin(), v.end());
  if (!out.diagnostics.empty()) return out;
  out.buffer.assign(size_t(layout.bytes()), 0);
  std::memcpy(out.buffer.data(), array.data.data(), std::min(out.buffer.size(), array.data.size()));
  return out;
}

void print_diagnostics(std::FILE* f, const Diagnostics& diags) {
  for (const auto& d : diags) {
    std::fprintf(f, "  [%s] %s: %s\n", d.rule.c_str(), d.argument.c_str(), d.message.c_str());
    std::fprintf(f, "      expected: %s\n", d.expected.c_str());
    std::fprintf(f, "      actual:   %s\n", d.actual.c_str());
    if (!d.fix.empty()) std::fprintf(f, "      fix:      %s\n", d.fix.c_str());
  }
}

nlohmann::json diagnostics_json(const Diagnostics& diags) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& d : diags)
    a.push_back({{"argument", d.argument},
                 {"rule", d.rule},
                 {"message", d.message},
                 {"expected", d.expected},
                 {"actual", d.actual},
                 {"fix", d.fix}});
  return a;
}

void check_layout_extent(const layouts::ScaleLayout& l) {
  constexpr int64_t kMaxExtent = int64_t(1) << 31;
  constexpr int64_t kMaxElements = int64_t(1) << 30;
  if (l.rows > kMaxExtent || l.k > kMaxExtent)
    throw Error(StatusCode::kInvalidArgument, "--rows and --cols must be at most 2^31");
  const auto compact = l.with_format(ScaleFormat::kCompact), lt = l.with_format(ScaleFormat::kCublasLt);
  if (std::max(compact.size(), lt.size()) > kMaxElements || l.rows * std::max<int64_t>(l.kblocks(), 1) > kMaxElements)
    throw Error(StatusCode::kInvalidArgument,
                "a scale buffer of more than 2^30 elements is too large for the CLI (" + l.to_string() + ")");
}

}  // namespace scalemm::cli
