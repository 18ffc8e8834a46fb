// libFuzzer target: bytes -> argv of the `scalemm` CLI -> CLI11 parsing of the layout subcommands.
//
// The input is split at '\n' (or '\0') into arguments after "scalemm". An app is built the way
// tools/cli/main.cpp builds it (require one subcommand, --version) with the host-only subcommands
// (`layout explain|render|check|convert`, registered by tools/cli/layout_commands.cpp; the gemm,
// replay, info and demo subcommands need the CUDA library and are not part of this target) and
// parsed with every callback replaced by a no-op: parsing, validators and option conversions run,
// nothing is read, written or computed. When the arguments select `layout explain` with small
// extents, the real callback runs too (on a second app, output to stdout: tools/fuzz.sh runs it with -close_fd_mask=3).
// The accepted ends are the CLI's own exit paths of main.cpp: CLI::ParseError (help, version and
// usage errors), scalemm::cli::Exit and scalemm::Error. Any other exception escapes and is a finding.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "commands.hpp"
#include "scalemm/status.hpp"

namespace {

void drop_callbacks(CLI::App* app) {
  app->callback([] {});
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) drop_callbacks(sub);
}

void build(CLI::App& app) {
  app.require_subcommand(1);
  app.set_version_flag("--version", "0.0.0-fuzz");
  scalemm::cli::register_layout_commands(app);
}

// Parses argv the way main() does; returns false when parsing ended on one of main()'s exit paths.
bool parse(CLI::App& app, std::vector<std::string> args) {
  try {
    app.parse(std::move(args));  // CLI11 takes a reversed argument vector here
    return true;
  } catch (const CLI::ParseError& e) {
    app.exit(e);
  } catch (const scalemm::cli::Exit&) {
  } catch (const scalemm::Error&) {
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 512) return 0;
  std::vector<std::string> args;
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\n' || c == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  args.push_back(cur);
  if (args.size() > 24) return 0;
  std::vector<std::string> reversed(args.rbegin(), args.rend());

  // Built once: CLI11 clears an app's previous results when it parses again.
  static CLI::App& dry = [] () -> CLI::App& {
    static CLI::App app{"scalemm"};
    build(app);
    drop_callbacks(&app);
    return app;
  }();
  if (!parse(dry, reversed)) return 0;

  CLI::App* layout = dry.get_subcommand("layout");
  if (!layout->parsed()) return 0;
  CLI::App* explain = layout->get_subcommand("explain");
  if (!explain->parsed()) return 0;
  const auto rows = explain->get_option("--rows")->as<int64_t>();
  const auto cols = explain->get_option("--cols")->as<int64_t>();
  if (rows > 4096 || cols > 4096) return 0;  // large extents are checked by the CLI tests, not here

  static CLI::App& real = [] () -> CLI::App& {
    static CLI::App app{"scalemm"};
    build(app);
    return app;
  }();
  parse(real, reversed);
  return 0;
}
