// plugins/kimi_k3/switches: the environment switches of the Kimi K3 family (plugin ABI 1.8): the
// seed's K3_* variables, the COLI_K3_* and COLI_VK_* ones and the old K3_VK* aliases, each with
// the option it sets (K3_THINK: the chat requests' enable_thinking), the values it takes and a
// help line. The host and its clients read the environment with this table
// (host/model_options_env.h); `coli-host --switches` lists it.
#ifndef COLI_PLUGINS_KIMI_K3_SWITCHES_H_
#define COLI_PLUGINS_KIMI_K3_SWITCHES_H_

#include <cstdint>
#include <span>

#include "plugin_api/coli_plugin.h"

namespace coli::k3 {

// The table for a host of ABI minor `host_minor`: request defaults (K3_THINK; ABI 1.10) only
// for a host that knows them.
std::span<const coli_switch_t> EnvironmentSwitches(uint32_t host_minor = COLI_ABI_VERSION_MINOR);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_SWITCHES_H_
