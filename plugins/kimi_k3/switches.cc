#include "plugins/kimi_k3/switches.h"

#include <cstdint>
#include <limits>

#include "plugin_api/cpp/switches.h"

namespace coli::k3 {
namespace {

using abi::BoolSwitch;
using abi::ChoiceSwitch;
using abi::IntSwitch;
using abi::ListSwitch;
using abi::RealSwitch;
using abi::TextSwitch;
using abi::ToExtra;
using abi::ToRequestDefault;

constexpr int64_t kBits[] = {4, 8, 32};
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Load-time bits: 0 would read as "unset" on the way to the model, so only the formats the
// engine has are taken. Counts: the model reads 0 or a negative value as "unset" (its default),
// so their ranges start above it. Options in `extra` travel as given; the model checks the
// text-valued ones and names the variable of a bad value.
constexpr coli_switch_t kSwitches[] = {
    ChoiceSwitch("K3_BITS", COLI_SWITCH_FIELD_BITS, kBits,
                 "load-time bits of the KDA / latent / shared / dense matrices (32 = f32; "
                 "default 4, a repacked container's own)"),
    ChoiceSwitch("K3_MLA_BITS", COLI_SWITCH_FIELD_MLA_BITS, kBits,
                 "bits of the MLA projections (default 8)"),
    ChoiceSwitch("K3_HEAD_BITS", COLI_SWITCH_FIELD_HEAD_BITS, kBits, "bits of lm_head (default 8)"),
    BoolSwitch("K3_IDOT", COLI_SWITCH_FIELD_IDOT,
               "int8 activations with integer dots in the expert matmuls (default 1)"),
    BoolSwitch("K3_DIRECT", COLI_SWITCH_FIELD_DIRECT, "O_DIRECT expert reads (default 1)"),
    BoolSwitch("K3_PIPE", COLI_SWITCH_FIELD_PIPE, "overlap expert reads with compute (default 1)"),
    IntSwitch("K3_CHUNK", COLI_SWITCH_FIELD_CHUNK, 1, 512, "prefill chunk in tokens (default 32)"),
    IntSwitch("K3_LOAD_THREADS", COLI_SWITCH_FIELD_LOAD_THREADS, 1, 16,
              "loader threads for expert reads and the tensor load (default 4)"),
    IntSwitch("K3_LAYERS", COLI_SWITCH_FIELD_LAYERS, 0, 1 << 20,
              "validation: run only the first N layers"),
    RealSwitch("K3_EXPERT_GB", COLI_SWITCH_FIELD_EXPERT_GB, 0, 1e6,
               "routed-expert cache budget in GB (default 8; 0 = one slot per layer)"),
    RealSwitch("K3_TOPP", COLI_SWITCH_FIELD_TOPP, 0, 1,
               "keep routed experts up to cumulative weight p (default 0 = off)"),
    RealSwitch("K3_MLA_NORM_EPS", COLI_SWITCH_FIELD_MLA_NORM_EPS, 0, 1,
               "epsilon of the MLA latent norms (default 1e-6)", /*lo_exclusive=*/true,
               "a positive epsilon (the vendor's is 1e-6)"),
    IntSwitch("K3_MAXT", COLI_SWITCH_FIELD_MAX_CONTEXT, 1, int64_t{1} << 40,
              "context capacity in tokens (default 8192)"),
    ListSwitch("K3_DIRS", COLI_SWITCH_FIELD_EXTRA_DIRS,
               "extra shard folders (':' or ',' separated)"),
    TextSwitch("K3_TRACE", COLI_SWITCH_FIELD_TRACE_PATH,
               "validation: dump per-layer hidden states to this file", "a file path"),
    TextSwitch("K3_X0", COLI_SWITCH_FIELD_X0_PATH, "validation: inject input rows (k3-run only)",
               "a file path"),
    TextSwitch("K3_LOGITS", COLI_SWITCH_FIELD_LOGITS_PATH,
               "validation: dump the f32 logits of every prefill position", "a file path"),
    ToExtra(IntSwitch("COLI_K3_CKPT", COLI_SWITCH_FIELD_EXTRA, 0, kInt32Max,
                      "recurrent-state checkpoint slots per session (default 0)",
                      "a number of checkpoints, 0 or more"),
            "ckpt"),
    ToExtra(TextSwitch("COLI_K3_CKPT_DIR", "park the checkpoints in this folder, not in RAM",
                       "a writable folder"),
            "ckpt_dir"),
    ToExtra(IntSwitch("COLI_K3_PREFIX_CACHE_MB", COLI_SWITCH_FIELD_EXTRA, 0, kInt64Max,
                      "MiB of the model-wide prefix cache (default 0 = off)", "0 or more"),
            "prefix_cache"),
    ToExtra(IntSwitch("COLI_K3_PREFIX_CACHE_MIN", COLI_SWITCH_FIELD_EXTRA, 0, kInt64Max,
                      "the shortest prefix the prefix cache keeps, in tokens (default 32)",
                      "0 or more"),
            "prefix_cache_min"),
    ToExtra(TextSwitch("COLI_K3_PREFIX_CACHE_KEEP",
                       "prefix-cache files in COLI_K3_CKPT_DIR outlive the process (default 0)",
                       "0 or 1"),
            "prefix_cache_keep"),
    ToExtra(TextSwitch("COLI_VULKAN", "the Vulkan expert tier (default 0)", "0 or 1"), "vulkan"),
    ToExtra(
        TextSwitch("K3_VK", "old alias of COLI_VULKAN (an explicit COLI_VULKAN wins)", "0 or 1"),
        "vk"),
    ToExtra(TextSwitch("COLI_VK_TIER_GB", "the Vulkan tier's device budget in GB (default 2)",
                       "GB, 0 or more"),
            "vk_tier_gb"),
    ToExtra(TextSwitch("K3_VK_GB", "old alias of COLI_VK_TIER_GB", "GB, 0 or more"), "vk_gb"),
    ToExtra(TextSwitch("COLI_VK_TIER_RATE", "Vulkan tier promotions per token (default 4)",
                       "0 or more"),
            "vk_tier_rate"),
    ToExtra(TextSwitch("K3_VK_UP", "old alias of COLI_VK_TIER_RATE (auto: does nothing)",
                       "a number or auto"),
            "vk_up"),
    ToExtra(TextSwitch("COLI_VK_DENSE", "shared experts on the Vulkan device (default auto)",
                       "auto, 0 or 1"),
            "vk_dense"),
    ToExtra(TextSwitch("COLI_VK_TIER", "routed experts on the Vulkan device (default 1)", "0 or 1"),
            "vk_tier"),
    ToExtra(TextSwitch("COLI_VK_DEVICE",
                       "Vulkan device index (default: the best, discrete > integrated > virtual > "
                       "CPU)",
                       "a device index, 0 or more"),
            "vk_device"),
    ToExtra(TextSwitch("COLI_VK_STAGING",
                       "1: resident experts staged into device-only memory (default: where the "
                       "device has it)",
                       "0 or 1"),
            "vk_staging"),
    ToExtra(TextSwitch("COLI_K3_MIX_ROWS",
                       "most decode rows one prefill chunk pass carries (default max(8, "
                       "K3_CHUNK); 0 = off)",
                       "0…4096"),
            "mix_rows"),
    ToExtra(IntSwitch("COLI_K3_SPEC", COLI_SWITCH_FIELD_EXTRA, 0, 16,
                      "speculative decoding: most prompt-lookup draft tokens (default 0 = off)",
                      "a draft length in 0…16"),
            "spec"),
    ToExtra(
        TextSwitch("COLI_K3_SPEC_MIN", "drafts shorter than this are dropped (default 1)", "1…16"),
        "spec_min"),
    ToExtra(TextSwitch("COLI_K3_SPEC_SAMPLED_NGRAM",
                       "sampled rows draft only on n-gram matches this long (default 3)", "1…8"),
            "spec_sampled_ngram"),
    ToExtra(TextSwitch("COLI_K3_SPEC_ADAPT", "the draft length adapts to acceptance (default 1)",
                       "0 or 1"),
            "spec_adapt"),
    ToExtra(TextSwitch("K3_MMAP", "map a repacked container's matrices read-only (default 0)",
                       "0 or 1"),
            "mmap"),
    ToExtra(
        TextSwitch("K3_VERIFY",
                   "check a container's per-tensor CRC-32s as they are read (default 1)", "0 or 1"),
        "verify"),
    // Request defaults (ABI 1.10) last: a host older than 1.10 gets the table without them.
    ToRequestDefault(
        [] {
          coli_switch_t s = BoolSwitch("K3_THINK", COLI_SWITCH_FIELD_REQUEST,
                                       "chat replies open the think channel (default 1; 0 = "
                                       "answer only); a request's own enable_thinking wins");
          s.expected = "1 (think) or 0 (answer only)";
          return s;
        }(),
        "enable_thinking"),
};
constexpr size_t kRequestDefaults = 1;

}  // namespace

std::span<const coli_switch_t> EnvironmentSwitches(uint32_t host_minor) {
  const std::span<const coli_switch_t> all = kSwitches;
  return host_minor >= 10 ? all : all.first(all.size() - kRequestDefaults);
}

}  // namespace coli::k3
