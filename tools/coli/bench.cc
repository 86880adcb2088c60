// `coli bench <area> [--json] [args]`: runs one registered benchmark area.
#include <cstdio>
#include <string>

#include "tools/coli/command.h"

namespace coli::cli {

std::map<std::string, Command>& BenchAreas() {
  static std::map<std::string, Command> areas;
  return areas;
}

namespace {

void PrintAreas(std::FILE* out) {
  std::fprintf(out, "usage: coli bench <area> [--json] [args]   (coli bench <area> --help)\n\nareas:\n");
  for (const auto& [name, area] : BenchAreas()) {
    std::fprintf(out, "  %-10s %s\n", name.c_str(), area.summary.c_str());
  }
}

int RunBench(int argc, char** argv) {
  if (argc < 2) {
    PrintAreas(stderr);
    return 2;
  }
  const std::string area = argv[1];
  if (area == "--help" || area == "-h" || area == "help") {
    PrintAreas(stdout);
    return 0;
  }
  auto it = BenchAreas().find(area);
  if (it == BenchAreas().end()) {
    std::fprintf(stderr, "coli bench: unknown area '%s'\n", area.c_str());
    PrintAreas(stderr);
    return 2;
  }
  return it->second.run(argc - 1, argv + 1);
}

}  // namespace

COLI_REGISTER_COMMAND(bench, "bench", "benchmarks: coli bench <area> [--json]", RunBench);

}  // namespace coli::cli
