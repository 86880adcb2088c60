// `coli bench <area> [--json] [args]`: runs one registered benchmark area.
#include <cstdio>

#include "tools/coli/command.h"

namespace coli::cli {

std::map<std::string, Command>& BenchAreas() {
  static std::map<std::string, Command> areas;
  return areas;
}

namespace {

int RunBench(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: coli bench <area> [--json] [args]\n\nareas:\n");
    for (const auto& [name, area] : BenchAreas()) {
      std::fprintf(stderr, "  %-10s %s\n", name.c_str(), area.summary.c_str());
    }
    return 2;
  }
  auto it = BenchAreas().find(argv[1]);
  if (it == BenchAreas().end()) {
    std::fprintf(stderr, "coli bench: unknown area '%s'\n", argv[1]);
    return 2;
  }
  return it->second.run(argc - 1, argv + 1);
}

}  // namespace

COLI_REGISTER_COMMAND(bench, "bench", "benchmarks: coli bench <area> [--json]", RunBench);

}  // namespace coli::cli
