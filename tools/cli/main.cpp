// scalemm command-line tool.
#include <cstdio>
#include <iostream>
#include <new>
#include <string>

#include "commands.hpp"
#include "scalemm/status.hpp"
#include "scalemm/version.hpp"

namespace {

// CLI11 reads an unknown command as a stray argument and answers "A subcommand is required"; name it
// instead, with the commands that exist at that level.
void check_command_names(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return;  // options (and their values) follow
    const auto subs = level->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return;  // a command's positional argument (replay DIR)
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* s : subs) {
      if (s->check_name(word)) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!next) {
      const std::string path = level == &app ? "scalemm" : "scalemm " + level->get_name();
      throw CLI::ValidationError(path, "unknown command '" + word + "'; expected one of " + names + " (" + path +
                                           " --help lists them)");
    }
    level = next;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scalemm " SCALEMM_VERSION_STRING
               ": inspect, check and convert the scale layouts of low-precision scaled GEMMs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", SCALEMM_VERSION_STRING);
  scalemm::cli::register_info_command(app);
  scalemm::cli::register_layout_commands(app);
  scalemm::cli::register_gemm_commands(app);
  scalemm::cli::register_demo_command(app);
  try {
    check_command_names(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return scalemm::cli::kExitUsage;
  } catch (const scalemm::cli::Exit& e) {
    return e.code;
  } catch (const scalemm::Error& e) {
    std::fprintf(stderr, "scalemm: %s\n", e.what());
    return e.code() == scalemm::StatusCode::kInvalidArgument ? scalemm::cli::kExitUsage
                                                             : scalemm::cli::kExitInvalidInput;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "scalemm: out of memory (an input declares more data than fits in memory)\n");
    return scalemm::cli::kExitInvalidInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scalemm: internal error: %s\n", e.what());
    return scalemm::cli::kExitInvalidInput;
  }
  return scalemm::cli::kExitOk;
}
