#include "cli_io.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "scalemm/io/output_file.hpp"
#include "scalemm/layouts/validate.hpp"

namespace scalemm::cli {

std::optional<DType> npy_dtype(const std::string& descr) {
  if (descr == "<f4") return DType::kF32;
  if (descr == "<f2") return DType::kF16;
  if (descr == "|u1" || descr == "<u1") return DType::kU8;
  return std::nullopt;
}

LoadedScales load_scales(const io::NpyArray& array, const layouts::ScaleLayout& layout, std::string_view argument,
                         bool check_content, std::string_view file) {
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
  // A conversion is a fix only when the file is a valid buffer of the other format: a wrong-size
  // buffer fits neither, and `layout convert` would refuse it in turn.
  layouts::ValidateOptions shape_only = opt;
  shape_only.check_content = false;
  const layouts::ScaleLayout other = layout.with_format(
      layout.format == ScaleFormat::kCompact ? ScaleFormat::kCublasLt : ScaleFormat::kCompact);
  if (!v.empty() && !layouts::validate_scale(t, other, argument, shape_only).empty())
    for (auto& d : out.diagnostics)
      if (d.fix.find("layouts::to_") != std::string::npos)
        d.fix = "The file holds " + std::to_string(array.numel()) + " elements, a valid buffer of neither format (" +
                std::to_string(layout.with_format(ScaleFormat::kCompact).size()) + " compact, " +
                std::to_string(layout.with_format(ScaleFormat::kCublasLt).size()) +
                " cublaslt): check the recipe, the operand's rows and K, and that the file holds this operand's "
                "scales (`scalemm layout explain --recipe " + std::string(to_string(layout.recipe)) + " --rows " +
                std::to_string(layout.rows) + " --cols " + std::to_string(layout.k) + "` prints both formats' shapes).";
  cli_fix_lines(out.diagnostics, layout, file);
  if (!out.diagnostics.empty()) return out;
  out.buffer.assign(size_t(layout.bytes()), 0);
  std::memcpy(out.buffer.data(), array.data.data(), std::min(out.buffer.size(), array.data.size()));
  return out;
}

void cli_fix_lines(Diagnostics& diags, const layouts::ScaleLayout& layout, std::string_view file) {
  const std::string in = file.empty() ? std::string("SCALES.npy") : std::string(file);
  const bool npy = in.size() > 4 && in.compare(in.size() - 4, 4, ".npy") == 0;
  const std::string stem = npy ? in.substr(0, in.size() - 4) : in;
  auto command = [&](const char* from, const char* to) {
    return "`scalemm layout convert --recipe " + std::string(to_string(layout.recipe)) + " --rows " +
           std::to_string(layout.rows) + " --cols " + std::to_string(layout.k) + " --from " + from + " --to " + to +
           " --in " + in + " --out " + stem + "-" + to + ".npy`";
  };
  // The C++ functions a fix line may name, and the CLI command that does the same.
  const std::pair<std::string, std::string> known[] = {
      {"layouts::to_cublaslt", command("compact", "cublaslt")},
      {"layouts::to_compact", command("cublaslt", "compact")},
  };
  for (auto& d : diags) {
    for (const auto& [cxx, cli] : known) {
      const size_t at = d.fix.find(cxx);
      if (at == std::string::npos) continue;
      d.fix.replace(at, cxx.size(), cli + " (in C++: " + cxx + ")");
      break;
    }
  }
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
  constexpr int64_t kMaxElements = int64_t(1) << 30;
  if (l.rows > kMaxExtent || l.k > kMaxExtent)
    throw Error(StatusCode::kInvalidArgument, "--rows and --cols must be at most 2^31");
  const auto compact = l.with_format(ScaleFormat::kCompact), lt = l.with_format(ScaleFormat::kCublasLt);
  if (std::max(compact.size(), lt.size()) > kMaxElements || l.rows * std::max<int64_t>(l.kblocks(), 1) > kMaxElements)
    throw Error(StatusCode::kInvalidArgument,
                "a scale buffer of more than 2^30 elements is too large for the CLI (" + l.to_string() + ")");
}

CLI::Validator whole_number(int64_t min, int64_t max, const std::string& meaning) {
  auto bound = [](int64_t v) { return v == kMaxExtent ? std::string("2^31") : std::to_string(v); };
  const std::string want = "expected a whole number from " + bound(min) + " to " + bound(max) + " (" + meaning + ")";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const char* s = text.c_str();
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s, &end, 10);
        if (text.empty() || end == s || *end != '\0')
          return want + ", got '" + text + "' (not a whole number)";
        if (errno == ERANGE || v < min || v > max) return want + ", got " + text;
        return "";
      },
      "INT in [" + bound(min) + ", " + bound(max) + "]", "whole_number");
}

CLI::Validator positive_finite(const std::string& meaning) {
  const std::string want = "expected a positive finite number (" + meaning + ")";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const char* s = text.c_str();
        char* end = nullptr;
        errno = 0;
        const float v = std::strtof(s, &end);
        if (text.empty() || end == s || *end != '\0') return want + ", got '" + text + "' (not a number)";
        if (errno == ERANGE && std::isinf(v)) return want + ", got " + text + " (beyond float32's range)";
        if (errno == ERANGE && v == 0.0f) return want + ", got " + text + " (0 in float32)";
        if (!(v > 0.0f) || !std::isfinite(v)) return want + ", got " + text;
        return "";
      },
      "FLOAT > 0", "positive_finite");
}

io::NpyArray read_npy_option(const std::string& path, std::string_view option) {
  try {
    return io::read_npy(path);
  } catch (const Error& e) {
    if (e.code() != StatusCode::kIoError) throw;
    const std::string opt(option),& what = e.status().message;
    const std::string fix = what.find("cannot open") != std::string::npos ? "Check the path given to " + opt
                            : what.find("more than fits in memory") != std::string::npos
                                ? "Check that " + opt + " names the intended file, or run where more memory is free"
                                : "The file given to " + opt +
                                      " must be a complete, little-endian, C-order .npy file (numpy.save writes one)";
    throw Error(StatusCode::kIoError, opt + ": " + what + ". " + fix + " [npy-file]");
  }
}

void check_output_path(const std::string& path, const char* option, const std::vector<std::string>& inputs) {
  (void)io::check_output(path, option, inputs);
}

/// --group-sizes: "3,0,5" or a 1-D .npy of int32/int64.
std::vector<int64_t> parse_group_sizes(const std::string& s) {
  std::vector<int64_t> out;
  if (s.size() > 4 && s.compare(s.size() - 4, 4, ".npy") == 0) {
    const io::NpyArray arr = read_npy_option(s, "--group-sizes");
    if (arr.shape.size() != 1 || (arr.descr != "<i4" && arr.descr != "<i8"))
      throw Error(StatusCode::kInvalidArgument, "--group-sizes: " + s + " must be a 1-D int32 or int64 array, got " +
                                                    arr.describe());
    for (int64_t i = 0; i < arr.shape[0]; ++i)
      out.push_back(arr.descr == "<i4" ? int64_t(arr.as<int32_t>()[i]) : arr.as<int64_t>()[i]);
    return out;
  }
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, comma - at);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw Error(StatusCode::kInvalidArgument, "--group-sizes: expected whole numbers separated by commas (e.g. "
                                                "3,0,5) or a .npy of int32/int64, got '" + s + "'");
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

}  // namespace scalemm::cli
