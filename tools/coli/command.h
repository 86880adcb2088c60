// The `coli` client's subcommand registry.
//
// Each subcommand lives in its own file and registers itself:
//
//   static int RunTokenize(int argc, char** argv);   // argv[0] is "tokenize"
//   COLI_REGISTER_COMMAND(tokenize, "tokenize", "text -> token ids (JSON)", RunTokenize);
//
// Those files are compiled straight into the `coli` executable (tools/coli/*.cmake add them with
// target_sources), so their static registrars always run.
#ifndef COLI_TOOLS_COLI_COMMAND_H_
#define COLI_TOOLS_COLI_COMMAND_H_

#include <map>
#include <string>

namespace coli::cli {

using CommandFn = int (*)(int argc, char** argv);

struct Command {
  std::string summary;
  CommandFn run = nullptr;
};

// Name -> command, sorted for `coli help`.
std::map<std::string, Command>& Commands();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, CommandFn run) {
    Commands()[name] = Command{summary, run};
  }
};

// `coli bench <area>`: each benchmark area registers itself the same way.
std::map<std::string, Command>& BenchAreas();

struct BenchRegistrar {
  BenchRegistrar(const char* area, const char* summary, CommandFn run) {
    BenchAreas()[area] = Command{summary, run};
  }
};

}  // namespace coli::cli

// argv[0] of a bench function is the area name; `--json` asks for one JSON object on stdout.
#define COLI_REGISTER_BENCH(id, area, summary, fn) \
  static ::coli::cli::BenchRegistrar coli_bench_registrar_##id(area, summary, fn)

#define COLI_REGISTER_COMMAND(id, name, summary, fn) \
  static ::coli::cli::CommandRegistrar coli_command_registrar_##id(name, summary, fn)

#endif  // COLI_TOOLS_COLI_COMMAND_H_
