// plugins/kimi_k3/options: the typed knobs of the Kimi K3 model (docs/contracts.md).
//
// The seed's environment switches arrive here as fields; they are read once at the edge (the
// CLI `k3-run`, the host) — never from the environment inside the model.
//
// | field               | switch          | default | meaning                                        |
// |---------------------|-----------------|---------|------------------------------------------------|
// | bits                | K3_BITS         | 4       | KDA q/k/v/o/g, latent down/up, shared, dense (4, 8, 32 = f32) |
// | mla_bits            | K3_MLA_BITS     | 8       | MLA q_a, q_b, kv_a, kv_b, o, g                 |
// | head_bits           | K3_HEAD_BITS    | 8       | lm_head                                        |
// | idot                | K3_IDOT         | 1       | int8-activation kernels (0 = exact float)      |
// | chunk               | K3_CHUNK        | 32      | prefill chunk (1…512; forced 1 with a trace)   |
// | load_threads        | K3_LOAD_THREADS | 4       | tensor loading / quantization and expert reads (1…16) |
// | topp                | K3_TOPP         | 0       | keep experts to cumulative weight p (0 = off)  |
// | extra_dirs          | K3_DIRS         | —       | extra shard folders                            |
// | max_context         | K3_MAXT         | 0       | context capacity (0 = unbounded; the plugin serves 8192 then) |
// | layers              | K3_LAYERS       | all     | run layers 0…N−1 only (validation; final mix, norm and head still run, as in tools/k3/k3_ref.py) |
// | trace_path          | K3_TRACE        | —       | f32 hidden state after every layer, token-major [T, layers, D] |
// | x0_path             | K3_X0           | —       | (CLI) f32 input rows [T, D] instead of embeddings |
// | logits_path         | K3_LOGITS       | —       | f32 LE logits of every prefill position [T, V] |
// | mla_latent_norm_eps | K3_MLA_NORM_EPS | 1e-6    | ε of q_a_layernorm / kv_a_layernorm (vendor; production engines use 1e-5) |
// | threads             | COLI_THREADS    | 0       | compute threads (0 = OpenMP default; ≤ 1024)   |
// | vulkan              | COLI_VULKAN (K3_VK) | 0   | open the Vulkan device, routed experts on its tier (vk_tier.h) |
// | vk_tier_gb          | COLI_VK_TIER_GB (K3_VK_GB) | 2 | tier budget in GB of device memory        |
// | vk_tier_rate        | COLI_VK_TIER_RATE (numeric K3_VK_UP) | 4 | tier promotions per token (forward pass) |
// | vk_dense            | COLI_VK_DENSE   | auto (-1) | shared experts of decode passes on the device: auto = on a discrete GPU, 1 always, 0 never (vk_dense.h) |
// | vk_tier             | COLI_VK_TIER    | 1       | 0: no routed experts on the device (the device stays open for vk_dense) |
// | vk_device           | COLI_VK_DEVICE  | -1      | Vulkan device index; -1 = unset: the host process's COLI_VK_DEVICE, else the best (discrete > integrated > virtual > CPU) |
// | vk_staging          | COLI_VK_STAGING | -1      | 1: resident experts staged into device-only memory even where the device maps all its memory; -1 = unset: the host process's COLI_VK_STAGING, else 0 |
// | mmap                | K3_MMAP         | 0       | map a repacked container's U8 matrices and F32 .qs read-only (no fallback) |
// | verify_checksums    | K3_VERIFY       | 1       | check a container's per-tensor CRC-32 as tensors and experts are read (weights.h) |
// | verify_mapped       | K3_VERIFY unset | !mmap   | also the mapped matrices and the embedding at load (reads them all: K3_MMAP's fast start is kept unless K3_VERIFY=1) |
// bits_set / mla_bits_set / head_bits_set say the switch was given explicitly: on a repacked
// container (container.h) an unset switch keeps the container's format, an explicit one must
// match it (or be 4 on int8: downcast to int4-g64 at load).
// expert_gb, direct, pipe are for the streaming expert store (expert_store.h).
#ifndef COLI_PLUGINS_KIMI_K3_OPTIONS_H_
#define COLI_PLUGINS_KIMI_K3_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace coli::k3 {

// The most loader threads (K3_LOAD_THREADS) and compute threads (COLI_THREADS) taken.
inline constexpr int kMaxLoadThreads = 16;
inline constexpr int kMaxComputeThreads = 1024;

struct ModelOptions {
  int bits = 4, mla_bits = 8, head_bits = 8;
  bool idot = true;
  int chunk = 32;
  double expert_gb = 8;
  bool direct = true;
  bool pipe = true;
  int load_threads = 4;
  double topp = 0;
  std::vector<std::string> extra_dirs;
  int64_t max_context = 0;
  int layers = -1;
  // DISAGREEMENT (spec §3.9): the vendor builds q_a_layernorm / kv_a_layernorm without an eps
  // argument, so they use the norm default 1e-6; production ports use rms_norm_eps (1e-5).
  // The vendor value is the default; set 1e-5 to match those engines.
  float mla_latent_norm_eps = 1e-6f;
  int threads = 0;
  bool bits_set = false, mla_bits_set = false, head_bits_set = false;
  bool mmap = false;
  bool verify_checksums = true;
  // With verify_checksums: also check the K3_MMAP-mapped matrices and the embedding at load,
  // which reads every byte of them. Off when K3_MMAP is on and K3_VERIFY unset, so the mapped
  // start stays fast (routed experts are still checked on their first read).
  bool verify_mapped = true;
  // The Vulkan expert tier (vk_tier.h); read at the edge by VkSwitches::Resolve.
  bool vulkan = false;
  double vk_tier_gb = 2;
  int vk_tier_rate = 4;
  int vk_dense = -1;     // kVkDenseAuto (vk_dense.h); 0 CPU, 1 device
  bool vk_tier = true;
  int vk_device = -1;   // COLI_VK_DEVICE; -1 = unset (the host's environment, else the best)
  int vk_staging = -1;  // COLI_VK_STAGING 0 / 1; -1 = unset (the host's environment, else 0)
  std::string trace_path, x0_path, logits_path;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_OPTIONS_H_
