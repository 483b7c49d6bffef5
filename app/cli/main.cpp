// kvchat-cli: the headless twin of the desktop app, over the same engine.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "app/cli/cli_command.h"
#include "engine/compute/process_setup.h"

namespace {

void print_help() {
  std::fprintf(stdout, "usage: kvchat-cli <command> [options]\n\ncommands:\n");
  for (const auto* command : kvchat::cli::CliRegistry::all())
    std::fprintf(stdout, "  %-10s %s\n", command->name.c_str(), command->summary.c_str());
  std::fprintf(stdout, "\n`kvchat-cli <command> --help` shows a command's options. --verbose logs debug output.\n");
}

}  // namespace

int main(int argc, char** argv) {
  kvchat::ensure_passive_openmp_threads(argv);
  kvchat::keep_freed_memory_for_reuse();
  // Logs go to stderr so that stdout stays machine-readable (--json, JSON lines).
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvchat-cli"));
  spdlog::set_level(spdlog::level::warn);

  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--verbose") {
      spdlog::set_level(spdlog::level::debug);
      continue;
    }
    args.push_back(arg);
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_help();
    return args.empty() ? 2 : 0;
  }
  const auto* command = kvchat::cli::CliRegistry::find(args[0]);
  if (!command) {
    std::fprintf(stderr, "kvchat-cli: unknown command '%s' (try --help)\n", args[0].c_str());
    return 2;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (!rest.empty() && (rest[0] == "--help" || rest[0] == "-h")) {
    std::fprintf(stdout, "%s\n", command->usage.c_str());
    return 0;
  }
  try {
    return command->run(rest);
  } catch (const kvchat::cli::UsageError& error) {
    std::fprintf(stderr, "kvchat-cli %s: %s\n", command->name.c_str(), error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "kvchat-cli %s: error: %s\n", command->name.c_str(), error.what());
    return 1;
  }
}
