// Shared helpers of the CLI subcommands: .npy scale files as TensorRefs checked by the layout
// contract, diagnostics printing, and size limits that keep bad arguments from exhausting memory.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scalemm/io/npy.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"

namespace scalemm::cli {

/// io::read_npy with its errors naming the option the file was given to: "--scale-b: sb.npy: truncated
/// header. The file given to --scale-b must be a complete .npy file (numpy.save writes one) [npy-file]".
/// Same status (kIoError) as read_npy.
io::NpyArray read_npy_option(const std::string& path, std::string_view option);

/// The scalemm DType a .npy type string stands for: "<f4" f32, "<f2" f16, "|u1" u8 (raw bytes of
/// FP8/FP4/E8M0/UE4M3). nullopt for every other type.
std::optional<DType> npy_dtype(const std::string& descr);

/// A scale file checked against its layout. `buffer` holds layout.bytes() bytes (the file's bytes,
/// then zeros for the trailing padding a shorter accepted view leaves out) when `diagnostics` is empty.
struct LoadedScales {
  Diagnostics diagnostics;
  std::vector<uint8_t> buffer;
};

/// Puts the array's shape and dtype into a TensorRef and runs layouts::validate_scale (content rules
/// included when `check_content`). Types that have no scalemm DType are reported under the same
/// rule (scale-dtype) and skip the content check.
/// `file` (the scale file's path, when known) goes into the CLI command of a fix line.
LoadedScales load_scales(const io::NpyArray& array, const layouts::ScaleLayout& layout, std::string_view argument,
                         bool check_content = true, std::string_view file = {});

/// Fix lines come from the library and name its C++ functions ("Convert with layouts::to_cublaslt.");
/// a CLI user needs the command. Rewrites each known function name into the `scalemm` command that
/// does the same for `layout`'s scales (read from `file`), followed by the C++ name.
void cli_fix_lines(Diagnostics& diags, const layouts::ScaleLayout& layout, std::string_view file);

/// Prints diagnostics, one block each: rule and message, then expected, actual and fix lines.
void print_diagnostics(std::FILE* f, const Diagnostics& diags);
nlohmann::json diagnostics_json(const Diagnostics& diags);

/// Throws Error(kInvalidArgument) (a usage error) when a layout of these extents is too large for
/// the CLI to describe, check or convert in memory.
void check_layout_extent(const layouts::ScaleLayout& l);

/// A CLI11 check of a whole-number option in [min, max]; `meaning` says what the value is. Errors
/// read "--k: expected a whole number from 1 to 2^31 (the reduction length K), got 0" instead of
/// CLI11's "Value 0 not in range 0.000000 to 1.79769e+308", and text is "not a number", never "out of range".
CLI::Validator whole_number(int64_t min, int64_t max, const std::string& meaning);

/// A CLI11 check of a float option that must be positive and finite (0, negative, NaN, inf and values
/// beyond float32 are refused): "--d-scale: expected a positive finite number (...), got 0".
/// A subnormal value is accepted: it is a positive number, however small.
CLI::Validator positive_finite(const std::string& meaning);

/// The largest extent (rows, K) the CLI accepts: 2^31.
inline constexpr int64_t kMaxExtent = int64_t(1) << 31;

/// Throws Error(kIoError) naming `option` when `path` cannot be written (io::check_output: a missing or
/// unwritable folder, a folder, a device, FIFO or socket, a dangling symlink, /proc or /sys, or the same
/// file as one of `inputs`), so that a command refuses before reading its inputs or doing its work.
void check_output_path(const std::string& path, const char* option, const std::vector<std::string>& inputs = {});

/// --group-sizes: "3,0,5" or a 1-D .npy of int32/int64 (throws Error(kInvalidArgument) naming the option).
std::vector<int64_t> parse_group_sizes(const std::string& s);

}  // namespace scalemm::cli
