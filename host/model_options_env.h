// host/model_options_env: the model switches of the environment (the seed's K3_BITS,
// K3_EXPERT_GB, ..., the COLI_VK_* and COLI_K3_* ones) read once, at the edge, into the typed
// options of a LoadModel request. Shared by the `coli` client (private hosts get the options in
// their LoadModel call) and coli-host itself (models named with --model), so one shell variable
// means the same thing whichever process loads the model.
//
//   COLI_ASSIGN_OR_RETURN(coli::v1::ModelOptions options, coli::host::ModelOptionsFromEnv());
//   request.mutable_options()->CopyFrom(options);
//
// A set value is checked here before anything loads: INVALID_ARGUMENT naming the variable, the
// value as given and what it takes ("environment variable K3_CHUNK: '0' is outside [1, 512]").
// An empty value counts as unset. The table (variable, field, values):
//   K3_BITS bits | K3_MLA_BITS mla_bits | K3_HEAD_BITS head_bits  (4, 8 or 32)
//   K3_IDOT idot | K3_DIRECT direct | K3_PIPE pipe  (0 or 1)
//   K3_CHUNK chunk (1…512) | K3_LOAD_THREADS load_threads (1…16) | COLI_THREADS threads (0…1024,
//   0 = all) | K3_LAYERS layers (0 or more) | K3_MAXT max_context (1 or more)
//   K3_EXPERT_GB expert_gb (0 or more; 0 = one slot per layer) | K3_TOPP topp [0, 1]
//   K3_MLA_NORM_EPS mla_norm_eps (0, 1]
//   K3_DIRS extra_dirs (':' or ',' separated) | K3_TRACE trace_path | K3_X0 x0_path
//   K3_LOGITS logits_path
//   COLI_K3_CKPT extra["ckpt"] (kimi_k3 recurrent-state checkpoint slots per session)
//   COLI_K3_CKPT_DIR extra["ckpt_dir"] (park those checkpoints in this folder, not in RAM)
//   COLI_K3_PREFIX_CACHE_MB extra["prefix_cache"] (kimi_k3 model-wide prefix cache, MiB, 0 = off)
//   COLI_K3_PREFIX_CACHE_MIN extra["prefix_cache_min"] (its shortest prefix kept, tokens)
//   COLI_K3_PREFIX_CACHE_KEEP extra["prefix_cache_keep"] (0/1: its files in COLI_K3_CKPT_DIR
//     outlive the process and a later one with the same model, build and switches adopts them)
//   COLI_VULKAN extra["vulkan"], K3_VK extra["vk"], COLI_VK_TIER_GB extra["vk_tier_gb"],
//     K3_VK_GB extra["vk_gb"], COLI_VK_TIER_RATE extra["vk_tier_rate"], K3_VK_UP extra["vk_up"],
//     COLI_VK_DENSE extra["vk_dense"], COLI_VK_TIER extra["vk_tier"] (kimi_k3 Vulkan expert
//     tier, plugins/kimi_k3/vk_tier.h, which checks them; COLI_VK_DEVICE is read where the
//     device opens)
//   K3_MMAP extra["mmap"] (0/1: map a repacked container's matrices read-only)
//   K3_VERIFY extra["verify"] (0/1, default 1: check a container's per-tensor CRC-32s as
//     tensors and experts are read)
//   COLI_K3_SPEC extra["spec"] (kimi_k3 speculative decoding: max prompt-lookup draft tokens
//     per verify pass, 0…16, 0 = off)
//   COLI_K3_SPEC_MIN extra["spec_min"], COLI_K3_SPEC_SAMPLED_NGRAM extra["spec_sampled_ngram"],
//     COLI_K3_SPEC_ADAPT extra["spec_adapt"] (the draft policy; the family checks the values)
//   COLI_K3_MIX_ROWS extra["mix_rows"] (kimi_k3: most decode rows one prefill chunk pass
//     carries, 0…4096, 0 = off; default max(8, K3_CHUNK); docs/status/batching.md)
// Unset fields stay unset: the plugin's defaults apply.
#ifndef COLI_HOST_MODEL_OPTIONS_ENV_H_
#define COLI_HOST_MODEL_OPTIONS_ENV_H_

#include <functional>

#include "absl/status/statusor.h"
#include "coli/v1/coli.pb.h"

namespace coli::host {

// `getenv` looks a variable up (nullptr = unset); tests pass a map's lookup.
using EnvLookup = std::function<const char*(const char*)>;

absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv(const EnvLookup& getenv);
// The process environment.
absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv();

}  // namespace coli::host

#endif  // COLI_HOST_MODEL_OPTIONS_ENV_H_
