// `coli switches [--host ADDR]`: the model switches of the environment, as the host's plugins
// declare them (plugin ABI 1.8, Health's PluginInfo.switches) plus the host's own: each
// variable, the values it takes, its family and what it sets, a help line, and the value this
// shell gives it. Without --host a private coli-host is started (and stopped) to ask, so the
// listing is the one `coli run` / `coli chat` read with; with --host, that host's.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "host/model_options_env.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/client.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

constexpr const char* kUsage =
    "usage: coli switches [--host ADDR]\n"
    "  the model switches of the environment the host's plugins declare: variable, values,\n"
    "  family: what it sets — help; then those this shell sets, checked as `coli run` checks\n"
    "  them (exit 2 naming a bad one)\n"
    "  --host ADDR  ask that coli-host (default: a private one, with $COLI_PLUGIN_DIR's plugins)\n";

int UsageError(const std::string& why) {
  std::fprintf(stderr, "coli switches: %s\n(coli switches --help lists the flags)\n", why.c_str());
  return 2;
}

int RunSwitches(int argc, char** argv) {
  std::string host;
  ArgReader args(argc, argv);
  while (args.Next()) {
    if (args.Is("--host")) {
      absl::StatusOr<std::string> v = args.Value();
      if (!v.ok()) return UsageError(std::string(v.status().message()));
      if (v->empty()) return UsageError("--host is empty: give an address");
      host = *v;
    } else if (args.Is("-h") || args.Is("--help")) {
      std::printf("%s", kUsage);
      return 0;
    } else if (args.IsFlag()) {
      return UsageError(std::string(args.Unknown().message()));
    } else {
      return UsageError("unexpected argument '" + args.arg() + "'");
    }
  }
  auto connected = client::Client::Connect({.host = host});
  if (!connected.ok()) {
    std::fprintf(stderr, "coli switches: %s\n", std::string(connected.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<v1::HealthResponse> health = (*connected)->Health();
  if (!health.ok()) {
    std::fprintf(stderr, "coli switches: %s\n", std::string(health.status().message()).c_str());
    return 1;
  }
  const std::vector<v1::ModelSwitch> switches = client::SwitchesOf(*health);
  std::fputs(host::SwitchListing(switches).c_str(), stdout);
  // What this shell sets, as `coli run` would read it.
  std::string set;
  for (const v1::ModelSwitch& s : switches) {
    const char* value = std::getenv(s.name().c_str());
    if (value != nullptr && *value != '\0') set += "  " + s.name() + "=" + value + "\n";
  }
  std::printf("\nset in this environment:%s\n%s", set.empty() ? " none" : "", set.c_str());
  absl::StatusOr<v1::ModelOptions> options = host::ModelOptionsFromEnv(switches);
  if (!options.ok()) {
    std::fprintf(stderr, "coli switches: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  return 0;
}

}  // namespace

COLI_REGISTER_COMMAND(switches, "switches",
                      "the model switches of the environment the plugins declare", RunSwitches);

}  // namespace coli::cli
