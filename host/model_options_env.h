// host/model_options_env: the model switches of the environment read once, at the edge, into the
// typed options of a LoadModel request. The switches are data: each model family declares its
// own (plugin ABI 1.8, coli_switch_t: variable, field or extra key, values, help; the kimi_k3
// table is in plugins/kimi_k3/switches.cc), coli-host adds the one it owns for every family
// (COLI_THREADS, the typed `threads` field), and this reader knows no family's names. Shared by
// the `coli` client, which gets the tables from its host's Health (PluginInfo.switches) and
// sends the options in LoadModel, and coli-host itself (models named with --model, and
// `coli-host --switches`), so one shell variable means the same thing whichever process loads.
//
//   std::vector<v1::ModelSwitch> switches = ...;  // HostSwitches() + each loaded family's
//   COLI_ASSIGN_OR_RETURN(v1::ModelOptions options, ModelOptionsFromEnv(switches));
//
// A set value is checked here before anything loads: INVALID_ARGUMENT naming the variable, the
// value as given and what it takes ("environment variable K3_CHUNK: '0' is outside [1, 512]").
// An empty value counts as unset; unset fields stay unset (the plugin's defaults apply).
#ifndef COLI_HOST_MODEL_OPTIONS_ENV_H_
#define COLI_HOST_MODEL_OPTIONS_ENV_H_

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "coli/v1/coli.pb.h"
#include "nlohmann/json.hpp"
#include "plugin_api/coli_plugin.h"

namespace coli::host {

// `getenv` looks a variable up (nullptr = unset); tests pass a map's lookup.
using EnvLookup = std::function<const char*(const char*)>;

// The switches coli-host owns whatever families it loads (family ""): COLI_THREADS, the compute
// threads of the typed `threads` field that every family's options carry.
const std::vector<v1::ModelSwitch>& HostSwitches();

// A plugin's declaration (read up to its struct_size) as the message, checked: a name of
// [A-Z0-9_], a known kind that suits its field (INT an integer field, LIST extra_dirs, ...), a
// key for `extra`, a non-empty range that fits the field. FAILED_PRECONDITION naming the switch
// and what is wrong otherwise (the host then refuses the plugin).
absl::StatusOr<v1::ModelSwitch> SwitchFromAbi(const coli_switch_t& declared,
                                              std::string_view family);

// HostSwitches() followed by the given families' switches.
std::vector<v1::ModelSwitch> WithHostSwitches(std::span<const v1::ModelSwitch> family_switches);

// Reads every variable of `switches` that is set. A name declared twice with different meanings
// (two families) is refused when it is set, naming both.
absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv(std::span<const v1::ModelSwitch> switches,
                                                     const EnvLookup& getenv);
// The process environment.
absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv(std::span<const v1::ModelSwitch> switches);

// Everything the set variables of `switches` say, read once: the model options, and the request
// defaults (COLI_SWITCH_FIELD_REQUEST switches, ABI 1.10) as {field: value} — BOOL a JSON bool,
// INT / REAL a number, STRING a string; {} when none is set — which model options never carry:
// the client puts them into the chat requests it renders. Every switch is checked as
// ModelOptionsFromEnv checks it (the same errors).
struct EnvironmentValues {
  v1::ModelOptions options;
  nlohmann::json request = nlohmann::json::object();
};
absl::StatusOr<EnvironmentValues> ReadEnvironment(std::span<const v1::ModelSwitch> switches,
                                                  const EnvLookup& getenv);
absl::StatusOr<EnvironmentValues> ReadEnvironment(std::span<const v1::ModelSwitch> switches);
// Sets each field of `defaults` that the JSON object `request` lacks (or has null). JsonT: any
// nlohmann::basic_json (the gateway's is ordered).
template <class JsonT>
void ApplyRequestDefaults(const nlohmann::json& defaults, JsonT* request) {
  if (!defaults.is_object() || !request->is_object()) return;
  for (auto it = defaults.begin(); it != defaults.end(); ++it) {
    auto have = request->find(it.key());
    if (have == request->end() || have->is_null()) (*request)[it.key()] = JsonT(it.value());
  }
}

// What a switch takes ("4, 8 or 32", "1…512", "0 or 1", "(0, 1]", "text") and what it sets
// ("chunk", "extra[ckpt]", "request[enable_thinking]"), for listings.
std::string SwitchValues(const v1::ModelSwitch& s);
std::string SwitchTarget(const v1::ModelSwitch& s);
// One line per switch: name, values, family and target, help (coli-host --switches).
std::string SwitchListing(std::span<const v1::ModelSwitch> switches);

}  // namespace coli::host

#endif  // COLI_HOST_MODEL_OPTIONS_ENV_H_
