// Subcommand registration for the scalemm CLI. Each register_* adds its subcommands to the app.
//
// Exit codes: 0 success; 1 an input was invalid (diagnostics printed); 2 a usage error.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace scalemm::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalidInput = 1;
inline constexpr int kExitUsage = 2;

/// Thrown by a subcommand to end the program with `code` after it has printed its output.
struct Exit {
  int code;
};

void register_layout_commands(CLI::App& app);
void register_demo_command(CLI::App& app);
void register_info_command(CLI::App& app);
void register_gemm_commands(CLI::App& app);  ///< gemm and replay
/// Adds --sm/--cublas/--json and the support matrix to `info`; `device_part` prints the device lines.
void extend_info_command(CLI::App* info, std::function<void()> device_part);

}  // namespace scalemm::cli
