// coli: the thin client. `coli <command> [args]`; `coli help` lists the commands.
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/coli/cli_args.h"
#include "tools/coli/command.h"

namespace coli::cli {

std::map<std::string, Command>& Commands() {
  static std::map<std::string, Command> commands;
  return commands;
}

namespace {

void PrintUsage(std::FILE* out) {
  std::fprintf(out, "usage: coli <command> [args]\n\ncommands:\n");
  for (const auto& [name, command] : Commands()) {
    std::fprintf(out, "  %-10s %s\n", name.c_str(), command.summary.c_str());
  }
  std::fprintf(out, "  %-10s %s\n", "version", "print the client version");
  std::fprintf(out, "\ncoli <command> --help (or coli help <command>) shows a command's flags.\n");
}

}  // namespace
}  // namespace coli::cli

int main(int argc, char** argv) {
  using coli::cli::Commands;
  if (argc < 2) {
    coli::cli::PrintUsage(stderr);
    return 2;
  }
  const bool help = !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") ||
                    !std::strcmp(argv[1], "-h");
  if (help && argc >= 3) {  // `coli help run` = `coli run --help`
    auto it = Commands().find(argv[2]);
    if (it == Commands().end()) {
      std::fprintf(stderr, "coli: unknown command '%s'\n", argv[2]);
      coli::cli::PrintUsage(stderr);
      return 2;
    }
    char help_flag[] = "--help";
    char* args[] = {argv[2], help_flag, nullptr};
    return it->second.run(2, args);
  }
  if (help) {
    coli::cli::PrintUsage(stdout);
    return 0;
  }
  if (!std::strcmp(argv[1], "version") || !std::strcmp(argv[1], "--version")) {
    std::printf("coli %s\n", COLI_VERSION);
    return 0;
  }
  auto it = Commands().find(argv[1]);
  if (it == Commands().end()) {
    std::fprintf(stderr, "coli: unknown command '%s'\n", argv[1]);
    coli::cli::PrintUsage(stderr);
    return 2;
  }
  return coli::cli::ExitLikeSignal(it->second.run(argc - 1, argv + 1));
}
